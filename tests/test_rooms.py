"""The room table of docs/internals.md ("Rooms and imports") is what the code does.

The table is read from the page, and every import of every module under ce_k8s/ is read from its
source with `ast` (imports inside functions included, and literal `importlib.import_module`
names), so a new import that breaks a rule, or a table row that no longer matches the code, fails
here. The rules themselves are stated under the table; each test below names the one it checks.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ce_k8s"
DOC = ROOT / "docs" / "internals.md"
# Standard-library modules newer than the oldest Python we run on, imported under a try that falls
# back to an older name (pods/names.py: `_sha2` is 3.12's name for 3.11's `_sha256`).
NEWER_STDLIB = frozenset({"_sha2"})
STDLIB = frozenset(sys.stdlib_module_names) | NEWER_STDLIB
# The test beds, each with its sub-rooms: the emulators (sim/), the real environments (real/, which
# may use the emulators' grammars; never the other way round, as the no-cycle rule keeps) and the
# demos that run on either (demos/, which no bed imports).
TEST_BED_ROOMS = ("ce_k8s/sim/", "ce_k8s/real/", "ce_k8s/demos/")
TEST_BED_PACKAGES = tuple(r.rstrip("/").replace("/", ".") for r in TEST_BED_ROOMS)
SIM_COMMAND_WORDS = frozenset({"demo", "sim", "testbed"})


# --------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Permission:
    target: str          # "stdlib", a third-party top-level module, or a path/pattern under ce_k8s/
    lazy_only: bool


@dataclass
class Row:
    room: str            # `ce_k8s/condor/`, `ce_k8s/condor/args.py`, `ce_k8s/condor/cli_*.py`
    owns: str
    allowed: list[Permission] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.room.endswith("/"):
            return "directory"
        return "pattern" if any(c in self.room for c in "*?[") else "file"

    def covers(self, path: str) -> bool:
        if self.kind == "directory":
            return path.startswith(self.room)
        if self.kind == "pattern":
            return fnmatch.fnmatchcase(path, self.room)
        return path == self.room

    def specificity(self) -> tuple[int, int]:
        return ({"file": 2, "pattern": 1, "directory": 0}[self.kind], len(self.room))


_TICKED = re.compile(r"`([^`]+)`")


def parse_table(text: str) -> list[Row]:
    """The rows of the first table after the "## Rooms and imports" heading."""
    section = text.split("## Rooms and imports", 1)[1].splitlines()
    first = next(i for i, ln in enumerate(section) if ln.startswith("|"))
    lines = []
    for ln in section[first:]:  # the table ends at the first line that is not a table row
        if not ln.startswith("|"):
            break
        lines.append(ln)
    rows: list[Row] = []
    for line in lines[2:]:  # header and separator
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"docs/internals.md: a room row needs 3 cells: {line!r}"
        room = _TICKED.fullmatch(cells[0])
        assert room, f"docs/internals.md: the room cell must be one `path`: {cells[0]!r}"
        row = Row(room.group(1), cells[1])
        for item in (i.strip() for i in cells[2].split(",")):
            lazy = item.endswith("(lazy)")
            item = item.removesuffix("(lazy)").strip()
            ticked = _TICKED.fullmatch(item)
            target = ticked.group(1) if ticked else item
            assert target == "stdlib" or ticked, f"docs/internals.md: {row.room}: unreadable entry {item!r}"
            row.allowed.append(Permission(target, lazy))
        rows.append(row)
    return rows


@cache
def table() -> tuple[Row, ...]:
    return tuple(parse_table(DOC.read_text()))


_EXCEPTION = re.compile(r"^\* `(ce_k8s/[^`]+\.py)` → `(ce_k8s/[^`]+\.py)`", re.MULTILINE)


@cache
def known_exceptions() -> frozenset[tuple[str, str]]:
    """(importer, imported) pairs the page lists under "Known exceptions" (a debt, not a rule)."""
    section = DOC.read_text().split("## Rooms and imports", 1)[1].split("\n## ", 1)[0]
    listed = section.split("Known exceptions", 1)[1] if "Known exceptions" in section else ""
    return frozenset(_EXCEPTION.findall(listed))


def row_of(path: str) -> Row | None:
    matching = [r for r in table() if r.covers(path)]
    return max(matching, key=Row.specificity) if matching else None


# --------------------------------------------------------------------------------------------
# The code


@dataclass(frozen=True)
class Import:
    module: str          # dotted name as written (resolved for relative imports)
    line: int
    lazy: bool           # inside a function


def module_path(name: str) -> str | None:
    """`ce_k8s/condor/wire.py` for "ce_k8s.condor.wire"; the package's __init__.py for a package."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(ROOT).as_posix()
    return None


def dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path) -> list[Import]:
    """Every import the module can execute: top level, in functions, and literal import_module names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = dotted(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, lazy)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lazy = True
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, lazy) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:  # `from ce_k8s import protocol` imports the module ce_k8s.protocol
                sub = f"{mod}.{alias.name}"
                found.append(Import(sub if module_path(sub) else mod, node.lineno, lazy))
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append(Import(arg.value, node.lineno, True))
        for child in ast.iter_child_nodes(node):
            visit(child, lazy)

    visit(tree, False)
    if name == "ce_k8s.cli":
        found.extend(Import(module, line, True) for _words, module, line in cli_commands())
    return found


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


@cache
def cli_commands() -> tuple[tuple[tuple[str, ...], str, int], ...]:
    """(words, module, line) of each entry of ce_k8s.cli.COMMANDS, read from the source."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "COMMANDS":
            entries = []
            for elt in node.value.elts:
                words = tuple(w.value for w in elt.elts[0].elts)
                entries.append((words, elt.elts[1].value, elt.lineno))
            return tuple(entries)
    raise AssertionError("ce_k8s/cli.py has no COMMANDS table")


def modules() -> Iterator[Path]:
    yield from sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def top_level_module(name: str) -> str:
    return name.split(".")[0]


def is_stdlib(name: str) -> bool:
    return top_level_module(name) in STDLIB or name == "__future__"


def target_allowed(row: Row, importer: str, imp: Import) -> bool:
    if is_stdlib(imp.module):
        return True
    if top_level_module(imp.module) != "ce_k8s":
        return any(p.target == top_level_module(imp.module) and (imp.lazy or not p.lazy_only) for p in row.allowed)
    target = module_path(imp.module)
    assert target is not None, f"{importer}:{imp.line}: imports {imp.module}, which does not exist"
    if target == "ce_k8s/__init__.py":
        return True  # the empty top-level package
    if row.kind == "directory" and target.startswith(row.room):
        return True  # its own room
    for p in row.allowed:
        if p.target in ("stdlib",) or not p.target.startswith("ce_k8s/"):
            continue
        if Row(p.target, "").covers(target) and (imp.lazy or not p.lazy_only):
            return True
    return False


# --------------------------------------------------------------------------------------------
# Tests: the table itself


def test_the_table_names_real_rooms_and_files():
    """Every room path exists, and every `file.py` a row says it owns is in that room."""
    assert len(table()) >= 10
    for row in table():
        if row.kind == "directory":
            assert (ROOT / row.room).is_dir(), f"{row.room}: no such directory"
            for owned in re.findall(r"`([\w/]+\.py)`", row.owns):
                assert (ROOT / row.room / owned).is_file(), f"{row.room} owns {owned}, which does not exist"
        elif row.kind == "file":
            assert (ROOT / row.room).is_file(), f"{row.room}: no such module"
        else:
            assert list(ROOT.glob(row.room)), f"{row.room}: matches no module"


