"""The product cites only documents it ships, and every section it cites exists (docs/design.md Decision 12).

Why a test: the code and the configuration explain themselves by pointing at sections of
`docs/hook-protocol.md` ("§2.3"), `docs/htcondor-ce.md` and `docs/design.md` ("Decision 5").
A citation of a document that is not in the repository, or of a section that was renumbered or
never existed, sends a reader nowhere; nothing else notices, so this test does.

The rules:

* nothing names the research notes the project was started from (the document names in
  `_UNSHIPPED`) or a path outside the checkout (`../shared`);
* every `<doc>.md §n`, `§n.m`, `§n-m` names a heading `n.`/`n.m` of `docs/<doc>.md`; a `§` in a
  docs page without a document name before it on its line cites that page itself; anywhere else
  a `§` must name its document on the same line (`docs/hook-protocol.md §2.3, §8`);
* every `Decision n` on a line that names `design.md` is a `### Decision n:` heading there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# What the product consists of; .venv, caches and egg-info are not product.
SCANNED = ("ce_k8s", "config.d", "routes", "docs", "containers", "bench", "tests", "examples", "fuzz", ".ci",
           "README.md", "CONTRIBUTING.md", "pyproject.toml")
SKIPPED_PARTS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache"})
SKIPPED_SUFFIXES = frozenset({".pyc", ".png", ".jpg", ".gz", ".tar", ".whl", ".so"})

# Built from pieces so that this file does not match its own patterns.
_UNSHIPPED = ("jobrouter" + "-protocol.md", "DESIGN" + ".md", "peer" + "-systems.md",
              "testbed" + "-measurements.md", "reference/" + "htcondor-ce.md")
_FORBIDDEN = re.compile("|".join([re.escape("../" + "shared"), re.escape("shared" + "/reference"),
                                  r"\bDESIGN" + r" decisions?\b", *map(re.escape, _UNSHIPPED)]))
_DOC = re.compile(r"([A-Za-z][\w-]*)\.md\b")
_NUM = r"\d+[a-z]?(?:\.\d+)*"
_SECTION = re.compile(rf"§\s?({_NUM})(?:\s?[-–]\s?§?({_NUM}))?")
_DECISION = re.compile(r"\b[Dd]ecisions?\s+(\d+)((?:\s*(?:[-–,]|and)\s*\d+)*)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")


def product_files() -> list[Path]:
    """Every text file of the product, this test excluded."""
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for file in candidates:
            if not file.is_file() or SKIPPED_PARTS & set(file.parts) or file.suffix in SKIPPED_SUFFIXES:
                continue
            if file.resolve() == Path(__file__).resolve():
                continue
            files.append(file)
    return files


def lines_of(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []


def headings(doc: Path) -> tuple[set[str], set[str]]:
    """Section numbers (`2`, `2.3`, `3b`) and decision numbers of a docs page's headings."""
    sections: set[str] = set()
    decisions: set[str] = set()
    fenced = False
    for line in lines_of(doc):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else _HEADING.match(line)
        if not m:
            continue
        title = m.group(1)
        d = re.match(r"Decision (\d+)\b", title)
        if d:
            decisions.add(d.group(1))
        first = title.split(maxsplit=1)[0] if title.split() else ""
        for part in first.rstrip(".:").split("/"):
            if re.fullmatch(_NUM, part):
                sections.add(part)
    return sections, decisions


_CACHE: dict[str, tuple[set[str], set[str]] | None] = {}


def page(name: str) -> tuple[set[str], set[str]] | None:
    """Headings of docs/<name>.md, or None when docs/ has no such page."""
    if name not in _CACHE:
        doc = DOCS / f"{name}.md"
        _CACHE[name] = headings(doc) if doc.is_file() else None
    return _CACHE[name]


_TAIL_DOC = re.compile(r"([A-Za-z][\w-]*)\.md`?$")


def section_problems(path: Path, lineno: int, line: str, previous: str = "") -> list[str]:
    """Broken `§` citations on one line; a line that opens with `§` may take its document from the
    end of the line before (`... (hook-protocol.md` / `§0) ...`)."""
    problems = []
    here = f"{path.relative_to(ROOT)}:{lineno}"
    own = path.stem if path.parent == DOCS and path.suffix == ".md" else None
    tail = _TAIL_DOC.search(previous.rstrip())
    for m in _SECTION.finditer(line):
        names = _DOC.findall(line[:m.start()])
        if not names and tail and not line[:m.start()].strip(" (`*#"):
            names = [tail.group(1)]
        doc = names[-1] if names else own
        if doc is None:
            problems.append(f"{here}: '{m.group(0)}' names no document (write e.g. 'docs/hook-protocol.md "
                            f"{m.group(0)}')")
            continue
        found = page(doc)
        if found is None:
            problems.append(f"{here}: '{doc}.md {m.group(0)}' cites a document that is not in docs/")
            continue
        for number in filter(None, m.groups()):
            if number not in found[0]:
                problems.append(f"{here}: '{doc}.md §{number}' is not a heading of docs/{doc}.md")
    return problems


