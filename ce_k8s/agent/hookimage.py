"""Hook images: each hook's modules precompiled into one file that its launcher loads in one read.

Why: the router starts one update hook per routed job per poll (docs/hook-protocol.md §8), and
issue 17 prices the CE's steady state against the bare `python -S` starts the router forces.
Importing the update hook's five `ce_k8s` modules through the import system costs ~1 ms of CPU
per process on top of a ~8.5 ms bare start (a path finder per directory, a directory listing,
a `stat` and an open per `.pyc`, a spec and a loader per module); the same code objects read
from one file with `marshal` cost ~0.6 ms (docs/performance.md "Steady state at size"). This is
what CPython itself does for its start-up modules (frozen modules).

An image is `<root>/ce_k8s/hooks/__pycache__/<launcher>.<cache tag>.image`:

    the interpreter's bytecode magic number (4 bytes)
    marshal((loader, {"STAMPS": stamps, "MODULES": modules, "EXTENSIONS": extensions,
                      "EXECUTABLE": executable}))
        loader     = the code of `load` below and a call of it (the launcher `exec`s it)
        stamps     = ((path, st_mtime_ns, st_size), ...)  one per source file (relative to the
                     root) and one per extension file (absolute)
        modules    = ((module name, relative path, is package, code object), ...)  parents and
                     dependencies first, so each module finds what it imports already executed
        extensions = {module name: absolute path}: found by path, see `build`
        executable = the interpreter the extension paths belong to

A launcher uses its image only when every check passes: the file reads whole, the magic number
is its own interpreter's, and every source file still has the recorded mtime and size (the
`.pyc` rule, so an upgraded or edited package is never run from a stale image). On any doubt,
or if executing a module fails, it removes what it registered and imports normally, so an image
can make a hook faster and never different. `ce-k8s agent --install-hooks` writes the images
with the launchers (`launchers.install_hooks`); a read-only tree only loses the speed.
"""

from __future__ import annotations

import ast
import importlib.util
import marshal
import os
import sys

IMAGE_DIR = "ce_k8s/hooks/__pycache__"


def image_name(launcher: str, cache_tag: str | None = None) -> str:
    """The image file of one launcher (`ce-k8s-update`) for an interpreter's cache tag."""
    return f"{launcher}.{cache_tag or sys.implementation.cache_tag}.image"


def module_file(root: str, name: str) -> tuple[str, bool] | None:
    """(relative path, is package) of `ce_k8s` module `name` under `root`, None if absent."""
    rel = name.replace(".", "/")
    for candidate, is_pkg in ((rel + "/__init__.py", True), (rel + ".py", False)):
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate, is_pkg
    return None


def _top_level_imports(tree: ast.Module, name: str, is_pkg: bool) -> list[str]:
    """`ce_k8s` modules a module imports when it is executed (statements at module level, also
    inside module-level `if`/`try`; imports inside functions run later and go through the normal
    import system). `from ce_k8s import protocol` names the submodule `ce_k8s.protocol`."""
    package = name if is_pkg else name.rpartition(".")[0]
    found: list[str] = []
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append(base)
            found += [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.If) and not _is_type_checking(node.test):
            stack[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack[:0] = node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody
    return [m for m in found if m == "ce_k8s" or m.startswith("ce_k8s.")]


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def closure(root: str, modules: list[str]) -> list[tuple[str, str, bool]]:
    """Every `ce_k8s` module that importing `modules` executes, as (name, relative path, is
    package), in an order where parents and imports come before the modules that need them."""
    order: list[tuple[str, str, bool]] = []
    done: set[str] = set()
    active: set[str] = set()

    def visit(name: str) -> None:
        if name in done or name in active:
            return
        found = module_file(root, name)
        if found is None:       # `from ce_k8s.x import name` where name is not a module
            return
        rel, is_pkg = found
        active.add(name)
        parent = name.rpartition(".")[0]
        if parent:
            visit(parent)
        with open(os.path.join(root, rel), "rb") as fh:
            tree = ast.parse(fh.read(), filename=rel)
        for dep in _top_level_imports(tree, name, is_pkg):
            visit(dep)
        active.discard(name)
        done.add(name)
        order.append((name, rel, is_pkg))

    for name in modules:
        visit(name)
    return order


def build(root: str, modules: list[str], extensions: dict[str, str] | None = None,
          executable: str | None = None) -> bytes:
    """The image of `modules` (and what they import) from the sources under `root`.

    `extensions`: extension modules a hook imports lazily (`_socket`, for the agent call), by name
    and absolute file path, for an image whose launcher runs this very interpreter. The launcher
    then loads them from that path instead of searching `sys.path` for them (a directory listing
    of the package root, the standard library and `lib-dynload`: ~0.2 ms when the root is a
    site-packages). Their files are stamped like the sources, and they are used only by a process
    whose `sys.executable` is `executable` (the launcher's interpreter): two interpreters with the
    same cache tag share the image's name, and only one of them owns those files.
    """
    stamps, entries = [], []
    for name, rel, is_pkg in closure(root, modules):
        path = os.path.join(root, rel)
        st = os.stat(path)
        with open(path, "rb") as fh:
            code = compile(fh.read(), path, "exec", dont_inherit=True)
        stamps.append((rel, st.st_mtime_ns, st.st_size))
        entries.append((name, rel, is_pkg, code))
    for path in (extensions or {}).values():
        if not os.path.isabs(path):
            raise ValueError(f"extension path {path!r} is not absolute")
        st = os.stat(path)
        stamps.append((path, st.st_mtime_ns, st.st_size))
    namespace = {"STAMPS": tuple(stamps), "MODULES": tuple(entries), "EXTENSIONS": dict(extensions or {}),
                 "EXECUTABLE": executable}
    return importlib.util.MAGIC_NUMBER + marshal.dumps((loader_code(), namespace))


def loader_code():
    """The code a launcher executes from the image: `load` below, called on the launcher's root.

    Compiled from `load`'s own source, so what runs in a hook is the function tested here. The
    launcher puts its root first on `sys.path` before it reads the image.
    """
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(load))
    return compile(f"import sys\n{source}\nload(sys.path[0], STAMPS, MODULES, EXTENSIONS, EXECUTABLE)\n",
                   __file__, "exec", dont_inherit=True)


