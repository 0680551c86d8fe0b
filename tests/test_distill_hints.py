"""distill's hints from follow-ups (rlcycle/distill/hints.py, docs/hints.md): which episodes get
one, on which row, the judge hook (dotted path and an OpenAI-compatible endpoint), the shuffled
control and the report, through the real CLI."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import polars as pl
import pytest
from distill_data import call, distill, episode

from rlcycle.distill.hints import HintConfig

SPEC = "[signals.dissatisfied_followup]\n[signals.invalid_tool_call]\n"
SAYS = "revert that, parse_config in src/config.py must keep returning {} for an empty file"


def rows():
    """Four episodes of three sessions: an informative complaint (edit on turn 1 of 3), a bare
    complaint, a satisfied one, and a second informative complaint with no edit."""
    return [
        *episode(
            "e1",
            [{}, {"tool_calls": [call("write_file")]}, {}],
            followup=SAYS,
            session_id="s1",
            policy_version="pa",
        ),
        *episode("e2", 2, followup="no, revert that", session_id="s2", policy_version="pa"),
        *episode("e3", 1, followup="thanks, works", session_id="s2", policy_version="pb"),
        *episode(
            "e4",
            2,
            followup="still broken: load() raises KeyError 'name' on a new file",
            session_id="s3",
            policy_version="pb",
        ),
    ]


def hints_of(df: pl.DataFrame) -> dict[str, str]:
    return {s: h for s, h in zip(df["sample_id"], df["hint"], strict=True) if h is not None}


def test_off_by_default_the_column_is_there_and_null(cli, tmp_path):
    df, report = distill(cli, tmp_path, rows(), SPEC)
    assert df["hint"].null_count() == df.height
    assert report["hints"] == {"enabled": False}
    assert HintConfig().enabled is False


def test_informative_complaints_hint_their_target_turn(cli, tmp_path):
    df, report = distill(cli, tmp_path, rows(), SPEC, "--set", "hints.enabled=true")
    # e1: the last turn with an ok edit (turn 1), not the final turn; e4 has no edit: its final turn.
    assert hints_of(df) == {"e1-t1": SAYS, "e4-t1": "still broken: load() raises KeyError 'name' on a new file"}
    h = report["hints"]
    assert (h["dissatisfied"], h["candidates"], h["rejected_by_rule"], h["accepted"]) == (3, 2, 1, 2)
    assert h["per_policy_version"] == {
        "pa": {"dissatisfied": 2, "accepted": 1, "acceptance": 0.5},
        "pb": {"dissatisfied": 1, "accepted": 1, "acceptance": 1.0},
    }
    df2, _ = distill(cli, tmp_path, rows(), SPEC, "--set", "hints.enabled=true", "--set", "hints.target=final")
    assert set(hints_of(df2)) == {"e1-t2", "e4-t1"}


def test_dotted_path_judge_rewrites_and_rejects(cli, tmp_path):
    args = ("--set", "hints.enabled=true", "--set", "hints.judge=test_distill_hints:judge")
    df, report = distill(cli, tmp_path, rows(), SPEC, *args)
    assert hints_of(df) == {"e1-t1": "parse_config must return {} for an empty file."}
    assert report["hints"]["rejected_by_judge"] == 1


def judge(texts: list[str]) -> list[str | None]:
    """Loaded by dotted path above: rewrites the config complaint, rejects the other."""
    return ["parse_config must return {} for an empty file." if "parse_config" in t else None for t in texts]


def test_endpoint_judge(cli, tmp_path):
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body["model"], body["messages"][-1]["content"]))
            text = body["messages"][-1]["content"]
            reply = "REJECT" if "KeyError" in text else "Keep {} for an empty file. Second. Third. Fourth."
            out = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        args = ("--set", "hints.enabled=true", "--set", f"hints.judge={url}", "--set", "hints.judge_model=j")
        df, report = distill(cli, tmp_path, rows(), SPEC, *args)
    finally:
        server.shutdown()
    assert hints_of(df) == {"e1-t1": "Keep {} for an empty file. Second. Third."}  # three sentences at most
    assert sorted(p for p, _, _ in seen) == ["/v1/chat/completions"] * 2 and {m for _, m, _ in seen} == {"j"}
    assert report["hints"]["rejected_by_judge"] == 1


def test_shuffle_moves_every_hint_to_another_session(cli, tmp_path):
    args = ("--set", "hints.enabled=true", "--set", "hints.shuffle=true")
    df, report = distill(cli, tmp_path, rows(), SPEC, *args)
    got = hints_of(df)
    assert set(got) == {"e1-t1", "e4-t1"}  # the same target rows ...
    assert got["e1-t1"].startswith("still broken") and got["e4-t1"] == SAYS  # ... with each other's words
    assert report["hints"]["shuffle"] == {"moved": 2, "same_session": 0}


def test_bad_hint_settings_are_reported_together(cli, tmp_path):
    with pytest.raises(AssertionError) as e:
        distill(cli, tmp_path, rows(), SPEC, "--set", "hints.target=first", "--set", "hints.judge=nope:missing")
    assert "hints.target" in str(e.value) and "hints.judge" in str(e.value)
