"""The information provider's verdict on its own run: OK, WARNING or CRITICAL, and why.

Why a module: the catalog (a route whose pods cannot be built is a WARNING) and the command (the
cluster could not be read: CRITICAL) both report into one verdict, which the ad carries as
`K8sInfoStatus` and `K8sInfoError` (docs/information-provider.md, "Where the cluster view comes
from, and health").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

OK, WARNING, CRITICAL = "OK", "WARNING", "CRITICAL"
_SEVERITY = {OK: 0, WARNING: 1, CRITICAL: 2}


@dataclass
class Health:
    """The provider's own health; the worst problem wins."""

    status: str = OK
    problems: list[str] = field(default_factory=list)

    def report(self, level: str, message: str) -> None:
        log.warning("info: %s: %s", level, message) if level != OK else log.info("info: %s", message)
        self.problems.append(message)
        if _SEVERITY[level] > _SEVERITY[self.status]:
            self.status = level
