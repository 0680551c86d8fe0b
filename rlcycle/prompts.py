"""Prompts stored once: a completion's prompt recorded as what it adds to an earlier sample.

An agent session's call t+1 usually sends call t's prompt and completion again, plus the tool
output and the next messages. Stored in full at every call, a session costs the square of its
length; stored as a delta it costs its unique tokens. The layout (events, trajectories and
examples alike; docs/design.md "Prompts stored once"):

    prompt_parent  string        sample_id of an earlier sample of the same session; null: a root
    prompt_shared  int32         leading tokens of the parent's *context* this prompt keeps
    prompt_added   list<int32>   the prompt's tokens after them
    prompt_ids     list<int32>   the whole prompt: null in this layout, set in the old one

    context(s) = prompt(s) + completion_ids(s)
    prompt(r)  = context(parent)[:prompt_shared] + prompt_added      (a root: prompt_added)

A row *extends* its parent when `prompt_shared == len(context(parent))`: its prompt is the
parent's whole context followed by new tokens. A run of rows each extending the one before is
a *segment*: one forward pass over its last row's context scores every row's completion
(train, docs/train.md "Segments"). A row that does not extend its parent (a chat template that
drops reasoning from history, a compacted history, a retry) starts a new segment.

Everything here works on flat numpy arrays (no per-token Python), and reconstructing a prompt
walks its parent chain once and copies only the tokens it returns: linear in what it returns.
Analysts get every full prompt with one call: `full_prompts(table)` (or
`rlcycle inspect FILE --full-prompts`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from rlcycle.errors import InputError

DELTA_COLUMNS = ("prompt_parent", "prompt_shared", "prompt_added")


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def delta(prompt: Sequence[int], parent_context: Sequence[int] | None) -> tuple[int, list[int]]:
    """(prompt_shared, prompt_added) of `prompt` against a parent's context (None: a root)."""
    p = np.asarray(prompt, dtype=np.int64)
    if parent_context is None:
        return 0, p.tolist()
    shared = lcp(p, np.asarray(parent_context, dtype=np.int64))
    return shared, p[shared:].tolist()


def list_parts(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, offsets, valid) of a list<int> column, zero-copy where Arrow allows."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr, pa.ChunkedArray):  # combine_chunks of an empty column
        arr = pa.array([], pa.list_(pa.int32()))
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    # Offsets of a sliced array start past 0; values are indexed by them as they are. A large
    # list's (what polars exports) are int64 already: taken as they are, not copied twice.
    offsets = arr.offsets.to_numpy()
    if offsets.dtype != np.int64:
        offsets = offsets.astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    return values, offsets, valid


@dataclass
class Prompts:
    """The prompts of a table's rows, resolved: parent row indices, shared lengths, added ids.

    `parent[i]` is the row index of row i's parent (-1: a root); rows in the old layout are
    roots whose `added` is their whole prompt. Build one with `from_table`."""

    parent: np.ndarray  # int64, -1 for roots
    shared: np.ndarray  # int64
    added_values: np.ndarray
    added_offsets: np.ndarray
    completion_values: np.ndarray
    completion_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.parent)

    def added(self, i: int) -> np.ndarray:
        return self.added_values[self.added_offsets[i] : self.added_offsets[i + 1]]

    def completion(self, i: int) -> np.ndarray:
        return self.completion_values[self.completion_offsets[i] : self.completion_offsets[i + 1]]

    # Computed once (the arrays are not changed after construction): `prompt(i)` and
    # `context(i)` read them, and a per-row loop over those was quadratic when each call
    # recomputed every row's length (full_prompts of 40k rows: 1.15 s; of 353k: 56.6 s, now 4.5).
    @functools.cached_property
    def prompt_lens(self) -> np.ndarray:
        return self.shared + np.diff(self.added_offsets)

    @functools.cached_property
    def context_lens(self) -> np.ndarray:
        return self.prompt_lens + np.diff(self.completion_offsets)

    def extends(self) -> np.ndarray:
        """Per row: its prompt is its parent's whole context followed by new tokens."""
        ctx = self.context_lens
        has = self.parent >= 0
        out = np.zeros(len(self), dtype=bool)
        out[has] = self.shared[has] == ctx[self.parent[has]]
        return out

    def prefix(self, i: int, n: int, *, context: bool = False) -> np.ndarray:
        """The first `n` tokens of row i's prompt (or of its context with `context=True`).

        Walks the parent chain down to the first row whose own tokens cover the start, then
        copies the pieces: linear in `n` plus the chain's length."""
        pieces: list[np.ndarray] = []
        while n > 0:
            if context:
                plen = int(self.shared[i]) + len(self.added(i))
                if n > plen:
                    pieces.append(self.completion(i)[: n - plen])
                    n = plen
            sh = int(self.shared[i])
            if n > sh:
                pieces.append(self.added(i)[: n - sh])
                n = sh
            if n == 0:
                break
            i, context = int(self.parent[i]), True
        if not pieces:
            return np.zeros(0, dtype=self.added_values.dtype)
        return np.concatenate(pieces[::-1])

    def prompt(self, i: int) -> np.ndarray:
        return self.prefix(i, int(self.prompt_lens[i]))

    def context(self, i: int) -> np.ndarray:
        return self.prefix(i, int(self.context_lens[i]), context=True)


