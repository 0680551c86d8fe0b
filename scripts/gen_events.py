r"""Generate realistic production event logs of a coding agent: the input of `rlcycle collect`.

Regenerate the committed sample (same seed, same bytes):
    .venv/bin/python scripts/gen_events.py --episodes 2000 --seed 20261130 \
        --out sample_data/events --otel sample_data/otel/genai_spans.json
A benchmark log of five million events (7.6 GB; under 3 minutes on 2 cores):
    .venv/bin/python scripts/gen_events.py --events 5000000 --seed 1 --out bench_data/events_5m

What goes in: a seed, a size (`--episodes` or `--events`) and the tokenizer the agent runs with
(default `sample_data/tokenizer`). What comes out: `DIR/events-YYYY-MM-DDTHH.jsonl`, one event
per line, each event in the file of the hour it was *logged* (edit outcomes arrive 1-24 h after
the edit, so they sit in later files), events within a file only roughly in `ts` order. With
`--otel FILE`, also an OTLP/JSON export of ~20 completions from extra sessions (not in DIR).

The event schema is rlcycle's (`rlcycle.schema.EVENTS`; the Parquet files are written in it), and
each logged tool call is what the harness parser (`rlcycle.harness.parse_completion`) makes of the
completion text with the sample agent's tools (`TOOLS`); docs/sample_data.md lists what the sample
holds (policies, invalid calls, clarifications, follow-ups, feedback, duplicates, planted
secrets). Speed comes from tokenising a pool of task texts once (batch encode) and assembling
every line from pre-rendered JSON fragments: token ids of turn k+1 are the string of turn k plus
the new pieces, never re-encoded.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rlcycle.harness import TOOLS as HARNESS_TOOLS
from rlcycle.harness import parse_completion
from rlcycle.harness.demos import call_text
from rlcycle.schema import EVENTS

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER = REPO / "sample_data" / "tokenizer"
START = datetime(2026, 11, 30, 6, 0, tzinfo=timezone.utc)
HOUR_MS = 3_600_000
# The production agent of the sample is a third-party deployment, not rlcycle's own harness: its
# system prompt is its own, and its tools are the harness's as they were when the sample was
# made, i.e. all but `replace_in_file` (added later). So its logs say "unknown tool" for a
# replace_in_file call, and the committed sample stays what it is.
SYSTEM_PROMPT = (
    'You are a coding agent in the user\'s repository. Call a tool as <tool_call>{"name": ..., '
    '"arguments": {...}}</tool_call>. Ask when the request is ambiguous.'
)
TOOLS = tuple(t for t in HARNESS_TOOLS if t.name != "replace_in_file")


@dataclass(frozen=True)
class Behaviour:
    """How one policy version acts. The newer one asks more and breaks fewer calls."""

    version: str
    p_clarify: float  # the first episode of a session is a clarifying question
    p_invalid_ok: float  # per edit, a malformed attempt first, when the task is going well
    p_invalid_hard: float  # ... when it is going badly (the reward hack docs/design.md describes)
    p_success: float
    latency: float  # latency multiplier
    survival: tuple[float, float]  # Beta(a, b) of the surviving share of edited lines


POLICIES = (
    Behaviour("policy-2026-11-30a", 0.06, 0.04, 0.16, 0.60, 1.00, (5.0, 2.0)),
    Behaviour("policy-2026-11-30b", 0.15, 0.015, 0.04, 0.66, 0.90, (6.0, 2.0)),
)

# Fake secrets planted for collect's redaction (docs/sample_data.md lists where they go).
SECRET_OPENAI = "sk-proj-Q3t9xLm2Vb7Kd1Rw8Zp4Hs6Ny0Fc5Ja2Ue7Tg"
SECRET_GITHUB = "ghp_7Yh2Kq9Lm4Xz8Vb1Nc6Rt3Wd5Ps0Fg2Jk7Ae"
SECRET_URL = "https://deploy-bot:Hunter2-Winter!@git.acme-internal.dev/payments/api.git"
SECRET_EMAILS = ("maria.lopez@acme-robotics.com", "j.chen+oncall@fincorp.io")

# ---------------------------------------------------------------------------------------------
# Task content: small bug-fix / test-writing / question tasks, each fully rendered as text
# ---------------------------------------------------------------------------------------------

PACKAGES = (
    "billing",
    "inventory",
    "auth",
    "api",
    "ingest",
    "reports",
    "scheduler",
    "payments",
    "search",
    "users",
    "notifications",
    "storage",
    "analytics",
    "catalog",
    "shipping",
)
NOUNS = (
    "order",
    "invoice",
    "user",
    "item",
    "record",
    "event",
    "payment",
    "account",
    "report",
    "batch",
    "job",
    "session",
    "token",
    "customer",
    "product",
    "shipment",
    "ticket",
    "row",
    "message",
    "metric",
    "entry",
    "refund",
    "coupon",
    "subscription",
    "upload",
)
FIELDS = (
    "total",
    "amount",
    "price",
    "quantity",
    "score",
    "weight",
    "discount",
    "balance",
    "duration",
    "count",
    "fee",
    "rating",
    "retries",
    "size",
    "tax",
)
VERBS = (
    "compute",
    "parse",
    "load",
    "get",
    "sum",
    "average",
    "normalize",
    "validate",
    "collect",
    "split",
    "find",
    "format",
    "resolve",
    "check",
)
HELPERS = ("clean_name", "to_cents", "is_blank", "chunked", "utc_now", "as_list", "slugify")


def family_index(n, f, fn):
    return dict(
        before=[
            f"def {fn}({n}s):",
            f'    """Return the {f} of the first {n}."""',
            f"    first = {n}s[0]",
            f'    return first["{f}"]',
        ],
        after=[
            f"def {fn}({n}s):",
            f'    """Return the {f} of the first {n}, or None if there is none."""',
            f"    if not {n}s:",
            "        return None",
            f"    first = {n}s[0]",
            f'    return first["{f}"]',
        ],
        exc="IndexError",
        msg="list index out of range",
        bad=f"first = {n}s[0]",
        call=f"{fn}([])",
        symptom=f"crashes with IndexError when there are no {n}s",
        fix="returns None for an empty list instead of indexing it",
        question=f"Should {fn} return None or raise a ValueError when the list of {n}s is empty?",
        answer="return None, the callers already handle that",
        test=[f"def test_{fn}_empty():", f"    assert {fn}([]) is None"],
    )


def family_batches(n, f, fn):
    return dict(
        before=[
            f"def {fn}({n}s, size):",
            f'    """Split {n}s into batches of `size`."""',
            "    batches = []",
            f"    for start in range(0, len({n}s) - size, size):",
            f"        batches.append({n}s[start:start + size])",
            "    return batches",
        ],
        after=[
            f"def {fn}({n}s, size):",
            f'    """Split {n}s into batches of `size`; the last one may be short."""',
            "    batches = []",
            f"    for start in range(0, len({n}s), size):",
            f"        batches.append({n}s[start:start + size])",
            "    return batches",
        ],
        exc="AssertionError",
        msg="assert [[1, 2]] == [[1, 2], [3]]",
        bad="assert batches == [[1, 2], [3]]",
        call=f"{fn}([1, 2, 3], 2)",
        symptom=f"silently drops the last batch of {n}s",
        fix="iterates up to len() so the short last batch is kept",
        question="Should a short final batch be kept as it is, or padded to `size`?",
        answer="keep it short, no padding",
        test=[
            f"def test_{fn}_keeps_last_batch():",
            f"    assert {fn}([1, 2, 3], 2) == [[1, 2], [3]]",
        ],
    )


def family_key(n, f, fn):
    return dict(
        before=[
            f"def {fn}(row):",
            f'    """Read the {f} of a {n} from a raw CSV row."""',
            f'    value = row["{f}"]',
            "    return float(value)",
        ],
        after=[
            f"def {fn}(row):",
            f'    """Read the {f} of a {n} from a raw CSV row (missing means 0)."""',
            f'    value = row.get("{f}") or "0"',
            "    return float(value)",
        ],
        exc="KeyError",
        msg=f"'{f}'",
        bad=f'value = row["{f}"]',
        call=f'{fn}({{"id": "7"}})',
        symptom=f"throws KeyError: '{f}' on rows exported by the old system",
        fix=f"treats a missing or empty {f} column as 0",
        question=f"When `{f}` is missing, should the row count as 0 or be skipped?",
        answer="count it as 0, skipping would break the totals",
        test=[f"def test_{fn}_missing_{f}():", f'    assert {fn}({{"id": "7"}}) == 0.0'],
    )


def family_zero(n, f, fn):
    return dict(
        before=[
            f"def {fn}({n}s):",
            f'    """Average {f} per {n}."""',
            f'    total = sum(x["{f}"] for x in {n}s)',
            f"    return total / len({n}s)",
        ],
        after=[
            f"def {fn}({n}s):",
            f'    """Average {f} per {n}; 0.0 when there are none."""',
            f"    if not {n}s:",
            "        return 0.0",
            f'    total = sum(x["{f}"] for x in {n}s)',
            f"    return total / len({n}s)",
        ],
        exc="ZeroDivisionError",
        msg="division by zero",
        bad=f"return total / len({n}s)",
        call=f"{fn}([])",
        symptom="raises ZeroDivisionError for customers with no history",
        fix="returns 0.0 when the list is empty",
        question="For an empty list, is 0.0 the right average, or should it be None?",
        answer="0.0 is fine",
        test=[f"def test_{fn}_no_{n}s():", f"    assert {fn}([]) == 0.0"],
    )


def family_parse(n, f, fn):
    return dict(
        before=[
            f"def {fn}(header):",
            f'    """Parse the {f} from a header like \'{f}: 42\'."""',
            '    _, _, value = header.partition(":")',
            "    return int(value)",
        ],
        after=[
            f"def {fn}(header):",
            f'    """Parse the {f} from a header like \'{f}: 42\' (blank means 0)."""',
            '    _, _, value = header.partition(":")',
            "    value = value.strip()",
            "    return int(value) if value else 0",
        ],
        exc="ValueError",
        msg="invalid literal for int() with base 10: ' '",
        bad="return int(value)",
        call=f'{fn}("{f}: ")',
        symptom=f"fails with ValueError when the {f} header is blank",
        fix="strips the value and maps a blank header to 0",
        question=f"Is a blank `{f}` header an error the client should see, or just 0?",
        answer="just 0, some proxies send it blank",
        test=[f"def test_{fn}_blank():", f'    assert {fn}("{f}: ") == 0'],
    )


