"""Write the four hook launchers: tiny scripts that start the hooks with `python -I -S`.

Why not the pip console scripts (`ce-k8s-update` ...): those run with `site` (the venv's .pth
files, ~10 ms) and import `re`; the router forks the update hook once per job per poll
(docs/hook-protocol.md §8), so the launcher skips `site` (`-S`), ignores the caller's
`PYTHON*` environment (`-I`), and puts just the directory holding `ce_k8s` on `sys.path`.
It ends with `exit_now` (`posix._exit`) instead of `sys.exit`: the interpreter's teardown is
~1.1 ms of CPU per process and a hook has nothing to tear down (see `ce_k8s.hooks._common`).
The console scripts remain a working fallback. The installer also bakes in the socket path, the
hook deadline, the CE spool (finalize's fallback) and `CE_K8S_GRID_RESOURCE` (which routed jobs
are Kubernetes jobs, docs/routes.md) as defaults; `CE_K8S_SOCKET` / `CE_K8S_HOOK_TIMEOUT` /
`CE_K8S_SPOOL` / `CE_K8S_GRID_RESOURCE` in the environment and `/etc/ce-k8s/hooks.conf` still win.

The installer compiles the hook modules' bytecode (`__pycache__/*.pyc`) for its own interpreter:
hooks run as the pilot accounts, which cannot write `__pycache__`, so a missing or stale `.pyc`
(an editable install, say) would be compiled from source in every hook process, about a
millisecond each time. Beside them it writes one image per launcher (`ce_k8s.agent.hookimage`):
the launcher executes its modules from that one file, and falls back to the normal import when
the image is missing, stale or for another interpreter.
"""

from __future__ import annotations

import logging
import os
import sys

from ce_k8s.agent import hookimage
from ce_k8s.protocol import DEFAULT_GRID_RESOURCE

log = logging.getLogger(__name__)

HOOKS = {
    "ce-k8s-translate": "ce_k8s.hooks.translate",
    "ce-k8s-update": "ce_k8s.hooks.update",
    "ce-k8s-finalize": "ce_k8s.hooks.finalize",
    "ce-k8s-cleanup": "ce_k8s.hooks.cleanup",
}

# Every module a hook process imports from ce_k8s (relative to the package root).
HOOK_MODULE_FILES = (
    "ce_k8s/__init__.py", "ce_k8s/protocol.py", "ce_k8s/hooks/__init__.py", "ce_k8s/hooks/_common.py",
    "ce_k8s/hooks/translate.py", "ce_k8s/hooks/update.py", "ce_k8s/hooks/finalize.py",
    "ce_k8s/hooks/cleanup.py", "ce_k8s/pods/__init__.py", "ce_k8s/pods/names.py",
)

TEMPLATE = """#!{python} -IS
# Written by `ce-k8s agent --install-hooks`; the router calls it with no arguments.
import sys
sys.path.insert(0, {root!r})
try:  # this hook's modules, precompiled into one file (ce_k8s/agent/hookimage.py); else a normal import
    import marshal
    import posix
    _fd = posix.open({image!r} + sys.implementation.cache_tag + ".image", posix.O_RDONLY)
    _image = posix.read(_fd, posix.fstat(_fd).st_size)
    posix.close(_fd)
    if _image[:4] == sys.modules["_frozen_importlib_external"].MAGIC_NUMBER:
        exec(*marshal.loads(_image[4:]))
except (OSError, ValueError, EOFError, TypeError):
    pass
from ce_k8s import protocol
protocol.DEFAULT_SOCKET = {socket!r}
protocol.DEFAULT_HOOK_TIMEOUT = {timeout!r}
protocol.DEFAULT_SPOOL = {spool!r}
protocol.DEFAULT_GRID_RESOURCE = {grid_resource!r}
from {module} import main
from ce_k8s.hooks._common import exit_now
exit_now(main())
"""


