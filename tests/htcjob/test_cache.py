"""The operator's watch copy (ce_k8s.htcjob.cache): newer wins, a write after a deletion does not bring
the resource back, a relist forgets what it no longer lists."""

from __future__ import annotations

from ce_k8s.htcjob.cache import ObjectCache


def version(rv: str, uid: str = "u1", name: str = "a", **meta) -> dict:
    return {"metadata": {"namespace": "users", "name": name, "uid": uid, "resourceVersion": rv, **meta}}


def test_an_older_version_of_the_same_resource_does_not_replace_a_newer_one():
    cache = ObjectCache()
    assert cache.put(version("12"))
    assert not cache.put(version("11"))           # an event that predates a write of ours
    assert cache.get("users/a")["metadata"]["resourceVersion"] == "12"
    assert cache.put(version("9", uid="u2"))      # another resource of that name: it replaces
    assert cache.put(version("x", uid="u2"))      # not an integer: the later arrival wins
    assert cache.get("users/a")["metadata"]["resourceVersion"] == "x"


def test_a_write_answered_after_the_deletion_event_does_not_bring_the_resource_back():
    cache = ObjectCache()
    assert not cache.put(version("5"), known_only=True)
    cache.put(version("5"))
    cache.drop("users/a")
    assert not cache.put(version("6"), known_only=True) and cache.get("users/a") is None
    cache.put(version("7", uid="u2"))
    assert not cache.put(version("8"), known_only=True)     # the old resource's write, not this one's
    assert cache.get("users/a")["metadata"]["uid"] == "u2"


def test_a_relist_forgets_what_it_no_longer_lists_and_managed_fields_are_not_kept():
    cache = ObjectCache()
    sent = version("3", name="a", managedFields=[{"manager": "kubectl"}])
    cache.put(sent)
    cache.put(version("4", name="b"))
    assert "managedFields" not in cache.get("users/a")["metadata"]
    assert "managedFields" in sent["metadata"]               # the caller's object is left as it was
    assert cache.keep_only({"users/b"}) == ["users/a"]
    assert cache.get("users/a") is None and len(cache) == 1
