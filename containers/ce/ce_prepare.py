#!/usr/bin/env python3
"""Prepare a CE container's writable state before condor_master starts (stdlib only).

Why this exists: on a host, the RPM and systemd-tmpfiles create HTCondor-CE's directories and an
admin creates the Unix accounts pilots are mapped to. In a Kubernetes pod the root filesystem is
read-only, the spool is a fresh PersistentVolume and /run, the logs and the locks are emptyDirs,
so somebody has to lay them out with HTCondor's ownership and modes, and the accounts have to be
known to the container's /etc/passwd (the hooks run as the mapped account, the agent maps a job's
Owner to a uid through pwd). This runs as the CE pod's init container (as root, with only CHOWN,
FOWNER and DAC_OVERRIDE) and does three things, each optional:

* ``--accounts FILE``: site accounts, one ``name uid [gid]`` per line, are merged into copies of
  the image's /etc/passwd and /etc/group written to ``--etc-out`` (the main container mounts those
  two files over /etc/passwd and /etc/group). Every line is validated; a bad one is an error that
  names the file and line.
* ``--layout``: the directories the htcondor-ce RPM owns (spool, execute, log, lock, run) are
  created under ``--root`` with condor ownership and the RPM's modes. Only the directories
  themselves are touched: spool files belong to job owners and are never chowned.
* ``--require FILE``: files that must exist and be non-empty (the IDTOKEN signing key, the host
  certificate and key mounted from Secrets). Failing early with the Secret's name beats a CE that
  starts, generates a throw-away signing key and invalidates every token on the next restart.

Exit status: 0 on success, 2 on a usage or input error (message on stderr, one line per problem).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

LOG = logging.getLogger("ce-prepare")

#: POSIX-portable account names as useradd accepts them by default (lower case, ≤ 32 chars).
NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
#: Site accounts live above the system range; 65534 is nobody and 2**32-1 is (uid_t)-1.
MIN_UID = 1000
MAX_UID = 2**32 - 2
RESERVED_IDS = frozenset({65534})

#: (path relative to root, mode) of the directories the htcondor-ce RPM creates, owned by condor.
LAYOUT: tuple[tuple[str, int], ...] = (
    ("var/lib/condor-ce", 0o755),
    ("var/lib/condor-ce/spool", 0o755),
    ("var/lib/condor-ce/execute", 0o755),
    ("var/log/condor-ce", 0o755),
    ("var/log/condor-ce/user", 0o1777),
    ("var/lock/condor-ce", 0o755),
    ("var/lock/condor-ce/user", 0o1777),
    ("run/condor-ce", 0o755),
)


class PrepareError(Exception):
    """A problem with the input; str() is ``file:line: message`` when a line is at fault."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None) -> None:
        self.file = file
        self.line = line
        self.message = message
        where = f"{file}:{line}: " if file is not None and line is not None else (f"{file}: " if file else "")
        super().__init__(where + message)


@dataclass(frozen=True)
class Account:
    """One site account a pilot can be mapped to."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class PasswdEntry:
    """The fields of an /etc/passwd (or /etc/group) line that matter for clash checks."""

    name: str
    id: int
    line: str


def _parse_id(text: str, what: str, file: str, line_no: int) -> int:
    if not text.isdigit():
        raise PrepareError(f"{what} {text!r} is not a non-negative integer", file, line_no)
    value = int(text)
    if not MIN_UID <= value <= MAX_UID or value in RESERVED_IDS:
        raise PrepareError(f"{what} {value} is outside the site range {MIN_UID}..{MAX_UID} (or reserved)",
                           file, line_no)
    return value


def parse_accounts(text: str, file: str = "<accounts>") -> list[Account]:
    """Parse ``name uid [gid]`` lines; ``#`` starts a comment; blank lines are ignored."""
    accounts: list[Account] = []
    names: dict[str, int] = {}
    uids: dict[int, int] = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        body = raw.split("#", 1)[0].strip()
        if not body:
            continue
        fields = body.split()
        if len(fields) not in (2, 3):
            raise PrepareError(f"expected 'name uid [gid]', got {len(fields)} fields", file, line_no)
        name = fields[0]
        if not NAME_RE.match(name):
            raise PrepareError(f"account name {name!r} is not a valid Unix user name", file, line_no)
        uid = _parse_id(fields[1], "uid", file, line_no)
        gid = _parse_id(fields[2], "gid", file, line_no) if len(fields) == 3 else uid
        if name in names:
            raise PrepareError(f"account {name!r} already defined on line {names[name]}", file, line_no)
        if uid in uids:
            raise PrepareError(f"uid {uid} already used on line {uids[uid]}", file, line_no)
        names[name] = line_no
        uids[uid] = line_no
        accounts.append(Account(name, uid, gid))
    return accounts


def parse_passwd(text: str, file: str) -> list[PasswdEntry]:
    """Read name and numeric id (field 3) from passwd or group text; other fields are kept verbatim."""
    entries = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.startswith("#"):
            continue
        fields = raw.split(":")
        if len(fields) < 4 or not fields[2].isdigit():
            raise PrepareError("not a passwd/group line", file, line_no)
        entries.append(PasswdEntry(fields[0], int(fields[2]), raw))
    return entries


