"""A small Containerfile parser and the lint rules that matter for our two images.

Why our own: hadolint is not a Python dependency of the project (it was run by hand, see
containers/README.md), so the rules the project relies on are checked here on every test run:
pinned base images, no remote ADD, no secrets in ENV/ARG, package caches cleaned in the same
layer, exec-form ENTRYPOINT/CMD/HEALTHCHECK, the last USER of an unprivileged image numeric and
non-root, COPY sources present in the build context.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

#: Words that make an ENV/ARG name look like it carries a credential.
SECRET_NAME = re.compile(r"(PASS(WORD|WD)?|SECRET|TOKEN|PRIVATE|CREDENTIAL|API_?KEY|SIGNING|_KEY$|^KEY$)", re.I)
PACKAGE_INSTALL = re.compile(r"\b(dnf|microdnf|yum)\b[^&;|]*\binstall\b")


@dataclass
class Instruction:
    """One instruction, continuation lines joined; ``line`` is where it starts (1-based)."""

    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    line: int
    args: dict[str, str] = field(default_factory=dict)
    instructions: list[Instruction] = field(default_factory=list)


@dataclass
class Containerfile:
    path: str
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


class LintError(ValueError):
    """A rule violation; str() is ``file:line: rule: message``."""


def parse(text: str, path: str = "<Containerfile>") -> Containerfile:
    """Parse a Containerfile into stages of instructions (comments and blank lines dropped)."""
    instructions: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are skipped by the builder
        if not buf:
            start = no
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].rstrip())
            continue
        buf.append(stripped)
        joined = " ".join(part for part in buf if part)
        keyword, _, args = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        buf = []
    if buf:
        raise LintError(f"{path}:{start}: syntax: file ends inside a continued instruction")
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, ins.line))
        elif not stages:
            if ins.keyword != "ARG":
                raise LintError(f"{path}:{ins.line}: syntax: only ARG may precede the first FROM")
            k, _, v = ins.args.partition("=")
            global_args[k.strip()] = v.strip().strip('"')
        else:
            if ins.keyword == "ARG":
                k, _, v = ins.args.partition("=")
                stages[-1].args[k.strip()] = v.strip().strip('"') if v else global_args.get(k.strip(), "")
            stages[-1].instructions.append(ins)
    if not stages:
        raise LintError(f"{path}:1: syntax: no FROM")
    return Containerfile(path, global_args, stages)


def expand(value: str, args: dict[str, str]) -> str:
    """Substitute ${NAME} and $NAME with ARG defaults."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value)


def _is_exec_form(args: str) -> bool:
    try:
        value = json.loads(args)
    except ValueError:
        return False
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def lint(cf: Containerfile, context: Path | None = None, unprivileged: bool = True) -> list[str]:
    """Every rule violation as ``file:line: rule: message`` (empty list = clean).

    ``unprivileged``: the final stage must end with a numeric non-root USER. The CE image passes
    False (condor_master must start as root, documented in the file) and must then have no USER.
    ``context``: the build context; COPY sources (without --from) must match a file in it.
    """
    problems: list[str] = []
    stage_names = {s.name for s in cf.stages if s.name}

    def bad(line: int, rule: str, msg: str) -> None:
        problems.append(f"{cf.path}:{line}: {rule}: {msg}")

    for k in cf.global_args:
        if SECRET_NAME.search(k):
            bad(1, "no-secrets", f"ARG {k} looks like a credential")
    for stage in cf.stages:
        base = expand(stage.base, cf.global_args)
        if base not in stage_names:
            image = base.split("@", 1)[0]
            tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else None
            if "@sha256:" not in base and (tag is None or tag == "latest" or "$" in base):
                bad(stage.line, "pinned-base", f"base image {base!r} has no fixed tag or digest")
            elif tag and not re.search(r"\d", tag):
                bad(stage.line, "pinned-base", f"base image tag {tag!r} carries no version")
        args = {**cf.global_args, **stage.args}
        for ins in stage.instructions:
            kw = ins.keyword
            if kw == "ADD":
                bad(ins.line, "no-add", "use COPY (ADD fetches URLs and unpacks archives implicitly)")
            if kw in ("ENV", "ARG"):
                names = re.findall(r"(\w+)=", ins.args) or [ins.args.split()[0]]
                for n in names:
                    if SECRET_NAME.search(n):
                        bad(ins.line, "no-secrets", f"{kw} {n} looks like a credential")
            if kw == "RUN":
                body = ins.args
                if re.search(r"\b(curl|wget)\b[^|;&]*\|\s*(ba)?sh\b", body):
                    bad(ins.line, "no-pipe-to-shell", "downloaded script piped into a shell")
                if PACKAGE_INSTALL.search(body):
                    tool = PACKAGE_INSTALL.search(body).group(1)
                    if not re.search(rf"\b{tool}\s+(-y\s+)?clean all\b", body):
                        bad(ins.line, "clean-cache", f"{tool} install without '{tool} clean all' in the same RUN")
                    if tool != "microdnf" and not re.search(r"\b(dnf|yum)\b\s+-y\b|\s-y\s", body):
                        bad(ins.line, "non-interactive", f"{tool} install without -y")
                    if tool in ("dnf", "yum") and "/var/cache/dnf" not in body and "/var/cache/yum" not in body:
                        bad(ins.line, "clean-cache", "package metadata cache not removed")
            if kw in ("ENTRYPOINT", "CMD") and not _is_exec_form(ins.args):
                bad(ins.line, "exec-form", f"{kw} must be a JSON array (signals reach the process)")
            if kw == "HEALTHCHECK":
                cmd = ins.args.split("CMD", 1)[1].strip() if "CMD" in ins.args else ""
                if ins.args.strip() != "NONE" and not _is_exec_form(cmd):
                    bad(ins.line, "exec-form", "HEALTHCHECK CMD must be a JSON array")
            if kw == "COPY" and context is not None and "--from=" not in ins.args:
                words = [w for w in ins.args.split() if not w.startswith("--")]
                for src in words[:-1]:
                    src = expand(src, args)
                    if not list(context.glob(src)):
                        bad(ins.line, "copy-source", f"{src!r} matches nothing in the build context {context}")
    users = [ins for ins in cf.final.instructions if ins.keyword == "USER"]
    final_args = {**cf.global_args, **cf.final.args}
    if unprivileged:
        if not users:
            bad(cf.final.line, "non-root", "no USER in the final stage: the image would run as root")
        else:
            user = expand(users[-1].args, final_args)
            uid = user.split(":", 1)[0]
            if not uid.isdigit():
                bad(users[-1].line, "non-root", f"USER {user!r} is not numeric (runAsNonRoot cannot verify it)")
            elif int(uid) == 0:
                bad(users[-1].line, "non-root", "the last USER is root")
    elif users:
        bad(users[-1].line, "root-image", "the CE image documents that it starts as root: no USER expected")
    return problems


def healthcheck(cf: Containerfile) -> Instruction | None:
    return next((i for i in cf.final.instructions if i.keyword == "HEALTHCHECK"), None)


def final_user(cf: Containerfile) -> str | None:
    users = [i for i in cf.final.instructions if i.keyword == "USER"]
    return expand(users[-1].args, {**cf.global_args, **cf.final.args}) if users else None
