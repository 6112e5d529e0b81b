"""The agent's own knobs: pod output, metrics, and what a cleanup does with a live pod.

Why not in `ce_k8s.settings.Settings`: these only matter to the agent process (the pod
builder, the information provider and the CLI never read them), so they live with it; they are
HTCondor knobs all the same (docs/design.md Decision 9), read from the CE's configuration by
`ce-k8s agent` and shown by `condor_ce_config_val`.

| knob | default | meaning |
|---|---|---|
| `CE_K8S_OUTPUT_DIR` | `<parent of CE_K8S_SPOOL>/ce-k8s-output` | agent-owned 0700 directory for saved pod logs |
| `CE_K8S_MAX_OUTPUT_BYTES` | 16 MiB | bytes kept per stream (stdout, stderr) of each pod |
| `CE_K8S_METRICS_ADDRESS` | `127.0.0.1:9620` | Prometheus endpoint `host:port`; empty = off |
| `CE_K8S_SOURCE_PROBE` | true | cleanup of a live pod asks the CE's schedd about the source job |
| `CE_K8S_RELEASE_GRACE` | 300 | seconds a released pod waits for adoption, from its last release |

(`CE_K8S_SOURCE_PROBE = false`: never ask, so a cleanup always releases a live pod; see sourceprobe.py
and docs/agent.md "Released pods".)

An in-process `Agent` (tests, bench) built without options serves no metrics: several agents
in one test run must not fight over a port.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ce_k8s.condor.config import ConfigError

DEFAULT_METRICS_ADDRESS = "127.0.0.1:9620"
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024
MAX_OUTPUT_BYTES_LIMIT = 1024 * 1024 * 1024
DEFAULT_RELEASE_GRACE = 300
MAX_RELEASE_GRACE = 7 * 86400     # the post journal forgets releases after 7 days anyway


class OptionsError(ConfigError, ValueError):
    """A bad agent knob; `str()` is `file:line: KNOB: message` like every ConfigError."""


@dataclass(frozen=True)
class AgentOptions:
    """The agent-only knobs (see the module docstring)."""

    output_dir: str = ""                          # "" = default_output_dir(spool)
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    metrics_address: str = ""                     # "" = no metrics endpoint
    source_probe: bool = True                     # ask the schedd before deleting a live pod at cleanup
    release_grace: int = DEFAULT_RELEASE_GRACE    # seconds a released pod is kept for adoption

    @classmethod
    def from_config(cls, cfg) -> AgentOptions:
        """Read the knobs from a CondorConfig; a bad value raises OptionsError naming file and line."""
        def fail(knob: str, message: str) -> OptionsError:
            origin = cfg.origin(knob)
            return OptionsError(getattr(origin, "file", "<config>"), getattr(origin, "line", 0),
                                f"{knob}: {message}")

        out_dir = (cfg.get("CE_K8S_OUTPUT_DIR") or "").strip()
        if out_dir and not os.path.isabs(out_dir):
            raise fail("CE_K8S_OUTPUT_DIR", f"{out_dir!r} is not an absolute path")
        raw = (cfg.get("CE_K8S_MAX_OUTPUT_BYTES") or "").strip()
        max_bytes = DEFAULT_MAX_OUTPUT_BYTES
        if raw:
            try:
                max_bytes = int(raw)
            except ValueError:
                raise fail("CE_K8S_MAX_OUTPUT_BYTES", f"{raw!r} is not an integer") from None
            if not 0 <= max_bytes <= MAX_OUTPUT_BYTES_LIMIT:
                raise fail("CE_K8S_MAX_OUTPUT_BYTES", f"{max_bytes} is outside 0..{MAX_OUTPUT_BYTES_LIMIT}")
        # Defined but empty means "off"; undefined means the default (raw() tells them apart).
        if cfg.raw("CE_K8S_METRICS_ADDRESS") is None:
            metrics = DEFAULT_METRICS_ADDRESS
        else:
            metrics = (cfg.get("CE_K8S_METRICS_ADDRESS") or "").strip()
        if metrics:
            try:
                parse_address(metrics)
            except ValueError as exc:
                raise fail("CE_K8S_METRICS_ADDRESS", str(exc)) from None
        try:
            probe = cfg.get_bool("CE_K8S_SOURCE_PROBE", True)
        except ConfigError:
            raise fail("CE_K8S_SOURCE_PROBE", f"{cfg.get('CE_K8S_SOURCE_PROBE')!r} is not a boolean") from None
        try:
            grace = cfg.get_int("CE_K8S_RELEASE_GRACE", DEFAULT_RELEASE_GRACE)
        except ConfigError:
            raise fail("CE_K8S_RELEASE_GRACE", f"{cfg.get('CE_K8S_RELEASE_GRACE')!r} is not an integer") from None
        if not 0 <= grace <= MAX_RELEASE_GRACE:
            raise fail("CE_K8S_RELEASE_GRACE", f"{grace} is outside 0..{MAX_RELEASE_GRACE}")
        return cls(output_dir=out_dir, max_output_bytes=max_bytes, metrics_address=metrics,
                   source_probe=probe, release_grace=grace)


def default_output_dir(spool: str) -> str:
    """Next to the CE spool (`/var/lib/condor-ce/ce-k8s-output`): on the same persistent disk,
    writable by the CE's service account, and outside the directories the pilots' hooks write."""
    return os.path.join(os.path.dirname(os.path.normpath(spool)) or "/", "ce-k8s-output")


def parse_address(text: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` (all interfaces) → (host, port); ValueError otherwise."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)  # noqa: S104 - ":port" is an explicit admin choice
