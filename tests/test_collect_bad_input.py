"""Bad input: every record is either written or quarantined with file, line and reason;
--strict fails with exit 2 naming file and line; no output path ever holds a partial file."""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa
import pytest
from events_factory import episode, write_jsonl

AS_OF = "2026-12-02T00:00:00Z"

BAD_LINES = {
    "malformed": ('{"event_id": "x1", "type": ', "malformed JSON"),
    "wrong_type": (
        '{"event_id": "x2", "type": "completion", "ts": "2026-11-30T10:00:00Z", "session_id": "s", "episode_id": "e", "sample_id": "q", "turn": "first", "policy_version": "p", "completion_ids": [1]}',
        "field 'turn': expected an integer",
    ),
    "wrong_list": (
        '{"event_id": "x3", "type": "completion", "ts": "2026-11-30T10:00:00Z", "session_id": "s", "completion_ids": ["a", "b"]}',
        "field 'completion_ids': expected a list of a 32-bit integer",
    ),
    "unknown_type": (
        '{"event_id": "x4", "type": "telemetry", "ts": "2026-11-30T10:00:00Z", "session_id": "s"}',
        "unknown event type 'telemetry'",
    ),
    "missing_key": (
        '{"event_id": "x5", "type": "tool_result", "ts": "2026-11-30T10:00:00Z", "session_id": "s", "sample_id": "q"}',
        "tool_result: missing call_id",
    ),
    "missing_ts": (
        '{"event_id": "x6", "type": "user_message", "session_id": "s", "episode_id": "e", "text": "hi"}',
        "missing ts",
    ),
    "bad_ts": (
        '{"event_id": "x7", "type": "user_message", "ts": 1764496800, "session_id": "s", "episode_id": "e", "text": "hi"}',
        "outside 2000–2100",
    ),
    "not_object": ("[1, 2, 3]", "expected a JSON object"),
    "logprob_len": (
        '{"event_id": "x8", "type": "completion", "ts": "2026-11-30T10:00:00Z", "session_id": "s", "episode_id": "e", "sample_id": "q", "turn": 0, "policy_version": "p", "completion_ids": [1, 2], "completion_logprobs": [-0.1]}',
        "1 completion_logprobs for 2 completion_ids",
    ),
}


def run(cli, *args):
    return cli(["collect", *args, "--as-of", AS_OF, "--quiet"])


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_is_quarantined_with_file_line_and_reason(cli, tmp_path, case):
    line, reason = BAD_LINES[case]
    good = episode("ep1")
    src = write_jsonl(tmp_path / "ev.jsonl", good[:2], [line])
    with open(src, "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in good[2:])
    out = tmp_path / "t.arrow"
    r = run(cli, src, "-o", out, "--json")
    assert r.exit_code == 0, r.error
    summary = json.loads(r.stdout)
    assert summary["quarantined"] == 1
    assert summary["events_in"] == len(good)  # the good events around it are all kept
    (q,) = [json.loads(x) for x in (tmp_path / "t.arrow.quarantine.jsonl").read_text().splitlines()]
    assert q["file"] == str(src) and q["line"] == 3 and reason in q["reason"]
    assert q["record"] == line
    assert pl.read_ipc(out).height == 2


@pytest.mark.parametrize("case", ["malformed", "unknown_type", "missing_key"])
def test_strict_fails_with_exit_2_naming_file_and_line_and_writes_nothing(cli, tmp_path, case):
    line, reason = BAD_LINES[case]
    src = write_jsonl(tmp_path / "ev.jsonl", episode("ep1"), [line])
    n = len(episode("ep1"))
    out = tmp_path / "t.arrow"
    r = run(cli, src, "-o", out, "--strict")
    assert r.exit_code == 2
    assert f"{src}:{n + 1}:" in r.error and reason in r.error
    assert not out.exists() and not (tmp_path / "t.arrow.quarantine.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ev.jsonl"]  # no temp files left either


def test_empty_input_is_an_error_and_writes_nothing(cli, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n  \n")
    out = tmp_path / "t.arrow"
    for src in ("empty.jsonl", "blank.jsonl"):
        r = run(cli, tmp_path / src, "-o", out)
        assert r.exit_code == 2 and "empty" in r.error
        assert not out.exists()
    r = cli(["collect", "-", "-o", out, "--quiet"], input=b"")
    assert r.exit_code == 2


def test_missing_input_path_is_named(cli, tmp_path):
    r = run(cli, tmp_path / "nope.jsonl", str(tmp_path / "*.parquet"), "-o", tmp_path / "t.arrow")
    assert r.exit_code == 2
    assert "nope.jsonl: no such file" in r.error and "glob matches no files" in r.error


def test_truncated_arrow_file_keeps_complete_batches(cli, tmp_path):
    import pyarrow.ipc as ipc

    df = pl.DataFrame(episode("ep1") + episode("ep2", session="s2"), infer_schema_length=None)
    table = df.to_arrow()
    path = tmp_path / "ev.arrow"
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=len(episode("ep1"))):
            w.write_batch(batch)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.6)])  # cut off the footer and the second batch
    out = tmp_path / "t.arrow"
    r = run(cli, path, "-o", out, "--json")
    assert r.exit_code == 0, r.error
    s = json.loads(r.stdout)
    assert s["quarantined"] == 1 and "truncated Arrow file" in next(iter(s["quarantine_reasons"]))
    assert set(pl.read_ipc(out)["episode_id"]) == {"ep1"}
    assert run(cli, path, "-o", out, "--strict").exit_code == 2