def write(root: str, launcher: str, modules: list[str], extensions: dict[str, str] | None = None,
          executable: str | None = None) -> str:
    """Build and write the image of one launcher under `root`; returns its path.

    Written to a temporary name and renamed, so a hook never reads half an image; readable by
    every account (the hooks run as the pilot accounts), like the `.pyc` beside it.
    """
    directory = os.path.join(root, IMAGE_DIR)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    path = os.path.join(directory, image_name(launcher))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(build(root, modules, extensions, executable))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def load(root, stamps, modules, extensions=None, executable=None):
    """Register and execute `modules` (an image's, sources under `root`); False if not used.

    Runs in a hook process before anything is imported, so it uses only `sys` and the built-in
    `posix`. Nothing is registered unless every stamped file (relative: under `root`) still has
    its recorded mtime and size. The extension files (absolute paths) count only in a process of
    `executable`, the only one that uses them: another interpreter may not even read them. If
    executing a module fails, everything registered is removed again, so the launcher's normal
    import then runs (and shows the error) as if there were no image. `extensions` (name -> path)
    are found by a finder first on `sys.meta_path` when, and only when, something imports them.
    """
    import posix

    own_extensions = bool(extensions) and sys.executable == executable
    try:
        for rel, mtime_ns, length in stamps:
            if rel[:1] == "/" and not own_extensions:
                continue
            st = posix.stat(rel if rel[:1] == "/" else root + "/" + rel)
            if st.st_mtime_ns != mtime_ns or st.st_size != length:
                return False
        registry = sys.modules
        spec_type = registry["_frozen_importlib"].ModuleSpec
    except (OSError, KeyError, AttributeError, TypeError, ValueError):
        return False
    added = []
    try:
        for name, rel, is_pkg, code in modules:
            if name in registry:
                raise ImportError(name)
            path = root + "/" + rel
            module = type(sys)(name)
            spec = spec_type(name, None, origin=path, is_package=is_pkg)
            spec.has_location = True
            module.__file__ = path
            module.__spec__ = spec
            if is_pkg:
                module.__path__ = spec.submodule_search_locations = [path.rpartition("/")[0]]
                module.__package__ = name
            else:
                module.__package__ = name.rpartition(".")[0]
            registry[name] = module
            added.append(name)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(registry[parent], child, module)
            exec(code, module.__dict__)  # noqa: S102 - our own modules' code, compiled by the installer
    except Exception:  # any failure: undo, and let the normal import show the error
        for name in added:
            registry.pop(name, None)
        return False
    if own_extensions:
        external = registry["_frozen_importlib_external"]

        def find_spec(name, path=None, target=None):
            origin = extensions.get(name)
            if origin is None:
                return None
            return external.spec_from_file_location(name, origin, loader=external.ExtensionFileLoader(name, origin))

        finder = type(sys)("ce_k8s.hookimage.finder")      # a module is enough: only find_spec is asked
        finder.find_spec = find_spec
        sys.meta_path.insert(0, finder)
    return True
