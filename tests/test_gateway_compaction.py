"""Compaction and retries through the real gateway (issue 36 item 4), on the tiny model.

A client that compacts its history sends a prompt that extends nothing: the gateway keeps it in
the same episode (rule "compaction"), stores it against the episode's latest sample as a new
segment, and collect + distill give every segment the episode's reward. A client retry (the
same request again under a new request id, the first answer never used) is found by collect
and left out of training.
"""

from __future__ import annotations

import json

from conftest import run_cli

from rlcycle import io as rio
from rlcycle import prompts
from tests.test_gateway import _client, _start, world  # noqa: F401  (fixture)
from tests.test_gateway_requests import _one

SYSTEM = {"role": "system", "content": "You fix bugs."}
TASK = {"role": "user", "content": "Fix add() in calc.py."}


def test_a_compacted_history_is_a_new_segment_of_the_same_episode(world, tmp_path):  # noqa: F811
    gw = _start(world, tmp_path / "logs")
    try:
        c = _client(gw)
        kw = dict(model="production", max_tokens=5, seed=1, temperature=1.0, extra_headers={"X-Session-Id": "cmp"})
        r1 = c.chat.completions.with_raw_response.create(messages=[SYSTEM, TASK], **kw)
        a1 = r1.parse().choices[0].message.content
        msgs2 = [SYSTEM, TASK, {"role": "assistant", "content": a1}, {"role": "user", "content": "go on"}]
        r2 = c.chat.completions.with_raw_response.create(messages=msgs2, **kw)
        # The client summarises: the task, then a summary instead of the history.
        msgs3 = [SYSTEM, TASK, {"role": "user", "content": "Summary so far: read calc.py; add() subtracts."}]
        r3 = c.chat.completions.with_raw_response.create(messages=msgs3, **kw)
        # The same task sent alone is a new request of the user: a new episode.
        r4 = c.chat.completions.with_raw_response.create(messages=[SYSTEM, TASK], **kw)
        ev = [_one(gw, r.headers["x-sample-id"]) for r in (r1, r2, r3, r4)]
    finally:
        gw.close()
    assert [e["episode_id"] for e in ev[:3]] == [ev[0]["episode_id"]] * 3 and ev[3]["episode_id"] != ev[0]["episode_id"]
    assert [e["turn"] for e in ev[:3]] == [0, 1, 2]
    assert ev[2]["id_rules"]["episode"] == "compaction" and ev[2]["parent_sample_id"] == ev[1]["sample_id"]
    # Stored against the sample it compacted, sharing only what it kept (a new segment).
    assert ev[1]["prompt_parent"] == ev[0]["sample_id"]
    assert ev[2]["prompt_parent"] == ev[1]["sample_id"]
    whole = {e["sample_id"]: e["prompt_ids"] for e in prompts.events_with_full_prompts(ev)}
    ctx1 = whole[ev[1]["sample_id"]] + ev[1]["completion_ids"]
    assert ev[2]["prompt_shared"] < len(ctx1)  # does not extend: a new segment
    assert whole[ev[1]["sample_id"]][: len(whole[ev[0]["sample_id"]])] == whole[ev[0]["sample_id"]]
    # collect: two segments in the episode; distill: the episode's follow-up reaches both.
    log = tmp_path / "ev.jsonl"
    follow = {
        "event_id": "u1",
        "type": "user_message",
        "ts": "2099-01-01T00:00:00Z",
        "session_id": "cmp",
        "episode_id": ev[0]["episode_id"],
        "text": "no, that's wrong, it still fails",
    }
    log.write_text("".join(json.dumps(e) + "\n" for e in [*ev, follow]))
    r = run_cli(["collect", str(log), "-o", str(tmp_path / "t.arrow"), "--json", "--quiet"])
    assert r.exit_code == 0, r.output + r.error
    res = json.loads(r.stdout)
    # r2 extends r1 unless re-tokenising the tiny model's sampled soup changed the ids (the
    # gateway renders history from text); r3 and r4 never extend what came before them.
    r2_extends = ev[1]["prompt_shared"] == len(whole[ev[0]["sample_id"]]) + len(ev[0]["completion_ids"])
    assert res["segments"] == (3 if r2_extends else 4) and res["sessions_out"] == 1
    r = run_cli(["distill", str(tmp_path / "t.arrow"), "-o", str(tmp_path / "ex.arrow")])
    assert r.exit_code == 0, r.output + r.error
    ex = rio.read_table(tmp_path / "ex.arrow").to_pylist()
    first_episode = [x for x in ex if x["episode_id"] == ev[0]["episode_id"]]
    assert len(first_episode) == 3
    assert all(x["reward_parts"]["dissatisfied_followup"] < 0 for x in first_episode)