def family_default(n, f, fn):
    return dict(
        before=[
            f"def {fn}({n}, seen=[]):",
            f'    """Collect the ids of unique {n}s."""',
            f'    if {n}["id"] not in seen:',
            f'        seen.append({n}["id"])',
            "    return seen",
        ],
        after=[
            f"def {fn}({n}, seen=None):",
            f'    """Collect the ids of unique {n}s."""',
            "    if seen is None:",
            "        seen = []",
            f'    if {n}["id"] not in seen:',
            f'        seen.append({n}["id"])',
            "    return seen",
        ],
        exc="AssertionError",
        msg="assert ['a1', 'b2'] == ['b2']",
        bad="assert ids == ['b2']",
        call=f'{fn}({{"id": "b2"}})',
        symptom="returns ids from earlier requests (state leaks between calls)",
        fix="uses None as the default so each call starts with a fresh list",
        question=f"Do callers rely on {fn} remembering ids across calls, or is that the bug?",
        answer="that's the bug, every call should start fresh",
        test=[
            f"def test_{fn}_fresh_each_call():",
            f'    {fn}({{"id": "a1"}})',
            f'    assert {fn}({{"id": "b2"}}) == ["b2"]',
        ],
    )


def family_bound(n, f, fn):
    return dict(
        before=[
            f"def {fn}({f}, limit=100):",
            f'    """True when the {n} {f} is within the limit."""',
            f"    return {f} < limit",
        ],
        after=[
            f"def {fn}({f}, limit=100):",
            f'    """True when the {n} {f} is within the limit (inclusive)."""',
            f"    return {f} <= limit",
        ],
        exc="AssertionError",
        msg="assert False is True",
        bad=f"assert {fn}(100) is True",
        call=f"{fn}(100)",
        symptom=f"rejects a {f} exactly at the limit",
        fix="makes the limit inclusive",
        question="Is the limit meant to be inclusive? The docs say 'up to 100'.",
        answer="yes, inclusive",
        test=[f"def test_{fn}_at_limit():", f"    assert {fn}(100) is True"],
    )


def family_none(n, f, fn):
    return dict(
        before=[
            f"def {fn}({n}):",
            f'    """Display name of the {n} owner."""',
            f"    return {n}.owner.name.title()",
        ],
        after=[
            f"def {fn}({n}):",
            f'    """Display name of the {n} owner, or "unknown"."""',
            f"    if {n}.owner is None:",
            '        return "unknown"',
            f"    return {n}.owner.name.title()",
        ],
        exc="AttributeError",
        msg="'NoneType' object has no attribute 'name'",
        bad=f"return {n}.owner.name.title()",
        call=f"{fn}({n.capitalize()}(owner=None))",
        symptom=f"crashes for {n}s whose owner was deleted",
        fix='returns "unknown" when the owner is missing',
        question=f'What should we show for a {n} without an owner: "unknown", or an empty string?',
        answer='"unknown" please',
        test=[
            f"def test_{fn}_no_owner():",
            f'    assert {fn}({n.capitalize()}(owner=None)) == "unknown"',
        ],
    )


FAMILIES = (
    family_index,
    family_batches,
    family_key,
    family_zero,
    family_parse,
    family_default,
    family_bound,
    family_none,
)


