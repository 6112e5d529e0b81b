"""The state directories a demo's own beds leave: what goes after `down`, and what stays.

A bed's `down` stops every process and undoes every mount, cgroup and sysctl, but keeps its state
directory (etcd's data, the daemons' logs: about 65 MB for the control plane), because an operator
who brought a bed up with `ce-k8s testbed ... up` reads its logs after `down`. A demo that brought
a bed up itself, in a directory that did not exist before, removes that directory too once the run
succeeded; after a failed run it keeps it and says where, as the logs are then what tells why.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path


def tidy(path: Path, made_here: bool, ok: bool, progress: Callable[[str], None]) -> None:
    """After a demo's own bed went down: remove `path` if this run made it and succeeded."""
    if not made_here:
        return
    if ok:
        shutil.rmtree(path, ignore_errors=True)
    else:
        progress(f"the run failed: its bed's files and logs are kept in {path}")
