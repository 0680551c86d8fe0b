"""Generate the edit suite: small, real one-line coding requests a tiny policy can sometimes get right.

What goes in: a seed. What comes out: a task suite in rlcycle's format (docs/tasks.md), one
task per directory, split into `train/` (the variants the warm start learns from) and
`heldout/` (variants it never sees), each task a one-file repository of a few lines:

    python scripts/gen_edit_tasks.py --seed 0 --out sample_data/edit_tasks
    rlcycle tasks check sample_data/edit_tasks --grade    # reference passes, doing nothing fails

Six families, each a kind of one-line fix with a clear location, several variants per family
(other names, values, messages), graded difficulty:

    family    the fix                                   difficulty
    string    correct a typo in a message                1  (both texts are in the request)
    default   change a default argument value            1  (old and new value in the request)
    rename    rename a function                          1  (old and new name in the request)
    compare   use another comparison operator            2  (the operator is named, the line is not)
    range     make a range include its end (off-by-one)  2  (behaviour only: `range(a, n + 1)`)
    return    add the missing `return`                   3  (behaviour only: the function returns None)

Every solution differs from the repo in one place, so the reference script edits with one short
`replace_in_file` (`Helo` -> `Hello`, `8` -> `2`, `age >` -> `age >=`, `, n` -> `, n + 1`,
`result =` -> `return`). The hidden tests check behaviour, not spelling
(e.g. the new default is checked by calling the function without the argument).
Deterministic: the same seed writes the same bytes; an existing --out is replaced.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from rlcycle.io import atomic_dir

MODULE = "app"  # the one file of every repo: the request names it, a small policy learns it once
VARIANTS = 12  # per family: the first TRAIN of a seeded shuffle go to train/, the rest to heldout/
TRAIN = 8


@dataclass
class Spec:
    """One generated task before it is written."""

    id: str
    family: str
    difficulty: int
    instruction: str
    module: str
    before: str
    after: str
    tests: str
    tags: tuple[str, ...]


# --- the families ---------------------------------------------------------------------------
# Each pool entry is one variant: names and values that make a different (but alike) task
# (its first field, a module name, only says what the code is about: every repo is app.py).
# Every module also holds a second, unrelated function so the edit has a place to find.

HELPERS = [
    ('def describe(value):\n    return f"<{value}>"\n', "describe"),
    ("def is_empty(items):\n    return len(items) == 0\n", "is_empty"),
    ("def double(n):\n    return n * 2\n", "double"),
    ("def first(items):\n    return items[0]\n", "first"),
    ("def label(name):\n    return name.upper()\n", "label"),
    ("def halve(n):\n    return n // 2\n", "halve"),
]

STRINGS = [  # module, function, argument, template with {w}, wrong word, right word
    ("greet", "greeting", "name", "{w}, {{name}}!", "Helo", "Hello"),
    ("status", "report", "job", "{w}: {{job}} finished", "Succes", "Success"),
    ("errors", "failure", "path", "{w}: cannot open {{path}}", "Eror", "Error"),
    ("banner", "welcome", "user", "{w} back, {{user}}", "Welcom", "Welcome"),
    ("farewell", "goodbye", "name", "{w}, {{name}}", "Godbye", "Goodbye"),
    ("alerts", "warn", "item", "{w}: {{item}} is low", "Warnnig", "Warning"),
    ("receipt", "thanks", "buyer", "{w} for your order, {{buyer}}", "Thnaks", "Thanks"),
    ("notice", "closed", "shop", "{{shop}} is {w} today", "closd", "closed"),
    ("orders", "shipped", "order", "Order {{order}} has {w}", "shiped", "shipped"),
    ("login", "denied", "user", "{w} denied for {{user}}", "Acess", "Access"),
    ("backup", "saved", "file", "{{file}} was {w}", "savd", "saved"),
    ("quiz", "correct", "answer", "{w}! The answer is {{answer}}", "Corect", "Correct"),
]

DEFAULTS = [  # module, function, argument, parameter, expression
    ("server", "connect", "host", "port", 'f"{host}:{port}"'),
    ("text", "pad", "text", "width", "text.ljust(width)"),
    ("words", "repeat", "word", "times", "word * times"),
    ("offsets", "shift", "n", "offset", "n + offset"),
    ("limits", "clamp", "n", "limit", "min(n, limit)"),
    ("lists", "take", "items", "count", "items[:count]"),
    ("layout", "indent", "line", "spaces", '" " * spaces + line'),
    ("retry", "backoff", "attempt", "base", "base ** attempt"),
    ("pages", "page_count", "total", "per_page", "-(-total // per_page)"),
    ("money", "with_tax", "price", "percent", "price + price * percent // 100"),
    ("grid", "cells", "rows", "cols", "rows * cols"),
    ("timer", "minutes", "seconds", "unit", "seconds // unit"),
]
DEFAULT_ARGS = {
    "host": '"db"',
    "text": '"ab"',
    "word": '"ha"',
    "n": "7",
    "items": "list(range(20))",
    "line": '"x"',
    "attempt": "2",
    "total": "95",
    "price": "200",
    "rows": "3",
    "seconds": "600",
}

RENAMES = [  # module, old name, new name, argument, body expression
    ("shop", "calc_total", "compute_total", "prices", "sum(prices)"),
    ("names", "get_initials", "initials", "name", '"".join(p[0] for p in name.split())'),
    ("files", "ext", "extension", "path", 'path.rsplit(".", 1)[-1]'),
    ("temps", "c_to_f", "celsius_to_fahrenheit", "c", "c * 9 / 5 + 32"),
    ("geometry", "sq", "square", "x", "x * x"),
    ("strings", "rev", "reverse", "text", "text[::-1]"),
    ("scores", "avg", "average", "values", "sum(values) / len(values)"),
    ("users", "usr_name", "username", "email", 'email.split("@")[0]'),
    ("maths", "cube_it", "cube", "x", "x ** 3"),
    ("tags", "mk_tag", "make_tag", "name", '"#" + name.lower()'),
    ("lists", "cnt", "count_items", "items", "len(items)"),
    ("paths", "basename_of", "basename", "path", 'path.split("/")[-1]'),
]
RENAME_ARGS = {
    "prices": "[1, 2, 3]",
    "name": '"Ada Lovelace"',
    "path": '"a/b/report.txt"',
    "c": "100",
    "x": "3",
    "text": '"abc"',
    "values": "[2, 4]",
    "email": '"ada@example.org"',
    "items": "[1, 2]",
}

COMPARES = [  # module, function, argument, old operator, new operator, constant, name of the rule
    ("people", "is_adult", "age", ">", ">=", 18, "age 18 counts as adult"),
    ("stock", "needs_reorder", "count", "<", "<=", 5, "a count of exactly 5 needs a reorder"),
    ("exam", "passed", "score", ">", ">=", 50, "a score of exactly 50 passes"),
    ("cache", "is_full", "size", ">", ">=", 100, "a size of exactly 100 is full"),
    ("battery", "is_low", "percent", "<", "<=", 20, "exactly 20 percent is low"),
    ("speed", "is_speeding", "kmh", ">=", ">", 50, "exactly 50 km/h is allowed"),
    ("waitlist", "has_room", "length", "<=", "<", 10, "a length of exactly 10 has no room"),
    ("temps", "is_freezing", "celsius", "<", "<=", 0, "exactly 0 degrees is freezing"),
    ("ranks", "is_top", "rank", "<", "<=", 3, "rank 3 is still top"),
    ("loans", "is_overdue", "days", ">=", ">", 30, "exactly 30 days is not overdue yet"),
    ("votes", "has_quorum", "present", ">", ">=", 12, "exactly 12 present is a quorum"),
    ("water", "is_boiling", "celsius", ">", ">=", 100, "exactly 100 degrees is boiling"),
]

RANGES = [  # module, function, docstring, expression of i, expected for n = 4
    ("series", "total", "the sum of 1..n", "i", None),
    ("squares", "sum_squares", "the sum of the squares of 1..n", "i * i", None),
    ("factorial", "product", "the product of 1..n", "i", "product"),
    ("counting", "numbers", "the list [1, 2, ..., n]", "i", "list"),
    ("evens", "evens", "the even numbers 2, 4, ..., 2n", "2 * i", "list"),
    ("cubes", "sum_cubes", "the sum of the cubes of 1..n", "i ** 3", None),
    ("odds", "odds", "the odd numbers 1, 3, ..., 2n - 1", "2 * i - 1", "list"),
    ("labels", "labels", "the labels 'item1' ... 'itemn'", 'f"item{i}"', "list"),
    ("triangle", "triangle", "the n-th triangle number", "i", None),
    ("halves", "sum_halves", "the sum of i / 2 for i in 1..n", "i / 2", None),
    ("tens", "tens", "the list [10, 20, ..., 10n]", "10 * i", "list"),
    ("powers", "sum_powers", "the sum of 2 ** i for i in 1..n", "2 ** i", None),
]

RETURNS = [  # module, function, arguments, expression
    ("area", "rectangle_area", "width, height", "width * height"),
    ("prices", "discounted", "price, percent", "price - price * percent / 100"),
    ("names", "full_name", "first, last", 'first + " " + last'),
    ("stats", "mean", "values", "sum(values) / len(values)"),
    ("units", "km_to_miles", "km", "km * 0.621"),
    ("vectors", "dot", "a, b", "sum(x * y for x, y in zip(a, b))"),
    ("text", "shout", "message", 'message.upper() + "!"'),
    ("ranges", "span", "values", "max(values) - min(values)"),
    ("money", "cents", "euros", "round(euros * 100)"),
    ("clock", "to_seconds", "hours, minutes", "hours * 3600 + minutes * 60"),
    ("lists", "without_none", "items", "[x for x in items if x is not None]"),
    ("words", "longest", "words", "max(words, key=len)"),
]
RETURN_ARGS = {
    "width, height": "3, 4",
    "price, percent": "200, 10",
    "first, last": '"Ada", "Lovelace"',
    "values": "[2, 9, 4]",
    "km": "10",
    "a, b": "[1, 2], [3, 4]",
    "message": '"hi"',
    "euros": "1.25",
    "hours, minutes": "1, 30",
    "items": "[1, None, 2]",
    "words": '["a", "abc", "ab"]',
}


def _module(helper: str, target: str, rng: random.Random) -> str:
    """A module: the target function and a helper, in a seeded order."""
    parts = [target, helper]
    rng.shuffle(parts)
    return "\n\n".join(parts)


def _eval(code: str, call: str) -> object:
    """What `call` returns under `code` (used to write the expected values of the tests)."""
    scope: dict = {}
    exec(code, scope)  # noqa: S102 — our own generated code
    return eval(call, scope)  # noqa: S307


def string_task(v: tuple, rng: random.Random, helper: tuple[str, str]) -> Spec:
    _, fn, arg, tpl, wrong, right = v  # the pool's module name is its topic; every task edits app.py
    mod = MODULE
    line = lambda w: f'    return f"{tpl.format(w=w)}"'  # noqa: E731
    before = _module(helper[0], f"def {fn}({arg}):\n{line(wrong)}\n", rng)
    after = before.replace(line(wrong), line(right))
    call = f'{fn}("X")'
    tests = f"from {mod} import {fn}\n\n\ndef test_{fn}_text():\n    assert {call} == {_eval(after, call)!r}\n"
    text = f'In {mod}.py, {fn}() says "{wrong}" but it should say "{right}". Fix the typo.'
    return Spec("", "string", 1, text, mod, before, after, tests, ("bugfix", "string"))


def default_task(v: tuple, rng: random.Random, helper: tuple[str, str]) -> Spec:
    _, fn, arg, param, expr = v  # the pool's module name is its topic; every task edits app.py
    mod = MODULE
    old, new = rng.sample(range(2, 10), 2)
    head = lambda d: f"def {fn}({arg}, {param}={d}):"  # noqa: E731
    before = _module(helper[0], f"{head(old)}\n    return {expr}\n", rng)
    after = before.replace(head(old), head(new))
    call = f"{fn}({DEFAULT_ARGS[arg]})"
    tests = (
        f"from {mod} import {fn}\n\n\ndef test_new_default():\n"
        f"    assert {call} == {_eval(after, call)!r}\n\n\n"
        f"def test_explicit_value_still_wins():\n"
        f"    assert {fn}({DEFAULT_ARGS[arg]}, {old}) == {_eval(before, call)!r}\n"
    )
    text = f"In {mod}.py, change the default {param} of {fn}() from {old} to {new}."
    return Spec("", "default", 1, text, mod, before, after, tests, ("config", "default"))


def rename_task(v: tuple, rng: random.Random, helper: tuple[str, str]) -> Spec:
    _, old, new, arg, expr = v  # the pool's module name is its topic; every task edits app.py
    mod = MODULE
    before = _module(helper[0], f"def {old}({arg}):\n    return {expr}\n", rng)
    after = before.replace(f"def {old}(", f"def {new}(")
    call = f"{new}({RENAME_ARGS[arg]})"
    tests = f"import {mod}\n\n\ndef test_new_name():\n    assert {mod}.{call} == {_eval(after, call)!r}\n"
    text = f"Rename the function {old} to {new} in {mod}.py."
    return Spec("", "rename", 1, text, mod, before, after, tests, ("refactor", "rename"))


def compare_task(v: tuple, rng: random.Random, helper: tuple[str, str]) -> Spec:
    _, fn, arg, op_old, op_new, k, rule = v  # the pool's module name is its topic; every task edits app.py
    mod = MODULE
    body = lambda op: f"    return {arg} {op} {k}"  # noqa: E731
    before = _module(helper[0], f"def {fn}({arg}):\n{body(op_old)}\n", rng)
    after = before.replace(body(op_old), body(op_new))
    checks = [k - 1, k, k + 1]
    asserts = "".join(f"    assert {fn}({x}) is {_eval(after, f'{fn}({x})')!r}\n" for x in checks)
    tests = f"from {mod} import {fn}\n\n\ndef test_boundary():\n{asserts}"
    text = f"In {mod}.py, {fn}() gets the boundary wrong: {rule}. Use {op_new} instead of {op_old}."
    return Spec("", "compare", 2, text, mod, before, after, tests, ("bugfix", "comparison"))


def range_task(v: tuple, rng: random.Random, helper: tuple[str, str]) -> Spec:
    _, fn, doc, expr, kind = v  # the pool's module name is its topic; every task edits app.py
    mod = MODULE
    wrap = {None: "sum({g})", "list": "[{g}]", "product": "math.prod({g})"}[kind]
    gen = lambda end: f"{expr} for i in range(1, {end})"  # noqa: E731
    line = lambda end: "    return " + wrap.format(g=gen(end))  # noqa: E731
    target = f'def {fn}(n):\n    """Return {doc}."""\n{line("n")}\n'
    before = ("import math\n\n\n" if kind == "product" else "") + _module(helper[0], target, rng)
    after = before.replace(line("n"), line("n + 1"))
    tests = (
        f"from {mod} import {fn}\n\n\ndef test_includes_n():\n"
        f"    assert {fn}(4) == {_eval(after, f'{fn}(4)')!r}\n"
        f"    assert {fn}(1) == {_eval(after, f'{fn}(1)')!r}\n"
    )
    text = (
        f"{fn}(n) in {mod}.py leaves out n itself: {fn}(4) should be {_eval(after, f'{fn}(4)')!r}. Fix the off-by-one."
    )
    return Spec("", "range", 2, text, mod, before, after, tests, ("bugfix", "off-by-one"))


def return_task(v: tuple, rng: random.Random, helper: tuple[str, str]) -> Spec:
    _, fn, args, expr = v  # the pool's module name is its topic; every task edits app.py
    mod = MODULE
    before = _module(helper[0], f"def {fn}({args}):\n    result = {expr}\n", rng)
    after = before.replace(f"    result = {expr}\n", f"    return {expr}\n")
    call = f"{fn}({RETURN_ARGS[args]})"
    tests = f"from {mod} import {fn}\n\n\ndef test_returns_the_result():\n    assert {call} == {_eval(after, call)!r}\n"
    text = f"{fn}() in {mod}.py always returns None. Make it return the result."
    return Spec("", "return", 3, text, mod, before, after, tests, ("bugfix", "missing-return"))


FAMILIES = {
    "string": (STRINGS, string_task),
    "default": (DEFAULTS, default_task),
    "rename": (RENAMES, rename_task),
    "compare": (COMPARES, compare_task),
    "range": (RANGES, range_task),
    "return": (RETURNS, return_task),
}


# --- writing ------------------------------------------------------------------------------


def generate(seed: int) -> list[tuple[str, Spec]]:
    """Every task as (split, spec); the same seed gives the same list."""
    rng = random.Random(seed)
    out = []
    for family, (pool, make) in FAMILIES.items():
        variants = list(pool)[:VARIANTS]
        rng.shuffle(variants)
        for i, v in enumerate(variants):
            helper = HELPERS[rng.randrange(len(HELPERS))]
            spec = make(v, rng, helper)
            assert spec.before != spec.after and spec.before.count("\n") <= 12, (family, v)
            assert spec.module not in sys.stdlib_module_names, spec.module  # would shadow it
            spec.id = f"edit-{family}-{i:02d}"
            out.append(("train" if i < TRAIN else "heldout", spec))
    return out


def task_toml(spec: Spec) -> str:
    import json

    tags = ", ".join(json.dumps(t) for t in spec.tags)
    return "\n".join(
        [
            f"id = {json.dumps(spec.id)}",
            f"instruction = {json.dumps(spec.instruction)}",
            f"cluster = {json.dumps('edit-' + spec.family)}",
            f"difficulty = {spec.difficulty}",
            f"tags = [{tags}]",
            "timeout_s = 20.0",
            # Prints what the warm-start demos show for run_tests (harness.demos.RUN_TESTS_OK).
            f"run_tests_command = {json.dumps(f'python3 -m py_compile {spec.module}.py && echo ok: all tests passed')}",
            "",
        ]
    )


def write(out: Path, tasks: list[tuple[str, Spec]], seed: int) -> None:
    """Write the suite to `out` (a temp directory renamed into place)."""
    with atomic_dir(out) as tmp:
        for split, spec in tasks:
            d = tmp / split / spec.id
            for sub in ("repo", "hidden_tests", "solution"):
                (d / sub).mkdir(parents=True)
            (d / "task.toml").write_text(task_toml(spec))
            (d / "repo" / f"{spec.module}.py").write_text(spec.before)
            (d / "solution" / f"{spec.module}.py").write_text(spec.after)
            (d / "hidden_tests" / f"test_{spec.family}.py").write_text(spec.tests)
        (tmp / "README.md").write_text(
            "Generated by `python scripts/gen_edit_tasks.py --seed "
            f'{seed} --out <this directory>`; do not edit by hand (docs/tasks.md, "The edit suite").\n'
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the variant split and values (default 0)")
    ap.add_argument("--out", type=Path, default=Path("sample_data/edit_tasks"), help="suite directory to (re)write")
    args = ap.parse_args(argv)
    tasks = generate(args.seed)
    write(args.out, tasks, args.seed)
    n_train = sum(split == "train" for split, _ in tasks)
    print(f"{len(tasks)} tasks ({n_train} train, {len(tasks) - n_train} heldout) -> {args.out}", file=sys.stderr)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
