"""The committed sample data keeps its promises: tokenizer, production event log, OTel export.

The sample (sample_data/events, sample_data/otel) is the input most other tests and the docs use,
so this file checks it against the `events` contract of docs/design.md field by field, and checks that
scripts/gen_events.py and scripts/make_tokenizer.py reproduce what is committed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "sample_data" / "tokenizer"
EVENTS = REPO / "sample_data" / "events"
OTEL = REPO / "sample_data" / "otel" / "genai_spans.json"
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|pad|>",
]
TOOLS = {
    "read_file",
    "write_file",
    "apply_patch",
    "list_files",
    "search",
    "run_shell",
    "run_tests",
    "ask_user",
    "finish",
}
RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
COMMON = {"event_id", "type", "ts", "session_id"}
FIELDS = {
    "completion": COMMON
    | {
        "episode_id",
        "sample_id",
        "turn",
        "policy_version",
        "prompt_ids",
        "completion_ids",
        "completion_logprobs",
        "completion_text",
        "tool_calls",
        "latency_ms",
        "temperature",
    },
    "tool_result": COMMON | {"sample_id", "call_id", "status", "error", "duration_ms"},
    "edit_outcome": COMMON | {"sample_id", "call_id", "lines_proposed", "lines_surviving", "observed_after_s"},
    "user_message": COMMON | {"episode_id", "text"},
    "feedback": COMMON | {"value", "kind"},  # plus exactly one of sample_id / episode_id
}


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen = load_script("gen_events")


def ts_ms(ts) -> int:
    if isinstance(ts, int):
        return ts
    from datetime import datetime

    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


def file_hour_ms(name: str) -> int:
    from datetime import datetime, timezone

    stamp = re.match(r"events-(\d{4}-\d\d-\d\dT\d\d)\.jsonl$", name).group(1)
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc).timestamp() * 1000)


# --- tokenizer --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER), local_files_only=True)


@pytest.fixture(scope="module")
def fast_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))


def test_tokenizer_loads_offline_with_specials_and_template(hf_tokenizer):
    tok = hf_tokenizer
    assert len(tok) == 4096
    assert tok.convert_ids_to_tokens(list(range(8))) == SPECIALS
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (
        "<|im_end|>",
        "<|pad|>",
        "<|endoftext|>",
    )
    assert tok.model_max_length == 4096
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": '<tool_call>{"name": "run_tests"}</tool_call>'},
        {"role": "tool", "content": "3 passed"},  # raw output: the template adds the tags
    ]
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "run_tests"}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n<tool_response>\n3 passed\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "text",
    [
        "def total(xs):\n    return sum(x['price'] for x in xs)  # naïve ✓\n",
        'Fixing it.\n<tool_call>{"name": "read_file", "arguments": {"path": "src/a.py"}}</tool_call><|im_end|>',
        'Traceback (most recent call last):\n  File "x.py", line 1\nZeroDivisionError: division by zero',
        "  leading spaces, tabs\t, emoji 🙏 and 中文",
    ],
)
def test_tokenizer_round_trips(hf_tokenizer, text):
    ids = hf_tokenizer.encode(text)
    assert hf_tokenizer.decode(ids) == text
    assert all(0 <= i < 4096 for i in ids)


def test_tool_tags_survive_skip_special_tokens(hf_tokenizer):
    ids = hf_tokenizer.encode('<tool_call>{"name": "finish"}</tool_call><|im_end|>')
    assert ids[0] == 3 and ids[-1] == 2
    assert hf_tokenizer.decode(ids, skip_special_tokens=True) == '<tool_call>{"name": "finish"}</tool_call>'


def test_committed_tokenizer_is_what_the_script_builds():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_tokenizer.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


# --- the committed event log ---------------------------------------------------------------------


class Sample:
    def __init__(self, root: Path):
        self.files = sorted(root.glob("events-*.jsonl"))
        self.lines: list[tuple[str, str, dict]] = []  # (file name, raw line, event)
        self.events: dict[str, dict] = {}  # first copy of each event_id
        self.first_file: dict[str, str] = {}
        self.copies: Counter = Counter()
        for f in self.files:
            for line in f.read_text(encoding="utf-8").splitlines():
                e = json.loads(line)
                self.lines.append((f.name, line, e))
                self.copies[e["event_id"]] += 1
                if e["event_id"] not in self.events:
                    self.events[e["event_id"]] = e
                    self.first_file[e["event_id"]] = f.name
        self.by_type = defaultdict(list)
        for e in self.events.values():
            self.by_type[e["type"]].append(e)
        self.completions = self.by_type["completion"]
        self.episodes = defaultdict(list)
        for e in self.completions:
            self.episodes[e["episode_id"]].append(e)
        for turns in self.episodes.values():
            turns.sort(key=lambda e: e["turn"])
        self.calls = {(e["sample_id"], c["call_id"]): (e, c) for e in self.completions for c in e["tool_calls"]}
        self.results = {(e["sample_id"], e["call_id"]): e for e in self.by_type["tool_result"]}


@pytest.fixture(scope="module")
def sample() -> Sample:
    return Sample(EVENTS)


def test_sample_files_are_hourly_jsonl_and_small(sample):
    assert len(sample.files) >= 12
    assert all(re.fullmatch(r"events-\d{4}-\d\d-\d\dT\d\d\.jsonl", f.name) for f in sample.files)
    assert sum(f.stat().st_size for f in sample.files) < 32e6


def test_every_event_has_exactly_the_contract_fields(sample):
    for e in sample.events.values():
        expected = FIELDS[e["type"]]
        if e["type"] == "completion" and "prompt_messages" in e:
            expected = expected | {"prompt_messages"}
        if e["type"] == "feedback":
            assert ("sample_id" in e) != ("episode_id" in e), e
            expected = expected | ({"sample_id"} if "sample_id" in e else {"episode_id"})
        assert set(e) == expected, e["type"]
        for key in ("event_id", "session_id", "episode_id", "sample_id", "call_id"):
            assert key not in e or isinstance(e[key], str)
        assert isinstance(e["ts"], int) or RFC3339_MS.match(e["ts"]), e["ts"]


def test_ts_mixes_rfc3339_and_epoch_ms(sample):
    share = sum(isinstance(e["ts"], int) for e in sample.events.values()) / len(sample.events)
    assert 0.03 < share < 0.08


def test_size_and_mix(sample):
    assert len(sample.episodes) >= 2000
    sessions = defaultdict(set)
    for e in sample.completions:
        sessions[e["session_id"]].add(e["episode_id"])
    assert len(sessions) >= 500
    assert max(len(v) for v in sessions.values()) <= 6
    assert {len(t) for t in sample.episodes.values()} == {1, 2, 3, 4, 5, 6}
    assert {e["policy_version"] for e in sample.completions} == {
        "policy-2026-11-30a",
        "policy-2026-11-30b",
    }
    assert {e["type"] for e in sample.events.values()} == set(FIELDS)


def test_completions_carry_the_sampled_tokens(sample, fast_tokenizer):
    comps = sample.completions
    encoded = fast_tokenizer.encode_batch([e["completion_text"] for e in comps], add_special_tokens=False)
    for e, enc in zip(comps, encoded, strict=True):
        assert enc.ids == e["completion_ids"]
        assert len(e["completion_logprobs"]) == len(e["completion_ids"]) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in e["completion_logprobs"])
        assert e["latency_ms"] > 0 and 0 < e["temperature"] <= 2
    for e in comps[:500]:
        assert fast_tokenizer.decode(e["completion_ids"], skip_special_tokens=False) == e["completion_text"]


def test_each_turn_extends_the_previous_prompt(sample, fast_tokenizer):
    system = fast_tokenizer.encode(f"<|im_start|>system\n{gen.SYSTEM_PROMPT}<|im_end|>", add_special_tokens=False).ids
    gen_prompt = fast_tokenizer.encode("\n<|im_start|>assistant\n", add_special_tokens=False).ids
    for turns in sample.episodes.values():
        assert [e["turn"] for e in turns] == list(range(len(turns)))
        assert len({(e["session_id"], e["policy_version"]) for e in turns}) == 1
        assert turns[0]["prompt_ids"][: len(system)] == system
        for prev, cur in zip(turns, turns[1:], strict=False):
            head = prev["prompt_ids"] + prev["completion_ids"]
            assert cur["prompt_ids"][: len(head)] == head
            assert len(cur["prompt_ids"]) > len(head)
        assert all(e["prompt_ids"][-len(gen_prompt) :] == gen_prompt for e in turns)


def test_prompt_messages_render_to_the_prompt_ids(sample, hf_tokenizer, fast_tokenizer):
    with_msgs = [e for e in sample.completions if "prompt_messages" in e]
    assert 0.35 < len(with_msgs) / len(sample.completions) < 0.65
    chosen = with_msgs[::7]
    texts = [
        hf_tokenizer.apply_chat_template(e["prompt_messages"], tokenize=False, add_generation_prompt=True)
        for e in chosen
    ]
    for e, enc in zip(chosen, fast_tokenizer.encode_batch(texts, add_special_tokens=False), strict=True):
        assert enc.ids == e["prompt_ids"]


def test_tool_calls_and_results(sample):
    for e in sample.completions:
        for c in e["tool_calls"]:
            assert set(c) == {"call_id", "name", "arguments"} and isinstance(c["arguments"], str)
            assert c["arguments"] in e["completion_text"] or json.loads(c["arguments"]) == {}
            assert c["name"] is None or f'"name": "{c["name"]}"' in e["completion_text"]
    statuses = Counter()
    for key, r in sample.results.items():
        assert key in sample.calls, "tool_result for an unknown call"
        statuses[r["status"]] += 1
        assert (r["error"] is None) == (r["status"] == "ok")
        assert r["duration_ms"] >= 0
    assert set(statuses) == {"ok", "error", "invalid", "timeout"}
    missing = [k for k in sample.calls if k not in sample.results]
    assert len(missing) == 0
    reasons = [r["error"] for r in sample.results.values() if r["status"] == "invalid"]
    assert any(x.startswith("bad JSON: ") for x in reasons)
    assert any(x.startswith("unknown tool ") for x in reasons)
    assert any(": missing argument " in x for x in reasons)
    for key, r in sample.results.items():  # valid calls have JSON arguments and a known tool
        _, call = sample.calls[key]
        if r["status"] != "invalid":
            assert call["name"] in TOOLS
            assert isinstance(json.loads(call["arguments"]), dict)


def test_tool_calls_are_what_the_harness_parser_makes_of_the_text(sample):
    """Production logs what rlcycle.harness.parse says with the sample agent's tools (the
    harness's but replace_in_file, see gen.TOOLS): same calls, names, arguments, reasons."""
    from rlcycle.harness import parse_completion

    for e in sample.completions:
        parsed = parse_completion(e["completion_text"].removesuffix("<|im_end|>"), gen.TOOLS)
        assert len(parsed.calls) == len(e["tool_calls"])
        for call, logged in zip(parsed.calls, e["tool_calls"], strict=True):
            assert call.as_log(logged["call_id"]) == logged
            result = sample.results[(e["sample_id"], logged["call_id"])]
            assert (result["status"] == "invalid") == (not call.valid)
            if not call.valid:
                assert result["error"] == call.reason


