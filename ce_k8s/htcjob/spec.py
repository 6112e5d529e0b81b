"""An HTCJob's spec as a typed value, and the checks the CRD's schema cannot make.

The CRD (containers/k8s/htcjob/crd.yaml) refuses most bad specs at `kubectl apply`. The operator
parses again anyway, because a resource may predate a schema change or come from a cluster where
the CRD was edited, and a bad spec must become a clear `SpecValid=False` condition, never a crash
or a half-submitted job. `RESERVED_SUBMIT_KEYS` is the same list as the CRD's CEL rule
(tests/htcjob/test_spec.py compares them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ce_k8s.quantity import QuantityError, int_value, parse_quantity

#: Submit commands the spec itself decides; `spec.submit` may not set them (nor `+HTCJob*`).
RESERVED_SUBMIT_KEYS = frozenset({
    "executable", "arguments", "args", "queue", "output", "error", "log", "initialdir", "initial_dir",
    "universe", "transfer_executable", "transfer_input_files", "should_transfer_files",
    "when_to_transfer_output", "leave_in_queue", "container_image", "environment", "env",
    "request_cpus", "request_memory", "request_disk", "request_gpus", "allowed_execute_duration",
})
_SUBMIT_KEY = re.compile(r"^[+]?[A-Za-z_][A-Za-z0-9_.]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OPERATOR_ATTR = re.compile(r"^(\+|my\.)htcjob", re.IGNORECASE)


class SpecError(ValueError):
    """A spec the operator will not submit; the message names the field."""


@dataclass(frozen=True)
class Input:
    kind: str                       # "configMap" or "secret"
    name: str
    keys: tuple[str, ...] = ()      # empty: every key


@dataclass(frozen=True)
class Target:
    schedd: str | None = None       # None: the operator's default schedd
    collector: str | None = None    # None: the operator's default pool
    token_secret: str | None = None
    token_key: str = "token"  # noqa: S105 (the Secret's key name, not a credential)

    @property
    def remote(self) -> bool:
        return self.collector is not None


@dataclass(frozen=True)
class Output:
    config_map: str | None = None   # the ConfigMap's name (default `<name>-output`)
    claim: str | None = None        # a PVC's name, when output goes to a claim
    path: str = ""                  # relative to the claim


@dataclass(frozen=True)
class HTCJobSpec:
    queue: int
    command: tuple[str, ...] = ()
    script: str | None = None
    interpreter: tuple[str, ...] = ()   # runs the script: `<interpreter...> htcjob.sh <index>`
    image: str | None = None
    cpus: int = 1
    memory_mib: int | None = None
    disk_kib: int | None = None
    gpus: int = 0
    wall_time: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    inputs: tuple[Input, ...] = ()
    output: Output = field(default_factory=Output)
    submit: tuple[tuple[str, str], ...] = ()
    target: Target = field(default_factory=Target)


def _str(value: Any, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise SpecError(f"{where} must be a string")
    return value


def _int(value: Any, where: str, default: int, lo: int, hi: int | None = None) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where} must be an integer")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise SpecError(f"{where} must be {bound}")
    return value


def _size(value: Any, where: str, unit: int) -> int | None:
    """A positive quantity in `unit` bytes, rounded up (HTCondor's request_memory is MiB, disk KiB).

    Read as the CRD's rule reads it (``isQuantity(self)``: ParseQuantity, so no white space).
    """
    if value is None:
        return None
    why = ""
    try:
        amount = parse_quantity(value) if isinstance(value, str) else None
    except QuantityError as exc:
        amount, why = None, f"; {exc.reason}"
    if amount is None or amount <= 0:
        raise SpecError(f"{where} must be a positive quantity such as 2Gi (got {value!r}{why})")
    return max(1, -(-int_value(amount) // unit))


def _dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object")
    return value


def parse_spec(raw: Any) -> HTCJobSpec:
    """The spec of an HTCJob object, or SpecError naming the first field that is wrong."""
    spec = _dict(raw, "spec")
    command = spec.get("command")
    script = _dict(spec.get("script"), "spec.script") if spec.get("script") is not None else None
    if (command is None) == (script is None):
        raise SpecError("spec: give exactly one of command or script")
    cmd: tuple[str, ...] = ()
    source = None
    interpreter: tuple[str, ...] = ()
    if command is not None:
        if not isinstance(command, list) or not command or not all(isinstance(w, str) for w in command):
            raise SpecError("spec.command must be a non-empty list of strings")
        if not command[0]:
            raise SpecError("spec.command[0] (the executable) may not be empty")
        cmd = tuple(command)
    else:
        source = _str(script.get("source"), "spec.script.source")
        words = script.get("interpreter")
        if words is not None:
            if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
                raise SpecError("spec.script.interpreter must be a non-empty list of strings")
            interpreter = tuple(words)
        elif not source.startswith("#!"):
            raise SpecError("spec.script.source must start with an interpreter line (#!/bin/sh, ...) "
                            "or name an interpreter")
    resources = _dict(spec.get("resources"), "spec.resources")
    env = []
    for i, item in enumerate(spec.get("env") or []):
        item = _dict(item, f"spec.env[{i}]")
        name = _str(item.get("name"), f"spec.env[{i}].name")
        value = _str(item.get("value", ""), f"spec.env[{i}].value")
        if not _ENV_NAME.match(name):
            raise SpecError(f"spec.env[{i}].name {name!r} is not an environment variable name")
        if "\n" in value or "\r" in value:
            raise SpecError(f"spec.env[{i}].value may not contain a newline")
        env.append((name, value))
    inputs = []
    for i, item in enumerate(spec.get("input") or []):
        item = _dict(item, f"spec.input[{i}]")
        kinds = [k for k in ("configMap", "secret") if item.get(k) is not None]
        if len(kinds) != 1:
            raise SpecError(f"spec.input[{i}] names exactly one of configMap or secret")
        keys = item.get("keys") or []
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise SpecError(f"spec.input[{i}].keys must be a list of key names")
        inputs.append(Input(kinds[0], _str(item[kinds[0]], f"spec.input[{i}].{kinds[0]}"), tuple(keys)))
    output = _dict(spec.get("output"), "spec.output")
    if output.get("configMap") is not None and output.get("pvc") is not None:
        raise SpecError("spec.output goes to a configMap or a pvc, not both")
    pvc = _dict(output.get("pvc"), "spec.output.pvc")
    path = _str(pvc.get("path", ""), "spec.output.pvc.path") or ""
    if path.startswith("/") or ".." in path.split("/"):
        raise SpecError("spec.output.pvc.path is relative to the claim and may not contain ..")
    out = Output(
        config_map=_str(_dict(output.get("configMap"), "spec.output.configMap").get("name"),
                        "spec.output.configMap.name", optional=True),
        claim=_str(pvc.get("claimName"), "spec.output.pvc.claimName") if pvc else None,
        path=path.strip("/"))
    submit = []
    for key, value in _dict(spec.get("submit"), "spec.submit").items():
        if not _SUBMIT_KEY.match(key):
            raise SpecError(f"spec.submit: {key!r} is not a submit command name")
        if key.lower() in RESERVED_SUBMIT_KEYS or _OPERATOR_ATTR.match(key):
            raise SpecError(f"spec.submit may not set {key!r}: the spec or the operator decides it")
        value = _str(value, f"spec.submit.{key}")
        if "\n" in value:
            raise SpecError(f"spec.submit.{key} may not contain a newline")
        submit.append((key, value))
    target = _dict(spec.get("target"), "spec.target")
    token = _dict(target.get("tokenSecret"), "spec.target.tokenSecret")
    tgt = Target(schedd=_str(target.get("schedd"), "spec.target.schedd", optional=True),
                 collector=_str(target.get("collector"), "spec.target.collector", optional=True),
                 token_secret=_str(token.get("name"), "spec.target.tokenSecret.name") if token else None,
                 token_key=_str(token.get("key", "token"), "spec.target.tokenSecret.key") if token else "token")
    if (tgt.collector is None) != (tgt.token_secret is None):
        raise SpecError("spec.target: a remote target names both its collector and its tokenSecret")
    image = _str(spec.get("image"), "spec.image", optional=True)
    return HTCJobSpec(
        queue=_int(spec.get("queue"), "spec.queue", 1, 1, 10000),
        command=cmd, script=source, interpreter=interpreter, image=image or None,
        cpus=_int(resources.get("cpus"), "spec.resources.cpus", 1, 1, 1024),
        memory_mib=_size(resources.get("memory"), "spec.resources.memory", 2 ** 20),
        disk_kib=_size(resources.get("disk"), "spec.resources.disk", 2 ** 10),
        gpus=_int(resources.get("gpus"), "spec.resources.gpus", 0, 0, 64),
        wall_time=None if spec.get("wallTimeSeconds") is None
        else _int(spec["wallTimeSeconds"], "spec.wallTimeSeconds", 0, 1),
        env=tuple(env), inputs=tuple(inputs), output=out, submit=tuple(submit), target=tgt)
