"""Wait for a condition in a test: the one poll-until loop of the suite (CONTRIBUTING.md: "no sleeps
as synchronisation (wait for the condition)").

Every test directory imports it as ``from polling import wait_for``: pytest puts tests/ on sys.path
for tests/conftest.py (rootdir-relative imports, the default import mode; tests/conftest.py also
adds it), as it does for ``from agent.conftest import ...``. Directories whose waits want another
pace or name keep a thin wrapper over it: ``wait`` (tests/agent/conftest.py), ``wait_for`` at a real
bed's pace (tests/real/conftest.py), ``_wait`` (tests/real/condor/test_real_condor.py); the loops that act
before each poll (``until`` in tests/real/test_lifecycle.py, ``_tick_until`` in
tests/real/test_restarts.py and tests/e2e/test_pilot_path.py) do their step in the predicate.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: How much of the predicate's source and of its last value a failure message shows.
SHOWN = 500


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02, what: str = "",
             on_timeout: Callable[[], object] | None = None) -> Any:
    """Call `predicate()` every `interval` seconds until it returns something true, and return that.

    After `timeout` seconds (it only bounds a failure: under a CPU hog on two cores a watch event
    took more than 5 s to reach the agent's cache) raise AssertionError naming `what` (or, without
    it, the predicate's source and place), the predicate's last value when it says more than
    False/None, and `on_timeout()`, the state worth seeing (e.g. the routed job as it stands). The
    predicate is asked once more after the last sleep, so a condition met during it is not missed.
    An exception from the predicate propagates at once. `interval` 0 suits a predicate that blocks
    on its own (a router tick).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    message = f"timed out after {timeout:g} s waiting for {what or describe(predicate)}"
    if value is not None and value is not False:
        message += f"; it last returned {_clip(repr(value))}"
    if on_timeout is not None:
        try:
            state = on_timeout()
        except Exception as exc:          # the timeout is the failure; a broken report must not hide it
            state = f"(on_timeout failed: {exc!r})"
        message += f"; {state}"
    raise AssertionError(message)


def describe(predicate: Callable[[], Any]) -> str:
    """The predicate as a failure message shows it: its source, one line, and file:line."""
    code = getattr(predicate, "__code__", None)
    if code is None:
        return repr(predicate)
    try:
        source = " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        source = getattr(predicate, "__qualname__", repr(predicate))
    return f"{_clip(source)} ({Path(code.co_filename).name}:{code.co_firstlineno})"


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"