def make_task(rng: random.Random) -> dict:
    """All the text one task can produce, by piece name: `u_` user messages, `c_` completions
    (assistant content), `r_` tool output, `e_` tool errors; plus a few plain facts."""
    pkg, noun, fld = rng.choice(PACKAGES), rng.choice(NOUNS), rng.choice(FIELDS)
    module = rng.choice((noun + "s", fld, noun + "_" + fld, "utils", "core"))
    fn = f"{rng.choice(VERBS)}_{noun}_{fld}" if rng.random() < 0.6 else f"{rng.choice(VERBS)}_{fld}"
    fam = rng.choice(FAMILIES)(noun, fld, fn)
    path, tpath = f"src/{pkg}/{module}.py", f"tests/test_{module}.py"
    other = f"src/{pkg}/{rng.choice(NOUNS)}_service.py"
    kind = rng.choices(("fix", "test", "question"), (0.72, 0.14, 0.14))[0]
    helper = rng.choice(HELPERS)
    head = [
        f'"""{pkg.capitalize()} helpers for {noun}s."""',
        "",
        "",
        f"def {helper}(value):",
        "    return value.strip().lower() if value else value",
        "",
        "",
    ]
    before, after = head + fam["before"], head + fam["after"]
    patch = "".join(
        difflib.unified_diff([ln + "\n" for ln in before], [ln + "\n" for ln in after], f"a/{path}", f"b/{path}", n=1)
    )
    n_tests = rng.randint(3, 12)
    test_file = (
        "\n".join(
            [f"from {pkg}.{module} import {fn}", "", ""]
            + fam["test"]
            + ["", "", f"def test_{fn}_typical():", f"    assert {fn} is not None"]
        )
        + "\n"
    )
    test_name = fam["test"][0][4:].split("(")[0]
    line_no = len(head) + 2 + rng.randint(0, 1)
    failing = (
        f"{'.' * (n_tests - 1)}F\n{path}:{line_no}: in {fn}\n    {fam['bad']}\nE   {fam['exc']}: {fam['msg']}\n"
        f"FAILED {tpath}::{test_name}\n1 failed, {n_tests - 1} passed in {rng.uniform(0.1, 3):.2f}s"
    )
    passing = f"{'.' * n_tests}\n{n_tests} passed in {rng.uniform(0.1, 3):.2f}s"
    repro = f'python -c "from {pkg}.{module} import {fn}; print({fam["call"]})"'
    traceback = (
        f'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
        f'  File "/app/{path}", line {line_no}, in {fn}\n    {fam["bad"]}\n{fam["exc"]}: {fam["msg"]}'
    )
    cap = fam["symptom"][0].upper() + fam["symptom"][1:]
    if kind == "test":
        requests = [
            f"Please add tests for {fn} in {path}, especially the edge case where it {fam['symptom']}.",
            f"can you write a regression test for {fn}? it {fam['symptom']}",
        ]
    elif kind == "question":
        requests = [
            f"Why does {fn} in {path} {fam['symptom'].split(' ', 1)[1] if ' ' in fam['symptom'] else fam['symptom']}?",
            f"Quick question: what happens in {fn} when I call {fam['call']}?",
        ]
    else:
        requests = [
            f"{fn} in {path} {fam['symptom']}. Can you fix it?",
            f"Getting `{fam['exc']}: {fam['msg']}` from {fn} in prod. Please fix it and add a test.",
            f"{cap} - see {path}. fix pls",
            f"The nightly job fails: {fn} {fam['symptom']}. Keep the public API.",
        ]
    lead = lambda options: rng.choice(options)  # noqa: E731
    t = {
        "kind": kind,
        "fn": fn,
        "path": path,
        "tpath": tpath,
        "test_file": test_file,
        "repro": repro,
        "u_request": rng.choice(requests),
        "u_request_after": rng.choice(("thanks, works. ", "Great, that fixed it. Next: ", "perfect. "))
        + rng.choice(requests),
        "u_answer": fam["answer"] + rng.choice(("", ".", ", thanks", ". go ahead")),
        "u_still": rng.choice(
            (
                f"Still getting {fam['exc']} from {fn}.",
                f"that's wrong, {test_name} still fails",
                f"no, revert that. {path} was fine before",
            )
        ),
        "c_ask": lead(("Before I change it: ", "", "One question first. "))
        + call_text("ask_user", {"question": fam["question"]}),
        "c_list": lead(("", "Let me see what is in the package.\n")) + call_text("list_files", {"path": f"src/{pkg}"}),
        "r_list": "\n".join(["__init__.py", f"{module}.py", other.rsplit("/", 1)[1], "models.py"]),
        "c_search": lead(("", f"I'll find where {fn} is defined.\n"))
        + call_text("search", {"pattern": fn, "path": "src"}),
        "r_search": f"{path}:{len(head) + 1}:def {fam['before'][0][4:]}\n{other}:{rng.randint(10, 200)}:        result = {fn}(payload)",
        "c_read": lead(("", "Let me look at the code first.\n", f"Reading {path}.\n"))
        + call_text("read_file", {"path": path}),
        "r_read": "\n".join(before),
        "c_read_bad": lead(("", "Let me open the module.\n")) + call_text("read_file", {"path": f"src/{module}.py"}),
        "e_read_bad": f"FileNotFoundError: [Errno 2] No such file or directory: 'src/{module}.py'",
        "c_read2": lead(("", "I'll read the code and its tests.\n"))
        + call_text("read_file", {"path": path})
        + call_text("read_file", {"path": tpath}),
        "r_read_test": test_file,
        "c_shell": lead(("Let me reproduce it.\n", "")) + call_text("run_shell", {"command": repro}),
        "r_shell": traceback,
        "c_patch": lead(("", f"The bug is `{fam['bad']}`. Fixing it.\n", "Here is the fix.\n"))
        + call_text("apply_patch", {"path": path, "patch": patch}),
        "e_patch": f"patch does not apply: hunk #1 FAILED at {len(head) + 1} ({path})",
        "c_patch_tests": lead(("", "Fix, then run the tests.\n"))
        + call_text("apply_patch", {"path": path, "patch": patch})
        + call_text("run_tests", {}),
        "c_write": lead(("", "Adding a regression test.\n"))
        + call_text("write_file", {"path": tpath, "content": test_file}),
        "r_ok": "ok",
        "c_tests": lead(("", "Running the tests.\n", "Now the tests.\n")) + call_text("run_tests", {}),
        "r_fail": failing,
        "r_pass": passing,
        "e_timeout": "run_tests timed out after 120 s (killed)",
        "c_finish": lead(("The tests pass now.\n", ""))
        + call_text(
            "finish",
            {"summary": f"Fixed {fn} in {path}: it now {fam['fix']}. {n_tests} tests pass."},
        ),
        "c_answer": f"Done. {fn} now {fam['fix']}, and I added `{test_name}`. All {n_tests} tests pass.",
        "c_giveup": f"I changed {fn}, but {test_name} still fails with {fam['exc']}. The caller in {other} may pass bad data; can you check how it builds the input?",
        "c_explain": f"`{fn}` {fam['symptom']}: the line `{fam['bad']}` does not handle that case. A fix would be that it {fam['fix']}. Want me to make that change?",
        # Invalid calls: the harness cannot run them and answers with the reason.
        "c_bad_json": lead(("", "Here is the fix.\n"))
        + "<tool_call>"
        + json.dumps({"name": "apply_patch", "arguments": {"path": path, "patch": patch}})[:-2]
        + "</tool_call>",
        "c_unknown": lead(("", "Editing the file.\n"))
        + call_text(
            rng.choice(("edit_file", "replace_in_file", "bash", "open_file")),
            {"path": path, "content": "\n".join(after)},
        ),
        "c_missing": lead(("", "Here is the fix.\n"))
        + call_text(rng.choice(("apply_patch", "write_file")), {"path": path}),
    }
    return t


# ---------------------------------------------------------------------------------------------
# Pool: every text of every task, tokenised once
# ---------------------------------------------------------------------------------------------


class Piece:
    """One tokenised chunk: ids as a JSON fragment, the message fragment, parsed calls."""

    __slots__ = ("ids", "n", "msg", "text_json", "calls")

    def __init__(self, ids: list[int], msg: str, text_json: str = "", calls: tuple = ()):
        self.ids = ",".join(map(str, ids))  # token ids, ready to paste into a JSON list
        self.n = len(ids)
        self.msg = msg  # {"role","content"} JSON object for prompt_messages ("" if none)
        self.text_json = text_json  # the text as a JSON string literal
        self.calls = calls  # parsed tool calls (completions only)


@dataclass(frozen=True)
class Call:
    name_json: str  # the tool name as JSON: a string, or null when the body is not JSON
    args_json: str  # the logged `arguments` string, JSON-encoded (a JSON string literal)
    invalid: str | None  # why the harness rejects it, or None
    edit_lines: int  # lines an edit proposes (0 for non-edits)


