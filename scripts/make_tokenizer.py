"""Build rlcycle's default tokenizer: a deterministic byte-level BPE with 4,096 tokens.

What goes in: nothing but a seed. The script writes its own training corpus (Python source of
small coding tasks -- functions, classes, tests, tracebacks, diffs, shell output -- and English
developer chat in ChatML with JSON tool calls), trains a byte-level BPE on it with the HF
`tokenizers` library, and saves it in Hugging Face format.

What comes out: `sample_data/tokenizer/` with `tokenizer.json`, `tokenizer_config.json` (eos, pad,
bos, `model_max_length` 4096, a ChatML `chat_template`) and `special_tokens_map.json`, loadable
offline by `transformers.AutoTokenizer.from_pretrained("sample_data/tokenizer")`.

Special tokens, ids 0..7 in this order: <|endoftext|> <|im_start|> <|im_end|> <tool_call>
</tool_call> <tool_response> </tool_response> <|pad|>. The four tool tags are added tokens that
are *not* special, so `decode(..., skip_special_tokens=True)` keeps tool calls in the text.

Regenerate the committed tokenizer (byte-identical on every run):
    .venv/bin/python scripts/make_tokenizer.py
Check that the committed files are what this script builds (exit 1 if not):
    .venv/bin/python scripts/make_tokenizer.py --check
"""

from __future__ import annotations

import os

# The BPE trainer counts words in parallel; one thread removes any doubt about merge order.
# Must be set before `tokenizers` starts its thread pool, i.e. before the import below.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import filecmp  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 4096
SEED = 20261130
N_DOCUMENTS = 12_000
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|pad|>",
]
# Tags that must survive skip_special_tokens=True (they carry the tool calls).
NON_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
# Plain ChatML. A `tool` message holds the raw tool output and is wrapped in <tool_response>
# here, as rlcycle.harness renders it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "sample_data" / "tokenizer"
OUTPUT_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# ---------------------------------------------------------------------------------------------
# Corpus: word lists
# ---------------------------------------------------------------------------------------------

NOUNS = (
    "user order invoice config cache token request session item record file path price total "
    "count event metric batch queue job task account report row column key value node edge graph "
    "score rate limit window timestamp message payload header url response client server worker "
    "retry parser schema field table query result error customer product cart discount tax "
    "address email name id status amount currency balance log line chunk buffer offset index "
    "version checkpoint model dataset sample label feature weight user_id order_id created_at"
).split()
VERBS = (
    "get load parse compute validate normalize fetch save update merge filter sort group format "
    "render build apply resolve split flatten handle convert read write check count find remove "
    "add create delete sync export import encode decode serialize hash retry schedule dispatch"
).split()
ADJS = "active pending valid raw clean total max min default current next last first new old".split()
PACKAGES = (
    "billing inventory auth api utils core cli ingest reports scheduler payments search users "
    "notifications storage analytics"
).split()
EXCEPTIONS = (
    "ValueError TypeError KeyError IndexError AttributeError ZeroDivisionError RuntimeError "
    "FileNotFoundError AssertionError ImportError NotImplementedError PermissionError"
).split()
TOOLS = ("read_file write_file apply_patch list_files search run_shell run_tests ask_user finish").split()
NAMES = "alice bob carol dave erin frank grace heidi ivan judy mallory oscar peggy trent".split()
# Everyday English for the chat side, so merges also learn prose and not only identifiers.
ENGLISH = (
    "the be to of and a in that have it for not on with he as you do at this but his by from they we "
    "say her she or an will my one all would there their what so up out if about who get which go me "
    "when make can like time no just him know take people into year your good some could them see "
    "other than then now look only come its over think also back after use two how our work first well "
    "way even new want because any these give day most us is are was were been has had did does doing "
    "should must might need try fix change add remove keep still again already before after while "
    "during until since though although however maybe probably actually really quite very too much "
    "more less many few every each both either neither same different other another such thing things "
    "problem issue bug error failure test tests passing failing broken works working expected actual "
    "behaviour behavior output input function method class module package file files folder directory "
    "repository branch commit merge pull request review comment comments change changes line lines "
    "code logic case cases edge empty missing wrong right correct incorrect slow fast faster memory "
    "speed performance database query api endpoint service server client request response timeout "
    "retry cache config setting settings option options flag flags argument arguments parameter value "
    "values type types string integer float list dict tuple set none null true false default "
    "please thanks thank sorry sure okay ok yes no hi hello hey great nice perfect awesome cool weird "
    "strange annoying urgent quick small big large simple complex clean messy old new legacy production "
    "staging local remote deploy deployed release version upgrade downgrade install installed run ran "
    "running start started stop stopped crash crashed hang hangs stuck wait waiting customer customers "
    "team manager weekend tomorrow today yesterday morning afternoon night week month soon later "
    "understand explain explained mean meant think thought guess assume assumed clarify question answer "
    "help helpful possible impossible sense idea suggestion alternative approach solution workaround "
    "refactor rename extract inline split combine document documentation readme example examples"
).split()