def test_every_module_belongs_to_a_row():
    """No module is outside the table (the empty top-level package aside)."""
    orphans = [rel(p) for p in modules() if rel(p) != "ce_k8s/__init__.py" and row_of(rel(p)) is None]
    assert not orphans, f"modules in no row of docs/internals.md: {orphans}"


def test_parse_table_reads_lazy_and_third_party_entries():
    """The reader itself: `(lazy)`, bare names and paths are told apart (guards the other tests)."""
    rows = parse_table("## Rooms and imports\n\n| room | owns | may import |\n|---|---|---|\n"
                       "| `ce_k8s/x/` | x | stdlib, `kubernetes` (lazy), `ce_k8s/y.py` |\n\nafter\n")
    assert [(r.room, r.kind) for r in rows] == [("ce_k8s/x/", "directory")]
    assert rows[0].allowed == [Permission("stdlib", False), Permission("kubernetes", True),
                               Permission("ce_k8s/y.py", False)]


# --------------------------------------------------------------------------------------------
# Tests: the code against the table


@pytest.mark.parametrize("path", [rel(p) for p in modules() if rel(p) != "ce_k8s/__init__.py"],
                         ids=lambda p: p.removeprefix("ce_k8s/"))
def test_module_imports_only_what_its_row_allows(path):
    """Each import is stdlib, the room's own directory, or listed in the row ("(lazy)": in a function)."""
    row = row_of(path)
    assert row is not None, f"{path} is in no row of docs/internals.md"
    bad = [f"{path}:{imp.line}: {imp.module}{' (lazy)' if imp.lazy else ''}"
           for imp in imports_of(ROOT / path) if not target_allowed(row, path, imp)]
    assert not bad, f"not allowed by the row `{row.room}` of docs/internals.md:\n" + "\n".join(bad)


def test_a_row_outside_the_test_bed_that_imported_it_would_fail():
    """The check is not vacuous: the agent row does not allow ce_k8s/sim, lazily or not."""
    agent = row_of("ce_k8s/agent/agent.py")
    assert agent is not None
    assert not target_allowed(agent, "ce_k8s/agent/agent.py", Import("ce_k8s.sim.kube.apiserver", 1, True))
    assert not target_allowed(row_of("ce_k8s/hooks/update.py"), "ce_k8s/hooks/update.py",
                              Import("classad2", 1, True))
    pods = row_of("ce_k8s/pods/builder.py")
    assert not target_allowed(pods, "ce_k8s/pods/builder.py", Import("jsonpatch", 1, False))  # lazy only
    assert target_allowed(pods, "ce_k8s/pods/builder.py", Import("jsonpatch", 1, True))


def test_hooks_load_only_the_standard_library():
    """Everything reachable from a hook module, through every ce_k8s module it imports, is stdlib."""
    start = [p for p in modules() if rel(p).startswith("ce_k8s/hooks/")]
    seen: set[str] = set()
    todo = [rel(p) for p in start]
    problems = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for imp in imports_of(ROOT / path):
            if is_stdlib(imp.module):
                continue
            target = module_path(imp.module) if top_level_module(imp.module) == "ce_k8s" else None
            if target is None:
                problems.append(f"{path}:{imp.line}: {imp.module}")
            else:
                todo.append(target)
    assert not problems, "the hooks would load non-stdlib modules:\n" + "\n".join(problems)
    assert {"ce_k8s/protocol.py", "ce_k8s/pods/names.py"} <= seen  # what they do reach, so the walk walked


