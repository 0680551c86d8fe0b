"""rlcycle.prompts: delta-layout prompts reconstruct exactly; segments are runs of extending rows.

Random sessions mix prompts that extend the previous context, prompts that cut it (a template
that drops history, a compaction), references to earlier samples that are not the previous one,
and rows in the old full-prompt layout; rows are shuffled so parents may come after children.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from rlcycle import prompts as P
from rlcycle.errors import InputError

SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("prompt_parent", pa.string()),
        ("prompt_shared", pa.int32()),
        ("prompt_added", pa.list_(pa.int32())),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
    ]
)


def _session(rng: random.Random):
    rows, ctxs = [], []
    for i in range(rng.randint(1, 12)):
        if i == 0 or rng.random() < 0.15:
            prompt = [rng.randrange(50) for _ in range(rng.randint(1, 6))]
        else:
            base = ctxs[-1] if rng.random() < 0.7 else ctxs[rng.randrange(len(ctxs))]
            cut = len(base) if rng.random() < 0.6 else rng.randint(0, len(base))
            prompt = base[:cut] + [rng.randrange(50) for _ in range(rng.randint(0, 5))]
        completion = [rng.randrange(50) for _ in range(rng.randint(0, 4))]
        parent = None if i == 0 else (rng.randrange(i) if rng.random() < 0.3 else i - 1)
        shared, added = P.delta(prompt, None if parent is None else ctxs[parent])
        legacy = rng.random() < 0.2
        rows.append(
            {
                "sample_id": f"s{i}",
                "prompt_parent": None if legacy or parent is None else f"s{parent}",
                "prompt_shared": None if legacy else shared,
                "prompt_added": None if legacy else added,
                "prompt_ids": prompt if legacy else None,
                "completion_ids": completion,
            }
        )
        ctxs.append(prompt + completion)
    return rows, ctxs


@pytest.mark.parametrize("seed", range(5))
def test_reconstruction_is_exact_and_segments_extend(seed):
    rng = random.Random(seed)
    for _ in range(60):
        rows, ctxs = _session(rng)
        order = list(range(len(rows)))
        rng.shuffle(order)
        table = pa.Table.from_pylist([rows[k] for k in order], schema=SCHEMA)
        full = P.full_prompts(table).to_pylist()
        for pos, k in enumerate(order):
            assert full[pos] == ctxs[k][: len(ctxs[k]) - len(rows[k]["completion_ids"])]
        p = P.from_table(table)
        segs = P.segments(p)
        assert sorted(r for s in segs for r in s.rows) == list(range(len(rows)))
        for s in segs:
            last = p.context(s.rows[-1])
            for r in s.rows:
                assert np.array_equal(p.context(r), last[: p.context_lens[r]])


def test_bad_references_are_input_errors():
    base = {"prompt_ids": None, "completion_ids": [1]}
    missing = [{"sample_id": "a", "prompt_parent": "zz", "prompt_shared": 0, "prompt_added": [1], **base}]
    with pytest.raises(InputError, match="not a row"):
        P.from_table(pa.Table.from_pylist(missing, schema=SCHEMA))
    cycle = [
        {"sample_id": "a", "prompt_parent": "b", "prompt_shared": 1, "prompt_added": [1], **base},
        {"sample_id": "b", "prompt_parent": "a", "prompt_shared": 1, "prompt_added": [2], **base},
    ]
    with pytest.raises(InputError, match="cycle"):
        P.from_table(pa.Table.from_pylist(cycle, schema=SCHEMA))
    overlong = [
        {"sample_id": "a", "prompt_parent": None, "prompt_shared": 0, "prompt_added": [1], **base},
        {"sample_id": "b", "prompt_parent": "a", "prompt_shared": 5, "prompt_added": [2], **base},
    ]
    with pytest.raises(InputError, match="outside its parent"):
        P.from_table(pa.Table.from_pylist(overlong, schema=SCHEMA))


@pytest.mark.parametrize("seed", range(6))
def test_range_mask_matches_a_plain_loop(seed):
    """Increasing, disjoint ranges: adjacent ones, one at each end of the mask, and none."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 6, rng.integers(0, 30))
    gaps = rng.integers(0, 3, lens.size) * (rng.random(lens.size) < 0.6)  # many adjacent
    starts = np.cumsum(gaps + np.r_[0, lens[:-1]]).astype(np.int64)
    size = int(starts[-1] + lens[-1]) + int(rng.integers(0, 3)) if lens.size else int(rng.integers(0, 4))
    want = np.zeros(size, bool)
    for s, k in zip(starts, lens, strict=True):
        want[s : s + k] = True
    assert P.range_mask(size, starts, lens).tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_gather_rows_and_lcp_pairs_match_a_plain_loop(seed):
    """The vectorised helpers against per-row Python: rows that tile a source, suffixes (the
    byte-mask path), rows in any order and overlapping (the index path), empty rows, pairs that
    differ in b, in c, or never, and blocks smaller than one row."""
    rng = np.random.default_rng(seed)
    n = 40
    lens = rng.integers(0, 9, n)
    offs = np.r_[0, np.cumsum(lens)]
    src0 = rng.integers(0, 4, offs[-1]).astype(np.int32)
    src1 = rng.integers(0, 4, 200).astype(np.int32)
    cut = np.minimum(rng.integers(0, 4, n), lens)
    for use_first, starts, rl in [
        (np.ones(n, bool), offs[:-1], lens),  # tiles source 0
        (np.ones(n, bool), offs[:-1] + cut, lens - cut),  # suffixes
        (rng.random(n) < 0.5, rng.integers(0, offs[-1] - 8, n), lens),  # any order, overlapping
    ]:
        starts = np.where(use_first, starts, rng.integers(0, 150, n))
        values, o = P.gather_rows([(src0, None), (src1, None)], use_first, starts, rl)
        want = [(src0 if f else src1)[s : s + k] for f, s, k in zip(use_first, starts, rl, strict=True)]
        assert [values[o[i] : o[i + 1]].tolist() for i in range(n)] == [w.tolist() for w in want]
    b_starts, b_lens = rng.integers(0, 150, n), rng.integers(0, 30, n)
    c_starts, c_lens = rng.integers(0, 150, n), rng.integers(0, 20, n)
    a = [
        np.r_[src1[s : s + k], src1[cs : cs + ck]]
        for s, k, cs, ck in zip(b_starts, b_lens, c_starts, c_lens, strict=True)
    ]
    for i in range(n):  # break some: in b, in c, or cut short
        if a[i].size and rng.random() < 0.5:
            a[i] = a[i][: rng.integers(0, a[i].size)] if rng.random() < 0.3 else a[i].copy()
            if a[i].size and rng.random() < 0.7:
                a[i][rng.integers(0, a[i].size)] += 1
    a_lens = np.array([x.size for x in a])
    a_vals = np.concatenate(a).astype(np.int32)
    a_starts = np.r_[0, np.cumsum(a_lens)[:-1]]
    want = []
    for x, s, k, cs, ck in zip(a, b_starts, b_lens, c_starts, c_lens, strict=True):
        ctx = np.r_[src1[s : s + k], src1[cs : cs + ck]]
        m = min(x.size, ctx.size)
        d = np.flatnonzero(x[:m] != ctx[:m])
        want.append(int(d[0]) if d.size else m)
    for block in (1, 7, 1 << 20):
        got = P.lcp_pairs(a_vals, a_starts, a_lens, src1, b_starts, b_lens, src1, c_starts, c_lens, block=block)
        assert got.tolist() == want
