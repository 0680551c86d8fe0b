"""Segments: a run of an agent session's turns that extend one another trains as ONE sequence.

Turn t+1's prompt usually is turn t's prompt + completion followed by the tool output and the
next messages (rlcycle/prompts.py: such a row *extends* its parent). Under causal attention the
logits of one forward pass over the last turn's context score every earlier turn's completion
exactly as that turn's own forward would: the tokens before a position are the same, at the
same positions. So a *segment* (rlcycle.prompts.segments: kept rows, each extending the one
before, through rows train filtered out) runs once, over its last member's context, and every
member's completion positions [prompt_len, context_len) are scored from it, each with its own
advantage, weight, behaviour logprobs, IS ratio and normaliser: the loss is the per-turn loss.

How train uses them (docs/train.md "Segments"):

- Reading (data.py `load_examples`): a file in the delta layout (prompt_parent / prompt_shared /
  prompt_added; either layout or a mix) is resolved with `rlcycle.prompts.from_table` and kept
  as it is: no row's full prompt is built in memory (a session's would be quadratic). A
  segment's sequence, `Prompts.context(last member)`, is built when its batch is collated.
- The schedule (data.py `Schedule`) draws *segments*: each epoch permutes them (seeded as the
  rows were) and a step takes whole segments until it holds `batch_size` rows or more (the last
  step of an epoch may hold fewer; drop_last drops it). Splitting a segment over two steps
  would run its first part's context twice. Every kept row is trained once per epoch. Rows in
  the old layout are roots, each its own segment: the schedule is then exactly the row one.
- Micro-batching: a segment is one sequence whose length is its last member's context;
  packing, bucketing, shared prefixes (prefix.py: capped before the first member's first
  completion token), chunked logprobs and checkpointing by length (longseq.py) treat it as a
  row of that length.
- Length: a segment's sequence is its last member's context, which fits `max_seq_len` because
  that member was kept (a longer row is dropped as too_long, and ends its segment). So no
  segment is ever split for length and no row that fits alone is dropped.

`TrainConfig.segments = false` scores every row from its own context (the per-turn baseline).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from rlcycle.prompts import Prompts, segments

# Columns train reads besides data.py's REQUIRED / OPTIONAL when a file has the delta layout.
DELTA_READ = ("sample_id", "prompt_parent", "prompt_shared", "prompt_added")


class DeltaPrompt:
    """The kept rows' prompts, resolved lazily from `Prompts` (data.py's Ragged interface:
    `row(i)` and `lengths`): the delta layout's prompts are never all materialised."""

    def __init__(self, p: Prompts, source: np.ndarray):
        self.p, self.source = p, source
        self.lengths = p.prompt_lens[source]

    def row(self, i: int) -> np.ndarray:
        return self.p.prompt(int(self.source[i])).astype(np.int64, copy=False)