def decision_problems(path: Path, lineno: int, line: str) -> list[str]:
    at = line.find("design.md")
    if at < 0:
        return []
    _, decisions = page("design")
    problems = []
    for m in _DECISION.finditer(line, at):
        numbers = [m.group(1), *re.findall(r"\d+", m.group(2))]
        for number in numbers:
            if number not in decisions:
                problems.append(f"{path.relative_to(ROOT)}:{lineno}: 'Decision {number}' is not a heading of "
                                "docs/design.md")
    return problems


# Pages whose headings are cited by name as well (`design.md "kmock 0.8, measured"`).
# every page of docs/: a citation "<page>.md, \"Heading\"" must name the start of one of its headings
_NAMED = tuple(sorted(p.stem for p in DOCS.glob("*.md")))
_NAMED_CITATION = re.compile(r"\b(" + "|".join(map(re.escape, _NAMED)) + r")\.md\)?`?,? \"([^\"]+)\"")


def titles(doc: Path) -> list[str]:
    fenced = False
    found = []
    for line in lines_of(doc):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else _HEADING.match(line)
        if m:
            found.append(m.group(1).replace("`", "").lower())
    return found


def named_problems(path: Path, lineno: int, line: str) -> list[str]:
    """`<page>.md "Heading"` must name the start of a heading of that page."""
    return [f"{path.relative_to(ROOT)}:{lineno}: '{m.group(0)}' is not a heading of docs/{m.group(1)}.md"
            for m in _NAMED_CITATION.finditer(line)
            if not any(t.startswith(m.group(2).replace("`", "").lower()) for t in titles(DOCS / f"{m.group(1)}.md"))]


def test_nothing_in_the_product_names_a_document_it_does_not_ship():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in product_files() for n, line in enumerate(lines_of(path), 1) if _FORBIDDEN.search(line)]
    assert not found, "cite docs/ instead:\n" + "\n".join(found)


def test_every_section_citation_resolves_to_a_heading_in_docs():
    problems = []
    for path in product_files():
        lines = lines_of(path)
        for n, line in enumerate(lines, 1):
            problems += section_problems(path, n, line, lines[n - 2] if n > 1 else "")
    assert not problems, "\n".join(problems)


def test_every_decision_citation_resolves_to_a_heading_of_design_md():
    problems = [p for path in product_files() for n, line in enumerate(lines_of(path), 1)
                for p in decision_problems(path, n, line)]
    assert not problems, "\n".join(problems)


def test_every_named_heading_citation_resolves():
    problems = [p for path in product_files() for n, line in enumerate(lines_of(path), 1)
                for p in named_problems(path, n, line)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_it_claims():
    """The rules fail on the mistakes they exist for (so the tests above cannot pass vacuously)."""
    assert page("hook-protocol") is not None and "2.3" in page("hook-protocol")[0]
    assert {"1", "12"} <= page("design")[1]
    code = ROOT / "ce_k8s" / "x.py"
    assert section_problems(code, 1, "see docs/hook-protocol.md §2.3, §8") == []
    assert section_problems(code, 1, "see docs/hook-protocol.md §2.1-2.7") == []
    assert len(section_problems(code, 1, "see hook-protocol.md §2.9")) == 1
    assert len(section_problems(code, 1, "(§2.3)")) == 1                   # bare outside docs/
    assert section_problems(code, 2, "§0) so ...", "forks per poll (hook-protocol.md") == []
    assert len(section_problems(code, 2, "and §0", "forks per poll (hook-protocol.md")) == 1
    assert len(section_problems(code, 1, "see nowhere.md §1")) == 1       # not a docs page
    assert section_problems(DOCS / "hook-protocol.md", 1, "as in §4.4") == []
    assert decision_problems(code, 1, "docs/design.md Decisions 4-5") == []
    assert len(decision_problems(code, 1, "docs/design.md Decision 99")) == 1
    assert named_problems(code, 1, 'see docs/design.md "kmock 0.8, measured"') == []
    assert len(named_problems(code, 1, 'see docs/design.md "No such heading"')) == 1
    assert named_problems(code, 1, 'see docs/internals.md, "ce_k8s.condor.config"') == []   # `...` in the heading
    assert len(named_problems(code, 1, 'see docs/reliability.md, "Open findings"')) == 1    # every page is checked
    assert _FORBIDDEN.search("see " + "../" + "shared/x")
    assert _FORBIDDEN.search("DESIGN" + " decision 5")
    assert not _FORBIDDEN.search("docs/design.md Decision 5")