def parse_calls(content: str) -> tuple[Call, ...]:
    """What the harness parser makes of the <tool_call> blocks of a completion, with the sample
    agent's TOOLS: a valid call logs its arguments as JSON; an invalid one logs the raw body
    between the tags, its name when the body parsed (else null), and the parser's reason."""
    calls = []
    for call in parse_completion(content, TOOLS).calls:
        lines = 0
        if call.valid and call.name == "apply_patch":
            lines = sum(
                1 for ln in call.arguments["patch"].splitlines() if ln.startswith("+") and not ln.startswith("+++")
            )
        elif call.valid and call.name == "write_file":
            lines = call.arguments["content"].count("\n")
        logged = json.dumps(call.arguments_json, ensure_ascii=False)
        calls.append(Call(json.dumps(call.name), logged, None if call.valid else call.reason, lines))
    return tuple(calls)


def msg_json(role: str, content: str) -> str:
    return f'{{"role":"{role}","content":{json.dumps(content, ensure_ascii=False)}}}'


# Pieces nearly every episode uses are encoded up front in one parallel batch; the rest (invalid
# calls, errors, clarifications, ...) on first use. Either way each text is encoded once.
EAGER = (
    "u_request",
    "u_request_after",
    "u_still",
    "c_read",
    "r_read",
    "c_patch",
    "r_ok",
    "c_patch_tests",
    "c_tests",
    "r_fail",
    "r_pass",
    "c_finish",
    "c_answer",
    "c_giveup",
)


class Task(dict):
    """One task's pieces by name; a piece not encoded yet is encoded when first asked for."""

    def __init__(self, pool: Pool, raw: dict):
        super().__init__(kind=raw["kind"])
        self.pool, self.raw = pool, raw

    def __missing__(self, key: str) -> Piece:
        piece = self[key] = self.pool.piece(key, self.raw[key])
        return piece


