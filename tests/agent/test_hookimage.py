"""Hook images (ce_k8s/agent/hookimage.py): each launcher loads its modules from one precompiled
file, and falls back to a normal import on any doubt without behaving differently."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ce_k8s.agent import hookimage
from ce_k8s.agent.launchers import HOOKS, install_hooks, stage_hook_package

OTHER_JOB = b'ClusterId = 1\nProcId = 0\nGridResource = "batch slurm"\n'
OUR_JOB = b'ClusterId = 1\nProcId = 0\nGridResource = "batch k8s"\n'


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, Path]:
    """A staged copy of the hook modules (so tests may touch its files) and launchers on it."""
    lib = Path(stage_hook_package(str(tmp_path / "lib")))
    hooks = tmp_path / "hooks"
    install_hooks(str(hooks), socket_path=str(tmp_path / "none.sock"), hook_timeout=5.0, package_dir=str(lib))
    return lib, hooks


def ce_k8s_imports(launcher: Path, stdin: bytes) -> tuple[list[str], subprocess.CompletedProcess]:
    """The `ce_k8s` modules the launcher imported through the import system (`-X importtime`)."""
    res = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(launcher)], input=stdin,
                         capture_output=True, timeout=30)
    names = [line.rsplit("|", 1)[1].strip() for line in res.stderr.decode().splitlines()
             if line.startswith("import time:") and "|" in line]
    return [n for n in names if n.startswith("ce_k8s")], res


def image_of(lib: Path, launcher: str) -> Path:
    return lib / hookimage.IMAGE_DIR / hookimage.image_name(launcher)


@pytest.mark.parametrize("launcher", sorted(HOOKS))
def test_image_holds_exactly_what_a_normal_import_executes(launcher):
    """The closure the installer computes equals the ce_k8s modules a real import of the launcher's
    three imports puts in sys.modules, in an order where each module's imports come first."""
    root = str(Path(hookimage.__file__).resolve().parents[2])
    wanted = ["ce_k8s.protocol", "ce_k8s.hooks._common", HOOKS[launcher]]
    code = (f"import sys; sys.path.insert(0, {root!r})\n"
            + "".join(f"import {m}\n" for m in wanted)
            + "print(' '.join(sorted(m for m in sys.modules if m.startswith('ce_k8s'))))")
    real = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, check=True)
    order = [name for name, _rel, _pkg in hookimage.closure(root, wanted)]
    assert sorted(order) == real.stdout.split()
    for i, name in enumerate(order):
        parent = name.rpartition(".")[0]
        assert not parent or order.index(parent) < i, (name, order)
    assert order[-1] == HOOKS[launcher]      # the hook module last: everything it imports runs first


def test_launcher_runs_from_its_image_and_answers_as_without_it(staged):
    lib, hooks = staged
    update = hooks / "ce-k8s-update"
    imported, res = ce_k8s_imports(update, OUR_JOB)
    assert imported == [], imported          # nothing of ours went through the import system
    assert res.returncode == 1 and b"unreachable" in res.stderr and res.stdout == b""
    image_of(lib, "ce-k8s-update").unlink()
    imported, res2 = ce_k8s_imports(update, OUR_JOB)
    assert "ce_k8s.hooks.update" in imported
    assert (res2.returncode, res2.stdout) == (res.returncode, res.stdout)


def test_every_launcher_passes_another_backends_job_through_from_its_image(staged):
    _lib, hooks = staged
    for name in HOOKS:
        imported, res = ce_k8s_imports(hooks / name, OTHER_JOB if name != "ce-k8s-translate"
                                       else b'[ GridResource = "batch slurm" ]\n------\n' + OTHER_JOB)
        assert imported == [], (name, imported)
        assert res.returncode == 0, (name, res.stderr)


def test_an_edited_source_makes_the_launcher_import_normally(staged):
    """The .pyc rule: a source whose mtime or size changed since the image was built is never run
    from the image; the edit takes effect."""
    lib, hooks = staged
    common = lib / "ce_k8s" / "hooks" / "_common.py"
    text = common.read_text()
    common.write_text(text.replace('"ce-k8s: " + message', '"ce-k8s(edited): " + message'))
    imported, res = ce_k8s_imports(hooks / "ce-k8s-update", OUR_JOB)
    assert "ce_k8s.hooks._common" in imported
    assert b"ce-k8s(edited): agent" in res.stderr and res.returncode == 1