def test_newer_policy_asks_more_and_breaks_fewer_calls(sample):
    stats = {v: Counter() for v in ("policy-2026-11-30a", "policy-2026-11-30b")}
    for e in sample.completions:
        s = stats[e["policy_version"]]
        s["completions"] += 1
        s["asks"] += any(c["name"] == "ask_user" for c in e["tool_calls"])
        s["invalid"] += sum(
            sample.results[(e["sample_id"], c["call_id"])]["status"] == "invalid" for c in e["tool_calls"]
        )
    a, b = stats["policy-2026-11-30a"], stats["policy-2026-11-30b"]
    assert a["invalid"] / a["completions"] > 1.5 * b["invalid"] / b["completions"]
    assert b["asks"] / b["completions"] > 1.3 * a["asks"] / a["completions"]


def test_edit_outcomes_follow_ok_edits_and_arrive_late(sample):
    outcomes = sample.by_type["edit_outcome"]
    assert len(outcomes) > 500
    comp_by_sample = {e["sample_id"]: e for e in sample.completions}
    later_file = 0
    for o in outcomes:
        comp, call = sample.calls[(o["sample_id"], o["call_id"])]
        assert call["name"] in ("write_file", "apply_patch")
        assert sample.results[(o["sample_id"], o["call_id"])]["status"] == "ok"
        assert 0 <= o["lines_surviving"] <= o["lines_proposed"]
        assert 3600 <= o["observed_after_s"] <= 86400
        edit_ms = ts_ms(o["ts"]) - o["observed_after_s"] * 1000
        assert 0 <= edit_ms - ts_ms(comp_by_sample[o["sample_id"]]["ts"]) < 200_000
        later_file += sample.first_file[o["event_id"]] > sample.first_file[comp["event_id"]]
    assert later_file == len(outcomes)
    ok_edits = [
        k
        for k, r in sample.results.items()
        if r["status"] == "ok" and sample.calls[k][1]["name"] in ("write_file", "apply_patch")
    ]
    assert len(outcomes) < len(ok_edits)  # some never arrive


