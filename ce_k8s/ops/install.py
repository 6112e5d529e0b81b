"""`ce-k8s install`: put the shipped knob files, the routes and the hook launchers where a stock
HTCondor-CE reads them. Idempotent; never overwrites a file the admin edited.

    ce-k8s install [--config-dir DIR] [--hooks-dir DIR] [--dry-run]

Layout (docs/install.md, "Layout"): the knob files of `config.d/` keep their names; each route
file `routes/NN-x.conf` becomes `70-ce-k8s-route-NN-x.conf`, the name the CE image uses. HTCondor
reads a config directory in byte order of the names (`ce_k8s.condor.config`, as condor_config.cpp),
and `20-ce-k8s-routing.conf` empties `JOB_ROUTER_ROUTE_NAMES`, which every route file appends to:
a route file read before it is silently disabled. Copied as they are, `10-cms-token.conf` sorts
before `20-ce-k8s-routing.conf` and the CMS route is lost. With one prefix above every knob
file the routes keep their own order among themselves, all come after the knobs, and a site's
`99-local.conf` still comes last. `01-ce-router-defaults.conf` is not installed: it restates
HTCondor-CE's own defaults for the embedded configuration (see its header).

Admin edits: `.ce-k8s-install.json` in each target directory records the sha256 of what was
installed last. A target whose content is neither that nor the new shipped content was edited:
it is kept and the new version written beside it as `.NAME.ce-k8s-new`. The leading dot matters:
HTCondor skips dot files in a config directory (`LOCAL_CONFIG_DIR_EXCLUDE_REGEXP`, every version),
but would read `NAME.ce-k8s-new` as configuration, right after `NAME`, undoing the admin's edit (and,
for a route, defining it twice).

Launchers are rendered by `launchers.install_hooks` itself (into a scratch directory), with the
arguments `agent.main.hook_install_arguments` takes from the resulting configuration, so they
are byte for byte what `ce-k8s agent --install-hooks` writes, and go through the same rules.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONFIG_DIR = "/etc/condor-ce/config.d"
DEFAULT_HOOKS_DIR = "/usr/libexec/ce-k8s"
#: Shipped only for the embedded default configuration; a real CE has HTCondor-CE's own.
NOT_INSTALLED = frozenset({"01-ce-router-defaults.conf"})
ROUTE_PREFIX = "70-ce-k8s-route-"
MANIFEST = ".ce-k8s-install.json"
NEW_SUFFIX = ".ce-k8s-new"

INSTALLED, UPDATED, UNCHANGED, KEPT = "installed", "updated", "unchanged", "kept"

_APPENDS_ROUTE = re.compile(r"^[ \t]*JOB_ROUTER_ROUTE_NAMES[ \t]*=[ \t]*\$\(JOB_ROUTER_ROUTE_NAMES\)",
                            re.MULTILINE | re.IGNORECASE)


class InstallError(Exception):
    """A file or directory that cannot be read or written; str() names it."""


@dataclass(frozen=True)
class Item:
    """One file to install: its target directory, name, content and mode."""

    directory: Path
    name: str
    content: bytes
    mode: int

    @property
    def path(self) -> Path:
        return self.directory / self.name


@dataclass
class Step:
    """What happens to one item; `beside` is where the new version goes when the target is kept."""

    item: Item
    action: str
    beside: Path | None = None

    def line(self) -> str:
        text = f"{self.action:<10} {self.item.path}"
        if self.action == KEPT:
            text += f" (edited by the admin; the new version is beside it: {self.beside})"
        return text


# --------------------------------------------------------------------------------------------
# What is shipped


def shipped_knob_files() -> list[Path]:
    """The shipped `config.d/*.conf` that belong on a CE, in the order HTCondor reads them."""
    from ce_k8s.condor.config import default_config_paths

    conf = default_config_paths()[0]
    return sorted((p for p in conf.glob("*.conf") if p.name not in NOT_INSTALLED), key=_order)


def shipped_route_files() -> list[Path]:
    from ce_k8s.condor.config import default_config_paths

    return sorted(default_config_paths()[1].glob("*.conf"), key=_order)


def installed_route_name(route: Path | str) -> str:
    """`routes/10-cms-token.conf` -> `70-ce-k8s-route-10-cms-token.conf`."""
    return ROUTE_PREFIX + Path(route).name


def _order(p: Path | str) -> bytes:
    """The sort key HTCondor (and ce_k8s.condor.config) uses for the files of a config directory."""
    return os.fsencode(os.path.basename(p))


def config_items(config_dir: Path) -> list[Item]:
    knobs = [Item(config_dir, p.name, p.read_bytes(), 0o644) for p in shipped_knob_files()]
    routes = [Item(config_dir, installed_route_name(p), p.read_bytes(), 0o644) for p in shipped_route_files()]
    if knobs and routes and _order(routes[0].name) <= _order(knobs[-1].name):
        # A shipped knob file numbered 70 or above would disable the routes again: refuse to ship that.
        raise InstallError(f"{routes[0].name} would be read before {knobs[-1].name}; "
                           f"route files must sort after every knob file")
    return knobs + routes


def launcher_items(hooks_dir: Path, cfg) -> list[Item]:
    """The four launchers for this configuration, as `install_hooks` writes them."""
    from ce_k8s.agent.launchers import install_hooks
    from ce_k8s.agent.main import hook_install_arguments
    from ce_k8s.settings import Settings

    arguments = hook_install_arguments(Settings.from_config(cfg))
    scratch = tempfile.mkdtemp(prefix="ce-k8s-install-")
    try:
        paths = install_hooks(os.path.join(scratch, "hooks"), **arguments)
        return [Item(hooks_dir, os.path.basename(p), Path(p).read_bytes(), 0o755) for p in paths]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Deciding and writing


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def beside_path(target: Path) -> Path:
    return target.with_name("." + target.name + NEW_SUFFIX)


def read_manifest(directory: Path) -> dict[str, str]:
    path = directory / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InstallError(f"{path}: cannot read the install record: {exc}") from exc
    files = data.get("files") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def _current(path: Path) -> bytes | None:
    if not os.path.lexists(path):
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InstallError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def decide(item: Item, recorded: str | None) -> Step:
    """installed (absent), unchanged (same bytes), updated (what we installed last), else kept."""
    current = _current(item.path)
    if current is None:
        return Step(item, INSTALLED)
    if current == item.content:
        return Step(item, UNCHANGED)
    if recorded is not None and sha256(current) == recorded:
        return Step(item, UPDATED)
    return Step(item, KEPT, beside_path(item.path))


def plan(items: list[Item]) -> list[Step]:
    manifests: dict[Path, dict[str, str]] = {}
    steps = []
    for item in items:
        if item.directory not in manifests:
            manifests[item.directory] = read_manifest(item.directory)
        steps.append(decide(item, manifests[item.directory].get(item.name)))
    return steps


def _write(path: Path, content: bytes, mode: int) -> None:
    tmp = path.with_name("." + path.name + ".ce-k8s-tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InstallError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise InstallError(f"{directory}: cannot create the directory: {exc.strerror or exc}") from exc
    if not directory.is_dir():
        raise InstallError(f"{directory}: not a directory")


def apply(steps: list[Step]) -> None:
    """Write what `plan` decided, then record the hashes in each directory's manifest."""
    records: dict[Path, dict[str, str]] = {}
    for step in steps:
        item = step.item
        if item.directory not in records:
            _make_dir(item.directory)
            records[item.directory] = read_manifest(item.directory)
        if step.action in (INSTALLED, UPDATED):
            _write(item.path, item.content, item.mode)
        elif step.action == KEPT:
            assert step.beside is not None
            _write(step.beside, item.content, 0o644)
            continue          # the record keeps what we installed last, so the edit stays visible
        records[item.directory][item.name] = sha256(item.content)
    for directory, files in records.items():
        path = directory / MANIFEST
        text = json.dumps({"files": dict(sorted(files.items()))}, indent=2) + "\n"
        try:
            old = path.read_text(encoding="utf-8") if path.exists() else None
        except OSError:
            old = None
        if old != text:
            _write(path, text.encode(), 0o644)


