"""Does a chat template's turn t+1 prompt extend turn t's prompt + completion token for token?

Train's segments (docs/train.md "Segments") need it: a run of turns trains as one sequence only
while each turn's prompt ids start with the previous turn's prompt ids followed by the ids the
model generated. Per template this renders multi-turn agent conversations with the tokenizer's
own chat template (`apply_chat_template`, add_generation_prompt) and compares, at every turn:

    prompt(t+1)[: len(prompt(t)) + len(completion(t))]  ==  prompt(t) + completion(t)

where completion(t) is what a server logs for the assistant message: the message text
tokenised alone (`encode(text, add_special_tokens=False)`) followed by the end-of-turn token
(the tokenizer's eos; `<|im_end|>` for ChatML). Conversations:

    plain        system, user, then assistant text / tool result alternating
    reasoning    the assistant text starts with <think>...</think> (a reasoning model's output)
    tool_calls   assistant messages carrying `tool_calls` (rendered only by templates that know them)
    boundary     assistant text whose first characters merge with the template's header when
                 tokenised together (a leading space / newline)

Templates: the tiny model's (rlcycle/data/tokenizer, what `rlcycle init-model` ships) and
SmolLM2-135M-Instruct's (read from its GGUF: `--smollm2-gguf FILE`, else rlcycle's preset,
downloaded once into $RLCYCLE_MODEL_CACHE or ~/.cache/rlcycle/models), and any `--tokenizer DIR`.

    .venv/bin/python scripts/template_extension.py            # the table docs/train.md shows
    .venv/bin/python scripts/template_extension.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TURNS = 4
SYSTEM = "You are a coding agent. Use the tools to inspect and edit the repository."
TASK = "The test tests/test_add.py fails: add(2, 3) returns -1. Fix it."
TOOL = [
    "def add(a, b):\n    return a - b\n",
    "1 failed, 0 passed",
    "edited src/calc.py (1 line)",
    "1 passed",
]
SAY = [
    "Let me read the file first.",
    "The function subtracts; I will run the test to confirm.",
    "I will change `a - b` to `a + b`.",
    "The test passes now. Done.",
]


def conversation(kind: str) -> list[dict]:
    """The messages of one session of TURNS assistant turns (each followed by a tool result)."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for t in range(TURNS):
        text = SAY[t]
        if kind == "reasoning":
            text = f"<think>\nturn {t}: what do I know so far?\n</think>\n{text}"
        elif kind == "boundary":
            text = ("\n" if t % 2 else " ") + text
        msg = {"role": "assistant", "content": text}
        if kind == "tool_calls":
            msg["tool_calls"] = [
                {"type": "function", "function": {"name": "run", "arguments": {"cmd": f"step {t}"}}, "id": f"c{t}"}
            ]
        msgs.append(msg)
        tool = {"role": "tool", "content": TOOL[t]}
        if kind == "tool_calls":
            tool["tool_call_id"] = f"c{t}"
        msgs.append(tool)
    return msgs


def end_of_turn(tok) -> int:
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        i = tok.convert_tokens_to_ids(name)
        if isinstance(i, int) and i != tok.unk_token_id and i is not None:
            return i
    return tok.eos_token_id


def render(tok, msgs: list[dict]) -> list[int]:
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # a BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return list(ids)


def measure(tok, kind: str) -> dict:
    """Per turn boundary: extends or not, and where and how it breaks."""
    msgs = conversation(kind)
    eot = end_of_turn(tok)
    # The prompt of assistant turn t: everything before its message.
    cuts = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    prompts = [render(tok, msgs[:i]) for i in cuts]
    comps = [tok.encode(msgs[i]["content"], add_special_tokens=False) + [eot] for i in cuts]
    out = {"kind": kind, "turns": len(cuts), "extends": [], "breaks": []}
    for t in range(len(cuts) - 1):
        want = prompts[t] + comps[t]
        got = prompts[t + 1][: len(want)]
        ok = got == want
        out["extends"].append(ok)
        if not ok:
            k = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            prompt_part = k < len(prompts[t])
            out["breaks"].append(
                {
                    "turn": t + 1,
                    "at": k,
                    "in": "the earlier prompt" if prompt_part else "the completion",
                    "history": tok.decode(prompts[t + 1][max(0, k - 8) : k + 12]),
                    "served": tok.decode(want[max(0, k - 8) : k + 12]),
                }
            )
    rendered_calls = (
        kind != "tool_calls" or '"step 0"' in tok.decode(prompts[-1]) or "step 0" in tok.decode(prompts[-1])
    )
    out["tool_calls_rendered"] = rendered_calls if kind == "tool_calls" else None
    return out


# Two rules of widespread templates, written here on the tiny tokenizer's ChatML (their own
# templates need the model hub): Qwen3 / DeepSeek-R1 keep only the text after `</think>` of an
# earlier assistant turn; Llama 3 renders `content | trim`.
RULES = {
    "ChatML + reasoning dropped from history (Qwen3's rule)": (
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'assistant' and '</think>' in c %}{% set c = c.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "ChatML + content trimmed (Llama 3's rule)": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}


def smollm2(path: str | None):
    from transformers import AutoTokenizer

    if path is None:
        from rlcycle.policy.gguf import preset_gguf

        cache = os.environ.get("RLCYCLE_MODEL_CACHE") or Path.home() / ".cache" / "rlcycle" / "models"
        path = str(preset_gguf("smollm2-135m", cache))
    p = Path(path)
    return AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smollm2-gguf", default=None, help="SmolLM2-135M-Instruct .gguf (default: rlcycle's preset)")
    ap.add_argument("--no-smollm2", action="store_true", help="measure the tiny template only")
    ap.add_argument("--tokenizer", action="append", default=[], help="another tokenizer directory (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    toks = {"tiny (rlcycle/data/tokenizer)": AutoTokenizer.from_pretrained(REPO / "rlcycle" / "data" / "tokenizer")}
    if not a.no_smollm2:
        toks["SmolLM2-135M-Instruct"] = smollm2(a.smollm2_gguf)
    for d in a.tokenizer:
        toks[d] = AutoTokenizer.from_pretrained(d)
    for name, template in RULES.items():
        tok = AutoTokenizer.from_pretrained(REPO / "rlcycle" / "data" / "tokenizer")
        tok.chat_template = template
        toks[name] = tok
    results = {
        name: [measure(tok, kind) for kind in ("plain", "reasoning", "tool_calls", "boundary")]
        for name, tok in toks.items()
    }
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    print("| template | conversation | extends | where it breaks |")
    print("| --- | --- | --- | --- |")
    for name, rows in results.items():
        for r in rows:
            n_ok = sum(r["extends"])
            verdict = "yes" if n_ok == len(r["extends"]) else f"no ({n_ok}/{len(r['extends'])} turns)"
            where = "-"
            if r["breaks"]:
                b = r["breaks"][0]
                where = (
                    f"turn {b['turn']}, token {b['at']} ({b['in']}): history {b['history']!r} vs served {b['served']!r}"
                )
            if r["tool_calls_rendered"] is False:
                where = (
                    ("tool_calls not rendered by the template; " + where) if where != "-" else "tool_calls not rendered"
                )
            print(f"| {name} | {r['kind']} | {verdict} | {where.replace('|', '¦')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
