"""The emulated control plane's built-in controllers: namespace deletion and the garbage collector.

Why a part of its own: on a real cluster these are controllers in kube-controller-manager that act
through the API like any client, after the fact; here they run on the server's loop a moment
(``gc_delay``) after the write that calls for them, and act through the same verbs of
:class:`Api`, so what they do gets resourceVersions and watch events like any other change. The
namespace controller empties a deleted namespace, finalizers included, then removes it; the
garbage collector deletes dependents whose owners are all gone (Background), drops the
ownerReferences of an Orphan delete's dependents, and finishes a Foreground delete once its
dependents are gone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ce_k8s.sim.kube.errors import ApiError, forbidden
from ce_k8s.sim.kube.objects import clone, meta_of, now_iso
from ce_k8s.sim.kube.resources import BY_PLURAL
from ce_k8s.sim.kube.store import Obj

if TYPE_CHECKING:
    from ce_k8s.sim.kube.api import Api

log = logging.getLogger(__name__)

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class Controllers:
    """The namespace controller and the garbage collector of ``api``'s objects."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.store = api.store

    def delete_namespace(self, ns_obj: Obj) -> Obj:
        """Mark a namespace Terminating and have it emptied (403 for the system namespaces)."""
        name = str(meta_of(ns_obj)["name"])
        if name in SYSTEM_NAMESPACES:
            raise forbidden("namespaces", name, "this namespace may not be deleted")
        if meta_of(ns_obj).get("deletionTimestamp"):
            return ns_obj
        new = clone(ns_obj)
        meta_of(new)["deletionTimestamp"] = now_iso()
        meta_of(new)["deletionGracePeriodSeconds"] = 0
        new["status"] = {"phase": "Terminating"}
        stored = self.api.commit("namespaces", ns_obj, new)
        self.api.later(self.api.opts.gc_delay, self._empty_namespace, name)
        return stored

    def _empty_namespace(self, name: str) -> None:
        for plural, info in BY_PLURAL.items():
            if not info.namespaced or plural == "selfsubjectaccessreviews":
                continue
            for obj in list(self.store.peek_list(plural, name)):
                m = meta_of(obj)
                if m.get("finalizers"):
                    new = clone(obj)
                    meta_of(new)["finalizers"] = []
                    meta_of(new).setdefault("deletionTimestamp", now_iso())
                    meta_of(new)["deletionGracePeriodSeconds"] = 0
                    self.api.remove(plural, new)
                else:
                    self.api.remove(plural, obj)
        ns_obj = self.store.peek("namespaces", "", name)
        if ns_obj is not None:
            self.api.remove("namespaces", ns_obj)

    def _owners_alive(self, obj: Obj) -> tuple[int, int]:
        refs = [r for r in (meta_of(obj).get("ownerReferences") or []) if isinstance(r, dict)]
        alive = sum(1 for r in refs if self.store.peek_uid(str(r.get("uid"))) is not None)
        return alive, len(refs)

    def _gc_delete(self, resource: str, ns: str, name: str) -> None:
        try:
            self.api.delete(resource, ns or None, name, {"propagationPolicy": "Background"})
            log.debug("garbage collector deleted %s %s/%s (owner gone)", resource, ns, name)
        except ApiError:
            pass

    def gc_dependents(self, owner_uid: str) -> None:
        """Delete the dependents of a gone owner that have no owner left."""
        if self.store.peek_uid(owner_uid) is not None:
            return
        for resource, ns, name in self.store.dependents_of(owner_uid):
            obj = self.store.peek(resource, ns, name)
            if obj is None:
                continue
            alive, total = self._owners_alive(obj)
            if total and alive == 0:
                self._gc_delete(resource, ns, name)

    def gc_orphan_check(self, resource: str, ns: str, name: str, uid: str) -> None:
        """Delete an object created with owners that are all gone already."""
        obj = self.store.peek(resource, ns, name)
        if obj is None or meta_of(obj).get("uid") != uid:
            return
        alive, total = self._owners_alive(obj)
        if total and alive == 0:
            self._gc_delete(resource, ns, name)

    def orphan_dependents(self, owner_uid: str) -> None:
        """Drop the owner's reference from each of its dependents (an Orphan delete)."""
        for resource, ns, name in self.store.dependents_of(owner_uid):
            def drop(o: Obj) -> None:
                m = meta_of(o)
                refs = [r for r in (m.get("ownerReferences") or []) if not (isinstance(r, dict)
                                                                            and r.get("uid") == owner_uid)]
                if refs:
                    m["ownerReferences"] = refs
                else:
                    m.pop("ownerReferences", None)
            try:
                self.api.write(resource, ns or None, name, drop, status=False)
            except ApiError:
                pass

    def foreground(self, owner_uid: str) -> None:
        """Delete an owner's dependents, then lift its foregroundDeletion finalizer once none is left."""
        for resource, ns, name in self.store.dependents_of(owner_uid):
            try:
                self.api.delete(resource, ns or None, name, {"propagationPolicy": "Background"})
            except ApiError:
                pass
        if self.store.dependents_of(owner_uid):
            self.api.later(self.api.opts.gc_delay, self.foreground, owner_uid)
            return
        key = self.store._uids.get(owner_uid)
        if key is None:
            return

        def unfinalize(o: Obj) -> None:
            m = meta_of(o)
            m["finalizers"] = [f for f in (m.get("finalizers") or []) if f != "foregroundDeletion"]
            if not m["finalizers"]:
                m.pop("finalizers")
        try:
            self.api.write(key[0], key[1] or None, key[2], unfinalize, status=False)
        except ApiError:
            pass
