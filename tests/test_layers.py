"""The import graph has floors, and every import points down (docs/design.md, "Layout").

Floors, top to bottom: the CLI; the cycle and the report; the stages; the shared machinery of
production, simulate and eval; the ground floor. A module may import its own floor or a lower
one, never a higher one; a stage never imports another stage; the ground floor imports nothing
of rlcycle's but the ground floor. Imports inside functions count too: an import moved into a
function to dodge a circle is still a circle. Checked over the source with `ast`, so the test
needs nothing installed and sees every import, taken or not.

Above the package: experiments/ (e.g. experiments/closed_loop/) imports rlcycle; rlcycle never
imports experiments/ (a wheel does not ship it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "rlcycle"

FLOORS: dict[str, int] = {
    "cli": 5,
    "__main__": 5,
    "cycle": 4,
    "report": 4,
    "gateway": 4,
    "edits": 4,  # reads gateway logs with collect's readers, writes events: above the stages, like report
    "collect": 3,
    "distill": 3,
    "train": 3,
    "evaluation": 3,
    "deploy": 3,
    "simulate": 3,
    "model_init": 3,
    "inspect": 3,
    "agent": 2,
    "harness": 2,
    "policy": 2,
    "sandbox": 2,
    "tasks": 2,
    "stats": 2,
    "online": 2,
    "rollout": 2,
    "stage": 2,
    "__init__": 1,
    "io": 1,
    "schema": 1,
    "config": 1,
    "errors": 1,
    "console": 1,
    "faults": 1,
    "resources": 1,
    "digest": 1,
    "prompts": 1,
}
STAGE_FLOOR = 3


def _part(module: str) -> str:
    """The top-level part of rlcycle a module belongs to: rlcycle.collect.jsonl -> collect."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _sources(pkg: Path) -> list[Path]:
    """rlcycle's modules; rlcycle/data holds shipped task repos, which are data, not code."""
    return sorted(p for p in pkg.rglob("*.py") if "data" not in p.relative_to(pkg).parts[:1])


def _edges(pkg: Path):
    """(file, line, importer, imported) for every rlcycle import under `pkg`, relative ones
    resolved; `from a import b` names the module a.b when b is a module, else a."""
    modules = {_module_name(p, pkg) for p in _sources(pkg)}
    for path in _sources(pkg):
        here = _module_name(path, pkg)
        package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    keep = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(keep + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for dst in targets:
                if dst.startswith("rlcycle.") and dst != here:
                    yield path, node.lineno, here, dst


def layer_problems(pkg: Path = PKG) -> list[str]:
    problems = []
    for path, line, src, dst in _edges(pkg):
        a, b = _part(src), _part(dst)
        fa, fb = FLOORS.get(a), FLOORS.get(b)
        if a == b or fa is None or fb is None:
            continue  # a part without a floor is reported by its own test
        where = f"{path.relative_to(pkg.parent)}:{line}"
        if fb > fa:
            problems.append(f"{where}: {src} (floor {fa}) imports {dst} (floor {fb}): upward")
        elif fa == fb == STAGE_FLOOR:
            problems.append(f"{where}: stage {a} imports stage {b}: stages talk through files")
    return problems


def circles(pkg: Path = PKG) -> list[set[str]]:
    graph: dict[str, set[str]] = {}
    for _path, _line, src, dst in _edges(pkg):
        graph.setdefault(src, set()).add(dst)
    # A package's __init__ re-exporting its own submodules is not a circle worth naming.
    return [c for c in _strongly_connected(graph) if not _only_package_reexports(c, pkg)]


def test_every_part_of_rlcycle_has_a_floor():
    parts = {_part(_module_name(p, PKG)) for p in _sources(PKG)}
    assert not parts - FLOORS.keys(), f"give these a floor in FLOORS: {sorted(parts - FLOORS.keys())}"


def test_imports_point_down():
    problems = layer_problems()
    assert not problems, "\n".join(problems)


def experiment_imports(pkg: Path = PKG) -> list[str]:
    """file:line of every import of `experiments` (the programs outside the package) under `pkg`."""
    found = []
    for path in _sources(pkg):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n == "experiments" or n.startswith("experiments.") for n in names):
                found.append(f"{path.relative_to(pkg.parent)}:{node.lineno}")
    return found


def test_the_package_never_imports_the_experiments():
    found = experiment_imports()
    assert not found, "rlcycle imports experiments/ (outside the package): " + ", ".join(found)
    assert (PKG.parent / "experiments" / "closed_loop" / "run.py").exists()  # the checker has something to guard


def test_the_experiment_checker_sees_an_import(tmp_path):
    pkg = _fake_package(
        tmp_path,
        {"rlcycle/__init__.py": "", "rlcycle/report/x.py": "def f():\n    from experiments.closed_loop import run\n"},
    )
    assert experiment_imports(pkg) == ["rlcycle/report/x.py:2"]


def test_no_import_circles():
    found = circles()
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def _only_package_reexports(component: set[str], pkg: Path) -> bool:
    packages = [m for m in component if (pkg.parent / m.replace(".", "/") / "__init__.py").exists()]
    return bool(packages) and all(any(m.startswith(p + ".") or m == p for p in packages) for m in component)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative; components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.add(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(comp)
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def _fake_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "rlcycle"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from rlcycle.cli import run\n", "upward"),
        ("def f():\n    from rlcycle import distill\n", "stages talk through files"),
    ],
)
def test_the_checker_sees_a_bad_import(tmp_path, source, expected):
    """The rules can fail: a collect module importing the CLI, or another stage, is reported."""
    pkg = _fake_package(
        tmp_path,
        {
            "rlcycle/__init__.py": "",
            "rlcycle/cli/__init__.py": "",
            "rlcycle/distill/__init__.py": "",
            "rlcycle/collect/__init__.py": "",
            "rlcycle/collect/probe.py": source,
        },
    )
    assert any(expected in p for p in layer_problems(pkg))


def test_the_checker_sees_a_circle_through_a_function_import(tmp_path):
    pkg = _fake_package(
        tmp_path,
        {
            "rlcycle/__init__.py": "",
            "rlcycle/train/__init__.py": "",
            "rlcycle/train/a.py": "from rlcycle.train import b\n",
            "rlcycle/train/b.py": "def f():\n    from rlcycle.train.a import x\n",
        },
    )
    assert circles(pkg) == [{"rlcycle.train.a", "rlcycle.train.b"}]