def test_no_room_that_runs_on_a_ce_imports_the_test_bed():
    """Only the test beds themselves (ce_k8s/real may use ce_k8s/sim, ce_k8s/demos both), and
    ce_k8s/cli.py lazily for demo/sim/testbed, may import ce_k8s/sim, ce_k8s/real or ce_k8s/demos."""
    def bed(target: str) -> bool:
        return any(target.startswith(r) or r.startswith(target) for r in TEST_BED_ROOMS)

    for row in table():
        if row.room.startswith(TEST_BED_ROOMS):
            continue
        for p in row.allowed:
            if bed(p.target):
                assert row.room == "ce_k8s/cli.py" and p.lazy_only, f"{row.room} may import {p.target}"
    for words, module, line in cli_commands():
        if module.startswith(tuple(p + "." for p in TEST_BED_PACKAGES)):
            assert words[0] in SIM_COMMAND_WORDS, f"cli.py:{line}: '{' '.join(words)}' loads the test bed"
    for path in modules():
        if rel(path).startswith(TEST_BED_ROOMS) or rel(path) == "ce_k8s/cli.py":
            continue
        bad = [i for i in imports_of(path) if i.module.startswith(TEST_BED_PACKAGES)]
        assert not bad, f"{rel(path)}:{bad[0].line} imports {bad[0].module}"


def test_the_emulators_never_import_the_real_beds_and_no_bed_imports_the_demos():
    """ce_k8s/sim imports neither ce_k8s/real nor ce_k8s/demos; ce_k8s/real does not import ce_k8s/demos."""
    forbidden = {"ce_k8s/sim/": ("ce_k8s.real", "ce_k8s.demos"), "ce_k8s/real/": ("ce_k8s.demos",)}
    for path in modules():
        for room, targets in forbidden.items():
            if rel(path).startswith(room):
                bad = [i for i in imports_of(path) if i.module.startswith(targets)]
                assert not bad, f"{rel(path)}:{bad[0].line} imports {bad[0].module}"


def test_no_module_cycle_at_start_up():
    """Top-level imports between ce_k8s modules form no cycle (package __init__ files aside)."""
    graph = {rel(p): {t for i in imports_of(p) if not i.lazy and top_level_module(i.module) == "ce_k8s"
                      and (t := module_path(i.module)) and not t.endswith("__init__.py")}
             for p in modules()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle at start-up: " + " -> ".join(cycle or [])


def row_graph() -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """(row -> rows it imports, counting lazy imports, without the known exceptions; the module pairs seen)."""
    graph: dict[str, set[str]] = {}
    pairs: set[tuple[str, str]] = set()
    for p in modules():
        row = row_of(rel(p))
        if row is None:
            continue
        for i in imports_of(p):
            target = module_path(i.module) if top_level_module(i.module) == "ce_k8s" else None
            other = row_of(target) if target else None
            if other is None or other.room == row.room:
                continue
            pairs.add((rel(p), target))
            if (rel(p), target) not in known_exceptions():
                graph.setdefault(row.room, set()).add(other.room)
    return graph, pairs


def test_no_cycle_between_rows():
    """No two rows import each other, counting lazy imports (the rooms form layers)."""
    graph, _pairs = row_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "rows import each other: " + " -> ".join(cycle or [])


def test_known_exceptions_are_still_there():
    """Each "Known exceptions" line names an import the code still has: a paid debt is struck off."""
    _graph, pairs = row_graph()
    gone = sorted(known_exceptions() - pairs)
    assert not gone, f"docs/internals.md lists exceptions the code no longer has: {gone}"


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) in (["a", "b", "c", "a"], ["b", "c", "a", "b"],
                                                                ["c", "a", "b", "c"])
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_cli_only_parses_and_dispatches():
    """cli.py imports only the stdlib at start-up; each command module has add_arguments and run."""
    top = [i for i in imports_of(PACKAGE / "cli.py") if not i.lazy]
    assert all(is_stdlib(i.module) for i in top), top
    for words, module, line in cli_commands():
        path = module_path(module)
        assert path is not None, f"cli.py:{line}: {module} does not exist"
        defined = {n.name for n in ast.parse((ROOT / path).read_text()).body if isinstance(n, ast.FunctionDef)}
        assert {"add_arguments", "run"} <= defined, f"{path} ('{' '.join(words)}') lacks add_arguments/run"