class Pool:
    """The tasks of a log and the fixed chunks (system prompt, generation prompt), tokenised."""

    def __init__(self, tokenizer_dir: Path, n_tasks: int, seed: int, eager_all: bool = False):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        rng = random.Random(f"tasks-{seed}")
        self.raw = [make_task(rng) for _ in range(n_tasks)]  # plain texts, for variants
        for t in self.raw:
            for key in ("c_bad_json", "c_unknown", "c_missing"):  # the harness states the reason
                t["e_" + key[2:]] = parse_calls(t[key])[0].invalid
        self.tasks = [Task(self, t) for t in self.raw]
        # Big logs use every piece of every task: then one batch for all is fastest.
        eager = [k for k in self.raw[0] if k[:2] in ("u_", "c_", "r_", "e_")] if eager_all else EAGER
        jobs = [(task, key) for task in self.tasks for key in eager]
        chunks = [self.chunk(key, task.raw[key]) for task, key in jobs]
        encoded = self.tok.encode_batch(chunks, add_special_tokens=False)
        for (task, key), enc in zip(jobs, encoded, strict=True):
            task[key] = self.piece(key, task.raw[key], enc.ids)
        self.system = self.encode(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>", "system")
        self.gen = self.encode("\n<|im_start|>assistant\n", None)
        self._cache: dict[str, Piece] = {}

    def chunk(self, key: str, text: str) -> str:
        """The exact text a piece contributes to the token stream. Pieces are cut at special
        tokens, so encoding them one by one gives the same ids as encoding the whole prompt."""
        kind = key[:2]
        if kind == "c_":  # a completion ends with the stop token the server sampled
            return text + "<|im_end|>"
        if kind == "u_":
            return f"\n<|im_start|>user\n{text}<|im_end|>"
        return self.tool_chunk(text if kind == "r_" else "error: " + text)

    def piece(self, key: str, text: str, ids: list[int] | None = None) -> Piece:
        chunk = self.chunk(key, text)
        if ids is None:
            ids = self.tok.encode(chunk, add_special_tokens=False).ids
        if key.startswith("c_"):
            return Piece(
                ids,
                msg_json("assistant", text),
                json.dumps(chunk, ensure_ascii=False),
                parse_calls(text),
            )
        if key.startswith("u_"):
            return Piece(ids, msg_json("user", text), json.dumps(text, ensure_ascii=False))
        # A tool message holds the raw output; the chat template adds the <tool_response> tags.
        output = text if key.startswith("r_") else "error: " + text
        return Piece(ids, msg_json("tool", output), json.dumps(text, ensure_ascii=False))

    @staticmethod
    def tool_chunk(out: str) -> str:
        return f"\n<|im_start|>tool\n<tool_response>\n{out}\n</tool_response><|im_end|>"

    def encode(self, chunk: str, role: str | None) -> Piece:
        """A chunk encoded on its own; role names the message it renders (None: no message)."""
        ids = self.tok.encode(chunk, add_special_tokens=False).ids
        if role is None:
            return Piece(ids, "")
        content = chunk.split(f"<|im_start|>{role}\n", 1)[1].rsplit("<|im_end|>", 1)[0]
        return Piece(ids, msg_json(role, content), json.dumps(content, ensure_ascii=False))

    def user(self, text: str) -> Piece:
        """A user message that is not part of a task (generic follow-ups, planted secrets)."""
        piece = self._cache.get(text)
        if piece is None:
            piece = self._cache[text] = self.piece("u_", text)
        return piece

    def completion(self, content: str) -> Piece:
        """A completion outside the pool (planted secrets); encoded on demand."""
        return self.piece("c_", content)


# ---------------------------------------------------------------------------------------------
# Simulation: sessions -> episodes -> turns, each turn one completion and its tool results
# ---------------------------------------------------------------------------------------------

# step -> (completion piece, [(status, result piece or None, duration range ms)])
OK, ERR, INV, TMO = "ok", "error", "invalid", "timeout"
STEPS = {
    "list": ("c_list", [(OK, "r_list", (5, 30))]),
    "search": ("c_search", [(OK, "r_search", (30, 400))]),
    "read": ("c_read", [(OK, "r_read", (3, 40))]),
    "read_bad": ("c_read_bad", [(ERR, "e_read_bad", (2, 10))]),
    "read2": ("c_read2", [(OK, "r_read", (3, 40)), (OK, "r_read_test", (3, 40))]),
    "shell": ("c_shell", [(OK, "r_shell", (300, 4000))]),
    "patch": ("c_patch", [(OK, "r_ok", (10, 80))]),
    "patch_bad": ("c_patch", [(ERR, "e_patch", (10, 80))]),
    "patch_tests_pass": ("c_patch_tests", [(OK, "r_ok", (10, 80)), (OK, "r_pass", (1500, 25000))]),
    "patch_tests_fail": ("c_patch_tests", [(OK, "r_ok", (10, 80)), (OK, "r_fail", (1500, 25000))]),
    "write": ("c_write", [(OK, "r_ok", (10, 80))]),
    "tests_pass": ("c_tests", [(OK, "r_pass", (1500, 25000))]),
    "tests_fail": ("c_tests", [(OK, "r_fail", (1500, 25000))]),
    "tests_timeout": ("c_tests", [(TMO, "e_timeout", (120000, 120400))]),
    "bad_json": ("c_bad_json", [(INV, "e_bad_json", (0, 2))]),
    "unknown": ("c_unknown", [(INV, "e_unknown", (0, 2))]),
    "missing": ("c_missing", [(INV, "e_missing", (0, 2))]),
    # final steps: control goes back to the user
    "ask": ("c_ask", [(OK, None, (1, 5))]),
    "finish": ("c_finish", [(OK, None, (1, 5))]),
    "answer": ("c_answer", []),
    "giveup": ("c_giveup", []),
    "explain": ("c_explain", []),
}
EDIT_STEPS = ("patch", "patch_bad", "patch_tests_pass", "patch_tests_fail", "write")
MAX_TURNS = 6
MAX_EPISODES = 6  # per session
SATISFIED = (
    "thanks, works",
    "Thanks! That fixed it.",
    "great, merging this",
    "perfect, thank you 🙏",
    "works now, ty",
)
DISSATISFIED = (
    "that's wrong, it still fails",
    "no, revert that",
    "This is not what I asked for.",
    "still broken on staging",
)
# Follow-up / write / shell counters at which a planted secret replaces the usual text.
SECRET_FOLLOWUPS = {
    3: f"still failing in prod. here's the key the client uses: {SECRET_OPENAI}",
    40: f"the deploy pulls from {SECRET_URL} if that matters",
    90: f"ok. send the summary to {SECRET_EMAILS[0]} please",
    400: f"cc {SECRET_EMAILS[1]} on the fix. also the old key {SECRET_OPENAI} is revoked now",
}
SECRET_WRITES = (2, 30)
SECRET_SHELLS = (5,)

COMPLETION = (
    '{"event_id":"%s","type":"completion","ts":%s,"session_id":"%s","episode_id":"%s",'
    '"sample_id":"%s","turn":%d,"policy_version":"%s",%s,"completion_ids":[%s],'
    '"completion_logprobs":[%s],%s"completion_text":%s,"tool_calls":[%s],"latency_ms":%.1f,'
    '"temperature":%s}'
)
CALL = '{"call_id":"%s","name":%s,"arguments":%s}'
TOOL_RESULT = (
    '{"event_id":"%s","type":"tool_result","ts":%s,"session_id":"%s","sample_id":"%s",'
    '"call_id":"%s","status":"%s","error":%s,"duration_ms":%.1f}'
)
EDIT_OUTCOME = (
    '{"event_id":"%s","type":"edit_outcome","ts":%s,"session_id":"%s","sample_id":"%s",'
    '"call_id":"%s","lines_proposed":%d,"lines_surviving":%d,"observed_after_s":%.1f}'
)
USER_MESSAGE = '{"event_id":"%s","type":"user_message","ts":%s,"session_id":"%s","episode_id":"%s","text":%s}'
FEEDBACK = '{"event_id":"%s","type":"feedback","ts":%s,"session_id":"%s","%s":"%s","value":%.1f,"kind":"%s"}'

_HOUR_PREFIX: dict[int, str] = {}


def rfc3339(ms: int) -> str:
    """Epoch ms as RFC 3339 UTC with milliseconds; the hour prefix is cached (this is hot)."""
    hour, rem = divmod(ms, HOUR_MS)
    prefix = _HOUR_PREFIX.get(hour)
    if prefix is None:
        prefix = _HOUR_PREFIX[hour] = datetime.fromtimestamp(hour * 3600, timezone.utc).strftime("%Y-%m-%dT%H:")
    minute, rem = divmod(rem, 60_000)
    return f"{prefix}{minute:02d}:{rem // 1000:02d}.{rem % 1000:03d}Z"


HEX_FORMAT = {48: "%012x", 64: "%016x", 128: "%032x"}  # ids: call, session/episode/sample, event


def logprob_tape(rng: random.Random, n: int = 100_003) -> list[str]:
    """Logprobs as JSON text, 4 decimals: 45% near-certain (-0.0), 30% confident, 21% unsure,
    4% surprised. Four decimals keep the log small; -0.0 is a legal logprob (probability 1)."""
    tape = []
    for _ in range(n):
        u = rng.random()
        if u < 0.45:
            v = math.exp(rng.uniform(-16, -10))
        elif u < 0.75:
            v = math.exp(rng.uniform(-10, -2.5))
        elif u < 0.96:
            v = math.exp(rng.uniform(-2.5, 0))
        else:
            v = rng.uniform(1, 8)
        text = f"{-v:.4f}".rstrip("0")
        tape.append(text + "0" if text.endswith(".") else text)
    return tape


@dataclass
class Session:
    session_id: str
    policy: Behaviour
    temperature: str


@dataclass
class Episode:
    episode_id: str
    end_ms: int
    final_step: str
    success: bool
    final: Piece  # the last completion, kept as history for the next episode
    edits: list  # (sample_id, call_id, ts_ms, lines)


class Simulator:
    """Plays sessions and hands each event line to `emit(ts_ms, line)`."""

    def __init__(
        self,
        pool: Pool,
        seed: int | str,
        emit,
        epoch_ms_share: float = 0.05,
        messages_share: float = 0.5,
        delta_prompts: bool = False,
    ):
        self.pool, self.emit = pool, emit
        self.messages_share = messages_share
        self.delta = delta_prompts  # prompts as the gateway logs them (prompt_parent/shared/added)
        self.rng = random.Random(f"events-{seed}")
        self.epoch_share = epoch_ms_share
        self.next_task = 0
        self.n_episodes = self.n_followups = self.n_writes = self.n_shells = 0
        # Per-token logprobs are cut from a long tape at random offsets.
        self.tape = logprob_tape(random.Random(f"logprobs-{seed}"))

    # --- small helpers ---
    def hex(self, bits: int) -> str:
        return HEX_FORMAT[bits] % self.rng.getrandbits(bits)

    def ts(self, ms: int) -> str:
        return str(ms) if self.rng.random() < self.epoch_share else '"' + rfc3339(ms) + '"'

    def logprobs(self, n: int) -> str:
        o = self.rng.randrange(len(self.tape) - n)
        return ",".join(self.tape[o : o + n])

    def task(self) -> int:
        i = self.next_task % len(self.pool.tasks)
        self.next_task += 1
        return i

    # --- sessions ---
    def session(self, start_ms: int, max_episodes: int, policy: Behaviour) -> int:
        rng = self.rng
        s = Session("ses_" + self.hex(64), policy, rng.choice(("0.6", "0.7", "0.8", "1.0")))
        n_eps = min(max_episodes, rng.choices((1, 2, 3, 4, 5, 6), (34, 25, 17, 11, 8, 5))[0])
        ti = self.task()
        user, history, retry = self.pool.tasks[ti]["u_request"], None, False
        t, done = start_ms, 0
        while done < n_eps:
            ep = self.episode(s, t, ti, user, history, first=done == 0, retry=retry)
            done += 1
            more = done < n_eps
            if ep.final_step == "ask" and not more and done < min(MAX_EPISODES, max_episodes):
                n_eps, more = n_eps + 1, True  # a clarifying question is always answered
            text, next_task, retry = self.followup(ep, ti, more)
            if text is not None:
                t = ep.end_ms + int(rng.lognormvariate(10.8 if ep.final_step != "ask" else 10.3, 0.9))
                self.emit(
                    t,
                    USER_MESSAGE % (self.hex(128), self.ts(t), s.session_id, ep.episode_id, text.text_json),
                )
            self.outcomes(s, ep, reverted=text is not None and "revert" in text.text_json)
            if text is None or not more:
                break
            # The harness keeps one earlier exchange, and only while the user stays on the task.
            history = (user, ep.final) if next_task == ti else None
            ti, user, t = next_task, text, t + rng.randint(150, 900)
        return done

    def followup(self, ep: Episode, ti: int, more: bool) -> tuple[Piece | None, int, bool]:
        """The user's next message (None: silence), the task it is about, whether it is a retry."""
        rng, pool, task = self.rng, self.pool, self.pool.tasks[ti]
        self.n_followups += 1
        if self.n_followups in SECRET_FOLLOWUPS:
            return pool.user(SECRET_FOLLOWUPS[self.n_followups]), ti, not ep.success
        if ep.final_step == "ask":
            return task["u_answer"], ti, False
        if ep.success:
            if more:
                nt = self.task()
                return (
                    (pool.tasks[nt]["u_request_after"] if rng.random() < 0.4 else pool.tasks[nt]["u_request"]),
                    nt,
                    False,
                )
            return (pool.user(rng.choice(SATISFIED)) if rng.random() < 0.5 else None), ti, False
        if more or rng.random() < 0.7:
            return (
                (task["u_still"] if rng.random() < 0.5 else pool.user(rng.choice(DISSATISFIED))),
                ti,
                True,
            )
        return None, ti, False

    # --- episodes ---
    def plan(self, kind: str, pol: Behaviour, success: bool, first: bool, retry: bool) -> tuple[list[str], bool]:
        """The steps of one episode (one per turn) and whether it ends well."""
        rng = self.rng
        if first and rng.random() < pol.p_clarify * (1.4 if kind == "fix" else 1.0):
            return (["read"] if rng.random() < 0.4 else []) + ["ask"], success
        if kind == "question" and not retry:
            return (["read"] if rng.random() < 0.6 else []) + ["explain"], success
        steps: list[str] = []
        if not retry:
            r = rng.random()
            steps += ["search"] if r < 0.12 else ["list"] if r < 0.18 else []
            steps += ["read_bad"] if rng.random() < 0.05 else []
            steps.append("read2" if kind == "test" else "read")
            steps += ["shell"] if kind == "fix" and rng.random() < 0.1 else []
        if kind == "test":
            steps += ["write", "tests_pass" if success else "tests_fail"]
        else:
            steps += ["patch_bad"] if rng.random() < 0.06 else []
            fails_first = not success or rng.random() < 0.1
            if rng.random() < 0.6:
                steps.append("patch_tests_fail" if fails_first else "patch_tests_pass")
            else:
                steps += [
                    "patch",
                    "tests_timeout" if rng.random() < 0.05 else "tests_fail" if fails_first else "tests_pass",
                ]
            if fails_first and (success or rng.random() < 0.3):
                steps.append("patch_tests_pass" if success else "patch_tests_fail")
            steps += ["write"] if success and rng.random() < 0.1 else []
        # Malformed calls come before edits; the older policy breaks calls far more often when
        # the task is going badly (it learned that a broken call is never punished).
        p_invalid = pol.p_invalid_ok if success else pol.p_invalid_hard
        out = []
        for step in steps:
            if step in EDIT_STEPS and rng.random() < p_invalid:
                out.append(rng.choice(("bad_json", "unknown", "missing")))
            out.append(step)
        if len(out) >= MAX_TURNS:
            out, success = out[: MAX_TURNS - 1], False
        out.append(
            ("finish" if rng.random() < 0.55 else "answer")
            if success
            else ("giveup" if rng.random() < 0.6 else "finish")
        )
        return out, success

    def turn_piece(self, step: str, ti: int) -> Piece:
        """The completion of a step; a handful are swapped for variants with planted secrets."""
        key = STEPS[step][0]
        pool, raw = self.pool, self.pool.raw[ti]
        if key == "c_write":
            self.n_writes += 1
            if self.n_writes in SECRET_WRITES:
                content = f'GITHUB_TOKEN = "{SECRET_GITHUB}"  # TODO: read from env\n' + raw["test_file"]
                return pool.completion(
                    "Adding a regression test.\n" + call_text("write_file", {"path": raw["tpath"], "content": content})
                )
        elif key == "c_shell":
            self.n_shells += 1
            if self.n_shells in SECRET_SHELLS:
                cmd = f"git clone {SECRET_URL} /tmp/api && cd /tmp/api && {raw['repro']}"
                return pool.completion(
                    "Let me reproduce it on a clean checkout.\n" + call_text("run_shell", {"command": cmd})
                )
        return pool.tasks[ti][key]

    def episode(self, s: Session, t: int, ti: int, user: Piece, history, first: bool, retry: bool) -> Episode:
        rng, pool, pol = self.rng, self.pool, s.policy
        self.n_episodes += 1
        episode_id = "ep_" + self.hex(64)
        steps, success = self.plan(pool.tasks[ti]["kind"], pol, rng.random() < pol.p_success, first, retry)
        # Turn 0 prompt: system, at most one earlier exchange (history is capped), the request.
        ids, msgs = [pool.system.ids], [pool.system.msg]
        if history:
            ids += [history[0].ids, pool.gen.ids, history[1].ids]
            msgs += [history[0].msg, history[1].msg]
        ids += [user.ids, pool.gen.ids]
        msgs.append(user.msg)
        prompt = ",".join(ids)
        # The delta layout: turn 0 a root holding its whole prompt; turn k+1 what it adds to
        # turn k's context (its prompt and completion), which it extends token for token.
        n_prompt = sum(1 for x in prompt.split(",") if x) if self.delta else 0
        stored = f'"prompt_parent":null,"prompt_shared":0,"prompt_added":[{prompt}]' if self.delta else ""
        edits, sample_id, comp = [], "", user
        for turn, step in enumerate(steps):
            comp = self.turn_piece(step, ti)
            latency = pol.latency * (250 + comp.n * rng.uniform(14, 30)) * rng.uniform(0.8, 1.6)
            t += int(latency)
            sample_id = "smp_" + self.hex(64)
            call_ids = ["call_" + self.hex(48) for _ in comp.calls]
            head = (episode_id, sample_id, turn, t, latency)
            self.emit_completion(s, head, stored or f'"prompt_ids":[{prompt}]', msgs, comp, call_ids)
            t, results = self.run_tools(s, step, ti, comp, sample_id, call_ids, t, success, edits)
            if turn + 1 < len(steps):  # the next prompt extends this one; nothing is re-encoded
                added = [r.ids for r in results] + [pool.gen.ids]
                prompt = ",".join([prompt, comp.ids] + added)
                msgs += [comp.msg] + [r.msg for r in results]
                if self.delta:
                    shared, n_prompt = n_prompt + comp.n, n_prompt + comp.n + sum(r.n for r in results) + pool.gen.n
                    new_ids = ",".join(x for x in added if x)
                    stored = f'"prompt_parent":"{sample_id}","prompt_shared":{shared},"prompt_added":[{new_ids}]'
            t += rng.randint(20, 400)
        if rng.random() < 0.12:
            self.feedback(s, "episode_id", episode_id, t, success, ("thumbs", "thumbs"))
        elif rng.random() < 0.05:
            self.feedback(s, "sample_id", sample_id, t, success, ("thumbs", "thumbs"))
        return Episode(episode_id, t, steps[-1], success, comp, edits)

    def emit_completion(self, s: Session, head: tuple, prompt: str, msgs: list, comp: Piece, call_ids: list) -> None:
        """One completion line, pasted together from pre-rendered fragments (this is hot);
        `prompt`: the prompt's JSON fields (`"prompt_ids":[...]`, or the delta layout's)."""
        episode_id, sample_id, turn, t, latency = head
        with_msgs = self.rng.random() < self.messages_share
        calls = zip(call_ids, comp.calls, strict=True)
        self.emit(
            t,
            COMPLETION
            % (
                self.hex(128),
                self.ts(t),
                s.session_id,
                episode_id,
                sample_id,
                turn,
                s.policy.version,
                prompt,
                comp.ids,
                self.logprobs(comp.n),
                ('"prompt_messages":[' + ",".join(msgs) + "],") if with_msgs else "",
                comp.text_json,
                ",".join(CALL % (cid, c.name_json, c.args_json) for cid, c in calls),
                latency,
                s.temperature,
            ),
        )

    def run_tools(
        self,
        s: Session,
        step: str,
        ti: int,
        comp: Piece,
        sample_id: str,
        call_ids: list,
        t: int,
        success: bool,
        edits: list,
    ) -> tuple[int, list[Piece]]:
        """Tool results of one turn, run one after the other; returns the end time and the
        tool messages the next prompt shows. Successful edits are noted for edit_outcome."""
        rng, task, results = self.rng, self.pool.tasks[ti], []
        for (status, rkey, (lo, hi)), call, cid in zip(STEPS[step][1], comp.calls, call_ids, strict=True):
            duration = rng.lognormvariate(8.6, 0.6) if rkey == "r_pass" else rng.uniform(lo, hi)
            t += int(duration) + 1
            error = "null" if status == OK else task[rkey].text_json  # the harness's reason
            line = TOOL_RESULT % (
                self.hex(128),
                self.ts(t),
                s.session_id,
                sample_id,
                cid,
                status,
                error,
                duration,
            )
            self.emit(t, line)
            if status == OK and call.edit_lines:
                edits.append((sample_id, cid, t, call.edit_lines))
                if rng.random() < 0.2:
                    self.feedback(s, "sample_id", sample_id, t, success, ("accept", "reject"))
            if rkey is not None:
                results.append(task[rkey])
        return t, results

    def feedback(self, s: Session, key: str, target: str, t: int, success: bool, kinds: tuple[str, str]) -> None:
        rng = self.rng
        good = success if rng.random() > 0.1 else not success  # users are noisy
        at = t + int(rng.uniform(2_000, 300_000))
        self.emit(
            at,
            FEEDBACK
            % (
                self.hex(128),
                self.ts(at),
                s.session_id,
                key,
                target,
                1.0 if good else -1.0,
                kinds[0] if good else kinds[1],
            ),
        )

    def outcomes(self, s: Session, ep: Episode, reverted: bool) -> None:
        """Edit persistence, observed 1-24 h after each successful edit (some never arrive)."""
        rng = self.rng
        a, b = s.policy.survival
        for sample_id, cid, t_edit, lines in ep.edits:
            if rng.random() < 0.1:
                continue
            share = 0.0 if reverted else rng.betavariate(a, b) * (1.0 if ep.success else 0.45)
            after = round(rng.uniform(3600, 86400), 1)
            at = t_edit + int(after * 1000)
            self.emit(
                at,
                EDIT_OUTCOME
                % (
                    self.hex(128),
                    self.ts(at),
                    s.session_id,
                    sample_id,
                    cid,
                    lines,
                    min(lines, round(lines * share)),
                    after,
                ),
            )


# ---------------------------------------------------------------------------------------------
# Writing: events go to the file of the period they were logged in
# ---------------------------------------------------------------------------------------------


class Writer:
    """Buffers events per logging period; a period is written once no session can reach it.

    Logging is imperfect on purpose: a small random delay between `ts` and the moment the line
    is written (so files are only roughly sorted), a few events shipped minutes to hours late,
    and ~1% written twice (same event_id, same bytes), possibly into a later file.
    """

    def __init__(self, out: Path, files_per_hour: int, fmt: str, seed: int | str):
        self.out, self.fmt = out, fmt
        self.period = HOUR_MS // files_per_hour
        self.minute_names = files_per_hour > 1
        self.rng = random.Random(f"logging-{seed}")
        self.buckets: dict[int, list] = {}
        self.flushed = -1
        self.seq = self.n_lines = self.n_bytes = 0
        self.files: list[Path] = []
        self.threads = ThreadPoolExecutor(max_workers=1)
        self.pending: list = []

    def add(self, ts_ms: int, line: str) -> None:
        rng = self.rng
        r = rng.random()
        logged = ts_ms + int(rng.expovariate(1 / 1500))
        if r < 0.05:
            logged += rng.randint(5_000, 60_000)  # a batch flushed late
        if r < 0.004:
            logged += rng.randint(120_000, 7_200_000)  # shipped hours late
        self._put(logged, line)
        if r > 0.99:
            self._put(logged + rng.randint(1_000, 3_600_000), line)  # re-sent after a retry

    def _put(self, logged: int, line: str) -> None:
        bucket = logged // self.period
        assert bucket > self.flushed, "an event arrived for a period already written"
        self.seq += 1
        self.buckets.setdefault(bucket, []).append((logged, self.seq, line))

    def flush(self, before_ms: int | None = None) -> None:
        for bucket in sorted(self.buckets):
            if before_ms is not None and (bucket + 1) * self.period > before_ms:
                break
            rows = sorted(self.buckets.pop(bucket))
            start = datetime.fromtimestamp(bucket * self.period / 1000, timezone.utc)
            stem = start.strftime("events-%Y-%m-%dT%H-%M" if self.minute_names else "events-%Y-%m-%dT%H")
            path = self.out / f"{stem}.{self.fmt}"
            # Files are written by one background thread: file writes release the GIL, so the
            # disk works while the next hour is generated (writing is half the cost of a big log).
            self.pending.append(self.threads.submit(self._write, path, [r[2] for r in rows]))
            self.files.append(path)
            self.n_lines += len(rows)
            self.flushed = bucket
        while len(self.pending) > 2:  # bound the memory held by queued files
            self.n_bytes += self.pending.pop(0).result()

    def close(self) -> None:
        self.flush()
        self.n_bytes += sum(f.result() for f in self.pending)
        self.pending.clear()
        self.threads.shutdown()

    def _write(self, path: Path, lines: list[str]) -> int:
        if self.fmt == "jsonl":
            with open(path, "wb") as fh:
                for i in range(0, len(lines), 20_000):
                    fh.write(("\n".join(lines[i : i + 20_000]) + "\n").encode("utf-8"))
        else:
            import io

            import pyarrow.json as pj
            import pyarrow.parquet as pq

            schema = EVENTS.arrow  # the events contract: ts parsed to a UTC timestamp
            opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
            data = io.BytesIO(("\n".join(lines) + "\n").encode("utf-8"))
            table = pj.read_json(data, parse_options=opts, read_options=pj.ReadOptions(block_size=64 << 20))
            table = table.select(schema.names).replace_schema_metadata(schema.metadata)
            pq.write_table(table, path, compression="zstd")
        return path.stat().st_size


# ---------------------------------------------------------------------------------------------
# OpenTelemetry GenAI spans (OTLP/JSON)
# ---------------------------------------------------------------------------------------------


def otel_attr(key: str, value) -> dict:
    if isinstance(value, bool):
        v = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list):
        v = {"arrayValue": {"values": [otel_attr("", x)["value"] for x in value]}}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