def test_events_are_filed_by_log_time_roughly_in_order(sample):
    late = unsorted_files = 0
    for f in sample.files:
        stamps = [ts_ms(e["ts"]) for name, _, e in sample.lines if name == f.name]
        unsorted_files += stamps != sorted(stamps)
    for name, _, e in sample.lines:
        t = ts_ms(e["ts"])
        assert t < file_hour_ms(name) + 3_600_000  # logged at or after ts, never before
        late += t < file_hour_ms(name)
    assert unsorted_files >= len(sample.files) // 2
    assert late > 0


def test_duplicates_are_identical_copies(sample):
    first_line = {}
    dups = 0
    for _, line, e in sample.lines:
        event_id = e["event_id"]
        if event_id in first_line:
            assert first_line[event_id] == line
            dups += 1
        first_line[event_id] = line
    assert 0.005 < dups / len(sample.lines) < 0.02


def test_conversation_signals(sample):
    followups = defaultdict(list)
    for m in sample.by_type["user_message"]:
        followups[m["episode_id"]].append(m["text"])
    assert set(followups) <= set(sample.episodes)
    ask_episodes = [
        ep
        for ep, turns in sample.episodes.items()
        if turns[-1]["tool_calls"] and turns[-1]["tool_calls"][-1]["name"] == "ask_user"
    ]
    assert len(ask_episodes) > 50
    assert sum(ep in followups for ep in ask_episodes) / len(ask_episodes) > 0.9
    texts = [t for v in followups.values() for t in v]
    assert any(t == "thanks, works" for t in texts) and any(t == "that's wrong, it still fails" for t in texts)
    assert any(t == "no, revert that" for t in texts)
    feedback = sample.by_type["feedback"]
    assert {f["kind"] for f in feedback} == {"thumbs", "accept", "reject"}
    assert all(-1 <= f["value"] <= 1 for f in feedback)
    assert any("episode_id" in f for f in feedback) and any("sample_id" in f for f in feedback)
    known_samples = {e["sample_id"] for e in sample.completions}
    for f in feedback:
        assert f["sample_id"] in known_samples if "sample_id" in f else f["episode_id"] in sample.episodes