def package_root() -> str:
    """The directory that contains the `ce_k8s` package (source tree or site-packages)."""
    # this file is <root>/ce_k8s/agent/launchers.py (ce_k8s.__file__ is None under editable installs)
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_hook_modules(root: str | None = None) -> bool:
    """Write the `.pyc` of every module a hook imports (for this interpreter); False on failure.

    Timestamp-checked `.pyc` are forced: with `SOURCE_DATE_EPOCH` set, py_compile would write
    hash-checked ones, which re-read and hash the source on every import. Done in-process (no
    child process: ce_k8s starts none, tests/hardening/test_injection.py), so a launcher on
    another interpreter version gets its `.pyc` from `python -m compileall` run by the admin. A
    failure (read-only tree) is logged and not fatal: the hooks still work, they only pay the
    compile on every start.
    """
    import py_compile

    root = root or package_root()
    for rel in HOOK_MODULE_FILES:
        try:
            py_compile.compile(os.path.join(root, rel), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        except (OSError, py_compile.PyCompileError) as exc:
            log.warning("could not compile %s for the hooks: %s", rel, exc)
            return False
    return True


def stage_hook_package(dest: str) -> str:
    """Copy the modules a hook imports (`HOOK_MODULE_FILES`, stdlib only) under `dest`, readable by
    every account, and return `dest` for `install_hooks(package_dir=...)`.

    Why: the router runs the hooks as the pilot accounts. When ce-k8s is installed where they cannot
    read (a venv in root's 0700 home, a private checkout), launchers that point into it fail with
    `No module named 'ce_k8s'`; launchers pointing at this copy work. The copy must be refreshed
    with every upgrade, like the launchers themselves.
    """
    import shutil

    root = package_root()
    for rel in HOOK_MODULE_FILES:
        target = os.path.join(dest, rel)
        for d in (dest, *(os.path.join(dest, p) for p in _parents(rel))):
            os.makedirs(d, mode=0o755, exist_ok=True)
            os.chmod(d, 0o755)  # noqa: S103 - the pilot accounts read the hooks from here
        shutil.copyfile(os.path.join(root, rel), target)
        os.chmod(target, 0o644)
    return dest


def _parents(rel: str) -> list[str]:
    """`a/b/c.py` -> [`a`, `a/b`]."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def install_hooks(directory: str, socket_path: str, hook_timeout: float, python: str | None = None,
                  spool: str | None = None, package_dir: str | None = None,
                  grid_resource: str | None = None) -> list[str]:
    """Write the launchers (mode 0755) into `directory` and return their paths.

    The router silently ignores a hook whose file or directory is world-writable
    (docs/hook-protocol.md §1.1), so the directory is created 0755 and checked. `package_dir` is
    the directory holding `ce_k8s` as the hooks will see it (default: this installation's); the
    real-HTCondor test bed runs them in a chroot where the package is mounted elsewhere.
    `grid_resource` is the CE's `CE_K8S_GRID_RESOURCE` (None: `protocol.DEFAULT_GRID_RESOURCE`).
    """
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if os.stat(directory).st_mode & 0o002:
        raise PermissionError(f"{directory} is world-writable; the job router would ignore hooks in it")
    python = python or sys.executable
    root = package_dir or package_root()
    build_root = _local_root(root)
    compile_hook_modules(build_root)
    paths = []
    extensions = _extensions(python)
    for name, module in HOOKS.items():
        _write_image(build_root, name, module, extensions, python)
        path = os.path.join(directory, name)
        text = TEMPLATE.format(python=python, root=root, socket=socket_path,
                               timeout=float(hook_timeout), module=module, spool=spool,
                               grid_resource=grid_resource or DEFAULT_GRID_RESOURCE,
                               image=f"{root}/{hookimage.IMAGE_DIR}/{name}.")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o755)  # noqa: S103 - executables for every pilot account; not writable by them
        os.replace(tmp, path)
        paths.append(path)
    return paths


def _local_root(root: str) -> str:
    """Where the `.pyc` and images are written: `root` when it holds the hook sources here (a staged
    copy), else this installation (the real-HTCondor test bed mounts it at `root` inside a chroot)."""
    if os.path.isfile(os.path.join(root, "ce_k8s", "hooks", "update.py")):
        return root
    return package_root()


def _extensions(python: str) -> dict[str, str]:
    """The extension modules the hooks import lazily, with this interpreter's files, when the
    launchers run this interpreter (another one has its own files, and may not read ours)."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return {}
    import _socket

    origin = getattr(_socket, "__file__", None)        # None when built into the interpreter
    return {"_socket": os.path.abspath(origin)} if origin else {}


def _write_image(root: str, name: str, module: str, extensions: dict[str, str], python: str) -> None:
    """The image of one launcher; a failure (read-only tree) is logged and only costs speed."""
    try:
        hookimage.write(root, name, ["ce_k8s.protocol", "ce_k8s.hooks._common", module], extensions, python)
    except (OSError, SyntaxError) as exc:
        log.warning("could not write the hook image of %s under %s: %s", name, root, exc)
