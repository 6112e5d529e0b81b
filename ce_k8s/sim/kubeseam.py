"""The seam between the test bed and its Kubernetes: what `TestBed` uses of the server it runs on.

Three servers meet there: the API emulator in the bed's process (ce_k8s.sim.kube.apiserver's
`ApiServer`), the emulator as a child process (`RemoteApiServer`, ce_k8s.sim.testbed), and a
real control plane handed in as `TestBed(kube_server=...)` (ce_k8s.real.kube.kubeserver's
`RealKubeServer`). The bed never imports the real room, so this module names the members it
relies on instead; tests/sim/test_kubeseam.py checks each server against them (names, and the
signatures and types the bed calls them with), so a change on either side that would break the
bed fails there rather than half-way through a real run.

Standard library only, so that naming the seam loads neither server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class FaultCounts(Protocol):
    """A server's injected faults as `TestBed.summary` reports them (none on a real server)."""

    @property
    def injected(self) -> Mapping[str, int]: ...


@runtime_checkable
class KubeServer(Protocol):
    """What the bed uses of whichever Kubernetes it runs on, emulated or real."""

    @property
    def time_scale(self) -> float:
        """Real seconds per simulated second of a scenario's `run=` (the bed takes a real one's)."""
        ...

    @property
    def faults(self) -> FaultCounts: ...

    @property
    def calls(self) -> Mapping[tuple[str, str], int]:
        """The agent's API calls by (verb, resource) since the server started counting."""
        ...

    def write_kubeconfig(self, path: Path) -> str:
        """The agent's kubeconfig at `path` (its own credentials, never the bed's)."""
        ...


@runtime_checkable
class HandedInKubeServer(KubeServer, Protocol):
    """A Kubernetes handed in as `TestBed(kube_server=...)`: the bed cannot read its store, so it
    asks it for what it counts and has it act as a site (namespaces with the shipped Role)."""

    @property
    def admin_core(self) -> Any:
        """A CoreV1Api with the site's rights: the bed evicts pods with it (the agent may not)."""
        ...

    @property
    def agent_config(self) -> str:
        """Configuration lines the agent needs on this Kubernetes, appended to the bed's overlay."""
        ...

    def start_tracking(self, tracker: Callable[[str, Any], None]) -> None:
        """Feed every managed pod's events to `tracker` (the bed's PodTracker) from now on."""
        ...

    def prepare_namespace(self, name: str) -> None:
        """A pilot namespace as a site makes one."""
        ...

    def managed_count(self, resource: str) -> int:
        """How many objects of `resource` ("pods", "secrets") ce-k8s manages now."""
        ...

    def stop(self) -> None:
        """Stop tracking and close the server's clients (the server itself stays up)."""
        ...
