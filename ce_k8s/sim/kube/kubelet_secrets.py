"""Secret volumes as a pod's containers see them, for the kubelet simulator.

Why: the agent refreshes a running pilot's credentials by patching its Secret (docs/agent.md
"Credential refresh"); what counts is whether the pilot then reads the new file. On a real node the
kubelet projects a Secret volume's keys into files when it mounts the volume, and rewrites them
when the Secret changes: all files of the volume are written into a new timestamped directory and
the volume's `..data` link is swapped to it in one rename (the atomic writer of the kubelet's
volume utilities), so a reader sees either the old set or the new one, never a mix. A Secret that
is deleted leaves the last contents mounted. The real kubelet notices a change on its periodic
sync (the pod sync period, one minute by default, plus its Secret cache's delay); the simulator
applies it as soon as the store reports the change, so a test measures the agent's delay alone.

`Kubelet.mounted_files(namespace, pod)` returns what the container would read.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

Key = tuple[str, str]          # (namespace, pod name), as in the kubelet simulator


def _project(secret: Mapping[str, Any], volume: Mapping[str, Any]) -> dict[str, bytes]:
    """The files one secret volume shows: its `items` (key → path), else every key by its name."""
    data: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            continue
    items = volume.get("items")
    if not items:
        return data
    return {str(item.get("path") or item.get("key")): data[str(item.get("key"))]
            for item in items if isinstance(item, Mapping) and str(item.get("key")) in data}


class SecretMounts:
    """Per pod: volume name → file path → contents; replaced as a whole when its Secret changes."""

    def __init__(self) -> None:
        self._files: dict[Key, dict[str, dict[str, bytes]]] = {}
        self._uids: dict[Key, str] = {}
        self._volumes: dict[Key, dict[str, tuple[str, Mapping[str, Any]]]] = {}  # volume -> (secret, spec)
        self._users: dict[Key, set[Key]] = {}        # (namespace, secret) -> pods mounting it

    def mount(self, key: Key, uid: str, pod: Mapping[str, Any], peek_secret) -> None:
        """Project every secret volume of `pod` (called when the kubelet sets up its volumes)."""
        self.forget(key, self._uids.get(key, uid))
        namespace = key[0]
        volumes: dict[str, tuple[str, Mapping[str, Any]]] = {}
        files: dict[str, dict[str, bytes]] = {}
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            spec = vol.get("secret") if isinstance(vol, Mapping) else None
            if not isinstance(spec, Mapping) or not spec.get("secretName"):
                continue
            name, secret_name = str(vol.get("name")), str(spec["secretName"])
            volumes[name] = (secret_name, spec)
            secret = peek_secret(namespace, secret_name)
            files[name] = _project(secret, spec) if secret is not None else {}
            self._users.setdefault((namespace, secret_name), set()).add(key)
        if volumes:
            self._uids[key], self._volumes[key], self._files[key] = uid, volumes, files

    def secret_changed(self, namespace: str, name: str, secret: Mapping[str, Any]) -> int:
        """A Secret was created or changed: every volume showing it gets the new set of files at once.
        Returns how many pods were updated."""
        pods = self._users.get((namespace, name)) or set()
        for key in pods:
            current = self._files.get(key)
            if current is None:
                continue
            updated = dict(current)
            for vol, (secret_name, spec) in self._volumes[key].items():
                if secret_name == name:
                    updated[vol] = _project(secret, spec)
            self._files[key] = updated      # one assignment: readers see the old set or the new one
        return len(pods)

    def forget(self, key: Key, uid: str) -> None:
        """The pod is gone (or replaced by a new uid): drop its volumes."""
        if self._uids.get(key) != uid:
            return
        for secret_name, _spec in self._volumes.pop(key, {}).values():
            users = self._users.get((key[0], secret_name))
            if users is not None:
                users.discard(key)
                if not users:
                    del self._users[(key[0], secret_name)]
        self._files.pop(key, None)
        self._uids.pop(key, None)

    def files(self, key: Key, volume: str | None = None) -> dict[str, bytes] | None:
        """A copy of the files of `volume` (default: the pod's first secret volume); None if not mounted."""
        mounted = self._files.get(key)
        if not mounted:
            return None
        if volume is None:
            volume = next(iter(mounted))
        found = mounted.get(volume)
        return dict(found) if found is not None else None
