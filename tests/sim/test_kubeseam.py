"""The bed's seam to its Kubernetes (ce_k8s.sim.kubeseam): each server the bed runs on has every
member the bed uses, with a signature the bed's calls fit and types the bed can take.

`runtime_checkable` isinstance checks only that the names exist, and only on an instance (a real
control plane's adapter needs a bed that is up), so this reads the classes themselves: methods by
`inspect.signature` and their evaluated annotations, properties by their getter's return type, plain
attributes by an assignment `self.<name> = ...` in a method of the class or a base class.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from ce_k8s.real.kube import kubeserver
from ce_k8s.sim.kube import faults as sim_faults
from ce_k8s.sim.kube.apiserver import ApiServer
from ce_k8s.sim.kubeseam import FaultCounts, HandedInKubeServer, KubeServer
from ce_k8s.sim.testbed import PodTracker, RemoteApiServer

SERVERS = [ApiServer, RemoteApiServer, kubeserver.RealKubeServer]
_MISSING = object()


# ----------------------------------------------------------------------------------- the checker
def protocol_members(proto: type) -> list[str]:
    """The members a Protocol declares, its bases' included (typing's own attributes aside)."""
    names: set[str] = set()
    for klass in proto.__mro__:
        if klass in (object, typing.Protocol, typing.Generic) or not getattr(klass, "_is_protocol", False):
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")}
        names |= set(getattr(klass, "__annotations__", {}))
    return sorted(names)


def hints(func: Callable[..., Any]) -> dict[str, Any]:
    """`func`'s annotations evaluated in its module (they are strings under `from __future__ import annotations`)."""
    return typing.get_type_hints(func, sys.modules[func.__module__].__dict__)


def union_members(t: Any) -> list[Any]:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return list(typing.get_args(t))
    return [t]


def accepts(wanted: Any, given: Any) -> bool:
    """Whether a value typed `given` is a `wanted` (each member of a union `given` is one of `wanted`'s)."""
    if wanted is Any or given is Any:
        return True
    for g in union_members(given):
        g_class = typing.get_origin(g) or g
        if not any(w is Any or (isinstance(typing.get_origin(w) or w, type) and isinstance(g_class, type)
                                and issubclass(g_class, typing.get_origin(w) or w))
                   for w in union_members(wanted)):
            return False
    return True


def assigned_attributes(cls: type) -> set[str]:
    """Names a method of `cls` or of a base assigns as `self.<name> = ...` (plain instance attributes)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            names |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                      and isinstance(t.value, ast.Name) and t.value.id == "self"}
        names |= set(getattr(klass, "__annotations__", {}))
    return names


def problems(cls: type, proto: type) -> list[str]:
    """What `cls` lacks or gets wrong of `proto`, in words; empty when it satisfies it."""
    found: list[str] = []
    for name in protocol_members(proto):
        declared = inspect.getattr_static(proto, name)
        have = inspect.getattr_static(cls, name, _MISSING)
        if isinstance(declared, property):
            want = hints(declared.fget).get("return", Any)
            if isinstance(have, property):
                got = hints(have.fget).get("return", Any)
                if not accepts(want, got):
                    found.append(f"{name}: a {got}, not a {want}")
            elif have is _MISSING and name not in assigned_attributes(cls):
                found.append(f"{name}: no such attribute")
            elif have is not _MISSING and callable(have):
                found.append(f"{name}: a method, where the bed reads an attribute")
            continue
        if not callable(have) or isinstance(have, property):
            found.append(f"{name}: no such method")
            continue
        found += [f"{name}: {p}" for p in signature_problems(declared, have)]
    return found


def signature_problems(declared: Callable[..., Any], have: Callable[..., Any]) -> list[str]:
    """The bed calls `have` as `declared` says: every declared parameter is taken (same name, same
    place), every other one has a default, the types the bed passes are taken, the result is the type it reads."""
    want_sig, have_sig = inspect.signature(declared), inspect.signature(have)
    want_types, have_types = hints(declared), hints(have)
    params = list(have_sig.parameters.values())
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    varkw = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    found: list[str] = []
    used: set[str] = set()
    for index, p in enumerate(want_sig.parameters.values()):
        if p.name == "self":
            continue
        match = have_sig.parameters.get(p.name)
        if p.kind is p.POSITIONAL_OR_KEYWORD:
            if match is None and not (varargs and varkw):
                found.append(f"takes no parameter {p.name!r}")
                continue
            if match is not None and (index >= len(positional) or positional[index].name != p.name):
                found.append(f"parameter {p.name!r} is not in place {index}")
        elif p.kind is p.KEYWORD_ONLY and match is None and not varkw:
            found.append(f"takes no keyword {p.name!r}")
            continue
        if match is not None:
            used.add(match.name)
            if not accepts(have_types.get(match.name, Any), want_types.get(p.name, Any)):
                found.append(f"parameter {p.name!r} takes {have_types[match.name]}, "
                             f"the bed passes {want_types[p.name]}")
    for p in params:
        if p.name not in used and p.name != "self" and p.default is p.empty \
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            found.append(f"parameter {p.name!r} has no default and the bed never passes it")
    if "return" in want_types and not accepts(want_types["return"], have_types.get("return", Any)):
        found.append(f"returns {have_types['return']}, the bed reads {want_types['return']}")
    return found


# ----------------------------------------------------------------------------------- the servers
@pytest.mark.parametrize("server", SERVERS, ids=lambda c: c.__name__)
def test_each_server_has_what_the_bed_uses_of_any_kubernetes(server):
    """The emulator in process, the emulator as a child and the real control plane's adapter."""
    assert problems(server, KubeServer) == []