def has_delta(table: pa.Table | pa.Schema) -> bool:
    names = table.names if isinstance(table, pa.Schema) else table.column_names
    return all(c in names for c in DELTA_COLUMNS)


def from_table(table: pa.Table, source: str = "<table>") -> Prompts:
    """Resolve a table's prompt columns (either layout, or a mix) into `Prompts`.

    A row with `prompt_ids` set is a root holding its whole prompt; otherwise its parent must be
    another row of the table and the references must form no cycle and point inside the
    parent's context — anything else is an InputError naming the row (collect quarantines such
    rows, so its outputs never hold one)."""
    n = table.num_rows
    comp_values, comp_offsets, _ = list_parts(table.column("completion_ids"))
    full = table.column("prompt_ids") if "prompt_ids" in table.column_names else pa.nulls(n, pa.list_(pa.int32()))
    full_values, full_offsets, full_valid = list_parts(full)
    if not has_delta(table):
        return Prompts(
            np.full(n, -1, np.int64), np.zeros(n, np.int64), full_values, full_offsets, comp_values, comp_offsets
        )
    add_values, add_offsets, add_valid = list_parts(table.column("prompt_added"))
    shared = table.column("prompt_shared").to_numpy(zero_copy_only=False)
    shared = np.nan_to_num(np.asarray(shared, dtype=np.float64), nan=0).astype(np.int64)
    parent, missing = _parent_rows(table)
    missing &= ~full_valid
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        ids = table.column("sample_id")
        raise InputError(
            f"{source}: row {i} (sample {ids[i].as_py()!r}): prompt_parent "
            f"{table.column('prompt_parent')[i].as_py()!r} is not a row of this file"
        )
    parent = np.where(full_valid, -1, parent)
    # Per row, the ids it holds itself: the full prompt (old layout) or the added tokens.
    use_full = full_valid
    shared = np.where(use_full | (parent < 0), 0, shared)
    lens = np.where(use_full, np.diff(full_offsets), np.where(add_valid, np.diff(add_offsets), 0))
    starts = np.where(use_full, full_offsets[:-1], add_offsets[:-1])
    values, offsets = gather_rows([(full_values, full_offsets), (add_values, add_offsets)], use_full, starts, lens)
    prompts = Prompts(parent, shared, values, offsets, comp_values, comp_offsets)
    _check_refs(prompts, table.column("sample_id"), source)
    return prompts