def out_of_vocab(p: Prompts, vocab_size: int) -> np.ndarray:
    """Per row of `p`: whether its prompt or completion holds an id outside [0, vocab_size).

    A row's own tokens are its added ones and its completion; its prompt's first `shared`
    tokens are its parent's, so the first bad position of each context is carried down the
    parent chains (parents first)."""
    n = len(p)

    def first_bad(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        lens = np.diff(offsets)
        bad = (values < 0) | (values >= vocab_size)
        out = np.full(n, np.iinfo(np.int64).max, np.int64)
        idx = np.flatnonzero(bad)
        if idx.size:
            row = np.searchsorted(offsets, idx, side="right") - 1
            keep = lens[row] > 0
            first = {}
            for r, i in zip(row[keep].tolist(), idx[keep].tolist(), strict=True):
                first.setdefault(r, i - int(offsets[r]))
            for r, pos in first.items():
                out[r] = pos
        return out

    plen = p.prompt_lens
    big = np.iinfo(np.int64).max
    own_added = first_bad(p.added_values, p.added_offsets)
    own_comp = first_bad(p.completion_values, p.completion_offsets)
    # First bad position in each row's context (big: none).
    ctx_bad = np.where(own_added < big, p.shared + own_added, np.where(own_comp < big, plen + own_comp, big))
    if (p.parent >= 0).any():
        for i in parents_first(p):
            par = int(p.parent[i])
            if par >= 0 and ctx_bad[par] < p.shared[i]:
                ctx_bad[i] = min(int(ctx_bad[i]), int(ctx_bad[par]))
    return ctx_bad < p.context_lens


def parents_first(p: Prompts) -> np.ndarray:
    """Row indices of `p`, every parent before its children (by depth, then index)."""
    n = len(p)
    if np.all(p.parent < np.arange(n)):
        return np.arange(n)
    depth = np.full(n, -1, np.int64)
    for start in range(n):
        path, i = [], start
        while i >= 0 and depth[i] < 0:
            path.append(i)
            i = int(p.parent[i])
        d = int(depth[i]) if i >= 0 else -1
        for k in reversed(path):
            d += 1
            depth[k] = d
    return np.lexsort((np.arange(n), depth))


def build(p: Prompts, source: np.ndarray) -> list[np.ndarray]:
    """The segments of the kept rows (`source`: their row indices in `p`), as arrays of kept
    indices in order, segments in `rlcycle.prompts.segments` order."""
    pos = np.full(len(p), -1, np.int64)
    pos[source] = np.arange(len(source))
    return [pos[np.asarray(s.rows, np.int64)] for s in segments(p, source)]


def unique_tokens(ex, rows) -> int:
    """Unique tokens of `rows`' contexts: every prompt + completion token once, however many
    of the rows hold it (a turn's prompt repeats the earlier turns it extends). Old-layout rows
    count whole; delta rows count the parent-chain positions some row's context reaches."""
    rows = np.asarray(rows, np.int64)
    if ex.prompts is None:
        return int(ex.seq_len[rows].sum())
    p, src = ex.prompts, ex.source[rows]
    ctx, shared, parent = p.context_lens, p.shared, p.parent
    reach: dict[int, int] = {}
    for s in src[np.argsort(-ctx[src], kind="stable")].tolist():  # deepest first: later walks stop early
        cur, r = s, int(ctx[s])
        while cur >= 0 and r > 0 and reach.get(cur, 0) < r:
            reach[cur] = r
            r = min(r, int(shared[cur]))
            cur = int(parent[cur])
    return int(sum(max(0, r - int(shared[j])) for j, r in reach.items()))


def segment_stats(ex) -> dict:
    """The kept rows' segments, per session: rlcycle.json metrics and train's summary."""
    segs = ex.segments if ex.segments is not None else [np.array([i]) for i in range(len(ex))]
    sizes = np.array([len(s) for s in segs], np.int64)
    per_session: Counter = Counter()
    for s in segs:
        per_session[ex.session_of(int(s[0]))] += 1
    counts = np.array(list(per_session.values()) or [0], np.int64)
    return {
        "segments": len(segs),
        "rows_in_segments": int(sizes[sizes > 1].sum()),  # rows scored from a longer segment's forward
        "segment_rows_max": int(sizes.max(initial=0)),
        "sessions": len(per_session),
        "segments_per_session_mean": float(counts.mean()) if per_session else None,
        "segments_per_session_max": int(counts.max()) if per_session else None,
    }


def step_bounds(sizes: np.ndarray, batch_size: int, drop_last: bool) -> list[tuple[int, int]]:
    """[start, end) of each step over segments of `sizes` rows (in the epoch's order): a step
    takes whole segments until it holds `batch_size` rows or more."""
    out, start, rows = [], 0, 0
    for k, n in enumerate(sizes.tolist()):
        rows += n
        if rows >= batch_size:
            out.append((start, k + 1))
            start, rows = k + 1, 0
    if start < len(sizes) and not drop_last:
        out.append((start, len(sizes)))
    return out