def ident(rng: random.Random) -> str:
    """A snake_case function name such as `parse_order_total`."""
    parts = [rng.choice(VERBS), rng.choice(NOUNS)]
    if rng.random() < 0.4:
        parts.append(rng.choice(NOUNS))
    return "_".join(parts)


def var(rng: random.Random) -> str:
    return rng.choice(NOUNS) if rng.random() < 0.7 else f"{rng.choice(ADJS)}_{rng.choice(NOUNS)}"


def camel(rng: random.Random) -> str:
    return "".join(w.capitalize() for w in (rng.choice(NOUNS) + "_" + rng.choice(NOUNS)).split("_"))


def src_path(rng: random.Random) -> str:
    return f"src/{rng.choice(PACKAGES)}/{rng.choice(NOUNS)}.py"


def test_path(rng: random.Random) -> str:
    return f"tests/test_{rng.choice(NOUNS)}.py"


def literal(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        return str(rng.choice([0, 1, 2, 3, 10, 42, 100, 256, 1000, -1]))
    if r < 0.55:
        return f"{rng.uniform(0, 100):.2f}"
    if r < 0.8:
        return repr(rng.choice(NOUNS + NAMES))
    return rng.choice(["None", "True", "False", "[]", "{}", "()"])


# ---------------------------------------------------------------------------------------------
# Corpus: Python source
# ---------------------------------------------------------------------------------------------


def function_body(rng: random.Random, args: list[str]) -> list[str]:
    a = args[0] if args else var(rng)
    x, y = var(rng), var(rng)
    shapes = [
        [
            "result = []",
            f"for {x} in {a}:",
            f"    if {x}.{y} is not None:",
            f"        result.append({x}.{y})",
            "return result",
        ],
        [f"return [{x} for {x} in {a} if {x} {rng.choice(['>', '<', '>=', '!='])} {literal(rng)}]"],
        ["total = 0", f"for {x} in {a}:", f"    total += {x}.get({y!r}, 0)", "return total"],
        [
            f"if not {a}:",
            f'    raise {rng.choice(EXCEPTIONS)}(f"empty {a}: {{{a}!r}}")',
            f"return {a}[{rng.choice(['0', '-1', '1:', ':-1'])}]",
        ],
        [
            "try:",
            f'    with open({a}, encoding="utf-8") as fh:',
            "        data = json.load(fh)",
            "except FileNotFoundError:",
            "    return {}",
            f"return data.get({y!r}, {literal(rng)})",
        ],
        [
            f"{x} = {{}}",
            f"for item in {a}:",
            f"    {x}.setdefault(item[{y!r}], []).append(item)",
            f"return {x}",
        ],
        [
            f"if {a} is None:",
            f"    {a} = {literal(rng)}",
            f'logger.debug("{ident(rng)} %s", {a})',
            f"return round(float({a}) * {literal(rng)}, 2)",
        ],
        [
            f"parts = {a}.strip().split({rng.choice([',', ':', '/', ' '])!r})",
            "return {k: v for k, v in zip(parts[::2], parts[1::2])}",
        ],
        [
            f"for attempt in range({rng.randint(2, 5)}):",
            "    try:",
            f"        return client.{rng.choice(VERBS)}({a}, timeout={rng.randint(1, 30)})",
            "    except TimeoutError:",
            "        time.sleep(2 ** attempt)",
            'raise RuntimeError("gave up after retries")',
        ],
        [f"return sorted({a}, key=lambda {x}: ({x}.{y}, {x}.{var(rng)}), reverse={rng.choice(['True', 'False'])})"],
        [
            f"if len({a}) > {rng.randint(2, 500)}:",
            f"    {a} = {a}[:{rng.randint(2, 500)}]",
            f'return "".join(c for c in {a} if c.isalnum() or c in "-_")',
        ],
        [
            f"async with session.get(url, params={{{y!r}: {a}}}) as resp:",
            "    resp.raise_for_status()",
            "    return await resp.json()",
        ],
    ]
    return rng.choice(shapes)


def python_function(rng: random.Random) -> str:
    name = ident(rng)
    args = [var(rng) for _ in range(rng.randint(1, 3))]
    hints = [
        rng.choice(["", ": str", ": int", ": list[dict]", ": dict[str, Any]", ": Path", ": float | None"]) for _ in args
    ]
    sig = ", ".join(a + h for a, h in zip(args, hints, strict=True))
    ret = rng.choice(["", " -> int", " -> list", " -> dict", " -> str", " -> bool", " -> None", " -> float"])
    lines = [f"def {name}({sig}){ret}:"]
    if rng.random() < 0.6:
        lines.append(f'    """{rng.choice(VERBS).capitalize()} the {rng.choice(NOUNS)} of each {rng.choice(NOUNS)}."""')
    lines += ["    " + ln for ln in function_body(rng, args)]
    return "\n".join(lines) + "\n"


def python_class(rng: random.Random) -> str:
    name = camel(rng)
    fields = [var(rng) for _ in range(rng.randint(2, 5))]
    lines = []
    if rng.random() < 0.5:
        lines += ["@dataclass", f"class {name}:"]
        lines += [
            f"    {f}: {rng.choice(['int', 'str', 'float', 'list[str]', 'dict', 'bool'])} = {literal(rng)}"
            for f in fields
        ]
    else:
        lines += [f"class {name}({rng.choice(['', 'Base', 'Exception', 'Protocol'])}):".replace("()", "")]
        lines += [f"    def __init__(self, {', '.join(fields)}):"]
        lines += [f"        self.{f} = {f}" for f in fields]
    for _ in range(rng.randint(1, 2)):
        body = function_body(rng, ["self." + fields[0]])
        lines += ["", f"    def {ident(rng)}(self):"] + ["        " + ln for ln in body]
    return "\n".join(lines) + "\n"


def python_module(rng: random.Random) -> str:
    head = rng.sample(
        [
            "import json",
            "import logging",
            "import os",
            "import re",
            "import time",
            "from pathlib import Path",
            "from dataclasses import dataclass",
            "from typing import Any",
            "import asyncio",
            f"from {rng.choice(PACKAGES)}.{rng.choice(NOUNS)} import {ident(rng)}",
        ],
        k=rng.randint(2, 5),
    )
    parts = ["\n".join(sorted(head)), "logger = logging.getLogger(__name__)"]
    for _ in range(rng.randint(1, 3)):
        parts.append(python_function(rng) if rng.random() < 0.7 else python_class(rng))
    return "\n\n".join(parts)


def pytest_file(rng: random.Random) -> str:
    mod, fn = rng.choice(NOUNS), ident(rng)
    lines = ["import pytest", "", f"from {rng.choice(PACKAGES)}.{mod} import {fn}", ""]
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.3:
            cases = ", ".join(f"({literal(rng)}, {literal(rng)})" for _ in range(rng.randint(2, 4)))
            lines += [
                "",
                f'@pytest.mark.parametrize("value, expected", [{cases}])',
                f"def test_{fn}_{rng.choice(ADJS)}(value, expected):",
                f"    assert {fn}(value) == expected",
            ]
        elif rng.random() < 0.3:
            lines += [
                "",
                f"def test_{fn}_raises():",
                f"    with pytest.raises({rng.choice(EXCEPTIONS)}):",
                f"        {fn}({literal(rng)})",
            ]
        else:
            lines += [
                "",
                f"def test_{fn}_{rng.choice(NOUNS)}(tmp_path):",
                f"    {var(rng)} = {literal(rng)}",
                f"    assert {fn}({literal(rng)}) == {literal(rng)}",
            ]
    return "\n".join(lines) + "\n"


def traceback_text(rng: random.Random) -> str:
    lines = ["Traceback (most recent call last):"]
    for _ in range(rng.randint(1, 4)):
        lines += [
            f'  File "{rng.choice([src_path(rng), test_path(rng)])}", line {rng.randint(3, 400)}, in {ident(rng)}',
            f"    {rng.choice(['return', 'result =', 'self.' + var(rng) + ' ='])} {ident(rng)}({var(rng)})",
        ]
    exc = rng.choice(EXCEPTIONS)
    msgs = {
        "KeyError": repr(rng.choice(NOUNS)),
        "TypeError": f"unsupported operand type(s) for +: 'int' and '{rng.choice(['str', 'NoneType', 'list'])}'",
        "AttributeError": f"'NoneType' object has no attribute '{rng.choice(NOUNS)}'",
        "IndexError": "list index out of range",
        "ZeroDivisionError": "division by zero",
        "ValueError": f"invalid literal for int() with base 10: '{rng.choice(NOUNS)}'",
        "FileNotFoundError": f"[Errno 2] No such file or directory: '{src_path(rng)}'",
        "ImportError": f"cannot import name '{ident(rng)}' from '{rng.choice(PACKAGES)}.{rng.choice(NOUNS)}'",
    }
    lines.append(f"{exc}: {msgs.get(exc, 'expected ' + literal(rng) + ', got ' + literal(rng))}")
    return "\n".join(lines) + "\n"


def unified_diff(rng: random.Random) -> str:
    path = src_path(rng)
    before = python_function(rng).splitlines()
    after = list(before)
    k = rng.randrange(1, len(after))
    after[k] = after[k].replace("None", "0").replace(">", ">=").replace("[0]", "[-1]") + rng.choice(["", "  # fixed"])
    if rng.random() < 0.5:
        after.insert(k, after[k][: len(after[k]) - len(after[k].lstrip())] + f"if {var(rng)} is None:")
    start = rng.randint(1, 200)
    out = [f"--- a/{path}", f"+++ b/{path}", f"@@ -{start},{len(before)} +{start},{len(after)} @@"]
    i = j = 0
    while i < len(before) or j < len(after):
        if i < len(before) and j < len(after) and before[i] == after[j]:
            out.append(" " + before[i])
            i += 1
            j += 1
        elif j < len(after) and (i >= len(before) or after[j] not in before[i:]):
            out.append("+" + after[j])
            j += 1
        else:
            out.append("-" + before[i])
            i += 1
    return "\n".join(out) + "\n"


def shell_output(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:
        n_pass, n_fail = rng.randint(0, 40), rng.randint(0, 3)
        dots = "." * min(n_pass, 30) + "F" * n_fail
        tail = f"{n_fail} failed, {n_pass} passed" if n_fail else f"{n_pass} passed"
        body = f"$ python -m pytest -q {test_path(rng)}\n{dots}\n"
        if n_fail:
            body += (
                f"=================================== FAILURES ===================================\n"
                f"___ test_{ident(rng)} ___\n\n    def test_{ident(rng)}():\n>       assert {ident(rng)}({literal(rng)}) == {literal(rng)}\nE       AssertionError: assert {literal(rng)} == {literal(rng)}\n\n"
            )
            body += f"FAILED {test_path(rng)}::test_{ident(rng)} - AssertionError\n"
        return body + f"{tail} in {rng.uniform(0.01, 9):.2f}s\n"
    if kind == 1:
        files = "\n".join(f"\tmodified:   {src_path(rng)}" for _ in range(rng.randint(1, 4)))
        return f"$ git status\nOn branch {rng.choice(['main', 'fix/' + ident(rng), 'feature/' + var(rng)])}\nChanges not staged for commit:\n{files}\n"
    if kind == 2:
        return f'$ grep -rn "{ident(rng)}" src/\n' + "".join(
            f"{src_path(rng)}:{rng.randint(1, 300)}:    {ident(rng)}({var(rng)})\n" for _ in range(rng.randint(1, 5))
        )
    if kind == 3:
        return (
            f"$ ls {rng.choice(['', 'src/', 'tests/', 'src/' + rng.choice(PACKAGES) + '/'])}\n"
            + "\n".join(
                rng.sample(
                    [
                        "README.md",
                        "pyproject.toml",
                        "setup.cfg",
                        "src",
                        "tests",
                        "__init__.py",
                        "conftest.py",
                        "requirements.txt",
                        "Makefile",
                        ".gitignore",
                        f"{rng.choice(NOUNS)}.py",
                        "docs",
                    ],
                    5,
                )
            )
            + "\n"
        )
    if kind == 4:
        pkg = rng.choice(["requests", "numpy", "pydantic", "httpx", "sqlalchemy", "pytest", "rich", "click"])
        return f"$ pip install {pkg}\nCollecting {pkg}\n  Downloading {pkg}-{rng.randint(1, 3)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}-py3-none-any.whl ({rng.randint(20, 900)} kB)\nSuccessfully installed {pkg}\n"
    if kind == 5:
        return "".join(
            f"{src_path(rng)}:{rng.randint(1, 300)}:{rng.randint(1, 80)}: {rng.choice(['F401', 'E501', 'B006', 'F841'])} {rng.choice(['unused import', 'line too long', 'mutable default argument', 'local variable is assigned to but never used'])}\n"
            for _ in range(rng.randint(1, 4))
        )
    return f'$ python -c "from {rng.choice(PACKAGES)} import {ident(rng)}"\n' + traceback_text(rng)


# ---------------------------------------------------------------------------------------------
# Corpus: developer chat with tool calls
# ---------------------------------------------------------------------------------------------

REQUESTS = [
    "Can you fix the bug in {path}? {fn} returns the wrong {noun} when the list is empty.",
    "The test {test} is failing after my last change, please take a look.",
    "Please add a unit test for {fn} that covers the {adj} case.",
    "Refactor {fn} so it does not read the whole file into memory.",
    "Why does {fn} raise {exc} on this input? {lit}",
    "Add type hints to {path} and make mypy happy.",
    "I need a function that {verb}s every {noun} in a {noun2} and returns a dict.",
    "rename {fn} to {fn2} everywhere and update the tests",
    "Our CI says {exc} in {path}, can you fix it without changing the public API?",
    "write a small CLI around {fn} that takes a path and prints json",
]
FOLLOWUPS = [
    "thanks, works",
    "Thanks! That fixed it.",
    "great, merging this",
    "perfect, thank you",
    "that's wrong, it still fails",
    "no, revert that",
    "This broke {test}, please undo it.",
    "Still getting {exc} on the same input.",
    "ok, now can you also {verb} the {noun}?",
    "Looks good. Next: add logging to {fn}.",
    "hmm, not what I meant. I wanted {fn2} to stay as it is.",
]
QUESTIONS = [
    "Should {fn} return None or raise {exc} when the {noun} is missing?",
    "Do you want me to keep the old behaviour for {noun2} values, or change it everywhere?",
    "Which Python version do you target? The fix is different before 3.10.",
    "Is {path} the file you mean, or the copy under tests/fixtures?",
    "Can I change the signature of {fn}, or is it used by other services?",
]
EXPLANATIONS = [
    "The bug is in {fn}: it uses `{noun}[0]` but the list can be empty, so it raises {exc}. I added a guard and a test.",
    "I changed {fn} to stream the file line by line instead of calling `read()`. Memory stays flat now.",
    "All {n} tests pass. The failure came from a stale default argument in {fn2}.",
    "I could not reproduce the failure locally; `{test}` passes on main. Could you share the full traceback?",
    "Done: {fn} is renamed to {fn2} in {n} files and the tests are updated.",
]
SYSTEM_PROMPTS = [
    "You are a coding agent working in a git repository. Use the tools to read, edit and test code. "
    'Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
    "Ask the user when the request is ambiguous. Call finish when done.",
    "You are a helpful assistant for software engineers.",
]


def fill(rng: random.Random, template: str) -> str:
    return template.format(
        path=src_path(rng),
        fn=ident(rng),
        fn2=ident(rng),
        noun=rng.choice(NOUNS),
        noun2=rng.choice(NOUNS),
        adj=rng.choice(ADJS),
        exc=rng.choice(EXCEPTIONS),
        lit=literal(rng),
        test=f"{test_path(rng)}::test_{ident(rng)}",
        verb=rng.choice(VERBS),
        n=rng.randint(2, 60),
    )


def tool_call(rng: random.Random) -> str:
    name = rng.choice(TOOLS)
    args = {
        "read_file": lambda: {"path": src_path(rng)},
        "write_file": lambda: {"path": test_path(rng), "content": pytest_file(rng)},
        "apply_patch": lambda: {"path": src_path(rng), "patch": unified_diff(rng)},
        "list_files": lambda: {"path": rng.choice(["src", "tests", ".", "src/" + rng.choice(PACKAGES)])},
        "search": lambda: {"pattern": ident(rng), "path": rng.choice(["src", "."])},
        "run_shell": lambda: {
            "command": rng.choice(
                [
                    "git status",
                    "git diff",
                    "ls -la",
                    f"python -m pytest -q {test_path(rng)}",
                    f"grep -rn {ident(rng)} src",
                ]
            )
        },
        "run_tests": lambda: {},
        "ask_user": lambda: {"question": fill(rng, rng.choice(QUESTIONS))},
        "finish": lambda: {"summary": fill(rng, rng.choice(EXPLANATIONS))},
    }[name]()
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"


def chat(rng: random.Random) -> str:
    """One ChatML conversation: system, user request, assistant turns with tool calls and results."""
    msgs = [("system", rng.choice(SYSTEM_PROMPTS)), ("user", fill(rng, rng.choice(REQUESTS)))]
    for _ in range(rng.randint(1, 4)):
        lead = rng.choice(
            [
                "",
                "Let me look at the code first.\n",
                "I'll run the tests.\n",
                "Now I'll apply the fix.\n",
            ]
        )
        msgs.append(("assistant", lead + tool_call(rng)))
        result = rng.choice([python_module, shell_output, traceback_text, lambda r: "ok"])(rng)
        msgs.append(("tool", f"<tool_response>\n{result}</tool_response>"))
    if rng.random() < 0.3:
        msgs.append(("assistant", fill(rng, rng.choice(QUESTIONS))))
    else:
        msgs.append(("assistant", fill(rng, rng.choice(EXPLANATIONS))))
    msgs.append(("user", fill(rng, rng.choice(FOLLOWUPS))))
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in msgs) + "<|endoftext|>"


def prose(rng: random.Random) -> str:
    """Free-form developer prose: commit messages, review comments, issue text."""
    sentences = []
    for _ in range(rng.randint(1, 6)):
        words = [rng.choice(ENGLISH) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.4:
            words.insert(
                rng.randrange(len(words)),
                rng.choice([f"`{ident(rng)}`", src_path(rng), rng.choice(EXCEPTIONS)]),
            )
        sentence = " ".join(words)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "?", "!", ":"]))
    text = " ".join(sentences)
    return rng.choice(["", "fix: ", "feat: ", "# ", "> ", "- ", "TODO: "]) + text + "\n"


