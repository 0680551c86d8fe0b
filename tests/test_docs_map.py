"""The docs are a map that stays true: every package is named in docs/design.md, every page is
in docs/README.md's reading order, every relative link resolves, and no code comment cites a
repository file that does not exist."""

from __future__ import annotations

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
    for page in [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]:
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
