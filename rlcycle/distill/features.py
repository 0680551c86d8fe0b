"""Features: the per-sample and per-episode facts the signals, groups and monitors read.

In:  the trajectories table (memory-mapped Arrow; only the scalar columns, the tool-call
     names/statuses and, for one sample per episode, the prompt ids are touched).
Out: `Features.samples`, one row per sample in input order, and `Features.episodes`, one row
     per episode indexed by `_ep` (0..E-1), which each sample carries.

Episodes are found by `episode_id`. Collect writes each episode's samples next to each other
in turn order, so the episode index is a run-length id and every per-episode aggregate is one
numpy `reduceat` over contiguous segments (no hashing, no sorting). Input laid out otherwise
gets a dense rank and one stable sort by (episode, turn) first, with the same result.

What an episode is, for the reward (documented in docs/distill.md):
- `asked`: one of its samples called a clarifying tool (`clarify_tools`, status ok or unknown);
- `edited`: one of its samples made an ok edit call (`edit_tools`);
- `persist`: lines surviving / lines proposed over all its edit outcomes (null: none arrived);
- `score`: its follow-up's score (rlcycle/distill/followup.py), null without a follow-up;
- `success`: some evidence that it went well and none that it went badly:
      good  satisfied follow-up, feedback > 0, tests passed, persist >= success_persistence
      bad   dissatisfied follow-up, feedback < 0, tests failed, persist < success_persistence
  (after a clarifying question the follow-up is an answer, not a verdict, so it is not used);
- `next_success`: the next episode of the same session (by start time) succeeded — for a
  clarifying question, that is the episode the user's answer started;
- `clear`: for an episode that asked, the task was clear already: the answer says so
  (`clear_phrases`, e.g. "as I said") or, with `clear_if_peers_succeeded`, another episode
  with the same turn-0 prompt succeeded without asking.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from rlcycle import prompts
from rlcycle.distill import followup
from rlcycle.distill.spec import RewardSpec, resolve_callable

C = pl.col
PROMPT_SEED = 0x5EED
_NUMERIC = [
    "turn",
    "ts",
    "n_invalid_tool_calls",
    "n_tool_errors",
    "edit_lines_proposed",
    "edit_lines_surviving",
    "feedback",
    "latency_ms",
    "is_final_turn",
]


@dataclass
class Features:
    samples: pl.DataFrame
    episodes: pl.DataFrame
    versions: list[str]  # policy versions; samples `_v` / episodes `_v` index this list
    notes: list[str] = field(default_factory=list)  # e.g. an optional column that is absent


def build(table: pa.Table, spec: RewardSpec, config) -> Features:
    """The feature frames of `table` (see the module docstring)."""
    notes: list[str] = []
    tests_col = spec.params_of("correctness").get("column", "tests_passed")
    if spec.get("correctness") is not None and tests_col not in table.column_names:
        notes.append(f"correctness: no {tests_col!r} column in the input, the signal is null everywhere")
    s, versions = _samples(table, config, tests_col)
    seg = Segments(s.get_column("_ep").to_numpy(), s.get_column("turn").fill_null(0).to_numpy())
    if s.get_column("is_final").null_count():  # the last turn of its episode
        last = np.zeros(s.height, dtype=bool)
        last[seg.last_rows()] = True
        s = s.with_columns(C("is_final").fill_null(pl.Series(last)))
    e = _episodes(s, seg, table, config)
    fp = spec.params_of("dissatisfied_followup")
    hook = resolve_callable(fp["classifier"]) if fp["classifier"] else None
    score = followup.score_texts(
        e.get_column("followup"), hook, fp["phrases"], fp["satisfied_phrases"], fp["negations"]
    )
    e = _success(e.with_columns(score=score), config.success_persistence)
    e = _next_success(e)
    e = _clarification_facts(e, spec.params_of("clarification"))
    s = s.with_columns(ep_failed=e.get_column("failed").gather(s.get_column("_ep")))  # for the monitors
    return Features(s, e, versions, notes)


def _samples(table: pa.Table, config, tests_col: str) -> tuple[pl.DataFrame, list[str]]:
    """One row per sample: numeric columns (zero-copy from Arrow) and derived flags."""
    s = pl.from_arrow(table.select(_NUMERIC))
    assert isinstance(s, pl.DataFrame)
    # Invalid / failed calls are counted again only where collect's counts are missing.
    recount = any(table.column(c).null_count for c in ("n_invalid_tool_calls", "n_tool_errors"))
    with ThreadPoolExecutor(1) as pool:  # the tool calls (Arrow, no GIL) beside the episode ids
        pending = pool.submit(
            _tool_call_counts, table.column("tool_calls"), config.edit_tools, config.clarify_tools, recount
        )
        episode = episode_codes(table.column("episode_id"))
        # One dictionary for all record batches: the indices are version codes.
        versions = pc.dictionary_encode(table.column("policy_version"))
        calls = pending.result()
    scope = pc.fill_null(pc.equal(table.column("feedback_scope"), "sample"), False)
    tests = pl.Series(table.column(tests_col)).cast(pl.Boolean) if tests_col in table.column_names else None
    s = s.select(
        "turn",
        "ts",
        "feedback",
        "latency_ms",
        _ep=episode,
        _v=pl.Series(pa.chunked_array([c.indices for c in versions.chunks], pa.int32())).cast(pl.Int32),
        n_invalid=C("n_invalid_tool_calls").fill_null(pl.Series(calls["invalid"])),
        n_errors=C("n_tool_errors").fill_null(pl.Series(calls["errors"])),
        proposed=C("edit_lines_proposed"),
        surviving=C("edit_lines_surviving"),
        n_tokens=pl.Series(_list_lengths(table.column("completion_ids"))),
        fb_sample=pl.Series(scope.to_numpy()),
        asked=pl.Series(calls["asked"] > 0),
        edited=pl.Series(calls["edited"] > 0),
        tests=tests if tests is not None else pl.lit(None, pl.Boolean),
        is_final=C("is_final_turn"),
    )
    return s, versions.chunks[-1].dictionary.to_pylist() if versions.num_chunks else []


def _list_lengths(col: pa.ChunkedArray) -> np.ndarray:
    """Lengths of a list column from its offsets alone (a null list spans no values: 0)."""
    parts = [np.diff(chunk.offsets.to_numpy()).astype(np.int32, copy=False) for chunk in col.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def dense_codes(values: pl.Series) -> pl.Series:
    """0..K-1 per distinct value: a run-length id when equal values are adjacent, else a rank.

    The run-length id is right only if no value comes back after another one. Checked
    cheaply: the first value of every run must be distinct (compared through a 64-bit hash;
    a collision only sends us to the slower rank, never to a wrong answer).
    """
    runs = values.rle_id()
    starts = values.filter(runs != runs.shift(1, fill_value=-1))
    if starts.hash(seed=1).n_unique() == starts.len():
        return runs.cast(pl.UInt32)
    return (values.rank("dense") - 1).cast(pl.UInt32)


def episode_codes(col: pa.ChunkedArray) -> pl.Series:
    """`dense_codes` of the (non-null) episode ids, straight from Arrow: only the first id of
    each run is copied out, and the whole column only if episodes are not contiguous."""
    n = len(col)
    if n < 2:
        return pl.Series(np.zeros(n, np.uint32))
    new = np.r_[True, pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)]
    firsts = pl.Series(take(col, np.flatnonzero(new)))
    if firsts.hash(seed=1).n_unique() == firsts.len():
        return pl.Series(np.cumsum(new, dtype=np.uint32) - 1)
    return dense_codes(pl.Series(col))


def _tool_call_counts(col: pa.ChunkedArray, edit_tools, clarify_tools, recount: bool) -> dict[str, np.ndarray]:
    """Per sample: clarifying calls, ok edit calls and (with `recount`) invalid and failed calls."""
    out: dict[str, list[np.ndarray]] = {"asked": [], "edited": [], "invalid": [], "errors": []}
    for chunk in col.chunks:
        offsets = chunk.offsets.to_numpy()
        flat = chunk.flatten()  # every call of the chunk: positions offsets[i] - offsets[0] on
        name, status = pc.struct_field(flat, "name"), pc.struct_field(flat, "status")
        ok = pc.fill_null(pc.equal(status, "ok"), False)
        masks = {
            # A question whose result was never logged still asked; a broken one did not.
            "asked": pc.and_(_one_of(name, clarify_tools), pc.or_(ok, pc.is_null(status))),
            "edited": pc.and_(_one_of(name, edit_tools), ok),
        }
        if recount:
            masks["invalid"] = pc.equal(status, "invalid")
            masks["errors"] = _one_of(status, ["error", "timeout"])
        for key, mask in masks.items():
            # Calls per sample from a running count: sample i owns calls offsets[i]..offsets[i+1].
            running = np.r_[0, np.cumsum(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=np.int32)]
            start = offsets - offsets[0]
            out[key].append((running[start[1:]] - running[start[:-1]]).astype(np.int32))
    n = len(col)
    return {k: (np.concatenate(v) if v else np.zeros(n, np.int32)) for k, v in out.items()}


def _one_of(values: pa.Array, names) -> pa.Array:
    """values in names: a few string comparisons (cheaper than a hash lookup for short lists)."""
    if not names:
        return pa.array(np.zeros(len(values), dtype=bool))
    if len(names) > 4:
        return pc.is_in(values, pa.array(list(names), pa.string()))
    mask = pc.equal(values, names[0])
    for name in names[1:]:
        mask = pc.or_(mask, pc.equal(values, name))
    return mask


# --- episodes ----------------------------------------------------------------------------------


class Segments:
    """Rows grouped by a dense code 0..K-1, as contiguous segments of a row order.

    `order` lists the rows by (code, turn): None (the identity, nothing copied) for collect's
    layout, else one stable sort. Segment k holds code k, its rows in turn order; aggregates
    are numpy reduceat calls over the segment starts.
    """

    def __init__(self, code: np.ndarray, turn: np.ndarray):
        n = code.size
        up, same = code[1:] > code[:-1], code[1:] == code[:-1]
        in_order = n < 2 or bool(np.all(up | (same & (turn[1:] >= turn[:-1]))))
        self.order = None if in_order else np.lexsort((turn, code))
        sorted_code = code if self.order is None else code[self.order]
        self.starts = np.flatnonzero(np.r_[True, sorted_code[1:] != sorted_code[:-1]]) if n else np.zeros(0, np.int64)
        self.ends = np.r_[self.starts[1:], n].astype(np.int64)  # one past each segment's last row
        self.n = n

    def in_order(self, x: np.ndarray) -> np.ndarray:
        """A per-row array rearranged into segment order."""
        return x if self.order is None else x[self.order]

    def rows_at(self, positions: np.ndarray) -> np.ndarray:
        """The rows at positions of the segment order."""
        return positions if self.order is None else self.order[positions]

    def first_rows(self) -> np.ndarray:
        return self.rows_at(self.starts)

    def last_rows(self) -> np.ndarray:
        return self.rows_at(self.ends - 1)

    def sum(self, x: np.ndarray, dtype=None) -> np.ndarray:
        return np.add.reduceat(self.in_order(x), self.starts, dtype=dtype) if self.n else np.zeros(0)

    def min(self, x: np.ndarray) -> np.ndarray:
        return np.minimum.reduceat(self.in_order(x), self.starts) if self.n else np.zeros(0)

    def count(self) -> np.ndarray:
        return self.ends - self.starts

    def nanmin(self, x: np.ndarray) -> np.ndarray:  # NaN only where the whole segment is NaN
        return np.fmin.reduceat(self.in_order(x), self.starts) if self.n else np.zeros(0)

    def nanmax(self, x: np.ndarray) -> np.ndarray:
        return np.fmax.reduceat(self.in_order(x), self.starts) if self.n else np.zeros(0)

    def first_valid(self, valid: np.ndarray) -> np.ndarray:
        """The first row (in turn order) of each segment where `valid`, or -1 where none is."""
        hits = np.flatnonzero(self.in_order(valid))  # positions, ascending
        i = np.searchsorted(hits, self.starts)  # the first hit at or after each start
        pos = hits[np.minimum(i, hits.size - 1)] if hits.size else np.zeros(self.starts.size, np.int64)
        found = (i < hits.size) & (pos < self.ends)
        return np.where(found, self.rows_at(pos), -1)

    def last_valid(self, valid: np.ndarray) -> np.ndarray:
        hits = np.flatnonzero(self.in_order(valid))
        i = np.searchsorted(hits, self.ends) - 1  # the last hit before each segment's end
        pos = hits[np.maximum(i, 0)] if hits.size else np.zeros(self.starts.size, np.int64)
        found = (i >= 0) & (pos >= self.starts)
        return np.where(found, self.rows_at(pos), -1)


def _np(s: pl.DataFrame, name: str, fill) -> np.ndarray:
    """A column as numpy in its own dtype (timestamps as epoch ms), nulls replaced by `fill`."""
    col = s.get_column(name).to_physical()
    return (col.fill_null(fill) if col.null_count() else col).to_numpy()


def _take(table: pa.Table, column: str, rows: np.ndarray) -> pl.Series:
    """Values of `column` at `rows` (-1: null), copying only those values out of the map."""
    return pl.Series(take(table.column(column), rows))


def take(col: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """`col` at `rows` (-1: null). Rows in ascending order (collect's layout: one row per
    episode, in episode order) are taken record batch by record batch, nothing else copied;
    any other order takes from one contiguous copy of the column."""
    safe = np.maximum(rows, 0)
    steady = np.maximum.accumulate(safe) if rows.size else safe  # -1s take their neighbour
    missing = rows < 0
    if not np.array_equal(steady[~missing], safe[~missing]):  # not ascending
        return col.combine_chunks().take(pa.array(safe, mask=missing))
    parts, base = [], 0
    for chunk in col.chunks:
        lo, hi = np.searchsorted(steady, [base, base + len(chunk)])
        parts.append(chunk.take(pa.array(steady[lo:hi] - base)))
        base += len(chunk)
    values = pa.concat_arrays(parts) if parts else pa.array([], col.type)
    return pc.if_else(pa.array(missing), pa.nulls(len(values), col.type), values) if missing.any() else values


def _episodes(s: pl.DataFrame, seg: Segments, table: pa.Table, config) -> pl.DataFrame:
    first = seg.first_rows()  # the earliest turn: its prompt is the episode's prompt
    with ThreadPoolExecutor(1) as pool:  # hashing the prompts overlaps the other aggregates
        prompt = pool.submit(_prompt_hash, table, first)
        e = _episode_facts(s, seg, table, first)
        e = e.with_columns(prompt.result())
    for col in config.group_keys:  # group-key columns: the first non-null value of the episode
        if col not in ("prompt", "batch"):
            rows = seg.first_valid(pc.is_valid(table.column(col)).to_numpy(zero_copy_only=False))
            e = e.with_columns(_take(table, col, rows).cast(pl.String).alias(col))
    return e


def _episode_facts(s: pl.DataFrame, seg: Segments, table: pa.Table, first: np.ndarray) -> pl.DataFrame:
    feedback = _np(s, "feedback", float("nan"))
    fu_row = seg.first_valid(pc.is_valid(table.column("followup_text")).to_numpy(zero_copy_only=False))
    e = pl.DataFrame(
        {
            "_ep": np.arange(first.size, dtype=np.uint32),
            "_v": s.get_column("_v").gather(first),
            "session_id": _take(table, "session_id", first),
            "start": seg.min(_np(s, "ts", 0)),
            "n_samples": seg.count(),
            "asked": seg.sum(s.get_column("asked").to_numpy()) > 0,
            "edited": seg.sum(s.get_column("edited").to_numpy()) > 0,
            "n_outcomes": seg.sum(s.get_column("proposed").is_not_null().to_numpy()),
            "lines_proposed": seg.sum(_np(s, "proposed", 0), dtype=np.int64),
            "lines_surviving": seg.sum(_np(s, "surviving", 0), dtype=np.int64),
            "fb_min": seg.nanmin(feedback),
            "fb_max": seg.nanmax(feedback),
            "followup": _take(table, "followup_text", fu_row),
            # For the monitors (rlcycle/online.py's episode facts): timed calls, their latency,
            # invalid calls and completion tokens.
            "timed": seg.sum(s.get_column("latency_ms").is_not_null().to_numpy(), dtype=np.float64),
            "latency": seg.sum(_np(s, "latency_ms", 0), dtype=np.float64),
            "invalid": seg.sum(_np(s, "n_invalid", 0), dtype=np.float64),
            "tokens": seg.sum(s.get_column("n_tokens").to_numpy(), dtype=np.float64),
        }
    ).with_columns(C("fb_min", "fb_max").fill_nan(None))
    tests_passed = pl.repeat(None, first.size, dtype=pl.Boolean, eager=True).alias("tests_passed")
    tests = s.get_column("tests")
    if tests.null_count() < s.height:  # the optional correctness column: its last value by turn
        last = seg.last_valid(tests.is_not_null().to_numpy())
        tests_passed = tests.gather(np.maximum(last, 0)).set(pl.Series(last < 0), None).alias("tests_passed")
    return e.with_columns(tests_passed)


def _prompt_hash(table: pa.Table, rows: np.ndarray) -> pl.Series:
    """A 64-bit hash of the prompt ids at each of `rows` (null for a missing or empty prompt).

    Only the selected prompts are copied out of the memory map, record batch by record batch,
    and each batch's copy is dropped once hashed (a contiguous copy of every prompt would
    cost more than the hash). The hash is polars' (fixed seed): equal prompts always share a
    key; the key's digits may change with the polars version. In the delta layout
    (rlcycle/prompts.py) a root's prompt is its `prompt_added`; a prompt stored against an
    earlier sample is rebuilt exactly first (one per such row: the first turns of a session's
    later episodes), so equal prompts hash equal whatever layout stored them.
    """
    if not prompts.has_delta(table):
        return _hash_lists(table.column("prompt_ids"), rows)
    h = _hash_lists(table.column("prompt_added"), rows)
    parent = table.column("prompt_parent").take(pa.array(rows)).is_valid().to_numpy(zero_copy_only=False)
    full = table.column("prompt_ids").take(pa.array(rows)).is_valid().to_numpy(zero_copy_only=False)
    if full.any():
        h = h.scatter(np.flatnonzero(full), _hash_lists(table.column("prompt_ids"), rows[full]))
    rebuild = parent & ~full
    if rebuild.any():
        p = prompts.from_table(table.select(["sample_id", "prompt_ids", *prompts.DELTA_COLUMNS, "completion_ids"]))
        rebuilt = pa.array([p.prompt(int(i)) for i in rows[rebuild]], pa.list_(pa.int32()))
        h = h.scatter(np.flatnonzero(rebuild), _hash_lists(pa.chunked_array([rebuilt]), np.arange(len(rebuilt))))
    return h


def _hash_lists(column: pa.ChunkedArray, rows: np.ndarray) -> pl.Series:
    perm = np.argsort(rows, kind="stable")  # batch by batch, then back in the order asked
    ordered, hashes, base = rows[perm], [], 0
    for chunk in column.chunks:
        lo, hi = np.searchsorted(ordered, [base, base + len(chunk)])
        local, base = ordered[lo:hi] - base, base + len(chunk)
        if local.size:
            lists = pl.Series(chunk.take(pa.array(local))).cast(pl.List(pl.Int32))
            empty = lists.is_null() | (lists.list.len() == 0)
            hashes.append(lists.hash(seed=PROMPT_SEED).set(empty, None))
    h = pl.concat(hashes) if hashes else pl.Series([], dtype=pl.UInt64)
    return h.gather(np.argsort(perm)).alias("prompt")


def _success(e: pl.DataFrame, min_persist: float) -> pl.DataFrame:
    # Persistence over all the episode's edits that have an outcome.
    persist = pl.when((C("n_outcomes") > 0) & (C("lines_proposed") > 0)).then(
        C("lines_surviving") / C("lines_proposed")
    )
    e = e.with_columns(persist=persist)
    # The follow-up is evidence about the work only when the episode did not end in a question.
    score = pl.when(~C("asked")).then(C("score"))
    bad = [score < 0, C("fb_min") < 0, C("tests_passed") == False, C("persist") < min_persist]  # noqa: E712
    good = [score > 0, C("fb_max") > 0, C("tests_passed") == True, C("persist") >= min_persist]  # noqa: E712
    failed = pl.any_horizontal(x.fill_null(False) for x in bad)
    success = pl.any_horizontal(x.fill_null(False) for x in good) & ~failed
    return e.with_columns(failed=failed, success=success, answered=C("followup").is_not_null())


def _next_success(e: pl.DataFrame) -> pl.DataFrame:
    """Whether the next episode of the same session (by start time) succeeded."""
    # A sample logged without a session is a session of its own.
    sessions = e.get_column("session_id")
    if sessions.null_count():
        sessions = e.select(C("session_id").fill_null(pl.lit("\x00") + C("_ep").cast(pl.String))).to_series()
    ses = dense_codes(sessions).to_numpy()
    start = e.get_column("start").to_numpy()
    seg = Segments(ses, start)  # episodes by (session, start): identity for collect's layout
    ses_sorted, succ_sorted = seg.in_order(ses), seg.in_order(e.get_column("success").to_numpy())
    # The next episode in that order belongs to the same session, and it succeeded.
    nxt_sorted = np.r_[(ses_sorted[1:] == ses_sorted[:-1]) & succ_sorted[1:], False]
    nxt = np.zeros(e.height, dtype=bool)
    nxt[seg.rows_at(np.arange(e.height))] = nxt_sorted
    return e.with_columns(next_success=pl.Series(nxt))


def _clarification_facts(e: pl.DataFrame, p: dict) -> pl.DataFrame:
    # Each policy version's clarification rate; the share of its questions above the target is
    # what `over_target` charges each of them: max(0, (rate - target) / rate).
    rate = C("asked").cast(pl.Float64).mean().over("_v")
    excess = pl.when(rate > p["target_rate"]).then((rate - p["target_rate"]) / rate).otherwise(0.0)
    e = e.with_columns(clar_excess=excess)
    # Whether the task was clear, decided only for the (few) episodes that asked.
    asked = e.filter(C("asked")).select("_ep", "prompt", "followup", "answered")
    clear = C("answered") & followup.matches_any(C("followup"), p["clear_phrases"]).fill_null(False)
    if p["clear_if_peers_succeeded"]:
        # Same turn-0 prompt, solved by another episode that did not ask: it was clear enough.
        solved = e.filter(C("success") & ~C("asked") & C("prompt").is_not_null()).get_column("prompt")
        clear = clear | C("prompt").is_in(solved.unique().implode()).fill_null(False)
    ids = asked.filter(clear).get_column("_ep").to_numpy()
    flags = np.zeros(e.height, dtype=bool)
    flags[ids] = True
    return e.with_columns(clear=pl.Series(flags))