def test_planted_secrets_are_there_for_redaction(sample):
    user_texts = "\n".join(m["text"] for m in sample.by_type["user_message"])
    assert gen.SECRET_OPENAI in user_texts
    assert gen.SECRET_URL in user_texts
    assert all(email in user_texts for email in gen.SECRET_EMAILS)
    writes = [c["arguments"] for _, c in sample.calls.values() if c["name"] == "write_file"]
    assert any(gen.SECRET_GITHUB in json.loads(a)["content"] for a in writes)
    shells = [c["arguments"] for _, c in sample.calls.values() if c["name"] == "run_shell"]
    assert any(gen.SECRET_URL in json.loads(a)["command"] for a in shells)


# --- OpenTelemetry export ------------------------------------------------------------------------


def test_otel_export_holds_genai_chat_spans(fast_tokenizer):
    doc = json.loads(OTEL.read_text(encoding="utf-8"))
    [rs] = doc["resourceSpans"]
    [ss] = rs["scopeSpans"]
    spans = ss["spans"]
    assert 18 <= len(spans) <= 30
    by_episode = defaultdict(list)
    for span in spans:
        assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
        assert int(span["endTimeUnixNano"]) > int(span["startTimeUnixNano"]) > 0
        attrs = {a["key"]: a["value"] for a in span["attributes"]}
        assert attrs["gen_ai.operation.name"] == {"stringValue": "chat"}
        assert span["name"] == "chat " + attrs["gen_ai.request.model"]["stringValue"]
        assert attrs["rlcycle.policy_version"] == attrs["gen_ai.request.model"]
        prompt, completion = (
            [int(v["intValue"]) for v in attrs[key]["arrayValue"]["values"]]
            for key in ("rlcycle.prompt_ids", "rlcycle.completion_ids")
        )
        logprobs = [v["doubleValue"] for v in attrs["rlcycle.completion_logprobs"]["arrayValue"]["values"]]
        assert len(logprobs) == len(completion) and all(lp <= 0 for lp in logprobs)
        assert int(attrs["gen_ai.usage.input_tokens"]["intValue"]) == len(prompt)
        assert int(attrs["gen_ai.usage.output_tokens"]["intValue"]) == len(completion)
        [out] = json.loads(attrs["gen_ai.output.messages"]["stringValue"])
        text = "".join(p["content"] for p in out["parts"] if p["type"] == "text")
        assert fast_tokenizer.encode(text, add_special_tokens=False).ids == completion
        calls = json.loads(attrs["rlcycle.tool_calls"]["stringValue"])
        assert [c["call_id"] for c in calls] == [p["id"] for p in out["parts"] if p["type"] == "tool_call"]
        assert json.loads(attrs["gen_ai.input.messages"]["stringValue"])[0]["role"] == "system"
        episode = attrs["rlcycle.episode_id"]["stringValue"]
        by_episode[episode].append((int(attrs["rlcycle.turn"]["intValue"]), prompt, completion))
    for turns in by_episode.values():
        turns.sort()
        assert [t for t, _, _ in turns] == list(range(len(turns)))
        for (_, p0, c0), (_, p1, _) in zip(turns, turns[1:], strict=False):
            assert p1[: len(p0) + len(c0)] == p0 + c0


