"""Per-container scenarios: what a simulated container does (runs, prints, exits, OOMs, fails to pull).

Tests state what will happen to a pod instead of waiting for chance: an annotation
``sim.ce-k8s.io/scenario: 'run=2s exit=0 stdout="hello"'`` (or ``sim.ce-k8s.io/scenario.<container>``
for one container), else a convention in the image name, else the kubelet's default scenario.
Durations are simulated seconds, multiplied by the kubelet's time scale. The grammar is in
docs/testbed.md; an unknown word raises :class:`ScenarioError` and the kubelet reports it on the
container (``CreateContainerError``) so a typo cannot silently run the default.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

SCENARIO_ANNOTATION = "sim.ce-k8s.io/scenario"
DEFAULT_SCENARIO = "run=60s exit=0"


class ScenarioError(ValueError):
    """A scenario string that does not parse."""


@dataclass
class Scenario:
    """What one container does. ``run`` None means it runs until killed."""

    run: float | None = 60.0
    exit_code: int = 0
    oom_after: float | None = None
    evict_after: float | None = None
    pull: float = 0.5
    pull_error: bool = False
    config_error: str | None = None
    output: list[tuple[str, str]] = field(default_factory=list)   # (stream, text) in print order
    ignore_sigterm: bool = False
    term_exit: int = 143
    source: str = ""


_DUR = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")


def parse_duration(text: str, where: str = "") -> float | None:
    """``2s``, ``500ms``, ``1.5m``, ``1h``, a bare number of seconds, or ``forever`` (None)."""
    if text in ("forever", "inf"):
        return None
    m = _DUR.match(text.strip())
    if not m:
        raise ScenarioError(f"{where}bad duration {text!r} (use e.g. 2s, 500ms, 1m, forever)")
    return float(m[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[m[2]]


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t")


def parse_scenario(text: str) -> Scenario:
    """Parse ``key=value`` words (values may be double-quoted)."""
    sc = Scenario(source=text)
    where = f"scenario {text!r}: "
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ScenarioError(f"{where}{e}") from e
    for word in words:
        key, eq, val = word.partition("=")
        if key == "run":
            sc.run = parse_duration(val, where)
        elif key == "exit":
            if not re.fullmatch(r"-?\d+", val):
                raise ScenarioError(f"{where}exit needs an integer")
            sc.exit_code = int(val)
        elif key == "oom-after":
            sc.oom_after = parse_duration(val, where)
        elif key == "evict-after":
            sc.evict_after = parse_duration(val, where)
        elif key == "pull":
            sc.pull = parse_duration(val, where) or 0.0
        elif key == "image-pull-error" and not eq:
            sc.pull_error = True
        elif key == "config-error":
            sc.config_error = val or "simulated configuration error"
        elif key in ("stdout", "out"):
            sc.output.append(("stdout", _unescape(val)))
        elif key in ("stderr", "err"):
            sc.output.append(("stderr", _unescape(val)))
        elif key == "lines":
            if not val.isdigit():
                raise ScenarioError(f"{where}lines needs a count")
            sc.output.extend(("stdout", f"line {i}") for i in range(1, int(val) + 1))
        elif key == "ignore-sigterm" and not eq:
            sc.ignore_sigterm = True
        elif key == "term-exit":
            if not re.fullmatch(r"\d+", val):
                raise ScenarioError(f"{where}term-exit needs an integer")
            sc.term_exit = int(val)
        else:
            raise ScenarioError(f"{where}unknown word {word!r} (run=, exit=, oom-after=, evict-after=, pull=, "
                                "image-pull-error, config-error=, stdout=, stderr=, lines=, ignore-sigterm, "
                                "term-exit=)")
    return sc


def scenario_from_image(image: str) -> str | None:
    """The scenario an image name implies, or None for an ordinary image.

    Conventions: a repository containing ``does-not-exist`` or ``pull-error`` fails to pull; tags
    ``oom``, ``fail``, ``forever``, ``exit-N`` and ``run-Ns`` select the matching scenario.
    """
    repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    if "does-not-exist" in repo or "pull-error" in repo:
        return "image-pull-error"
    if tag == "oom":
        return "oom-after=1s"
    if tag == "fail":
        return "run=1s exit=1"
    if tag == "forever":
        return "run=forever"
    if m := re.fullmatch(r"exit-(\d+)", tag):
        return f"run=1s exit={m[1]}"
    if m := re.fullmatch(r"run-(\d+(?:\.\d+)?)s", tag):
        return f"run={m[1]}s exit=0"
    return None


def scenario_for(pod: Mapping[str, object], container: Mapping[str, object], default: str) -> Scenario:
    """The scenario of one container: per-container annotation, pod annotation, image, default."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    ann = (meta or {}).get("annotations") or {}  # type: ignore[union-attr]
    name = str(container.get("name", ""))
    text = ann.get(f"{SCENARIO_ANNOTATION}.{name}") or ann.get(SCENARIO_ANNOTATION)
    if text is None:
        text = scenario_from_image(str(container.get("image", ""))) or default
    return parse_scenario(str(text))
