"""The docs are a map that stays true: every package is named in docs/design.md, every page is
in docs/README.md's map, every relative link resolves, no code comment cites a repository file
that does not exist, and no doc cites a file, module or function that does not exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a repository path in a comment or docstring: docs/x.md, scripts/x.py, tests/x.py, rlcycle/x/y.py, ...
CITED = re.compile(r"(?<![\w/])((?:docs|scripts|tests|experiments|sample_data|sandbox_images|rlcycle)/[\w./-]*\w)")


def test_every_package_is_named_in_the_design_doc():
    design = (REPO / "docs" / "design.md").read_text()
    packages = sorted(p.name for p in (REPO / "rlcycle").iterdir() if (p / "__init__.py").is_file())
    missing = [p for p in packages if f"{p}/" not in design]
    assert not missing, f"docs/design.md's layout does not name these packages: {missing}"


def test_every_doc_page_is_in_the_reading_order():
    index = (REPO / "docs" / "README.md").read_text()
    linked = {m.group(1) for m in LINK.finditer(index)}
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    assert not [p for p in pages if p not in linked], "add these pages to docs/README.md"


def test_relative_links_in_the_readme_and_docs_resolve():
    broken = []
    for page in _doc_pages():  # README.md, CHANGELOG.md, docs/*.md, the experiments' results pages
        for m in LINK.finditer(page.read_text()):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_no_comment_cites_a_missing_file():
    missing = []
    for src in sorted((REPO / "rlcycle").rglob("*.py")):
        if "data" in src.relative_to(REPO / "rlcycle").parts[:1]:
            continue
        for n, line in enumerate(src.read_text().splitlines(), 1):
            for m in CITED.finditer(line):
                path = m.group(1).rstrip(".")
                if any(ch in path for ch in "*<{") or re.search(r"/[A-Z_]+\.", path) or not re.search(r"\.\w+$", path):
                    continue  # a pattern (`configs/NAME.toml`) or a directory, not a file
                if not (REPO / path).exists():
                    missing.append(f"{src.relative_to(REPO)}:{n}: {path}")
    assert not missing, "\n".join(missing)


# --- every name a doc cites exists ---------------------------------------------------------------
# The docs (README.md, CHANGELOG.md, docs/*.md and the experiments' results pages) cite the code by
# repository path (`rlcycle/train/loop.py`, `scripts/dev.sh`), by dotted name (`rlcycle.stats`,
# `rlcycle.cycle.Cycle`), by `module:name` or `file.py:name`, and by a path followed by a
# backticked name ("rlcycle/report/online.py `paired_cells`"). Each one is resolved against the
# tree: paths must exist, names must be defined in the file (read by `ast`, nothing is imported).
# A CHANGELOG bullet that says a thing was removed, renamed or moved may name the old thing.

DOC_PAGES = ["README.md", "CHANGELOG.md", "docs/*.md", "experiments/**/*.md"]
TOPS = ("rlcycle", "experiments", "scripts", "tests")
DOC_PATH = re.compile(
    r"(?<![\w/.~-])((?:\.ci|docs|scripts|tests|experiments|sample_data|sandbox_images|rlcycle)/[\w./*<>{}-]*[\w*>}])"
)
DOTTED = re.compile(r"(?<![\w/.~-])((?:rlcycle|experiments)(?:\.\w+)+)(?::(\w+(?:\.\w+)?))?(?![\w-]|\.\w)")
FILE_NAME = re.compile(r"(?<![\w/.~-])([\w/.-]*\w\.py):(\w+(?:\.\w+)?)")  # loop.py:PACKING_KL, rlcycle/x.py:f
# a path, then a backticked name: "rlcycle/cycle.py, `_stage_deploy`", "`report/online.py` `paired_cells`"
PATH_THEN_NAME = re.compile(r"`?([\w/.-]*\w\.py)`?,? `(?!\w+\.[a-z]+`)(\w+(?:\.\w+)?)(?:\(\))?`")
HISTORY = re.compile(r"\b(removed|deleted|renamed|moved|replaced|went|gone|no longer)\b", re.I)
_DEFS: dict[Path, dict[str, set[str]]] = {}


def _definitions(src: Path) -> dict[str, set[str]]:
    """Top-level names of a Python file, each with the names defined in its body (for `Class.attr`)."""
    if src not in _DEFS:
        tree = ast.parse(src.read_text())
        names: dict[str, set[str]] = {}

        def targets(node: ast.AST) -> list[str]:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return [node.name]
            if isinstance(node, ast.Assign):
                return [t.id for t in node.targets if isinstance(t, ast.Name)]
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                return [node.target.id]
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                return [(a.asname or a.name).split(".")[0] for a in node.names]
            return []

        def walk(body: list[ast.stmt]) -> list[ast.AST]:  # also what `if`/`try` blocks define
            out: list[ast.AST] = []
            for node in body:
                out.append(node)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        out += walk(getattr(node, field, []) or [])
            return out

        for node in walk(tree.body):
            for name in targets(node):
                inner = node.body if isinstance(node, ast.ClassDef) else []
                names.setdefault(name, set()).update(n for child in walk(inner) for n in targets(child))
        if src.name == "__init__.py":  # a package's submodules are its names too
            for sub in src.parent.iterdir():
                if sub.suffix == ".py" or (sub / "__init__.py").is_file():
                    names.setdefault(sub.stem, set())
        _DEFS[src] = names
    return _DEFS[src]


def _defined(src: Path, name: str) -> bool:
    head, _, attr = name.partition(".")
    names = _definitions(src)
    return head in names and (not attr or attr in names[head] or not names[head])


def _dotted_problem(dotted: str, name: str | None) -> str | None:
    """`rlcycle.a.b` (+ `:name`): the longest prefix that is a module, then names defined in it."""
    parts = dotted.split(".")
    if parts[-1] in ("json", "toml", "arrow", "jsonl", "md") and not name:
        return None  # `rlcycle.manifest.json`: a file name, not a module
    where = REPO
    for i, part in enumerate(parts):
        if (where / part / "__init__.py").is_file() or (where / part).is_dir() and i == 0:
            where = where / part
        elif (where / f"{part}.py").is_file():
            where = where / f"{part}.py"
            rest = parts[i + 1 :]
            break
        else:
            src = where / "__init__.py"
            rest = parts[i:]
            if not src.is_file():
                return f"no module {'.'.join(parts[: i + 1])}"
            if where == REPO / parts[0] and len(rest) == 1 and not name:
                return None  # `rlcycle.json`, `rlcycle.owner`: a metadata key or a label, not a module
            where = src
            break
    else:
        rest = []
        where = where / "__init__.py" if where.is_dir() else where
    attrs = [".".join(rest[:2])] if rest else []
    if name:
        if rest:
            return f"{dotted} is not a module"
        attrs = [name]
    for attr in attrs:
        if not where.is_file() or not _defined(where, attr):
            return f"{attr} is not defined in {where.relative_to(REPO)}"
    return None


def _py_file(cited: str) -> list[Path]:
    """A cited .py file: the path itself, or (a bare or partial name) every file that ends so."""
    if (REPO / cited).is_file():
        return [REPO / cited]
    found = []
    for top in TOPS:
        found += [p for p in (REPO / top).rglob(Path(cited).name) if p.as_posix().endswith("/" + cited)]
    return found


def _doc_pages() -> list[Path]:
    return sorted({p for pattern in DOC_PAGES for p in REPO.glob(pattern)})


def _bullets(page: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph or list item, so a reference split over lines is
    whole; in a fenced block each line alone, less its string literals (an agent's prompt) and less
    tree listings (`  tests/test_dates.py   visible tests`, a path inside a task, not the repo's)."""
    out: list[tuple[int, str]] = []
    start, buf, fenced = 0, [], False
    for n, line in enumerate(page.read_text().splitlines() + [""], 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            line = ""
        elif fenced:
            if not re.match(r"\s+[\w./-]+/?\s{2,}\S", line):
                out.append((n, re.sub(r'"[^"]*"', '""', line)))
            line = ""
        new_item = re.match(r"\s*(?:[-*] |\d+\. |#|\|)", line) or not line.strip()
        if new_item and buf:
            out.append((start, " ".join(buf)))
            buf = []
        if line.strip():
            if not buf:
                start = n
            buf.append(line.strip())
    return out


def _problems(page: Path) -> list[str]:
    found = []
    for n, text in _bullets(page):
        where = f"{page.relative_to(REPO) if page.is_relative_to(REPO) else page.name}:{n}"
        if page.name == "CHANGELOG.md" and HISTORY.search(text) or "removed since" in text:
            continue  # an entry about the old name; a results page's script kept as it ran
        for m in DOC_PATH.finditer(text):
            path = m.group(1).rstrip(".")
            if any(ch in path for ch in "*<{") or re.search(r"/[A-Z_]+(?:\.|$)", path) or "XX" in path:
                continue  # a pattern (`configs/NAME.toml`, `edit-range-*`), not a path
            if not (REPO / path).exists():
                found.append(f"{where}: no file {path}")
        for m in DOTTED.finditer(text):
            problem = _dotted_problem(m.group(1), m.group(2))
            if problem:
                found.append(f"{where}: {m.group(0)}: {problem}")
        for m in [*FILE_NAME.finditer(text), *PATH_THEN_NAME.finditer(text)]:
            cited, name = m.group(1), m.group(2)
            files = _py_file(cited)
            if not files:
                found.append(f"{where}: no file {cited}")
            elif not any(_defined(f, name) for f in files):
                found.append(f"{where}: {name} is not defined in {cited}")
    return found


def test_docs_cite_only_files_and_names_that_exist():
    problems = [p for page in _doc_pages() for p in _problems(page)]
    assert not problems, "\n".join(problems)


def test_the_doc_reference_check_catches_a_renamed_function(tmp_path):
    page = tmp_path / "page.md"
    good = "`rlcycle/stats.py` `paired_difference`, `rlcycle.stats:paired_difference`, `rlcycle.cycle.Cycle`."
    page.write_text(good)
    assert _problems(page) == []
    for bad in [
        "`rlcycle/stats.py` `paired_diff`",
        "`rlcycle.stats:paired_diff`",
        "`rlcycle.stats.paired_diff`",
        "rlcycle/stats.py:paired_diff",
        "`rlcycle.cycle.Cycle.no_such_method`",
        "`rlcycle/no_such_module.py`",
        "`scripts/no_such_script.sh`",
        "`rlcycle.no_such_module.f`",
        "`rlcycle.no_such_module:f`",
        "`python -m rlcycle.policy.no_such_module`",
    ]:
        page.write_text(bad)
        assert _problems(page), bad