# --- the generator --------------------------------------------------------------------------------


def generate(out: Path, *extra: str) -> None:
    assert gen.main(["--episodes", "40", "--seed", "7", "--out", str(out), *extra]) == 0


def test_same_seed_gives_identical_bytes(tmp_path, capsys):
    generate(tmp_path / "a", "--otel", str(tmp_path / "a.json"))
    generate(tmp_path / "b", "--otel", str(tmp_path / "b.json"))
    files_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files_a == sorted(p.name for p in (tmp_path / "b").iterdir()) and files_a
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["episodes"] == 40
    assert gen.main(["--episodes", "40", "--seed", "8", "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / files_a[0]).read_bytes() != (tmp_path / "a" / files_a[0]).read_bytes()


def test_events_target_rotation_and_parquet(tmp_path):
    import pyarrow.parquet as pq

    assert (
        gen.main(
            [
                "--events",
                "600",
                "--seed",
                "3",
                "--files-per-hour",
                "4",
                "--out",
                str(tmp_path / "j"),
            ]
        )
        == 0
    )
    jsonl = sorted((tmp_path / "j").iterdir())
    assert all(re.fullmatch(r"events-\d{4}-\d\d-\d\dT\d\d-(00|15|30|45)\.jsonl", p.name) for p in jsonl)
    n_lines = sum(len(p.read_text().splitlines()) for p in jsonl)
    assert 600 <= n_lines < 700
    assert (
        gen.main(
            [
                "--events",
                "600",
                "--seed",
                "3",
                "--files-per-hour",
                "4",
                "--format",
                "parquet",
                "--out",
                str(tmp_path / "p"),
            ]
        )
        == 0
    )
    tables = [pq.read_table(p) for p in sorted((tmp_path / "p").iterdir())]
    assert [p.name.replace(".parquet", ".jsonl") for p in sorted((tmp_path / "p").iterdir())] == [p.name for p in jsonl]
    assert sum(t.num_rows for t in tables) == n_lines
    assert set(tables[0].column("type").to_pylist()) <= set(FIELDS)


@pytest.mark.slow
def test_committed_sample_is_what_the_documented_command_makes(tmp_path):
    assert (
        gen.main(
            [
                "--episodes",
                "2000",
                "--seed",
                "20261130",
                "--out",
                str(tmp_path / "ev"),
                "--otel",
                str(tmp_path / "otel.json"),
            ]
        )
        == 0
    )
    committed = sorted(p.name for p in EVENTS.glob("events-*.jsonl"))
    assert committed == sorted(p.name for p in (tmp_path / "ev").iterdir())
    for name in committed:
        assert (EVENTS / name).read_bytes() == (tmp_path / "ev" / name).read_bytes(), name
    assert OTEL.read_bytes() == (tmp_path / "otel.json").read_bytes()


def test_delta_prompts_are_the_same_prompts_stored_once(tmp_path):
    """`--prompts delta` writes what the gateway writes (a root, then what each turn adds to the
    previous turn's context): collected, it gives the whole-prompt log's rows and prompts."""
    from conftest import run_cli

    from rlcycle import prompts

    for layout in ("whole", "delta"):
        assert gen.main(["--episodes", "40", "--seed", "9", "--out", str(tmp_path / layout), "--prompts", layout]) == 0
        args = ["collect", tmp_path / layout, "-o", tmp_path / f"{layout}.arrow", "--as-of", "2030-01-01T00:00:00Z"]
        assert run_cli([*args, "-q"]).exit_code == 0
    lines = [json.loads(x) for f in sorted((tmp_path / "delta").iterdir()) for x in f.read_text().splitlines()]
    comps = [e for e in lines if e["type"] == "completion"]
    assert comps and not any("prompt_ids" in e for e in comps)
    assert {e["prompt_parent"] is None for e in comps if e["turn"] == 0} == {True}
    assert all(e["prompt_parent"] and e["prompt_shared"] > 0 for e in comps if e["turn"] > 0)
    whole, delta = (prompts.with_full_prompts(tmp_path / f"{x}.arrow") for x in ("whole", "delta"))
    by_id = [dict(zip(t["sample_id"].to_pylist(), t["prompt_ids"].to_pylist(), strict=True)) for t in (whole, delta)]
    assert by_id[0] == by_id[1] and len(by_id[0]) > 40
    layout_cols = ["prompt_ids", "prompt_parent", "prompt_shared", "prompt_added"]
    assert whole.drop_columns(layout_cols).equals(delta.drop_columns(layout_cols))
