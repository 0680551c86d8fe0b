"""Long agent sessions as the gateway logs them: the input of scripts/bench_sessions.py.

What goes in: a seed, how many sessions, how many turns each, and the shape of a turn (default:
a 400-token first prompt, then per turn 200 generated tokens and 800 tokens of tool output, so
1,000 tokens a turn, as in issue 36). What comes out: `DIR/events-YYYY-MM-DDTHH.jsonl`, one
gateway-format event per line (the keys and their order of `rlcycle.gateway.chat.
completion_events`), that `rlcycle collect DIR` reads:

    completion   per model call: the prompt as the gateway logs it since issue 36 (`delta`:
                 prompt_parent / prompt_shared / prompt_added, what it adds to the previous
                 call) or as it did before (`delta=False`: the *whole* prompt_ids),
                 completion_ids, completion_logprobs, a tool call, sampling fields
    tool_result  per call, status ok (what a client posts to /v1/rlcycle/events)
    feedback     per session, episode-level thumbs +1 / -1 (so distill has a reward that varies)

The shape is the one that matters for cost: turn t+1's prompt *extends* turn t's prompt +
completion + tool output token for token, as an agent's re-rendered history does when the chat
template keeps every message (the best case for a layout that stores a session once). So the
ids of a session's final context are its unique tokens, and every earlier prompt is a prefix
of it. Token ids are drawn from the model's vocabulary (above the special ids), seeded:
the same arguments give the same bytes.

    python scripts/session_events.py --out /tmp/ev --sessions 2 --turns 10 --policy-version v0

Speed: each turn's new ids are rendered to JSON text once and a prompt is written as the
concatenation of its turns' fragments, so a 200-turn session (~20M prompt ids in its log) is
written at disk speed, not at `json.dumps` speed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

START_MS = int(datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc).timestamp() * 1000)
FIRST_ID = 16  # ids below this are left to the tokenizer's special tokens


@dataclass(frozen=True)
class Shape:
    """Tokens of a session: the first prompt, then per turn what the model writes and what the
    tool returns (framing tokens of the chat template included in the tool output)."""

    prompt0: int = 400
    generated: int = 200
    tool_output: int = 800

    def unique_tokens(self, turns: int) -> int:
        """The session's final context: first prompt + every completion + every tool output that
        a later prompt holds (the last call's tool output reaches no prompt)."""
        return self.prompt0 + turns * self.generated + (turns - 1) * self.tool_output

    def logged_ids(self, turns: int) -> int:
        """prompt_ids + completion_ids of every completion event of one session (today's log)."""
        step = self.generated + self.tool_output
        prompts = turns * self.prompt0 + step * turns * (turns - 1) // 2
        return prompts + turns * self.generated


def iso(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab) for _ in range(n)]