def test_failure_midway_leaves_no_partial_output(cli, tmp_path, monkeypatch):
    from rlcycle.collect import join as collect_join

    src = write_jsonl(tmp_path / "ev.jsonl", episode("ep1"))
    out = tmp_path / "t.arrow"
    out.write_bytes(b"previous good output")

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(collect_join, "join_partition", boom)
    r = run(cli, src, "-o", out)
    assert r.exit_code != 0
    assert out.read_bytes() == b"previous good output"  # untouched, not half-replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.jsonl", "t.arrow"]


def test_bad_config_lists_every_problem(cli, tmp_path):
    src = write_jsonl(tmp_path / "ev.jsonl", episode("ep1"))
    cfg = tmp_path / "c.toml"
    cfg.write_text("maturty_s = 5\nbucket_bytes = 'big'\nsince = 'yesterday'\n")
    r = run(cli, src, "-o", tmp_path / "t.arrow", "--config", cfg, "--set", "strict=maybe")
    assert r.exit_code == 2
    assert "unknown key 'maturty_s' (did you mean 'maturity_s'?)" in r.error
    assert "bucket_bytes='big'" in r.error and "strict='maybe'" in r.error


def test_refuses_binary_to_a_terminal(monkeypatch, tmp_path):
    import sys

    from rlcycle import io as rio
    from rlcycle.errors import InputError

    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Tty())
    with pytest.raises(InputError, match="terminal"):
        rio.refuse_terminal(sys.stdout)


# --- hostile input: huge and deeply nested lines -------------------------------------------------

GITHUB_KEY = "ghp_" + "A1b2" * 10


