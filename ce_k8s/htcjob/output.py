"""Retrieved sandboxes → where the spec says: a ConfigMap (small logs) or a directory on a claim.

A ConfigMap holds at most 1 MiB in all (etcd's object limit is a little more; the rest is
metadata). When the output is larger, every file keeps its *end* (the last lines of a log say
why a job failed), each file gets an equal share of the budget, and `truncated` is reported so
the status says so; nothing is cut silently. Keys are `<proc>.stdout`, `<proc>.stderr` and
`<proc>.<file>` for each file the job left; bytes that are not UTF-8 go to `binaryData`.

A claim: the operator cannot mount a PVC a user names at run time, so the site mounts the claims
it allows under the operator's `--claims-root` (docs/htcjob.md); output goes to
`<claims-root>/<claimName>/<path>/<htcjob>/<proc>/`. A claim that is not mounted there is an
`OutputDelivered=False` condition naming the directory, never a silent drop.
"""

from __future__ import annotations

import base64
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ce_k8s.htcjob.submitdesc import STDERR, STDOUT

CONFIGMAP_BUDGET = 1_000_000
_RENAMES = {STDOUT: "stdout", STDERR: "stderr"}


class OutputError(RuntimeError):
    """Output that cannot go where the spec says (the message says why and where)."""


@dataclass
class ConfigMapOutput:
    data: dict[str, str] = field(default_factory=dict)
    binary: dict[str, str] = field(default_factory=dict)
    truncated: bool = False


def _files(out_dir: Path, procs: list[int]) -> list[tuple[str, Path]]:
    """(key, path) of every regular file each proc left, stdout and stderr first."""
    found: list[tuple[str, Path]] = []
    for proc in procs:
        pdir = out_dir / str(proc)
        if not pdir.is_dir():
            continue
        names = sorted(p.name for p in pdir.iterdir() if p.is_file() and not p.is_symlink())
        names.sort(key=lambda n: (n not in _RENAMES, n))
        for name in names:
            found.append((f"{proc}.{_RENAMES.get(name, name)}", pdir / name))
    return found


def to_configmap(out_dir: Path, procs: list[int], budget: int = CONFIGMAP_BUDGET) -> ConfigMapOutput:
    """The ConfigMap data of the procs' output, each file's tail kept when the whole is too big."""
    files = _files(out_dir, procs)
    sizes = {key: path.stat().st_size for key, path in files}
    result = ConfigMapOutput()
    share = budget
    if sum(sizes.values()) > budget:
        result.truncated = True
        # Small files whole, the rest share what is left equally (water-filling).
        remaining, left = budget, sorted(files, key=lambda kp: sizes[kp[0]])
        while left:
            share = remaining // len(left)
            if sizes[left[0][0]] > share:
                break
            remaining -= sizes[left.pop(0)[0]]
    for key, path in files:
        raw = path.read_bytes()
        if len(raw) > share:
            raw = raw[-share:] if share > 0 else b""
        try:
            result.data[key] = raw.decode("utf-8")
        except UnicodeDecodeError:
            result.binary[key] = base64.b64encode(raw).decode()
    return result


def to_claim(out_dir: Path, procs: list[int], claims_root: Path, claim: str, path: str, name: str) -> Path:
    """Copy the procs' output to the claim's directory; the directory it wrote."""
    mount = claims_root / claim
    if not mount.is_dir():
        raise OutputError(f"claim {claim!r} is not mounted in the operator at {mount} "
                          f"(the site mounts the claims HTCJobs may use under --claims-root)")
    dest = (mount / path / name) if path else (mount / name)
    for proc in procs:
        target = dest / str(proc)
        target.mkdir(parents=True, exist_ok=True)
        for key, src in _files(out_dir, [proc]):
            shutil.copyfile(src, target / key.split(".", 1)[1])
    return dest