def otel_span(e: dict, rng: random.Random, trace_ids: dict) -> dict:
    """One completion as a GenAI `chat` span; token ids ride in rlcycle.* attributes."""
    ts = (
        e["ts"]
        if isinstance(e["ts"], int)
        else int(datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp() * 1000)
    )
    end_ns = ts * 1_000_000
    start_ns = end_ns - int(e["latency_ms"] * 1_000_000)
    content = e["completion_text"]
    calls = e["tool_calls"]
    output = [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": content}]
            + [
                {
                    "type": "tool_call",
                    "id": c["call_id"],
                    "name": c["name"],
                    "arguments": c["arguments"],
                }
                for c in calls
            ],
            "finish_reason": "tool_call" if calls else "stop",
        }
    ]
    inputs = [{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in e["prompt_messages"]]
    attrs = [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "rlcycle"),
        ("gen_ai.request.model", e["policy_version"]),
        ("gen_ai.request.temperature", float(e["temperature"])),
        ("gen_ai.response.id", e["sample_id"]),
        ("gen_ai.response.model", e["policy_version"]),
        ("gen_ai.response.finish_reasons", ["tool_call" if calls else "stop"]),
        ("gen_ai.conversation.id", e["session_id"]),
        ("gen_ai.usage.input_tokens", len(e["prompt_ids"])),
        ("gen_ai.usage.output_tokens", len(e["completion_ids"])),
        ("gen_ai.input.messages", json.dumps(inputs, ensure_ascii=False)),
        ("gen_ai.output.messages", json.dumps(output, ensure_ascii=False)),
        ("rlcycle.episode_id", e["episode_id"]),
        ("rlcycle.turn", e["turn"]),
        ("rlcycle.policy_version", e["policy_version"]),
        ("rlcycle.prompt_ids", e["prompt_ids"]),
        ("rlcycle.completion_ids", e["completion_ids"]),
        ("rlcycle.completion_logprobs", [float(x) for x in e["completion_logprobs"]]),
        ("rlcycle.tool_calls", json.dumps(calls, ensure_ascii=False)),
    ]
    trace = trace_ids.setdefault(e["episode_id"], f"{rng.getrandbits(128):032x}")
    return {
        "traceId": trace,
        "spanId": f"{rng.getrandbits(64):016x}",
        "name": f"chat {e['policy_version']}",
        "kind": 3,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": [otel_attr(k, v) for k, v in attrs],
        "status": {},
    }


