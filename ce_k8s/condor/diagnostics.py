"""One finding about a configuration or a routed job, with the severity the real router gives it.

Why a shared type: the configuration reader, the transform engine, ``routes check`` and ``route``
each find problems, and the site admin needs one rule for all of them (docs/routes.md, "Severity"):

* ``ERROR`` — the real router refuses or mis-routes: a parse error, an unknown keyword in a route,
  a listed route that does not exist, a route that fails validation at load, a Kubernetes route the
  pod builder rejects. ``routes check`` exits 1.
* ``WARNING`` — HTCondor logs an ERROR (or a warning) and carries on, e.g. an ``EVALMACRO`` that
  cannot be evaluated (xform_utils.cpp, ``kw_EVALMACRO`` logs and goes on with the transform), a
  ``TARGET.`` reference in a route's REQUIREMENTS, an unreachable route. ``--strict`` makes these
  errors.
* ``NOTE`` — nothing the router does differently, but worth knowing: a route that HTCondor-CE's
  shipped defaults define and the site does not enable, a metaknob that cannot change routing, a
  configuration command that ``--no-commands`` did not run.

``str()`` is the ``file:line: severity: message`` line the CLIs print, so an editor can jump to it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_TEXT = re.compile(r"^(?P<file>.*?):(?P<line>\d+): (?P<message>.*)$", re.DOTALL)


class Severity(enum.IntEnum):
    """Ordered so that ``max()`` of a list of severities is the worst one."""

    NOTE = 0
    WARNING = 1
    ERROR = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, order=True)
class Diagnostic:
    """A finding at ``file:line`` (``<config>``/0 when it has no place, e.g. a missing knob)."""

    file: str
    line: int
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.severity}: {self.message}"

    @classmethod
    def from_text(cls, text: str, severity: Severity) -> Diagnostic:
        """Wrap a legacy ``file:line: message`` string (as the readers produced before severities)."""
        m = _TEXT.match(text)
        if m is None:
            return cls("<config>", 0, severity, text)
        return cls(m.group("file"), int(m.group("line")), severity, m.group("message"))


def worst(diagnostics: list[Diagnostic], *, strict: bool = False) -> Severity | None:
    """The highest severity present (warnings count as errors when ``strict``), or None if empty."""
    if not diagnostics:
        return None
    top = max(d.severity for d in diagnostics)
    if strict and top == Severity.WARNING:
        return Severity.ERROR
    return top