def test_a_same_size_edit_with_a_new_mtime_is_seen(staged):
    lib, hooks = staged
    update = lib / "ce_k8s" / "hooks" / "update.py"
    st = update.stat()
    os.utime(update, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    imported, _res = ce_k8s_imports(hooks / "ce-k8s-update", OUR_JOB)
    assert "ce_k8s.hooks.update" in imported


@pytest.mark.parametrize("damage", ["truncated", "magic", "empty", "garbage"])
def test_a_damaged_image_falls_back_to_the_normal_import(staged, damage):
    lib, hooks = staged
    image = image_of(lib, "ce-k8s-update")
    data = image.read_bytes()
    image.write_bytes({"truncated": data[: len(data) // 2], "magic": b"\0\0\r\n" + data[4:], "empty": b"",
                       "garbage": data[:4] + b"\xff" * 64}[damage])
    imported, res = ce_k8s_imports(hooks / "ce-k8s-update", OUR_JOB)
    assert "ce_k8s.hooks.update" in imported
    assert res.returncode == 1 and b"unreachable" in res.stderr


def test_load_undoes_everything_when_a_module_fails():
    """A module that raises while executing: nothing it or the modules before it registered stays
    in sys.modules, so the normal import starts clean and shows the real error."""
    good = compile("VALUE = 1\n", "<good>", "exec")
    bad = compile("raise RuntimeError('broken')\n", "<bad>", "exec")
    modules = (("cek8s_imgtest", "cek8s_imgtest/__init__.py", True, good),
               ("cek8s_imgtest.bad", "cek8s_imgtest/bad.py", False, bad))
    assert hookimage.load("/nonexistent", (), modules) is False
    assert "cek8s_imgtest" not in sys.modules and "cek8s_imgtest.bad" not in sys.modules


def test_load_registers_packages_as_the_import_system_would(tmp_path):
    (tmp_path / "cek8s_imgpkg").mkdir()
    (tmp_path / "cek8s_imgpkg" / "__init__.py").write_text("")
    (tmp_path / "cek8s_imgpkg" / "later.py").write_text("LAZY = True\n")
    st = (tmp_path / "cek8s_imgpkg" / "__init__.py").stat()
    modules = (("cek8s_imgpkg", "cek8s_imgpkg/__init__.py", True, compile("", "<init>", "exec")),)
    stamps = (("cek8s_imgpkg/__init__.py", st.st_mtime_ns, st.st_size),)
    try:
        assert hookimage.load(str(tmp_path), stamps, modules) is True
        pkg = sys.modules["cek8s_imgpkg"]
        assert pkg.__path__ == [str(tmp_path / "cek8s_imgpkg")] and pkg.__spec__.origin.endswith("__init__.py")
        from cek8s_imgpkg import later  # a lazy import inside the package still works

        assert later.LAZY is True
    finally:
        for name in ("cek8s_imgpkg", "cek8s_imgpkg.later"):
            sys.modules.pop(name, None)


def test_a_stale_stamp_registers_nothing():
    modules = (("cek8s_imgstale", "x.py", False, compile("", "<x>", "exec")),)
    assert hookimage.load("/", (("nonexistent-file.py", 1, 1),), modules) is False
    assert "cek8s_imgstale" not in sys.modules


def test_installer_writes_images_readable_by_every_account(staged):
    lib, _hooks = staged
    for name in HOOKS:
        image = image_of(lib, name)
        assert image.stat().st_mode & 0o777 == 0o644
        assert image.read_bytes()[:4] == importlib.util.MAGIC_NUMBER


def image_namespace(path: Path) -> dict:
    import marshal

    return marshal.loads(path.read_bytes()[4:])[1]


def test_own_interpreter_launchers_find_socket_by_its_path(staged):
    """The agent call's `_socket` is loaded from the file the image names, not searched for along
    sys.path (no path finder is created for the package root or lib-dynload)."""
    import _socket

    lib, _hooks = staged
    namespace = image_namespace(image_of(lib, "ce-k8s-update"))
    assert namespace["EXTENSIONS"] == {"_socket": os.path.abspath(_socket.__file__)}
    assert namespace["EXECUTABLE"] == sys.executable
    code = (f"import sys, marshal\nsys.path.insert(0, {str(lib)!r})\n"
            f"data = open({str(image_of(lib, 'ce-k8s-update'))!r}, 'rb').read()\n"
            "exec(*marshal.loads(data[4:]))\n"
            "import _socket\n"
            "print(_socket.__spec__.origin)\n"
            "print(sorted(sys.path_importer_cache))")
    res = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, timeout=30, check=True)
    origin, searched = res.stdout.splitlines()
    assert origin == os.path.abspath(_socket.__file__)
    assert repr(str(lib)) not in searched and repr(os.path.dirname(_socket.__file__)) not in searched, searched


def test_another_interpreters_launchers_name_no_extension(tmp_path):
    lib = Path(stage_hook_package(str(tmp_path / "lib")))
    other = tmp_path / "python3"
    other.symlink_to("/usr/bin/python3")
    install_hooks(str(tmp_path / "hooks"), socket_path="/none.sock", hook_timeout=1.0, package_dir=str(lib),
                  python=str(other))
    assert image_namespace(image_of(lib, "ce-k8s-update"))["EXTENSIONS"] == {}


def test_extensions_serve_only_the_launchers_own_interpreter(tmp_path):
    """Two interpreters with one cache tag share an image's name: the extension paths are used only
    in a process whose sys.executable is the one the image was written for."""
    ext = tmp_path / "fake_ext.so"
    ext.write_bytes(b"\x7fELF")

    def finders() -> int:
        return sum(1 for f in sys.meta_path if getattr(f, "__name__", "") == "ce_k8s.hookimage.finder")

    before = finders()
    try:
        assert hookimage.load(str(tmp_path), (), (), {"cek8s_fake_ext": str(ext)}, "/another/python") is True
        assert finders() == before
        assert hookimage.load(str(tmp_path), (), (), {"cek8s_fake_ext": str(ext)}, sys.executable) is True
        assert finders() == before + 1
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") != "ce_k8s.hookimage.finder"]


def test_a_changed_extension_file_rejects_the_image(tmp_path):
    ext = tmp_path / "fake_ext.so"
    ext.write_bytes(b"\x7fELF")
    (tmp_path / "pkg").mkdir()
    data = hookimage.build(str(tmp_path), [], {"cek8s_fake_ext": str(ext)})
    stamps = image_namespace_of_bytes(data)["STAMPS"]
    assert hookimage.load(str(tmp_path), stamps, (), {"cek8s_fake_ext": str(ext)}, sys.executable) is True
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") != "ce_k8s.hookimage.finder"]
    ext.write_bytes(b"\x7fELF changed")
    assert hookimage.load(str(tmp_path), stamps, (), {"cek8s_fake_ext": str(ext)}, sys.executable) is False
    assert not any(getattr(f, "__name__", "") == "ce_k8s.hookimage.finder" for f in sys.meta_path)


def image_namespace_of_bytes(data: bytes) -> dict:
    import marshal

    return marshal.loads(data[4:])[1]


def test_another_interpreter_ignores_extension_files_it_cannot_read(tmp_path):
    """An image shared by two interpreters (one cache tag): the other one neither stats the owner's
    extension files (a pilot account may not read them) nor rejects the modules because of them."""
    code = compile("VALUE = 7\n", "<m>", "exec")
    (tmp_path / "m.py").write_text("VALUE = 7\n")
    st = (tmp_path / "m.py").stat()
    stamps = (("m.py", st.st_mtime_ns, st.st_size), ("/nonexistent/_socket.so", 1, 1))
    modules = (("cek8s_imgother", "m.py", False, code),)
    try:
        assert hookimage.load(str(tmp_path), stamps, modules, {"_socket": "/nonexistent/_socket.so"},
                              "/another/python") is True
        assert sys.modules["cek8s_imgother"].VALUE == 7
    finally:
        sys.modules.pop("cek8s_imgother", None)
    assert hookimage.load(str(tmp_path), stamps, (), {"_socket": "/nonexistent/_socket.so"}, sys.executable) is False
