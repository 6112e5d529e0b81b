"""One cleanup, one pod delete: the agent's delete paths never delete the same pod twice.

A cleanup request, the creator finishing a create the cleanup overtook, the garbage collector
retrying a cleanup and a hold can each decide at the same moment that a pod must go. A second
call meets the pod already deleted (404) and then deletes the sandbox Secret by name, the
fallback for a pod that never existed: three calls where one is right (docs/agent.md "Deleting a
pod once"). Each test forces one interleaving with hooks and events, never with sleeps.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ce_k8s import protocol
from ce_k8s.agent.effects import THREAD_PREFIX
from ce_k8s.agent.status import CREATE_DONE
from ce_k8s.pods.names import pod_name, secret_name

from .conftest import GJID, new_agent, routed_ad, text_of, wait

NAME = pod_name(GJID, 0)


def stored(server, name=NAME, resource="pods"):
    try:
        return server.call(server.api.get, resource, "default", name)
    except Exception:
        return None


def deletes(server) -> tuple[int, int]:
    """(pod deletes, Secret deletes) the API server has answered so far."""
    return server.calls[("delete", "pods")], server.calls[("delete", "secrets")]


def created(agent, server, settings):
    """The routed ad of a pilot whose pod and Secret exist and whose pod the cache shows."""
    ad = routed_ad(Path(settings.spool))
    status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
    assert status == protocol.STATUS_OK, parts
    wait(lambda: stored(server, secret_name(NAME), "secrets"))
    wait(lambda: agent.cache.get(NAME))
    wait(lambda: agent.jobs[NAME].creation.info.state == CREATE_DONE)
    return ad


def test_cleanup_that_overtakes_the_creators_last_steps_deletes_the_pod_once(server, settings):
    """The race behind the flaky `test_cleanup_deletes_only_the_pod_and_leaves_shared_secrets`:
    the Secret is stored and the watch shows the pod, but the creator thread has not yet reached
    its `rec.cleanup.asked_at` check when the cleanup deletes the pod. The creator must not delete it again
    (nor the Secret by name), and its create reply must not bring the deleted pod back into the
    cache, where the GC would delete it on every pass."""
    agent = new_agent(server, settings, gc_interval=3600)
    reached, go, ran = threading.Event(), threading.Event(), threading.Event()
    seed, run = agent.credentials.seed, agent.creator.run

    def held_seed(*args, **kwargs):         # the creator's last step before its cleaned check
        seed(*args, **kwargs)
        reached.set()
        assert go.wait(30)

    def traced_run(rec):
        try:
            run(rec)
        finally:
            ran.set()

    agent.credentials.seed, agent.creator.run = held_seed, traced_run
    try:
        ad = routed_ad(Path(settings.spool))
        status, _ = agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
        assert status == protocol.STATUS_OK
        assert reached.wait(30)
        wait(lambda: stored(server, secret_name(NAME), "secrets"))
        wait(lambda: agent.cache.get(NAME))
        before = deletes(server)
        status, parts = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
        assert status == protocol.STATUS_OK, parts
        wait(lambda: agent.cache.get(NAME) is None)     # the watch saw the pod deleted
        go.set()
        assert ran.wait(30)
        wait(agent.effects.idle)                        # every delete the creator queued has run
        assert deletes(server) == (before[0] + 1, before[1])
        assert agent.cache.get(NAME) is None            # no ghost of the deleted pod
        assert agent.garbage.collect() == []
        assert deletes(server) == (before[0] + 1, before[1])
    finally:
        go.set()
        agent.stop()


def test_gc_run_while_the_cleanups_delete_is_in_flight_leaves_the_pod_to_it(server, settings):
    """The GC retries the delete of a cleaned-up pod (`rec.cleanup.asked_at`); while the cleanup's own call
    is on its way it must leave the pod alone."""
    agent = new_agent(server, settings, gc_interval=3600)
    try:
        ad = created(agent, server, settings)
        real = agent.calls.delete_namespaced_pod
        collected: list[list[str]] = []
        gc_ran = threading.Event()

        def delete(name, namespace, **kwargs):
            if not gc_ran.is_set():
                gc_ran.set()
                collected.append(agent.garbage.collect())     # the GC thread's pass, mid-request
            return real(name, namespace, **kwargs)

        agent.calls.delete_namespaced_pod = delete
        before = deletes(server)
        status, parts = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
        assert status == protocol.STATUS_OK, parts
        assert collected == [[]]
        assert deletes(server) == (before[0] + 1, before[1])
        wait(lambda: stored(server) is None and stored(server, secret_name(NAME), "secrets") is None)
    finally:
        agent.stop()


def test_gc_run_before_the_watch_reports_the_cleanups_delete_leaves_the_pod_alone(server, settings):
    """The cleanup's delete has returned, the watch has not yet reported it: the cache still shows
    the pod as it was, and the GC must not take that for a pod to delete again."""
    agent = new_agent(server, settings, gc_interval=3600)
    try:
        ad = created(agent, server, settings)
        real, apply = agent.calls.delete_namespaced_pod, agent.cache._apply
        collected: list[list[str]] = []
        gc_ran, events_flow = threading.Event(), threading.Event()
        events_flow.set()

        def held_apply(event):              # the watch thread applies no event while the gate is shut
            assert events_flow.wait(30)
            apply(event)

        def delete(name, namespace, **kwargs):
            if gc_ran.is_set():
                return real(name, namespace, **kwargs)
            gc_ran.set()
            events_flow.clear()
            try:
                reply = real(name, namespace, **kwargs)
                assert agent.cache.get(NAME) is not None and not agent.cache.get(NAME).deleting
                collected.append(agent.garbage.collect())     # before the DELETED event is applied
            finally:
                events_flow.set()
            return reply

        agent.cache._apply, agent.calls.delete_namespaced_pod = held_apply, delete
        before = deletes(server)
        status, parts = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
        assert status == protocol.STATUS_OK, parts
        assert collected == [[]]
        assert deletes(server) == (before[0] + 1, before[1])
    finally:
        agent.stop()


def test_cleanup_after_the_gc_took_the_pod_counts_that_delete(server, settings):
    """The GC runs between the cleanup marking the job cleaned and the cleanup's delete: the GC's
    delete is the pod's one delete, and the cleanup reports the pod deleted without a call."""
    agent = new_agent(server, settings, gc_interval=3600)
    try:
        ad = created(agent, server, settings)
        record_done = agent.journal.record_done
        collected: list[list[str]] = []

        def done_then_gc(names):
            record_done(names)
            collected.append(agent.garbage.collect())

        agent.journal.record_done = done_then_gc
        before = deletes(server)
        status, parts = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
        assert collected == [[NAME]]
        assert status == protocol.STATUS_OK and parts == [b"1 pod(s) deleted"]
        assert deletes(server) == (before[0] + 1, before[1])
    finally:
        agent.stop()