def _dump(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def session_lines(s: int, turns: int, shape: Shape, vocab: int, seed: int, policy_version: str, delta: bool = False):
    """(ts_ms, JSON line) of every event of session `s`, in order (the same ids either layout)."""
    rng = random.Random(f"{seed}-{s}")
    session = f"sess-{seed}-{s:04d}"
    episode = f"{session}-e0"
    t_ms = START_MS + s * 600_000
    prompt_parts = [",".join(map(str, _ids(rng, shape.prompt0, vocab)))]  # JSON text, per turn
    for turn in range(turns):
        sample = f"{episode}-t{turn}"
        call = f"{sample}-c0"
        comp = _ids(rng, shape.generated, vocab)
        comp_text = ",".join(map(str, comp))
        # Near a random tiny model's own (-ln 4096 = -8.3), so train warns of no serving mismatch.
        logprobs = ",".join(str(-round(rng.uniform(7.8, 8.8), 4)) for _ in comp)
        latency = round(rng.uniform(2_000, 9_000), 3)
        t_ms += int(latency)
        path = f"src/pkg/module_{s}_{turn}.py"
        args = _dump({"cmd": f"pytest -x {path}"})
        # ~4 characters a token: the decoded completion a real log carries beside its ids.
        text = "Running the tests for this module first." + " ok" * (shape.generated - 40)
        text += f'\n<tool_call>{{"name": "run_command", "arguments": {args}}}</tool_call>'
        head = (
            f'{{"event_id":"{sample}-completion","type":"completion","ts":"{iso(t_ms)}",'
            f'"session_id":"{session}","episode_id":"{episode}","sample_id":"{sample}","turn":{turn},'
            f'"policy_version":{_dump(policy_version)},'
        )
        if delta:  # stored against the previous call: its whole context, then the tool output
            parent = f'"{episode}-t{turn - 1}"' if turn else "null"
            shared = shape.prompt0 + (turn - 1) * (shape.generated + shape.tool_output) + shape.generated if turn else 0
            head += f'"prompt_parent":{parent},"prompt_shared":{shared},"prompt_added":['
            prompt_text = prompt_parts[-1]
        else:
            head += '"prompt_ids":['
            prompt_text = ",".join(prompt_parts)
        tail = _dump(
            {
                "completion_text": text,
                "tool_calls": [{"call_id": call, "name": "run_command", "arguments": args}],
                "latency_ms": latency,
                "temperature": 1.0,
                "max_new_tokens": 1024,
                "greedy": False,
                "top_p": 1.0,
                "seed": None,
                "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": None, "seed": None, "max_tokens": 1024},
                "finish_reason": "stop",
                "cut": None,
                "choice_index": 0,
                "id_rules": {"session": "header", "episode": "continuation" if turn else "new"},
                "parent_sample_id": f"{episode}-t{turn - 1}" if turn else None,
                "api": "chat.completions",
                "request_id": f"req-{sample}",
                "served_as": "policy",
                "n_unlisted_calls": 0,
            }
        )[1:]
        line = head + prompt_text + f'],"completion_ids":[{comp_text}],"completion_logprobs":[{logprobs}],' + tail
        yield t_ms, line
        duration = round(rng.uniform(50, 3_000), 3)
        t_ms += int(duration)
        yield (
            t_ms,
            _dump(
                {
                    "event_id": f"{call}-result",
                    "type": "tool_result",
                    "ts": iso(t_ms),
                    "session_id": session,
                    "sample_id": sample,
                    "call_id": call,
                    "status": "ok",
                    "error": None,
                    "duration_ms": duration,
                }
            ),
        )
        # The next prompt: this one + the completion + the tool's output (with its framing).
        prompt_parts.append(comp_text)
        prompt_parts.append(",".join(map(str, _ids(rng, shape.tool_output, vocab))))
    t_ms += 30_000
    value = 1.0 if rng.random() < 0.5 else -1.0
    yield (
        t_ms,
        _dump(
            {
                "event_id": f"{episode}-feedback",
                "type": "feedback",
                "ts": iso(t_ms),
                "session_id": session,
                "episode_id": episode,
                "value": value,
                "kind": "thumbs",
            }
        ),
    )


def generate(
    out: Path,
    sessions: int,
    turns: int,
    *,
    vocab: int,
    policy_version: str,
    seed: int = 0,
    shape: Shape = Shape(),
    delta: bool = False,
) -> dict:
    """Write the log into `out` (one file per hour of `ts`); return its summary. `delta`: each
    prompt stored as what it adds to the previous call (the gateway since issue 36)."""
    if sessions < 1 or turns < 1:
        raise ValueError(f"sessions={sessions} and turns={turns} must be at least 1")
    if vocab <= FIRST_ID:
        raise ValueError(f"vocab={vocab} leaves no ordinary ids above {FIRST_ID}")
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, object] = {}
    n_events = 0
    try:
        for s in range(sessions):
            for ts, line in session_lines(s, turns, shape, vocab, seed, policy_version, delta):
                name = "events-" + iso(ts)[:13] + ".jsonl"
                fh = files.get(name) or files.setdefault(name, open(out / name, "w", encoding="utf-8"))
                fh.write(line)
                fh.write("\n")
                n_events += 1
    finally:
        for fh in files.values():
            fh.close()
    return {
        "out": str(out),
        "files": len(files),
        "events": n_events,
        "sessions": sessions,
        "turns": turns,
        "unique_tokens": sessions * shape.unique_tokens(turns),
        "logged_ids": sessions * shape.logged_ids(turns),
        "bytes": sum((out / n).stat().st_size for n in files),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=4096, help="ids are drawn below this (the model's vocabulary)")
    ap.add_argument("--policy-version", required=True, help="the checkpoint id the events name")
    ap.add_argument("--prompt0", type=int, default=Shape.prompt0, help="tokens of the first prompt")
    ap.add_argument("--generated", type=int, default=Shape.generated, help="completion tokens a turn")
    ap.add_argument("--tool-output", type=int, default=Shape.tool_output, help="tool-output tokens a turn")
    ap.add_argument(
        "--layout", choices=("delta", "full"), default="delta", help="prompts as deltas (today's gateway) or whole"
    )
    a = ap.parse_args(argv)
    shape = Shape(a.prompt0, a.generated, a.tool_output)
    summary = generate(
        a.out,
        a.sessions,
        a.turns,
        vocab=a.vocab,
        policy_version=a.policy_version,
        seed=a.seed,
        shape=shape,
        delta=a.layout == "delta",
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
