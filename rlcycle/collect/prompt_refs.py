"""collect's prompt step: every completion's prompt stored once, its references checked.

In:  one partition's completions (duplicates already dropped): `sample_id`, `session_id`,
     `ts_ms`, `request_id`, `completion_ids` and the prompt in either layout — `prompt_ids` (the
     whole prompt: logs written before issue 36, OTel spans) or `prompt_parent` /
     `prompt_shared` / `prompt_added` (the gateway and the simulator; rlcycle/prompts.py).
Out: the same rows with the prompt in the delta layout (`prompt_ids` null), rows with a bad
     reference removed and returned as quarantine records, the resolved `Prompts` (train's
     segments and the re-rooting after collect's filters use it), and counts.

Rules (docs/design.md, "Prompts stored once"):
- a given reference must name an earlier sample (by (ts, sample_id)) of the same session in
  this input, and share no more than that sample's context; anything else — a missing or
  later sample, another session's, a shared length outside the context, a cycle (impossible
  once references point back in time) — quarantines the row *and every row whose prompt is
  built on it*: each is counted and named, none is rebuilt from a wrong token.
- a whole prompt (old layout) is stored against the session's previous sample by (ts,
  sample_id): its longest common prefix with that sample's context is the shared part (0: a
  root). Reconstruction is exact whatever the previous sample was; the prefix only decides
  how compact it is. Comparing costs the tokens compared: linear in the input's prompts.
- a retry: sample B re-sends sample A's prompt unchanged (B's parent is A, it shares exactly
  A's prompt and adds nothing) under another `request_id`, and no call ever continues A's
  completion (no row shares more than A's prompt): A is `retried` — the client dropped it and
  the user never saw it. It stays in trajectories (analysts, references) and train leaves it
  out, counted. Without request ids (the simulator) nothing is taken for a retry: n > 1
  choices of one request look the same.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from rlcycle.collect.events import BadRecord
from rlcycle.prompts import Prompts, gather_rows, lcp_pairs, list_parts, segment_starts


def canonical(comp: pl.DataFrame, result: Any, bad: list[BadRecord]) -> tuple[pl.DataFrame, Prompts]:
    """(completions in the delta layout, their resolved prompts); see the module docstring."""
    order = _SessionOrder(comp)
    parent = _parent_index(comp)
    dropped, records = _bad_refs(comp, order, parent)
    bad.extend(records)  # counted and written by collect's quarantine, like a parse error
    if dropped.any():  # rare: index the rows that are left afresh
        comp = comp.filter(pl.Series(~dropped))
        order, parent = _SessionOrder(comp), _parent_index(comp)
    prev = order.prev
    tab = comp.select("prompt_ids", "prompt_added", "completion_ids").to_arrow()
    full_v, full_o, full_ok = list_parts(tab.column("prompt_ids"))
    add_v, add_o, add_ok = list_parts(tab.column("prompt_added"))
    comp_v, comp_o, _ = list_parts(tab.column("completion_ids"))
    full_len, add_len, comp_len = np.diff(full_o), np.diff(add_o), np.diff(comp_o)
    old = full_ok  # the old layout wins where a row carries both
    parent = np.where(old, -1, parent)
    shared = np.where(old | (parent < 0), 0, comp.get_column("prompt_shared").fill_null(0).to_numpy()).astype(np.int64)
    # The rows given as deltas first, old rows as roots holding their whole prompt.
    lens = np.where(old, full_len, np.where(add_ok, add_len, 0))
    starts = np.where(old, full_o[:-1], add_o[:-1])
    p0 = _prompts(parent, shared, (full_v, add_v), old, starts, lens, comp_v, comp_o)
    # Old rows: against the session's previous sample.
    cand = np.flatnonzero(old & (prev >= 0))
    if cand.size:
        simple = p0.parent[prev[cand]] < 0  # the previous one holds its whole prompt itself
        s_rows, s_prev = cand[simple], prev[cand[simple]]
        got = lcp_pairs(
            full_v,
            full_o[s_rows],
            full_len[s_rows],
            p0.added_values,
            p0.added_offsets[s_prev],
            np.diff(p0.added_offsets)[s_prev],
            comp_v,
            comp_o[s_prev],
            comp_len[s_prev],
        )
        shared[s_rows] = got
        for i in cand[~simple]:  # a mixed log: rebuild the previous context (rare)
            ctx = p0.context(int(prev[i]))
            a = full_v[full_o[i] : full_o[i + 1]]
            m = min(len(a), len(ctx))
            diff = np.flatnonzero(a[:m] != ctx[:m])
            shared[i] = int(diff[0]) if diff.size else m
        linked = cand[shared[cand] > 0]
        parent[linked] = prev[linked]
    # Each row's own tokens: an old row's prompt after the shared part, else what it added.
    own_start = np.where(old, full_o[:-1] + shared, add_o[:-1])
    own_len = np.where(old, full_len - shared, np.where(add_ok, add_len, 0))
    p = _prompts(parent, shared, (full_v, add_v), old, own_start, own_len, comp_v, comp_o)
    no_prompt = ~old & ~add_ok  # neither layout: the prompt is unknown (train: no_prompt)
    retried = _retries(comp, p, no_prompt)
    result.prompt_tokens_logged += int(np.where(old, full_len, np.where(add_ok, add_len, 0)).sum())
    # Arrow's take with null indices: only the named ids in the data buffer, whatever the row
    # order (a masked gather would keep every row's text and make the file's bytes order-dependent).
    index = pa.array(parent, mask=parent < 0)
    parent_ids = pl.Series("prompt_parent", comp.get_column("sample_id").to_arrow().take(index))
    large = len(p.added_values) >= 2**31  # list offsets are int32: past that, a large list
    added = (pa.LargeListArray if large else pa.ListArray).from_arrays(
        pa.array(p.added_offsets.astype(np.int64 if large else np.int32)),
        pa.array(p.added_values, pa.int32()),
        mask=pa.array(no_prompt),
    )
    comp = comp.with_columns(
        pl.lit(None, pl.List(pl.Int32)).alias("prompt_ids"),
        parent_ids,
        pl.Series("prompt_shared", shared, pl.Int32),
        pl.Series("prompt_added", pl.from_arrow(added)).cast(pl.List(pl.Int32)),
        pl.Series("retried", retried),
    )
    return comp, p


def reroot(comp: pl.DataFrame, p: Prompts, kept: np.ndarray) -> pl.DataFrame:
    """The kept rows (`kept`: row indices into `p`, in `comp`'s order), with every row whose
    parent was filtered out made a root holding its whole prompt (rebuilt exactly)."""
    keep = np.zeros(len(p), bool)
    keep[kept] = True
    orphans = np.flatnonzero((p.parent[kept] >= 0) & ~keep[np.maximum(p.parent[kept], 0)])
    if not orphans.size:
        return comp
    rows = kept[orphans]
    whole = [p.prompt(int(i)).astype(np.int32) for i in rows]
    lens = np.zeros(comp.height, np.int64)
    lens[orphans] = [len(w) for w in whole]
    offsets = np.zeros(comp.height + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    repl = pl.from_arrow(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(whole), pa.int32())))
    mask = np.zeros(comp.height, bool)
    mask[orphans] = True
    is_orphan = pl.Series(mask)
    return comp.with_columns(
        pl.when(is_orphan).then(repl.cast(pl.List(pl.Int32))).otherwise(pl.col("prompt_added")).alias("prompt_added"),
        pl.Series(  # Arrow's if_else: a compact string buffer (see canonical)
            "prompt_parent",
            pc.if_else(pa.array(mask), pa.scalar(None, pa.string()), comp.get_column("prompt_parent").to_arrow()),
        ),
        pl.when(is_orphan).then(0).otherwise(pl.col("prompt_shared")).cast(pl.Int32).alias("prompt_shared"),
    )


def _prompts(parent, shared, sources, use_first, starts, lens, comp_v, comp_o) -> Prompts:
    values, offsets = gather_rows([(sources[0], None), (sources[1], None)], use_first, starts, lens)
    return Prompts(parent.astype(np.int64), shared.astype(np.int64), values, offsets, comp_v, comp_o)


class _SessionOrder:
    """Rows by (session, ts, sample_id): each row's rank, its session's code, the previous row of
    its session (-1: the first)."""

    def __init__(self, comp: pl.DataFrame):
        n = comp.height
        srt = comp.select(pl.int_range(n, dtype=pl.Int64).alias("_i"), "session_id", "ts_ms", "sample_id").sort(
            "session_id", "ts_ms", "sample_id"
        )
        order = srt.get_column("_i").to_numpy()
        sessions = srt.get_column("session_id")
        same = (sessions == sessions.shift(1)).fill_null(False).to_numpy()
        self.rank = np.empty(n, np.int64)
        self.rank[order] = np.arange(n)
        self.session = np.empty(n, np.int64)
        self.session[order] = np.cumsum(~same)
        self.prev = np.full(n, -1, np.int64)
        if n > 1:
            self.prev[order[1:]] = np.where(same[1:], order[:-1], -1)


def _parent_index(comp: pl.DataFrame) -> np.ndarray:
    """Row index of each row's `prompt_parent` in this frame (-1: none or not found)."""
    n = comp.height
    if comp.get_column("prompt_parent").null_count() == n:  # a log of whole prompts
        return np.full(n, -1, np.int64)
    ids = comp.select("sample_id", pl.int_range(n, dtype=pl.Int64).alias("_p"))
    got = (
        comp.select(pl.int_range(n, dtype=pl.Int64).alias("_i"), "prompt_parent")
        .join(ids, left_on="prompt_parent", right_on="sample_id", how="left")
        .sort("_i")
        .get_column("_p")
    )
    return got.fill_null(-1).to_numpy()


BAD_REFS = (
    "prompt_parent: names no sample of this input",
    "prompt_parent: names a sample of another session",
    "prompt_parent: names a later sample (by ts, sample_id)",
    "prompt_parent: prompt_added is missing",
    "prompt_parent: prompt_shared is missing",
    "prompt_shared: outside the parent's context",
)
INHERITED = "prompt_parent: built on a quarantined sample"


def _bad_refs(comp: pl.DataFrame, order: _SessionOrder, parent: np.ndarray) -> tuple[np.ndarray, list[BadRecord]]:
    """(rows to drop, their quarantine records): a bad reference, and every row built on one
    (see the module docstring)."""
    n = comp.height
    has = (comp.get_column("prompt_ids").is_null() & comp.get_column("prompt_parent").is_not_null()).to_numpy()
    if not has.any():
        return np.zeros(n, bool), []
    parent = np.where(has, parent, -1)
    par = np.maximum(parent, 0)
    given = parent >= 0
    plen = np.where(
        comp.get_column("prompt_ids").is_not_null().to_numpy(),
        comp.get_column("prompt_ids").list.len().fill_null(0).to_numpy(),
        comp.get_column("prompt_shared").fill_null(0).to_numpy()
        + comp.get_column("prompt_added").list.len().fill_null(0).to_numpy(),
    )
    ctx = plen + comp.get_column("completion_ids").list.len().fill_null(0).to_numpy()
    shared = comp.get_column("prompt_shared").fill_null(0).to_numpy()
    checks = [  # in BAD_REFS order: the first that applies names the reason
        has & ~given,
        has & given & (order.session[par] != order.session),
        has & given & (order.rank[par] >= order.rank),
        has & comp.get_column("prompt_added").is_null().to_numpy(),
        has & comp.get_column("prompt_shared").is_null().to_numpy(),
        has & given & ((shared < 0) | (shared > ctx[par])),
    ]
    reason = np.select(checks, np.arange(len(checks)), -1)
    bad = reason >= 0
    if not bad.any():
        return bad, []
    # Every row built on a bad one is bad too: pointer jumping, log(depth) vectorised steps.
    up = parent.copy()
    inherited = bad.copy()
    while True:
        step = inherited | np.where(up >= 0, inherited[np.maximum(up, 0)], False)
        nxt = np.where(up >= 0, up[np.maximum(up, 0)], -1)
        if np.array_equal(step, inherited) and np.array_equal(nxt, up):
            break
        inherited, up = step, nxt
    ids = comp.get_column("sample_id").to_numpy()
    sessions = comp.get_column("session_id").to_numpy()
    parents = comp.get_column("prompt_parent").to_numpy()
    raw_shared = comp.get_column("prompt_shared").to_list()
    files, lines = comp.get_column("_file").to_list(), comp.get_column("_line").to_list()
    records = []
    for i in np.flatnonzero(inherited):
        why = BAD_REFS[reason[i]] if bad[i] else INHERITED
        detail = f"{why} (completion {ids[i]!r} of session {sessions[i]!r}, prompt_parent {parents[i]!r})"
        record = {
            "sample_id": ids[i],
            "session_id": sessions[i],
            "prompt_parent": parents[i],
            "prompt_shared": raw_shared[i],
        }
        records.append(BadRecord(files[i], lines[i], detail, json.dumps(record)))
    return inherited, records


def _retries(comp: pl.DataFrame, p: Prompts, no_prompt: np.ndarray) -> np.ndarray:
    """Per row: a retry's orphan (see the module docstring)."""
    n = len(p)
    out = np.zeros(n, bool)
    has = (p.parent >= 0) & ~no_prompt
    if not has.any():
        return out
    req = comp.get_column("request_id").to_numpy()
    child = np.flatnonzero(has)
    par = p.parent[child]
    plen = p.prompt_lens
    added = np.diff(p.added_offsets)
    same = (p.shared[child] == plen[par]) & (added[child] == 0)
    c, a = req[child[same]], req[par[same]]
    other_request = (c != None) & (a != None) & (c != a)  # noqa: E711
    resent = child[same][other_request.astype(bool)]
    continued = np.zeros(n, bool)
    continued[par[p.shared[child] > plen[par]]] = True
    orphans = p.parent[resent]
    out[orphans[~continued[orphans]]] = True
    return out


def count_stored(comp: pl.DataFrame, p: Prompts, result: Any) -> None:
    """Counts of the rows written: prompt ids stored vs whole, segments, sessions, retries."""
    kept = comp.get_column("_row").to_numpy()
    keep = np.zeros(len(p), bool)
    keep[kept] = True
    known = comp.get_column("prompt_added").is_not_null().to_numpy()
    result.prompt_tokens_stored += int(comp.get_column("prompt_added").list.len().fill_null(0).sum())
    result.prompt_tokens_full += int(p.prompt_lens[kept][known].sum())
    starts = segment_starts(p) | (p.parent < 0) | ~keep[np.maximum(p.parent, 0)]
    result.segments += int(starts[kept].sum())
    result.sessions_out += comp.get_column("session_id").n_unique()
    per_session = (
        pl.DataFrame({"s": comp.get_column("session_id"), "start": starts[kept]})
        .group_by("s")
        .agg(pl.col("start").sum())
    )
    if per_session.height:
        result.segments_per_session_max = max(result.segments_per_session_max, int(per_session["start"].max()))
    result.retried += int(comp.get_column("retried").sum())