def build_corpus(seed: int = SEED, n_documents: int = N_DOCUMENTS) -> list[str]:
    """The training documents, a pure function of the seed. Sorted, so order is never an accident."""
    rng = random.Random(seed)
    makers = [
        (python_module, 3),
        (pytest_file, 2),
        (traceback_text, 1),
        (unified_diff, 2),
        (shell_output, 2),
        (chat, 4),
        (prose, 4),
    ]
    population = [m for m, weight in makers for _ in range(weight)]
    return sorted(rng.choice(population)(rng) for _ in range(n_documents))


# ---------------------------------------------------------------------------------------------
# Train and save
# ---------------------------------------------------------------------------------------------


def train(corpus: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    return tok


def tokenizer_json(tok: Tokenizer) -> dict:
    """The serialised tokenizer, with the tool tags marked non-special."""
    data = json.loads(tok.to_str())
    for added in data["added_tokens"]:
        added["special"] = added["content"] not in NON_SPECIAL
    return data


def added_tokens_decoder() -> dict:
    return {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t not in NON_SPECIAL,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }


def save(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    specials = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
        "added_tokens_decoder": added_tokens_decoder(),
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in NON_SPECIAL and t not in specials.values()],
        "chat_template": CHAT_TEMPLATE,
    }
    files = {
        "tokenizer.json": tokenizer_json(tok),
        "tokenizer_config.json": config,
        "special_tokens_map.json": specials,
    }
    for name, obj in files.items():
        text = json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=name != "tokenizer.json") + "\n"
        (out / name).write_text(text, encoding="utf-8")


def build(out: Path, seed: int) -> None:
    corpus = build_corpus(seed)
    tok = train(corpus)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    save(tok, out)
    mb = sum(len(d) for d in corpus) / 1e6
    print(
        f"trained byte-level BPE ({VOCAB_SIZE} tokens) on {len(corpus)} documents ({mb:.1f} MB) -> {out}",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=SEED, help="corpus seed (default: %(default)s)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="rebuild into a temp dir; exit 1 if it differs from --out",
    )
    args = parser.parse_args(argv)
    if not args.check:
        build(args.out, args.seed)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), args.seed)
        differ = [
            n
            for n in OUTPUT_FILES
            if not (args.out / n).exists() or not filecmp.cmp(Path(tmp) / n, args.out / n, shallow=False)
        ]
    if differ:
        print(f"Error: {args.out} differs from a fresh build: {', '.join(differ)}", file=sys.stderr)
        print("Hint: python scripts/make_tokenizer.py", file=sys.stderr)
        return 1
    print(f"{args.out} is up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