def test_a_5_mb_bad_line_is_quarantined_redacted_and_capped(cli, tmp_path):
    """Redaction is linear: a backtracking regex over this 5 MB run of letters would not finish
    (the e-mail pattern alone is quadratic in it), so this test would hang, not just be slow."""
    from rlcycle.collect.stage import QUARANTINE_FIELD_CHARS

    run_of_letters = "a" * (5 << 20)
    line = f'{{"event_id": "big", "type": "completion", "text": "key {GITHUB_KEY} {run_of_letters} bob@example.com"'
    good = episode("ep1")
    src = write_jsonl(tmp_path / "ev.jsonl", good[:2], [line])
    with open(src, "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in good[2:])
    out = tmp_path / "t.arrow"
    r = run(cli, src, "-o", out, "--json")
    assert r.exit_code == 0, r.error
    s = json.loads(r.stdout)
    assert s["quarantined"] == 1 and s["events_in"] == len(good)
    assert s["redactions"] == {"github_token": 1, "email": 1}  # the whole line was redacted
    assert s["quarantine_truncated"] == 1
    qfile = tmp_path / "t.arrow.quarantine.jsonl"
    assert GITHUB_KEY.encode() not in qfile.read_bytes() and b"bob@example.com" not in qfile.read_bytes()
    (q,) = [json.loads(x) for x in qfile.read_text().splitlines()]
    assert q["line"] == 3 and "malformed JSON" in q["reason"]
    assert q["record"].startswith('{"event_id": "big", "type": "completion", "text": "key [REDACTED:github_token] aaa')
    redacted = line.replace(GITHUB_KEY, "[REDACTED:github_token]").replace("bob@example.com", "[REDACTED:email]")
    cap = QUARANTINE_FIELD_CHARS
    assert q["record"] == f"{redacted[:cap]}…[truncated: {len(redacted) - cap} more characters]"
    assert pl.read_ipc(out).height == 2


def test_a_long_followup_with_a_secret_is_redacted_on_the_main_path(cli, tmp_path):
    text = "x" * (2 << 20) + " mail bob@example.com"
    src = write_jsonl(tmp_path / "ev.jsonl", episode("ep1", followup=text))
    out = tmp_path / "t.arrow"
    r = run(cli, src, "-o", out, "--json")
    assert r.exit_code == 0, r.error
    assert json.loads(r.stdout)["redactions"] == {"email": 1}
    (followup,) = set(pl.read_ipc(out)["followup_text"])
    assert followup == "x" * (2 << 20) + " mail [REDACTED:email]"


DEEP = 5000
DEEP_LINES = {
    "arrays": "[" * DEEP + "]" * DEEP,
    "objects": '{"a":' * DEEP + "1" + "}" * DEEP,
    "in_a_field": '{"event_id": "d", "type": "completion", "ts": "2026-11-30T10:00:00Z", "session_id": "s", "tool_calls": '
    + "[" * DEEP
    + "]" * DEEP
    + "}",
    "unclosed": "{" * DEEP,
}


@pytest.mark.parametrize("case", sorted(DEEP_LINES))
def test_a_deeply_nested_line_is_quarantined_like_any_bad_line(cli, tmp_path, case):
    line = DEEP_LINES[case]
    good = episode("ep1")
    src = write_jsonl(tmp_path / "ev.jsonl", good[:2], [line])
    with open(src, "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in good[2:])
    out = tmp_path / "t.arrow"
    r = run(cli, src, "-o", out, "--json")
    assert r.exit_code == 0, r.error
    s = json.loads(r.stdout)
    assert s["quarantined"] == 1 and s["events_in"] == len(good)
    (q,) = [json.loads(x) for x in (tmp_path / "t.arrow.quarantine.jsonl").read_text().splitlines()]
    assert q["line"] == 3 and q["record"] == line
    expected = "malformed JSON" if case == "unclosed" else "JSON nested too deeply"
    assert q["reason"].startswith(expected), q["reason"]
    assert pl.read_ipc(out).height == 2


def _otel_line(spans) -> str:
    return json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]})


def test_deeply_nested_otel_is_quarantined_not_a_crash(cli, tmp_path):
    attrs = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.output.messages", "value": {"stringValue": "[" * DEEP + "]" * DEEP}},
    ]
    deep_span = {"traceId": "t1", "spanId": "sp1", "name": "chat m", "attributes": attrs}
    deep_doc = '{"resourceSpans": ' + "[" * DEEP + "]" * DEEP + "}"
    src = tmp_path / "spans.jsonl"  # the collector's file exporter: one document per line
    src.write_text(_otel_line([deep_span]) + "\n" + deep_doc + "\n")
    r = run(cli, src, "-o", tmp_path / "t.arrow", "--json")
    assert r.exit_code == 0, r.error
    assert json.loads(r.stdout)["quarantined"] == 2
    lines = (tmp_path / "t.arrow.quarantine.jsonl").read_text().splitlines()
    span, doc = sorted((json.loads(x) for x in lines), key=lambda q: q["line"])
    assert span["line"] == 1 and "span 'chat m': an attribute is nested too deeply" in span["reason"]
    assert doc["line"] == 2 and "nested too deeply" in doc["reason"] and doc["record"] == deep_doc


def test_a_deeply_nested_json_document_is_a_usage_error(cli, tmp_path):
    src = tmp_path / "doc.json"
    src.write_text("[\n" + "[" * DEEP + "]" * DEEP + "\n]\n")
    r = run(cli, src, "-o", tmp_path / "t.arrow")
    assert r.exit_code == 2 and "nested too deeply" in r.error