# --------------------------------------------------------------------------------------------
# The configuration the CE will read


def preview_config(config_dir: Path, steps: list[Step], scratch: Path):
    """The CE configuration as it will be after `steps`: the directory's files with ours on top,
    copied into `scratch` and read by `CondorConfig.load` (so a dry run sees what a real run does)."""
    from ce_k8s.condor.config import CondorConfig

    if config_dir.is_dir():
        for entry in sorted(config_dir.iterdir()):
            if entry.is_file():
                try:
                    shutil.copyfile(entry, scratch / entry.name)
                except OSError as exc:
                    raise InstallError(f"{entry}: cannot read: {exc.strerror or exc}") from exc
    for step in steps:
        if step.item.directory == config_dir and step.action in (INSTALLED, UPDATED):
            (scratch / step.item.name).write_bytes(step.item.content)
    cfg = CondorConfig.load(scratch)
    cfg.sources = [str(config_dir / Path(s).name) for s in cfg.sources]
    return cfg


def is_route_file(path: str | Path, text: str | None = None) -> bool:
    """A file installed as a route, or one that appends to JOB_ROUTER_ROUTE_NAMES."""
    if os.path.basename(path).startswith(ROUTE_PREFIX):
        return True
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    return _APPENDS_ROUTE.search(text) is not None


