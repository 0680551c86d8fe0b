"""How often does the gateway's plain re-tokenisation of a client's history extend the previous
call's context token for token? (issue 36 item 2; docs/train.md "Segments").

The gateway renders each request from the client's messages: the assistant turns come back as
text and are tokenised again. When that gives other ids than the ones the model sampled (a
non-canonical tokenisation, a decode that does not round-trip), the next prompt does not extend
the previous context and train starts a new segment there. This runs real sessions through a
real in-process `rlcycle gateway` (a client that sends its whole history back each turn, plus a
tool result and a user message, as agent clients do) and reads its log:

    .venv/bin/python scripts/gateway_extension.py                       # tiny random model, 16 x 6 turns
    .venv/bin/python scripts/gateway_extension.py --model runs/smol2/start --sessions 16 --turns 6

Printed: turns that extend their parent (`prompt_shared` == the parent's context length), and
for those that do not, where the first differing id sits relative to the parent's completion
(inside it: a re-tokenised answer; after it: the template's framing of the history).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a checkpoint directory (default: a fresh tiny model)")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import openai

    from rlcycle import model_init
    from rlcycle import prompts as PR
    from rlcycle.gateway import GatewayConfig, start
    from rlcycle.policy.registry import Entry, Registry

    with tempfile.TemporaryDirectory(prefix="rlcycle-gw-ext-") as tmp:
        root = Path(tmp)
        model = a.model or Path(model_init.run(model_init.InitModelConfig(seed=0), root / "m").path)
        reg = Registry(root / "registry")
        with reg.locked():
            cid = reg.add(model)
            reg.commit({"production": cid}, Entry("promote", "production", cid, None))
        gw = start(GatewayConfig(registry=str(reg.root), log_dir=str(root / "logs"), port=0, flush_interval_s=0.05))
        try:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
            for s in range(a.sessions):
                msgs = [
                    {"role": "system", "content": "You are a coding agent. Use the tools."},
                    {"role": "user", "content": f"Task {s}: fix the failing test in module_{s}.py."},
                ]
                for t in range(a.turns):
                    r = client.chat.completions.create(
                        model="production",
                        messages=msgs,
                        max_tokens=a.max_tokens,
                        seed=1000 * s + t,
                        extra_headers={"X-Session-Id": f"ext-{s}"},
                    )
                    msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
                    msgs.append({"role": "user", "content": f"Observation: exit code {t % 3}; 2 tests failed."})
            gw.gateway.log.flush()
        finally:
            gw.close()
        evs = []
        for f in sorted((root / "logs").rglob("*.jsonl")):
            evs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        evs = [e for e in evs if e.get("type") == "completion"]
    whole = {e["sample_id"]: e for e in PR.events_with_full_prompts(evs)}
    with_parent = [e for e in evs if e.get("prompt_parent")]
    extends, inside, after, where = 0, 0, 0, []
    for e in with_parent:
        p = whole[e["prompt_parent"]]
        ctx = len(p["prompt_ids"]) + len(p["completion_ids"])
        if e["prompt_shared"] == ctx:
            extends += 1
        elif e["prompt_shared"] >= len(p["prompt_ids"]):
            inside += 1
            where.append((e["prompt_shared"] - len(p["prompt_ids"])) / max(len(p["completion_ids"]), 1))
        else:
            after += 1
    n = len(with_parent)
    out = {
        "model": str(a.model or "tiny random (rlcycle init-model, seed 0)"),
        "sessions": a.sessions,
        "turns": a.turns,
        "continuations": n,
        "extend": extends,
        "extend_share": round(extends / n, 3) if n else None,
        "break_inside_completion": inside,
        "break_before_completion": after,
        "break_position_median": round(sorted(where)[len(where) // 2], 3) if where else None,
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(
            f"{out['model']}: {extends}/{n} continuations extend their parent's context "
            f"({100 * extends / max(n, 1):.0f} %); breaks inside the parent's completion {inside} (median at "
            f"{out['break_position_median']} of its length), before it {after}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
