"""Segments (rlcycle/train/segments.py): a run of turns that extend one another trains as one
sequence, with the per-token logprobs, gradient and update of scoring every turn alone.

The examples file is in the delta prompt layout (rlcycle/prompts.py), written with
`prompts.delta`: session A has 5 turns that extend one another, its turn 2 excluded (a filtered
middle row); session B's turn 3 drops the end of turn 2's completion from its history (the
reasoning a chat template drops), so a new segment starts there; and two rows in the old full
layout (prompt_ids set). Every session starts with the same 40-token system prompt.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from train_data import VOCAB, behavior_logprobs, make_base

from rlcycle import io as rio
from rlcycle import prompts as PR
from rlcycle.train import data as D
from rlcycle.train import loop, stage
from rlcycle.train import loss as L
from rlcycle.train import prefix as PX
from rlcycle.train import segments as SG
from rlcycle.train.config import TrainConfig

SYSTEM = 40


def session(rng, system, turns: int, drop_at: int | None = None):
    """Full prompts and completions of one session; turn `drop_at` keeps all but the last 3
    tokens of the previous completion in its history (so it does not extend it)."""
    prompts, comps = [], []
    for t in range(turns):
        if t == 0:
            prompt = system + rng.integers(5, VOCAB, 6).tolist()
        else:
            prev = prompts[-1] + comps[-1]
            if t == drop_at:
                prev = prev[:-3]
            prompt = prev + rng.integers(5, VOCAB, int(rng.integers(3, 8))).tolist()  # tool output
        prompts.append(prompt)
        comps.append(rng.integers(5, VOCAB, int(rng.integers(2, 7))).tolist())
    return prompts, comps


def delta_rows(seed: int = 0):
    rng = np.random.default_rng(seed)
    system = rng.integers(5, VOCAB, SYSTEM).tolist()
    rows = []  # (session, sample_id, full prompt, completion, parent index or None, old layout)
    for name, turns, drop in (("A", 5, None), ("B", 5, 3)):
        prompts, comps = session(rng, system, turns, drop)
        for t, (p, c) in enumerate(zip(prompts, comps, strict=True)):
            rows.append((name, f"{name}{t}", p, c, len(rows) - 1 if t else None, False))
    for k in range(2):  # the old layout: whole prompts, no parent
        p, c = system + rng.integers(5, VOCAB, 5).tolist(), rng.integers(5, VOCAB, 4).tolist()
        rows.append((f"O{k}", f"O{k}", p, c, None, True))
    return rows


def write_delta(path, base, rows, **override):
    """An examples file in the delta layout (old-layout rows keep prompt_ids), on-policy."""
    n = len(rows)
    shared, added, full = [], [], []
    for _, _, p, _, parent, old in rows:
        if old:
            shared.append(None), added.append(None), full.append(p)
            continue
        ctx = None if parent is None else rows[parent][2] + rows[parent][3]
        s, a = PR.delta(p, ctx)
        shared.append(s if parent is not None else 0), added.append(a), full.append(None)
    cols = {
        "sample_id": [r[1] for r in rows],
        "session_id": [r[0] for r in rows],
        "policy_version": [None] * n,
        "prompt_ids": pa.array(full, pa.list_(pa.int32())),
        "prompt_parent": [rows[r[4]][1] if r[4] is not None else None for r in rows],
        "prompt_shared": pa.array(shared, pa.int32()),
        "prompt_added": pa.array(added, pa.list_(pa.int32())),
        "completion_ids": pa.array([r[3] for r in rows], pa.list_(pa.int32())),
        "behavior_logprobs": pa.array(
            behavior_logprobs(base, [r[2] for r in rows], [r[3] for r in rows]), pa.list_(pa.float32())
        ),
        "advantage": pa.array([1.0 if i % 3 else -0.5 for i in range(n)], pa.float32()),
        "weight": pa.array([1.0 + 0.1 * i for i in range(n)], pa.float32()),
        "excluded": [None] * n,
    }
    cols.update(override)
    rio.write_table(pa.table(cols), path)
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory.mktemp("segments") / "base", tie=False)


@pytest.fixture(scope="module")
def rows():
    return delta_rows()


@pytest.fixture(scope="module")
def examples(base, rows):
    excluded = [None] * len(rows)
    excluded[2] = "filtered"  # A2: a filtered middle row
    return write_delta(base.parent / "examples.arrow", base, rows, excluded=excluded)


def cfg(**kw) -> TrainConfig:
    defaults = dict(lr=1e-2, batch_size=12, micro_batch_tokens=512, max_seq_len=256, save_every=0, min_shared_prefix=8)
    return TrainConfig(**{**defaults, "max_policy_lag": None, **kw})


def load(path, config):
    return D.load_examples([str(path)], config, [], VOCAB)


def by_id(ex, rows):
    """Kept index of each sample id."""
    return {rows[int(s)][1]: k for k, s in enumerate(ex.source)}


def test_segments_follow_extension_through_a_filtered_row(examples, rows):
    ex = load(examples, cfg())
    k = by_id(ex, rows)
    assert ex.dropped == {"excluded": 1} and len(ex) == len(rows) - 1
    segs = [[rows[int(ex.source[r])][1] for r in s] for s in ex.segments]
    # A2 is filtered: A3 extends it, so A joins through it; B3 drops tokens: a new segment.
    assert segs == [["A0", "A1", "A3", "A4"], ["B0", "B1", "B2"], ["B3", "B4"], ["O0"], ["O1"]]
    for s in ex.segments:
        seq = ex.sequence(int(s[-1]))
        for m in s:  # each member's completion sits at [prompt_len, context_len) of the sequence
            p = int(ex.prompt_lens[m])
            assert seq[p : p + len(ex.completion.row(m))].tolist() == ex.completion.row(m).tolist()
            assert ex.prompt.row(m).tolist() == rows[int(ex.source[m])][2]  # exact reconstruction
    # Old-layout rows are roots, each its own sequence, scored as before.
    o = k["O0"]
    assert ex.members(o) == [o] and ex.sequence(o).tolist() == rows[-2][2] + rows[-2][3]
    stats = SG.segment_stats(ex)
    assert stats == {
        "segments": 5,
        "rows_in_segments": 9,
        "segment_rows_max": 4,
        "sessions": 4,
        "segments_per_session_mean": 1.25,
        "segments_per_session_max": 2,
    }
    # Off: every row its own sequence.
    assert load(examples, cfg(segments=False)).segments is None


def test_unique_tokens_count_each_context_token_once(examples, rows):
    ex = load(examples, cfg())
    k = by_id(ex, rows)
    a = [k[f"A{t}"] for t in (0, 1, 3, 4)]
    a4 = rows[4]
    assert SG.unique_tokens(ex, a) == len(a4[2]) + len(a4[3])  # one session, one chain: its last context
    b = [k[f"B{t}"] for t in range(5)]
    b2, b4 = rows[7], rows[9]
    kept = len(b2[2]) + len(b2[3]) - 3  # B3 keeps all but 3 tokens of B2's context
    assert SG.unique_tokens(ex, b) == len(b2[2]) + len(b2[3]) + (len(b4[2]) + len(b4[3]) - kept)
    o = [k["O0"], k["O1"]]
    assert SG.unique_tokens(ex, o) == int(ex.seq_len[o].sum())


def grads_of(model, batch, logp):
    params = [p for p in model.parameters() if p.requires_grad]
    tb = L.TokenBatch(logp, batch.behavior, batch.advantage, batch.coef, batch.mask, row=batch.row)
    loss, sums, _ = L.micro_loss(tb, L.LossSettings())
    return loss, sums, torch.autograd.grad(loss, params)


def test_logprobs_and_gradient_equal_per_turn_scoring(base, examples):
    from transformers import AutoModelForCausalLM

    ex = load(examples, cfg())
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).train()
    units = [int(s[-1]) for s in ex.segments]
    scored = [m for u in units for m in ex.members(u)]
    coef = {r: 0.01 * (r + 1) for r in range(len(ex))}
    seg = D.collate(ex, [[u] for u in units], coef, True)
    per_turn = load(examples, cfg(segments=False))  # the same kept rows, each its own sequence
    assert per_turn.segments is None and per_turn.source.tolist() == ex.source.tolist()
    turn = D.collate(per_turn, [[r] for r in scored], coef, True)
    # The same completion tokens, in the same order, with the same per-token inputs.
    for name in ("labels", "behavior", "advantage", "coef", "mask", "row"):
        assert getattr(seg, name).tolist() == getattr(turn, name).tolist(), name
    assert seg.forward < turn.forward * 0.6  # and far fewer tokens run
    a = loop.completion_logprobs(model, seg, "cpu")
    b = loop.completion_logprobs(model, turn, "cpu")
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    la, sa, ga = grads_of(model, seg, a)
    lb, sb, gb = grads_of(model, turn, b)
    torch.testing.assert_close(la, lb, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sa, sb, atol=1e-5, rtol=1e-5)  # ratios, per-sequence stats too
    norm = max(g.abs().max().item() for g in gb)
    assert norm > 1e-4
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6 * max(norm, 1.0), rtol=1e-4)
    # Chunked logprobs (longseq.py) score the segment's completions the same.
    torch.testing.assert_close(loop.completion_logprobs(model, seg, "cpu", chunk_tokens=5), a, atol=1e-5, rtol=0)
    # A shared-prefix pass (prefix.py) over segments: the system prompt once, the same logprobs.
    p = PX.common_prefix(ex, units)
    assert SYSTEM <= p < min(ex.first_prompt_len(u) for u in units)
    shared = D.collate(ex, PX.SharedPass(units, p), coef, False)
    assert shared.labels.tolist() == seg.labels.tolist()
    torch.testing.assert_close(loop.completion_logprobs(model, shared, "cpu"), a, atol=1e-5, rtol=0)


def test_a_wrong_member_position_is_caught(base, examples):
    # The comparison above can fail: scoring a member one position off moves its logprobs.
    from transformers import AutoModelForCausalLM

    ex = load(examples, cfg())
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    u = int(ex.segments[0][-1])
    coef = dict.fromkeys(range(len(ex)), 1.0)
    good = D.collate(ex, [[u]], coef, True)
    bad = D.collate(ex, [[u]], coef, True)
    first = int(torch.nonzero(bad.keep[0])[0])
    bad.keep[0, first], bad.keep[0, first - 1] = False, True
    with torch.no_grad():
        want = loop.completion_logprobs(model, good, "cpu")
        assert (loop.completion_logprobs(model, bad, "cpu") - want).abs().max() > 1e-4


def test_a_row_too_long_ends_its_segment_and_drops_nothing_else(examples, rows):
    a3 = rows[3]
    limit = len(a3[2]) + len(a3[3])  # A3 fits, A4 does not (nor does B's longest turn)
    ex = load(examples, cfg(max_seq_len=limit))
    names = [[rows[int(ex.source[r])][1] for r in s] for s in ex.segments]
    assert ["A0", "A1", "A3"] in names
    kept = {rows[int(s)][1] for s in ex.source}
    too_long = {r[1] for r in rows if len(r[2]) + len(r[3]) > limit}
    assert "A4" in too_long and kept == {r[1] for r in rows} - too_long - {"A2"}
    assert ex.dropped["too_long"] == len(too_long)
    assert all(int(ex.seq_len[int(s[-1])]) <= limit for s in ex.segments)  # every sequence fits


def test_the_schedule_draws_whole_segments_and_every_row_once_per_epoch(examples):
    c = cfg(batch_size=3, epochs=2)
    ex = load(examples, c)
    sched = D.Schedule(len(ex), c, ex.segments)
    seg_of = {int(r): i for i, s in enumerate(ex.segments) for r in s}
    epochs: dict[int, list[int]] = {}
    sizes: dict[int, list[int]] = {}
    for k in range(sched.n_steps):
        epoch, rows = sched.rows(k)
        epochs.setdefault(epoch, []).extend(rows.tolist())
        sizes.setdefault(epoch, []).append(len(rows))
        segs = {seg_of[r] for r in rows}
        assert sorted(rows.tolist()) == sorted(r for i in segs for r in ex.segments[i].tolist())  # whole
        plan = D.plan_step(ex, sched, k, c, 1, 0, 8)
        assert plan.sequences == len(segs)
    assert sorted(epochs) == [0, 1]
    for got in epochs.values():
        assert sorted(got) == list(range(len(ex)))
    assert epochs[0] != epochs[1]  # shuffled per epoch
    # A step closes once it holds batch_size rows: every step but an epoch's last holds >= 3,
    # and fewer than 3 + the longest segment.
    for got in sizes.values():
        assert all(3 <= n < 3 + 4 for n in got[:-1]) and 0 < got[-1] < 3 + 4
    # Without segments the schedule is the row schedule, unchanged.
    old = D.Schedule(len(ex), c)
    assert old.n_steps == -(-len(ex) // 3) * 2 and old.rows(0)[1].tolist() != []


def weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_step_over_segments_equals_the_per_turn_step(base, examples, tmp_path):
    common = dict(optimizer="sgd", lr=0.5, batch_size=16, share_prefix=False)
    on = stage.run(cfg(**common), examples, base, tmp_path / "on", quiet=True)
    off = stage.run(cfg(**common, segments=False), examples, base, tmp_path / "off", quiet=True)
    w0, w1, w2 = weights(base), weights(tmp_path / "on"), weights(tmp_path / "off")
    assert max((w1[k] - w0[k]).abs().max().item() for k in w0) > 1e-3  # the update is real
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=1e-6, rtol=0, msg=k)
    (m_on,) = rio.read_table(tmp_path / "on" / stage.METRICS_FILE).to_pylist()
    (m_off,) = rio.read_table(tmp_path / "off" / stage.METRICS_FILE).to_pylist()
    assert m_on["loss"] == pytest.approx(m_off["loss"], abs=1e-6)
    assert m_on["sequences"] == 5 and m_off["sequences"] == 11
    ex = load(examples, cfg())
    lasts = [int(s[-1]) for s in ex.segments]
    assert m_on["forward_tokens"] == int(ex.seq_len[lasts].sum())  # one forward per segment
    assert m_off["forward_tokens"] == int(ex.seq_len.sum())  # one per row
    # B3 does not extend B2: the 3-token cut and what precedes it run twice, nothing else does.
    assert m_on["unique_tokens"] == m_off["unique_tokens"] < m_on["forward_tokens"] < m_off["forward_tokens"]
    s = on.summary
    assert s["segments"] == 5 and s["rows_in_segments"] == 9 and s["forward_tokens"] == m_on["forward_tokens"]
    assert off.summary["segments"] == 11 and off.summary["forward_per_unique"] > 2 * s["forward_per_unique"]
    text = stage.format_summary(on)
    assert "segments       5 sequences for the rows (9 rows in multi-turn segments, up to 4 rows), 4 sessions" in text
    assert f"forward        {m_on['forward_tokens']:,} tokens run for {m_on['unique_tokens']:,} unique" in text


def test_the_cli_trains_a_delta_file_and_refuses_a_broken_one(cli, base, rows, tmp_path):
    path = write_delta(tmp_path / "ex.arrow", base, rows)
    r = cli(["train", path, "--base", base, "-o", tmp_path / "ck", "--set", "max_policy_lag=none", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["steps"] == 1 and doc["summary"]["segments"] == 5 and doc["summary"]["rows_in_segments"] == 10
    assert "segments       5 sequences for the rows" in r.stderr
    parents = [rows[r[4]][1] if r[4] is not None else None for r in rows]
    parents[1] = "nope"
    bad = write_delta(tmp_path / "bad.arrow", base, rows, prompt_parent=parents)
    r = cli(["train", bad, "--base", base, "-o", tmp_path / "ck2", "--set", "max_policy_lag=none"])
    assert r.exit_code == 2 and "bad.arrow" in r.stderr and "'nope' is not a row of this file" in r.stderr