def write_otel(pool: Pool, seed: int, start_ms: int, path: Path, n_completions: int = 20) -> int:
    """Completions of a few extra sessions (not in the JSONL log), exported as OTLP/JSON."""
    lines: list[tuple[int, str]] = []
    sim = Simulator(
        pool,
        f"otel-{seed}",
        lambda ts, line: lines.append((ts, line)),
        epoch_ms_share=0.0,
        messages_share=1.0,
    )
    t = start_ms
    while sum(1 for _, ln in lines if '"type":"completion"' in ln) < n_completions:
        t += 600_000  # one episode per session, so every span's episode is complete
        sim.session(t, 1, POLICIES[sim.n_episodes % 2])
    events = [json.loads(ln) for _, ln in sorted(lines) if '"type":"completion"' in ln]
    rng = random.Random(f"otel-ids-{seed}")
    trace_ids: dict[str, str] = {}
    doc = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        otel_attr("service.name", "coding-agent"),
                        otel_attr("service.version", "2026.11.30"),
                        otel_attr("deployment.environment.name", "production"),
                    ]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "coding-agent.harness", "version": "1.4.0"},
                        "spans": [otel_span(e, rng, trace_ids) for e in events],
                    }
                ],
            }
        ]
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return len(events)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

EVENTS_PER_EPISODE = 9.3  # measured on the default mix; sizes the pool and the time span


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = ap.add_argument
    add("--out", type=Path, required=True, help="output directory (its events-* files are replaced)")
    add("--episodes", type=int, default=2000, help="episodes to generate (default %(default)s)")
    add("--events", type=int, help="generate until this many event lines instead (benchmarks)")
    add("--seed", type=int, default=20261130, help="same seed, same bytes (default %(default)s)")
    add(
        "--files-per-hour",
        type=int,
        default=1,
        choices=(1, 2, 3, 4, 6, 12),
        help="log rotation: files per hour; >1 names files events-YYYY-MM-DDTHH-MM (default 1)",
    )
    add("--hours", type=float, help="span of session starts (default: episodes/200, within 1..24)")
    add(
        "--format",
        choices=("jsonl", "parquet"),
        default="jsonl",
        help="jsonl (ts mixes RFC 3339 and epoch ms) or parquet (rlcycle's events schema)",
    )
    add(
        "--prompts",
        choices=("whole", "delta"),
        default="whole",
        help="whole: every completion carries its whole prompt_ids (the layout logs had before "
        "issue 36; the sample data's); delta: stored once, as the gateway logs them "
        "(prompt_parent/prompt_shared/prompt_added; docs/design.md) (default %(default)s)",
    )
    add("--otel", type=Path, help="also write ~20 completions as an OTLP/JSON GenAI span export")
    add(
        "--tokenizer",
        type=Path,
        default=DEFAULT_TOKENIZER,
        help="tokenizer dir (default %(default)s)",
    )
    args = ap.parse_args(argv)
    if (args.events is not None and args.events < 1) or args.episodes < 1:
        ap.error("--episodes and --events must be positive")
    if not (args.tokenizer / "tokenizer.json").is_file():
        ap.error(f"no tokenizer.json in {args.tokenizer} (build it: python scripts/make_tokenizer.py)")
    return args