def test_the_real_control_plane_has_what_the_bed_asks_of_a_handed_in_server():
    """TestBed(kube_server=RealKubeServer(...)): everything the bed uses of a handed-in server."""
    assert problems(kubeserver.RealKubeServer, HandedInKubeServer) == []


@pytest.mark.parametrize("faults", [sim_faults.Faults, kubeserver.Faults], ids=["emulated", "real"])
def test_each_server_counts_its_injected_faults(faults):
    """`summary` reads `faults.injected` of either kind of server."""
    assert problems(faults, FaultCounts) == []


def test_the_bed_takes_its_handed_in_server_as_the_seam_names_it():
    """The parameter is typed with the protocol, and the protocol holds what the bed uses of it."""
    from ce_k8s.sim.testbed import TestBed

    annotation = hints(TestBed.__init__)["kube_server"]
    assert set(union_members(annotation)) == {HandedInKubeServer, type(None)}
    assert {"time_scale", "faults", "calls", "write_kubeconfig", "admin_core", "agent_config",
            "start_tracking", "prepare_namespace", "managed_count", "stop"} == set(protocol_members(HandedInKubeServer))


# ----------------------------------------------------------------------------------- the checker itself
class _Good:
    time_scale = 1.0
    faults = sim_faults.Faults()

    @property
    def calls(self) -> dict[tuple[str, str], int]:
        return {}

    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str | None = None) -> str:
        return str(path)


class _WrongTypes(_Good):
    def write_kubeconfig(self, path: str) -> bytes:  # type: ignore[override]
        return b""


class _WrongShape(_Good):
    def write_kubeconfig(self, target: Path, extra: int) -> str:  # type: ignore[override]
        return ""


class _Missing:
    def __init__(self) -> None:
        self.time_scale = 1.0


def test_the_checker_tells_a_server_that_fits_from_ones_that_do_not():
    """Not vacuous: a wrong parameter type or result, a renamed or extra required parameter, and
    missing members are each found; a superset of what the bed passes is fine."""
    assert problems(_Good, KubeServer) == []
    wrong = problems(_WrongTypes, KubeServer)
    assert any("the bed passes" in p and "path" in p for p in wrong), wrong
    assert any("returns" in p for p in wrong), wrong
    shape = problems(_WrongShape, KubeServer)
    assert any("takes no parameter 'path'" in p for p in shape), shape
    assert any("'extra' has no default" in p for p in shape), shape
    missing = problems(_Missing, KubeServer)
    assert sorted(p.split(":")[0] for p in missing) == ["calls", "faults", "write_kubeconfig"], missing
    assert isinstance(_Missing(), KubeServer) is False
    assert accepts(Mapping[str, int], dict[str, int]) and not accepts(int, str | int)
    assert PodTracker  # the bed's tracker is what start_tracking is fed (a Callable[[str, Any], None])
