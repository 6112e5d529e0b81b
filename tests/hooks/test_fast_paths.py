"""The hooks' cheap start: what they import, how they exit, and that the fast code equals the slow.

Every hook call is one process (docs/hook-protocol.md §0, §2.1) and the update hook runs once per
routed job per poll (hook-protocol.md §8), so a hook's CPU above a bare interpreter start is paid thousands of
times a minute (docs/performance.md, issue 7). These tests pin the choices that keep it small:
no `os` and no `__future__` in the hook modules, `_socket` only for hooks that talk to the agent,
the launcher's `posix._exit` (no interpreter teardown) with exit codes and output intact, and
the hand-written replacements (`posixpath` functions, the translate scanners) equal to what they
replace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ce_k8s.agent import launchers
from ce_k8s.hooks import finalize, translate

from .conftest import GJID, run_hook

ROOT = launchers.package_root()


def _modules_after(code: str, stdin: bytes = b"") -> set[str]:
    """sys.modules of a `python -I -S` process that ran `code` (the launchers' flags)."""
    prog = f"import sys\nsys.path.insert(0, {ROOT!r})\n{code}\nsys.stderr.write(' '.join(sys.modules))\n"
    res = subprocess.run([sys.executable, "-I", "-S", "-c", prog], input=stdin, capture_output=True, check=False,
                         timeout=30)
    return set(res.stderr.decode().split())


def test_hook_modules_import_neither_os_nor_future():
    """`os` is ~1.1 ms and `__future__` ~0.15 ms of CPU per process (issue 7); a bare start
    with `-I -S` loads neither, so a hook must not either (names.py, owned elsewhere, still
    imports `__future__`, so translate is checked for `os` only)."""
    bare = _modules_after("")
    assert "os" not in bare and "__future__" not in bare
    for hook in ("update", "finalize", "cleanup"):
        mods = _modules_after(f"import ce_k8s.hooks.{hook}")
        assert "os" not in mods and "__future__" not in mods, hook
        assert not {m for m in mods - bare if not m.startswith("ce_k8s")}, hook
    assert "os" not in _modules_after("import ce_k8s.hooks.translate")


def test_translate_never_loads_the_socket_module():
    """The translate hook never talks to the agent (hook-protocol.md §2.2, design.md Decision 1), so it must not pay
    for loading the `_socket` extension (~0.35 ms): `ce_k8s.protocol` loads it only in `call()`."""
    stdin = ('[ Name = "r"; GridResource = "batch k8s" ]\n------\nClusterId = 1\nProcId = 0\nGlobalJobId = "'
             + GJID + '"\n').encode()
    mods = _modules_after("from ce_k8s.hooks.translate import main\nmain()", stdin)
    assert "ce_k8s.hooks.translate" in mods and "ce_k8s.pods.names" in mods
    assert "_socket" not in mods and "socket" not in mods


def test_pass_through_loads_neither_pod_names_nor_the_socket():
    """Another backend's job (docs/routes.md, "CEs with other backends") costs the hooks no more
    than reading stdin: translate echoes it without loading the pod-name module, and update,
    cleanup and finalize return before `protocol.call` would load `_socket`."""
    ad = 'ClusterId = 1\nProcId = 0\nGridResource = "batch slurm"\nGlobalJobId = "' + GJID + '"\n'
    stdin = ('[ Name = "r"; GridResource = "batch slurm" ]\n------\n' + ad).encode()
    mods = _modules_after("from ce_k8s.hooks.translate import main\nmain()", stdin)
    assert "ce_k8s.hooks.translate" in mods and "ce_k8s.pods.names" not in mods and "_socket" not in mods
    for hook, data in (("update", ad), ("cleanup", ad), ("finalize", ad + "\n------\n" + ad)):
        mods = _modules_after(f"from ce_k8s.hooks.{hook} import main\nmain()", data.encode())
        assert f"ce_k8s.hooks.{hook}" in mods and "_socket" not in mods, hook


def test_launcher_ends_with_exit_now_and_keeps_exit_codes(hook_dir):
    """The launchers skip the interpreter's teardown (`exit_now`), and the router still sees the
    hook's own exit code: translate exits 1 on input without the separator (hook-protocol.md §2.2), cleanup 0
    for an ad that never got a pod (hook-protocol.md §2.5), update 1 when the agent is unreachable (§2.3)."""
    text = (hook_dir / "ce-k8s-update").read_text()
    assert text.rstrip().endswith("from ce_k8s.hooks._common import exit_now\nexit_now(main())")
    assert run_hook(hook_dir, "translate", b"no separator").returncode == 1
    assert run_hook(hook_dir, "cleanup", b'ClusterId = 1\nOwner = "x"\n').returncode == 0
    res = run_hook(hook_dir, "update", b'ClusterId = 1\nGridResource = "batch k8s"\nK8sPodName = "p"\n')
    assert res.returncode == 1 and res.stdout == b"" and b"unreachable" in res.stderr


def test_exit_now_flushes_python_buffers_and_passes_the_code():
    """Nothing written through Python's own buffers is lost by skipping the teardown."""
    prog = (f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom ce_k8s.hooks._common import exit_now\n"
            "sys.stdout.write('buffered out')\nsys.stderr.write('buffered err')\nexit_now(3)\n")
    res = subprocess.run([sys.executable, "-I", "-S", "-c", prog], capture_output=True, check=False, timeout=30)
    assert (res.returncode, res.stdout, res.stderr) == (3, b"buffered out", b"buffered err")
    res = subprocess.run([sys.executable, "-I", "-S", "-c", prog.replace("exit_now(3)", "exit_now(None)")],
                         capture_output=True, check=False, timeout=30)
    assert res.returncode == 0


def test_install_compiles_the_hook_modules(tmp_path):
    """The hooks run as pilot accounts that cannot write `__pycache__`; the installer writes the
    `.pyc` of every module a hook imports, so no hook process compiles source."""
    root = tmp_path / "root"
    for rel in launchers.HOOK_MODULE_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((Path(ROOT) / rel).read_bytes())
    assert launchers.compile_hook_modules(str(root))
    tag = sys.implementation.cache_tag
    for rel in launchers.HOOK_MODULE_FILES:
        src = root / rel
        pyc = src.parent / "__pycache__" / f"{src.stem}.{tag}.pyc"
        assert pyc.is_file(), rel
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags == 0, f"{rel}: not a timestamp-checked .pyc"
    (root / "ce_k8s/hooks/update.py").write_text("def broken(:\n")
    assert not launchers.compile_hook_modules(str(root))


# -- the hand-written replacements equal what they replace -----------------------------------------

def _old_string_open(text: str, open_: bool) -> bool:
    """The per-character scanner translate used before (the reference)."""
    prev = ""
    for c in text:
        if c == '"' and not (open_ and prev == "\\"):
            open_ = not open_
        prev = c
    return open_


def _old_is_attr_start(line: str) -> str | None:
    name, sep, _ = line.partition("=")
    if not sep:
        return None
    name = name.strip()
    if not name or not (name[0].isalpha() or name[0] == "_"):
        return None
    if not all(c.isalnum() or c in "_." for c in name):
        return None
    return name.lower()


_AD_CHARS = st.sampled_from(['"', "\\", "=", " ", "a", "Z", "_", ".", "1", "-", "é", "\u0663", "\t", "x"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_AD_CHARS, max_size=30).map("".join), st.booleans())
def test_string_open_equals_the_per_character_scan(text, open_):
    """hook-protocol.md §2.2: only `\\"` escapes in a string; the find-based scanner agrees char for char."""
    assert translate._string_open(text, open_) == _old_string_open(text, open_)


@settings(max_examples=400, deadline=None)
@given(st.lists(_AD_CHARS, max_size=30).map("".join))
def test_attr_start_equals_the_per_character_check(line):
    assert translate._is_attr_start(line) == _old_is_attr_start(line)


def test_normpath_and_join_equal_posixpath():
    """finalize builds the job's Out/Err paths without `os` (its import is ~1.1 ms); the spool check
    (docs/security.md) rests on these giving exactly os.path's answers, `..` and `//` included."""
    cases = ["", "/", "//", "///", ".", "..", "a//b/", "/a/./b/../c", "//x/../y", "a/../../b", "../..", "x/"]
    for path in cases:
        assert finalize._normpath(path) == os.path.normpath(path), path
        for other in ("", "b", "/c", "d/"):
            assert finalize._join(path, other) == os.path.join(path, other), (path, other)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "x"]), min_size=1, max_size=6), st.booleans())
    def check(parts, absolute):
        path = ("/" if absolute else "") + "/".join(parts)
        assert finalize._normpath(path) == os.path.normpath(path), path

    check()


def test_realpath_resolves_the_spool_root_as_the_kernel_does(tmp_path):
    """The spool root is compared with the job's paths after every symlink in it is resolved
    (a CE whose spool is a symlink to another disk); a missing root is only normalised, and
    `open_in_spool` then refuses to write below it."""
    (tmp_path / "disk" / "spool").mkdir(parents=True)
    os.symlink(str(tmp_path / "disk"), tmp_path / "abs")
    os.symlink("disk/spool", tmp_path / "rel")
    for path in ("abs/spool", "rel", "rel/", "abs/spool/../spool", "disk//spool"):
        assert finalize.realpath(str(tmp_path) + "/" + path) == os.path.realpath(tmp_path / path), path
    missing = str(tmp_path) + "/nothing/../here"
    assert finalize.realpath(missing) == os.path.normpath(missing)