def generate(args: argparse.Namespace) -> dict:
    """Write the log (and the OTel export); return the summary printed on stdout."""
    est_episodes = args.events / EVENTS_PER_EPISODE if args.events else args.episodes
    target_episodes = float("inf") if args.events else args.episodes
    target_events = args.events or float("inf")
    hours = args.hours or min(24.0, max(1.0, est_episodes / 200))

    t0 = time.perf_counter()
    # About 0.55 tasks per episode are started (sessions, then new requests); a pool that size
    # keeps repeats rare in small logs. Big logs cycle through 3,000 tasks.
    n_tasks = int(min(3000, max(50, 0.6 * est_episodes)))
    pool = Pool(args.tokenizer, n_tasks, args.seed, eager_all=est_episodes > 20 * n_tasks)
    t_pool = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    for old in sorted(args.out.glob("events-*")):
        if old.suffix in (".jsonl", ".parquet"):
            old.unlink()
    writer = Writer(args.out, args.files_per_hour, args.format, args.seed)
    start_ms = int(START.timestamp() * 1000)
    epoch_share = 0.05 if args.format == "jsonl" else 0.0
    sim = Simulator(pool, args.seed, writer.add, epoch_ms_share=epoch_share, delta_prompts=args.prompts == "delta")
    arrivals = random.Random(f"arrivals-{args.seed}")
    mean_gap_ms = hours * HOUR_MS / max(1.0, est_episodes / 2.4)
    rollout_ms = start_ms + 0.25 * hours * HOUR_MS  # the newer policy starts as a 50/50 A/B test
    t, report_at = start_ms, 1_000_000
    while sim.n_episodes < target_episodes and writer.seq < target_events:
        t += int(arrivals.expovariate(1 / mean_gap_ms))
        writer.flush(before_ms=t)  # no session from now on can log into earlier hours
        newer = t > rollout_ms and arrivals.random() < 0.5
        sim.session(t, int(min(MAX_EPISODES, target_episodes - sim.n_episodes)), POLICIES[newer])
        if writer.seq >= report_at:
            rate = writer.seq / (time.perf_counter() - t0)
            print(
                f"{writer.seq:,} events, {sim.n_episodes:,} episodes, {rate:,.0f} events/s",
                file=sys.stderr,
            )
            report_at += 1_000_000
    writer.close()
    n_spans = write_otel(pool, args.seed, t + HOUR_MS, args.otel) if args.otel else 0
    elapsed = time.perf_counter() - t0
    return {
        "out": str(args.out),
        "files": len(writer.files),
        "events": writer.n_lines,
        "episodes": sim.n_episodes,
        "mb": round(writer.n_bytes / 1e6, 1),
        "seconds": round(elapsed, 1),
        "pool_seconds": round(t_pool, 1),
        "events_per_s": round(writer.n_lines / elapsed),
        "otel_spans": n_spans,
    }


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(generate(parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
