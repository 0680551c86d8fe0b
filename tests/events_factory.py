"""Tiny hand-made production events for tests (the big realistic log is sample_data/events)."""

from __future__ import annotations

import json
from pathlib import Path

T0 = 1_796_033_700_000  # 2026-11-30T10:15:00Z in epoch ms


def iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def episode(
    ep: str,
    session: str = "s1",
    version: str = "policy-a",
    turns: int = 2,
    start_ms: int = T0,
    edit: bool = True,
    outcome: bool = True,
    invalid: bool = False,
    followup: str | None = "thanks, works",
    feedback: float | None = None,
) -> list[dict]:
    """One episode: `turns` completions (turn 0 edits a file), results, outcome, follow-up."""
    events = []
    prompt = [1, 2, 3]
    for t in range(turns):
        sid = f"{ep}-s{t}"
        ts = start_ms + t * 2000
        calls = []
        if t == 0 and edit:
            calls.append(
                {
                    "call_id": f"{sid}-c0",
                    "name": "write_file",
                    "arguments": json.dumps({"path": "a.py", "content": "x = 1\n"}),
                }
            )
        if invalid:
            calls.append({"call_id": f"{sid}-bad", "name": "run_shell", "arguments": "{not json"})
        if t == turns - 1:
            calls.append({"call_id": f"{sid}-fin", "name": "finish", "arguments": json.dumps({"summary": "done"})})
        completion = [10 + t, 11 + t, 12 + t]
        events.append(
            {
                "event_id": f"{sid}-e",
                "type": "completion",
                "ts": iso(ts),
                "session_id": session,
                "episode_id": ep,
                "sample_id": sid,
                "turn": t,
                "policy_version": version,
                "prompt_ids": list(prompt),
                "completion_ids": completion,
                "completion_logprobs": [-0.5, -0.25, -1.0],
                "tool_calls": calls,
                "latency_ms": 100.0 + t,
                "temperature": 1.0,
            }
        )
        for c in calls:
            status = "invalid" if c["call_id"].endswith("-bad") else "ok"
            events.append(
                {
                    "event_id": f"{c['call_id']}-r",
                    "type": "tool_result",
                    "ts": iso(ts + 500),
                    "session_id": session,
                    "sample_id": sid,
                    "call_id": c["call_id"],
                    "status": status,
                    "error": "bad JSON" if status == "invalid" else None,
                    "duration_ms": 5.0,
                }
            )
            if c["name"] == "write_file" and outcome:
                events.append(
                    {
                        "event_id": f"{c['call_id']}-o",
                        "type": "edit_outcome",
                        "ts": iso(ts + 3_600_000),
                        "session_id": session,
                        "sample_id": sid,
                        "call_id": c["call_id"],
                        "lines_proposed": 4,
                        "lines_surviving": 3,
                        "observed_after_s": 3600.0,
                    }
                )
        prompt = prompt + completion + [7]
    if followup is not None:
        events.append(
            {
                "event_id": f"{ep}-u",
                "type": "user_message",
                "ts": iso(start_ms + 60_000),
                "session_id": session,
                "episode_id": ep,
                "text": followup,
            }
        )
    if feedback is not None:
        events.append(
            {
                "event_id": f"{ep}-f",
                "type": "feedback",
                "ts": iso(start_ms + 61_000),
                "session_id": session,
                "episode_id": ep,
                "value": feedback,
                "kind": "thumbs",
            }
        )
    return events


def many(n: int = 6) -> list[dict]:
    out = []
    for i in range(n):
        out += episode(
            f"ep{i}",
            session=f"s{i % 3}",
            version="policy-a" if i % 2 else "policy-b",
            turns=1 + i % 3,
            start_ms=T0 + i * 100_000,
            invalid=(i == 4),
            feedback=(1.0 if i == 2 else None),
        )
    return out


def write_jsonl(path: Path, events: list[dict], extra_lines: list[str] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path