def route_order_problems(sources: list[str]) -> list[str]:
    """Route files read before a ce-k8s knob file (files in reading order, as `CondorConfig.sources`).

    `20-ce-k8s-routing.conf` empties JOB_ROUTER_ROUTE_NAMES, so a route appended before it is
    disabled without any message from the router.
    """
    knob_names = {p.name for p in shipped_knob_files()}
    knob_at = [i for i, s in enumerate(sources) if os.path.basename(s) in knob_names]
    if not knob_at:
        return []
    last = knob_at[-1]
    return [f"{src} is read before {sources[last]}" for src in sources[:last] if is_route_file(src)]


# --------------------------------------------------------------------------------------------
# The command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-dir", metavar="DIR", default=DEFAULT_CONFIG_DIR,
                        help=f"the CE's config directory (default {DEFAULT_CONFIG_DIR})")
    parser.add_argument("--hooks-dir", metavar="DIR", default=DEFAULT_HOOKS_DIR,
                        help=f"where the hook launchers go (default {DEFAULT_HOOKS_DIR})")
    parser.add_argument("--dry-run", action="store_true", help="print what would be done; write nothing")


def install(config_dir: Path, hooks_dir: Path, dry_run: bool = False) -> tuple[list[Step], list[str]]:
    """(the steps, warnings). Everything is decided before the first write."""
    from ce_k8s.condor.config import ConfigError

    steps = plan(config_items(config_dir))
    with tempfile.TemporaryDirectory(prefix="ce-k8s-install-") as scratch:
        try:
            cfg = preview_config(config_dir, steps, Path(scratch))
            launchers = launcher_items(hooks_dir, cfg)
        except ConfigError as exc:
            where = str(exc).replace(scratch, str(config_dir))   # name the CE's file, not our copy
            raise InstallError(f"the resulting configuration is not valid: {where}") from exc
    if hooks_dir.exists() and os.stat(hooks_dir).st_mode & 0o002:
        raise InstallError(f"{hooks_dir}: world-writable; the job router would ignore the hooks in it")
    steps += plan(launchers)
    warnings = [f"{p}: route files must be read after every ce-k8s knob file (20-ce-k8s-routing.conf "
                f"empties JOB_ROUTER_ROUTE_NAMES); remove it if it is a copy of a shipped route, which "
                f"`ce-k8s install` installs as {ROUTE_PREFIX}*" for p in route_order_problems(cfg.sources)]
    hook_dir_knob = cfg.get("CE_K8S_HOOK_DIR")
    if hook_dir_knob and os.path.abspath(hook_dir_knob) != os.path.abspath(hooks_dir):
        warnings.append(f"CE_K8S_HOOK_DIR is {hook_dir_knob}, so the router will not run the launchers in "
                        f"{hooks_dir}: set CE_K8S_HOOK_DIR = {hooks_dir} in {config_dir}/99-local.conf")
    for directory in (config_dir, hooks_dir):
        preflight(directory)
    if not dry_run:
        apply(steps)
    return steps, warnings


def preflight(directory: Path) -> None:
    """Fail before the first write when `directory` cannot be created or written, so a bad
    `--hooks-dir` does not leave the knobs installed and the launchers missing."""
    probe = directory
    while not os.path.lexists(probe):
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise InstallError(f"{directory}: cannot create the directory: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InstallError(f"{directory}: cannot write: permission denied on {probe}")


def run(args: argparse.Namespace) -> int:
    config_dir, hooks_dir = Path(args.config_dir), Path(args.hooks_dir)
    try:
        steps, warnings = install(config_dir, hooks_dir, dry_run=args.dry_run)
    except InstallError as exc:
        print(f"ce-k8s install: {exc}", file=sys.stderr)
        return 1
    for step in steps:
        print(("[dry-run] " if args.dry_run else "") + step.line())
    for warning in warnings:
        print(f"ce-k8s install: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print("ce-k8s install: dry run, nothing was written")
    return 0
