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