def merge_accounts(base_passwd: str, base_group: str, accounts: list[Account]) -> tuple[str, str]:
    """Return (passwd, group) texts: the base files plus one user and one group per new account.

    An account already present with the same uid is left alone (so re-running is harmless); a name
    or id that the base uses for something else is an error, never an overwrite.
    """
    users = parse_passwd(base_passwd, "/etc/passwd")
    groups = parse_passwd(base_group, "/etc/group")
    user_by_name = {u.name: u for u in users}
    user_by_id = {u.id: u for u in users}
    group_by_name = {g.name: g for g in groups}
    group_by_id = {g.id: g for g in groups}
    new_users: list[str] = []
    new_groups: list[str] = []
    for acc in accounts:
        existing = user_by_name.get(acc.name)
        if existing is not None:
            if existing.id != acc.uid:
                raise PrepareError(f"account {acc.name!r} exists in the image with uid {existing.id}, not {acc.uid}")
            continue
        if acc.uid in user_by_id:
            raise PrepareError(f"uid {acc.uid} of {acc.name!r} belongs to {user_by_id[acc.uid].name!r} in the image")
        group = group_by_id.get(acc.gid)
        if group is None:
            if acc.name in group_by_name:
                raise PrepareError(f"group {acc.name!r} exists in the image with gid {group_by_name[acc.name].id}")
            new_groups.append(f"{acc.name}:x:{acc.gid}:")
            group_by_id[acc.gid] = PasswdEntry(acc.name, acc.gid, new_groups[-1])
            group_by_name[acc.name] = group_by_id[acc.gid]
        # No home directory and no login shell: nobody logs in; HTCondor runs hooks with the uid.
        new_users.append(f"{acc.name}:x:{acc.uid}:{acc.gid}:ce-k8s pilot account:/nonexistent:/sbin/nologin")
        user_by_id[acc.uid] = PasswdEntry(acc.name, acc.uid, new_users[-1])

    def join(base: str, extra: list[str]) -> str:
        body = base if base.endswith("\n") or not base else base + "\n"
        return body + "".join(line + "\n" for line in extra)

    return join(base_passwd, new_users), join(base_group, new_groups)


def lookup_id(passwd_text: str, name: str, file: str) -> int:
    """The numeric id of ``name`` in passwd/group text (condor's uid/gid for the layout)."""
    for entry in parse_passwd(passwd_text, file):
        if entry.name == name:
            return entry.id
    raise PrepareError(f"no {name!r} entry", file)


def make_layout(root: Path, uid: int, gid: int) -> list[Path]:
    """Create the RPM's directories under ``root`` owned by uid:gid with the RPM's modes.

    Existing directories get their owner and mode corrected (a fresh PersistentVolume is owned by
    root); their contents are not touched. A symlink where a directory should be is refused, so a
    compromised volume cannot redirect the chown.
    """
    done = []
    for rel, mode in LAYOUT:
        path = root / rel
        if path.is_symlink():
            raise PrepareError("is a symlink, refusing to chown through it", str(path))
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, uid, gid, follow_symlinks=False)
        os.chmod(path, mode)
        done.append(path)
    return done


def check_required(paths: list[str]) -> None:
    """Every path must be a non-empty regular file (Secret mounts are symlinks to one: followed)."""
    problems = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            problems.append(f"{p}: missing (mount it from its Secret, see docs/deploy-kubernetes.md)")
        elif path.stat().st_size == 0:
            problems.append(f"{p}: empty")
    if problems:
        raise PrepareError("; ".join(problems))


def _write(path: Path, text: str) -> None:
    """Write atomically (temp file + rename) so a half-written passwd is never mounted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ce-prepare", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--accounts", help="site accounts file: 'name uid [gid]' per line")
    parser.add_argument("--etc-out", help="directory to write the merged passwd and group into")
    parser.add_argument("--base-etc", default="/etc", help="where the image's passwd and group are")
    parser.add_argument("--layout", action="store_true", help="create the HTCondor-CE directories")
    parser.add_argument("--root", default="/", help="root the layout is created under")
    parser.add_argument("--condor-user", default="condor", help="owner of the HTCondor-CE directories")
    parser.add_argument("--require", action="append", default=[], metavar="FILE", help="file that must exist")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    base = Path(args.base_etc)
    try:
        check_required(args.require)
        passwd_text = (base / "passwd").read_text(encoding="utf-8")
        group_text = (base / "group").read_text(encoding="utf-8")
        if args.accounts:
            if not args.etc_out:
                raise PrepareError("--accounts needs --etc-out")
            accounts = parse_accounts(Path(args.accounts).read_text(encoding="utf-8"), args.accounts)
            passwd_text, group_text = merge_accounts(passwd_text, group_text, accounts)
            _write(Path(args.etc_out) / "passwd", passwd_text)
            _write(Path(args.etc_out) / "group", group_text)
            LOG.info("wrote %d site account(s) to %s", len(accounts), args.etc_out)
        if args.layout:
            uid = lookup_id(passwd_text, args.condor_user, str(base / "passwd"))
            gid = lookup_id(group_text, args.condor_user, str(base / "group"))
            made = make_layout(Path(args.root), uid, gid)
            LOG.info("laid out %d HTCondor-CE directories under %s", len(made), args.root)
    except (PrepareError, OSError) as exc:
        print(f"ce-prepare: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