def test_cleanup_while_a_hold_deletes_the_pod_waits_for_that_delete(server, settings):
    """A hold's delete (`Deleter.delete_async`) is on its way when the cleanup comes: the cleanup waits for
    it and reports its outcome instead of sending a second delete."""
    agent = new_agent(server, settings, gc_interval=3600)
    try:
        ad = created(agent, server, settings)
        real = agent.calls.delete_namespaced_pod
        in_hold, release = threading.Event(), threading.Event()

        def delete(name, namespace, **kwargs):
            if threading.current_thread().name.startswith(THREAD_PREFIX):  # the hold's queued delete
                in_hold.set()
                assert release.wait(30)
            return real(name, namespace, **kwargs)

        agent.calls.delete_namespaced_pod = delete
        before = deletes(server)
        agent.deleter.delete_async(agent.cache.get(NAME), why="hold", job="104711.0")
        assert in_hold.wait(30)
        reply: list[tuple[str, list[bytes]]] = []
        cleanup = threading.Thread(target=lambda: reply.append(agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)))
        cleanup.start()
        wait(lambda: agent.deletions.waiters(NAME) == 1)      # the cleanup waits on the hold's call
        release.set()
        cleanup.join(30)
        assert reply == [(protocol.STATUS_OK, [b"1 pod(s) deleted"])]
        assert deletes(server) == (before[0] + 1, before[1])
    finally:
        release.set()
        agent.stop()
