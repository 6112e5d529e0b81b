"""The one up/down/status/build dispatcher of the `ce-k8s testbed real-*` commands.

Why one: the real HTCondor bed and the real Kubernetes bed are driven the same way (progress lines
on stderr, `status` as `key: value` lines or one JSON object, exit 3 when the bed is down, exit 2
with the command's name on a bed error), and two copies of that drifted apart once already (the
Kubernetes one gained `build`). Each command keeps only its own arguments and how to reach its bed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, Protocol


class Bed(Protocol):
    """What the dispatcher needs of a bed (RealCondor, StockCE, RealKube)."""

    def down(self, progress: Callable[[str], None] | None = ...) -> Any: ...

    def status(self) -> dict[str, Any]: ...


def progress(msg: str) -> None:
    """A progress line on stderr (stdout stays for `status` and `build`'s answers)."""
    sys.stderr.write(f"ce-k8s testbed: {msg}\n")
    sys.stderr.flush()


def run_bed(command: str, action: str, bed: Callable[[], Bed], *, up: Callable[[Bed], object],
            errors: tuple[type[BaseException], ...], as_json: bool = False,
            others: dict[str, Callable[[], object]] | None = None) -> int:
    """Run `action` ("up", "down", "status" or one of `others`) of the bed `bed()` makes.

    `command` names the command in error lines (`ce-k8s testbed real-kube up: ...`); `up(bed)`
    brings the bed up with the command's own arguments; `errors` are the bed's own failures (exit
    2, one line, no traceback); `others` are actions that need no bed object (`build`). Exit codes:
    0, 2 on a bed error, 3 for `status` of a bed that is down.
    """
    try:
        if others and action in others:
            others[action]()
            return 0
        env = bed()
        if action == "up":
            up(env)
        elif action == "down":
            env.down(progress=progress)
        else:
            status = env.status()
            if as_json:
                print(json.dumps(status, sort_keys=True))
            else:
                for key, value in sorted(status.items()):
                    print(f"{key}: {value}")
            return 0 if status.get("up") else 3
    except errors as exc:
        sys.stderr.write(f"ce-k8s testbed {command} {action}: {exc}\n")
        return 2
    return 0