def _parent_rows(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(row index of each row's prompt_parent or -1, rows whose named parent is not a row)."""
    import polars as pl

    n = table.num_rows
    frame = pl.from_arrow(table.select(["sample_id", "prompt_parent"])).with_row_index("_i")
    found = (
        frame.select("_i", "prompt_parent")
        .join(
            frame.select(pl.col("sample_id"), pl.col("_i").alias("_p")),
            left_on="prompt_parent",
            right_on="sample_id",
            how="left",
        )
        .sort("_i")
    )
    if found.height != n:
        raise InputError(f"sample_id is not unique ({n - frame.get_column('sample_id').n_unique()} repeated)")
    parent = found.get_column("_p").fill_null(-1).cast(pl.Int64).to_numpy()
    named = found.get_column("prompt_parent").is_not_null().to_numpy()
    return parent, named & (parent < 0)


def gather_rows(sources, use_first: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One flat values/offsets pair from two list columns, row by row: row i is
    `sources[0 if use_first[i] else 1][0][starts[i] : starts[i] + lens[i]]`. Where the rows of a
    source tile it, that source comes back as it is; where they are increasing and disjoint (a
    suffix of each list, say), one byte mask selects them; otherwise one index gather."""
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    dtype = np.result_type(sources[0][0].dtype, sources[1][0].dtype) if total else np.int32
    if not total:
        return np.empty(0, dtype), offsets
    nonempty = lens > 0
    values = None
    for first, (src, _) in ((True, sources[0]), (False, sources[1])):
        rows = np.flatnonzero(nonempty & (use_first == first))
        if not rows.size:
            continue
        picked = slices(src, starts[rows], lens[rows])
        if rows.size == int(nonempty.sum()):  # every row from this source
            return picked.astype(dtype, copy=False), offsets
        if values is None:
            values = np.empty(total, dtype)
        values[range_mask(total, offsets[rows], lens[rows])] = picked
    return values, offsets


def slices(src: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The concatenation of `src[starts[k] : starts[k] + lens[k]]` (every `lens[k]` > 0): `src`
    itself when they tile it, a masked copy when they are increasing and disjoint, else a gather
    through one index array. Linear in what it returns (plus `src` for the mask)."""
    ends = starts + lens
    if not starts.size:
        return src[:0]
    if starts[0] == 0 and ends[-1] == len(src) and np.array_equal(starts[1:], ends[:-1]):
        return src
    if np.all(starts[1:] >= ends[:-1]):
        lo, hi = int(starts[0]), int(ends[-1])
        return src[lo:hi][range_mask(hi - lo, starts - lo, lens)]
    return src[range_index(starts, lens)]


def range_mask(size: int, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """A bool mask of `size` that is true on the increasing, disjoint ranges [starts[k],
    starts[k] + lens[k]) (every `lens[k]` > 0): one `np.repeat` of alternating false/true runs,
    each run written at once (a byte-wide running sum over `size` cost ~12x more: it was most
    of collect's prompt step on whole-prompt logs, docs/performance.md)."""
    ends = starts + lens
    runs = np.empty(2 * len(starts) + 1, np.int64)
    runs[0] = starts[0] if len(starts) else size
    runs[1::2] = lens
    runs[2:-1:2] = starts[1:] - ends[:-1]  # the gaps between ranges (0 where one ends, the next starts)
    if len(starts):
        runs[-1] = size - ends[-1]
    inside = np.zeros(len(runs), bool)
    inside[1::2] = True
    return np.repeat(inside, runs)


def range_index(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The concatenation of `arange(starts[k], starts[k] + lens[k])` (every `lens[k]` > 0), from
    one running sum of steps: 1 inside a range, a jump at each range's first position."""
    step = np.ones(int(lens.sum()), np.int64)
    step[0] = starts[0]
    step[np.cumsum(lens[:-1])] = starts[1:] - (starts[:-1] + lens[:-1]) + 1
    return np.cumsum(step, out=step)


def _check_refs(p: Prompts, ids: pa.ChunkedArray, source: str) -> None:
    """No cycle, and each shared length inside its parent's context (vectorised)."""
    n = len(p)
    up = p.parent.copy()
    for _ in range(max(1, int(np.ceil(np.log2(max(n, 2))))) + 1):  # pointer jumping
        if not (up >= 0).any():
            break
        up = np.where(up >= 0, up[np.maximum(up, 0)], -1)  # the ancestor twice as far up
    if (up >= 0).any():
        i = int(np.flatnonzero(up >= 0)[0])
        raise InputError(f"{source}: row {i} (sample {ids[i].as_py()!r}): prompt_parent references form a cycle")
    ctx = p.context_lens
    has = p.parent >= 0
    bad = np.flatnonzero(has & (p.shared > np.where(has, ctx[np.maximum(p.parent, 0)], 0)))
    bad = np.concatenate([bad, np.flatnonzero(p.shared < 0)])
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{source}: row {i} (sample {ids[i].as_py()!r}): prompt_shared {int(p.shared[i])} is outside its parent's "
            f"context ({int(ctx[p.parent[i]]) if p.parent[i] >= 0 else 0} tokens)"
        )


def full_prompts(table: pa.Table, source: str = "<table>") -> pa.Array:
    """Every row's whole prompt as a list<int32> array, whatever layout the table uses."""
    p = from_table(table, source)
    out = [p.prompt(i) for i in range(len(p))]
    lens = np.array([len(x) for x in out], np.int64)
    offsets = np.zeros(len(out) + 1, np.int32 if lens.sum() < 2**31 else np.int64)
    np.cumsum(lens, out=offsets[1:])
    values = np.concatenate(out).astype(np.int32) if out else np.zeros(0, np.int32)
    typ = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    return typ.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))


def with_full_prompts(data: pa.Table | str | Path, source: str | None = None) -> pa.Table:
    """The table (or Arrow/Parquet file) with `prompt_ids` filled in for every row.

    The one call an analyst needs: `pl.from_arrow(rlcycle.prompts.with_full_prompts(path))`."""
    if not isinstance(data, pa.Table):
        from rlcycle import io as rio

        source = source or str(data)
        data = rio.read_table(data)
    prompts = full_prompts(data, source or "<table>")
    if "prompt_ids" in data.column_names:
        i = data.column_names.index("prompt_ids")
        return data.set_column(i, pa.field("prompt_ids", prompts.type), prompts)
    return data.append_column("prompt_ids", prompts)


@dataclass(frozen=True)
class Segment:
    """Rows whose contexts extend one another: `rows` in order, each row's context length."""

    rows: list[int]

    def __len__(self) -> int:
        return len(self.rows)


def segments(p: Prompts, rows: Sequence[int] | None = None) -> list[Segment]:
    """Split rows (default all) into segments: a row joins the segment of its parent when it
    extends the parent and the parent is that segment's last row (the first such child claims
    it); otherwise it starts a segment. Rows are taken parents first, in index order.

    A row left out of `rows` (filtered by train) still lies inside later rows' contexts; a kept
    row extending it joins through it (its parent's segment is looked up through the chain).
    Each segment's sequence is `p.context(rows[-1])`; row r's completion sits at
    `[p.prompt_lens[r], p.context_lens[r])` in it."""
    n = len(p)
    ext = p.extends()
    seg_of = np.full(n, -1, np.int64)  # segment index of each row, for every row
    last_of: list[int] = []  # last row (any row) of each segment
    members: list[list[int]] = []
    keep = np.zeros(n, dtype=bool)
    keep[np.asarray(list(range(n)) if rows is None else rows, dtype=np.int64)] = True
    for i in _topological(p):
        par = int(p.parent[i])
        if par >= 0 and ext[i] and last_of[seg_of[par]] == par:
            s = int(seg_of[par])
            last_of[s] = i
        else:
            s = len(last_of)
            last_of.append(i)
            members.append([])
        seg_of[i] = s
        if keep[i]:
            members[s].append(i)
    return [Segment(m) for m in members if m]


def _topological(p: Prompts) -> np.ndarray:
    """Row indices, every parent before its children, otherwise in index order."""
    if np.all(p.parent < np.arange(len(p))):
        return np.arange(len(p))
    depth = np.full(len(p), -1, np.int64)
    for start in range(len(p)):
        path = []
        i = start
        while i >= 0 and depth[i] < 0:
            path.append(i)
            i = int(p.parent[i])
        d = depth[i] if i >= 0 else -1
        for k in reversed(path):
            d += 1
            depth[k] = d
    return np.lexsort((np.arange(len(p)), depth))


def stored_tokens(table: pa.Table) -> int:
    """Token ids a table stores for its prompts and completions (the budget's numerator)."""
    total = 0
    for c in ("prompt_ids", "prompt_added", "completion_ids"):
        if c in table.column_names:
            for ch in table.column(c).chunks:
                o = ch.offsets.to_numpy()
                total += int(o[-1] - o[0]) if len(o) else 0
    return total


def lcp_pairs(
    a_values: np.ndarray,
    a_starts: np.ndarray,
    a_lens: np.ndarray,
    b_values: np.ndarray,
    b_starts: np.ndarray,
    b_lens: np.ndarray,
    c_values: np.ndarray,
    c_starts: np.ndarray,
    c_lens: np.ndarray,
    block: int = 1 << 23,
) -> np.ndarray:
    """Per pair k: the longest common prefix of `a[k]` and `b[k] + c[k]` (a prompt against an
    earlier context: that sample's prompt `b` and completion `c`), every slice given by its
    start and length in a flat values array. `a` is compared with `b` first, and with `c` only
    where it matched all of `b`; each in blocks of about `block` tokens, with one gather per
    side (`slices`) and one comparison: linear in the tokens compared."""
    a_starts, a_lens = np.asarray(a_starts, np.int64), np.asarray(a_lens, np.int64)
    b_lens, c_lens = np.asarray(b_lens, np.int64), np.asarray(c_lens, np.int64)
    out = _first_diff(a_values, a_starts, b_values, np.asarray(b_starts, np.int64), np.minimum(a_lens, b_lens), block)
    rest = np.flatnonzero((out == b_lens) & (a_lens > b_lens))  # all of b matched: go on into c
    if rest.size:
        m = np.minimum(a_lens[rest] - b_lens[rest], c_lens[rest])
        more = _first_diff(
            a_values, a_starts[rest] + b_lens[rest], c_values, np.asarray(c_starts, np.int64)[rest], m, block
        )
        out[rest] += more
    return out


def _first_diff(x_values, x_starts, y_values, y_starts, m, block: int) -> np.ndarray:
    """Per pair k: the first position where `x[k]` and `y[k]` differ within their first m[k]
    tokens, or m[k] where those are equal."""
    out = m.copy()
    ends = np.cumsum(m)
    lo = 0
    while lo < len(m):  # rows [lo, hi): about `block` tokens, at least one row
        base = int(ends[lo - 1]) if lo else 0
        hi = max(int(np.searchsorted(ends, base + block, side="right")), lo + 1)
        rows = np.arange(lo, hi)[m[lo:hi] > 0]
        lo = hi
        if not rows.size:
            continue
        mm = m[rows]
        differ = np.flatnonzero(slices(x_values, x_starts[rows], mm) != slices(y_values, y_starts[rows], mm))
        if differ.size:
            local = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(mm, out=local[1:])
            i = np.searchsorted(differ, local[:-1])  # the first difference at or after each row's start
            pos = differ[np.minimum(i, differ.size - 1)]
            found = (i < differ.size) & (pos < local[1:])
            out[rows[found]] = pos[found] - local[:-1][found]
    return out


def segment_starts(p: Prompts) -> np.ndarray:
    """Per row: it starts a segment (see `segments`), computed without a Python loop.

    A row continues its parent's segment when it extends the parent and is the parent's first
    such child in row order (rows are in an order where parents come first)."""
    ext = p.extends()
    starts = ~ext
    idx = np.flatnonzero(ext)
    if idx.size:
        _, first = np.unique(p.parent[idx], return_index=True)
        claimed = np.zeros(len(p), bool)
        claimed[idx[first]] = True
        starts = starts | (ext & ~claimed)
    return starts


def events_with_full_prompts(events: Sequence[dict]) -> list[dict]:
    """Event dicts (as read from a JSON-lines log) with `prompt_ids` set on every completion.

    For readers that work on events rather than collect's output: a copy of each completion
    event gets its whole prompt, rebuilt exactly from the delta layout (other events pass
    through unchanged). A reference to a sample not among `events` is an InputError."""
    comps, seen = [], set()
    for e in events:  # a re-logged completion (same sample_id): the first one, as collect keeps
        if e.get("type") == "completion" and e.get("sample_id") not in seen:
            seen.add(e.get("sample_id"))
            comps.append(e)
    if not comps:
        return list(events)
    ids = pa.list_(pa.int32())
    table = pa.table(
        {
            "sample_id": pa.array([e.get("sample_id") for e in comps], pa.string()),
            "prompt_ids": pa.array([e.get("prompt_ids") for e in comps], ids),
            "prompt_parent": pa.array([e.get("prompt_parent") for e in comps], pa.string()),
            "prompt_shared": pa.array([e.get("prompt_shared") for e in comps], pa.int32()),
            "prompt_added": pa.array([e.get("prompt_added") for e in comps], ids),
            "completion_ids": pa.array([e.get("completion_ids") for e in comps], ids),
        }
    )
    whole = dict(zip(table.column("sample_id").to_pylist(), full_prompts(table, "<events>").to_pylist(), strict=True))
    return [{**e, "prompt_ids": whole[e.get("sample_id")]} if e.get("type") == "completion" else e for e in events]
