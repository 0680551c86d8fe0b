"""The join at the heart of collect: one partition of events in, its trajectories out.

In:  a polars DataFrame of valid events of some sessions (every event of each of their
     episodes), with the columns in `READ`, ts as epoch ms in `ts_ms`.
Out: one row per completion (sample) in the `trajectories` column layout, counts added to the
     `CollectResult`. Rules are documented in rlcycle/collect/stage.py; nothing here depends on the
     order events arrived in (every "latest" and "first" is by (ts, event_id)).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from rlcycle.collect import prompt_refs, redact

_CALL_FIELDS = ["call_id", "name", "arguments", "status"]
# A completion's token lists (after prompt_refs.canonical): the bulk of a partition's bytes.
_LISTS = ["prompt_ids", "prompt_added", "completion_ids", "behavior_logprobs"]
# The partition key (rlcycle.collect.Partitioner) and the first sort key of the output.
SESSION_HASH = pl.col("session_id").hash(seed=7)


def join_partition(events, config, as_of_ms, since_ms, until_ms, patterns, result, bad=None) -> pl.DataFrame:
    # One pass over the events (their token lists are the bulk): the repeats of an event id
    # are split off with the types, into a group of their own that nothing reads.
    first = _first_rows(events, "event_id")
    if first is not None:
        result.duplicates += int((~first).sum())
    by_type = _by_type(events, first)

    comp = _completions(by_type["completion"], result)
    if comp.height:
        comp, prompts = prompt_refs.canonical(comp, result, [] if bad is None else bad)
    if comp.height == 0:
        _count_orphans(by_type, comp, result)
        return comp
    comp = comp.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("_row"))
    # The token lists stay aside until the rows and their order are final: every join, filter
    # and sort below would copy them (a left join gathers every column of its left side), so
    # they are gathered once, by `_row`, in the output order.
    lists = comp.select(_LISTS)
    comp = comp.drop(_LISTS)
    calls, per_sample = _tool_calls(comp, by_type["tool_result"], by_type["edit_outcome"], config, patterns, result)
    comp = comp.drop("tool_calls").join(per_sample, on="sample_id", how="left")
    comp = _episode_signals(comp, by_type["user_message"], by_type["feedback"], patterns, result)
    _count_orphans(by_type, comp, result)
    comp = _mature_and_filter(comp, config, as_of_ms, since_ms, until_ms, result)
    comp = _in_output_order(comp)
    comp = comp.hstack(lists[comp.get_column("_row")].get_columns())
    comp = prompt_refs.reroot(comp, prompts, comp.get_column("_row").to_numpy())
    prompt_refs.count_stored(comp, prompts, result)
    return _finish(comp)


# A completion as the join takes it: its columns, typed and named for trajectories.
_COMPLETION = [
    pl.col("sample_id"),
    pl.col("episode_id"),
    pl.col("session_id"),
    pl.col("turn").cast(pl.Int32),
    pl.col("policy_version"),
    pl.col("ts_ms"),
    pl.col("prompt_ids").cast(pl.List(pl.Int32)),
    pl.col("prompt_parent"),
    pl.col("prompt_shared").cast(pl.Int32),
    pl.col("prompt_added").cast(pl.List(pl.Int32)),
    pl.col("request_id"),
    pl.col("completion_ids").cast(pl.List(pl.Int32)),
    pl.col("completion_logprobs").cast(pl.List(pl.Float32)).alias("behavior_logprobs"),
    pl.col("tool_calls"),
    pl.col("latency_ms"),
    pl.col("temperature").cast(pl.Float32),
    pl.col("max_new_tokens").cast(pl.Int32),
    pl.col("greedy").cast(pl.Boolean),
    pl.col("top_p").cast(pl.Float32),
    pl.col("pair_key"),
    pl.col("_file"),
    pl.col("_line"),
]
# What the join reads of each type of event.
_TYPE_COLUMNS = {
    "completion": [name for e in _COMPLETION for name in e.meta.root_names()],
    "tool_result": ["event_id", "ts_ms", "sample_id", "call_id", "status"],
    "edit_outcome": ["event_id", "ts_ms", "sample_id", "call_id", "lines_proposed", "lines_surviving"],
    "user_message": ["event_id", "ts_ms", "episode_id", "text"],
    "feedback": ["event_id", "ts_ms", "sample_id", "episode_id", "value", "kind"],
}


# Every column the join reads: what collect's pass 1 keeps of each event (partitions.KEEP).
READ = list(dict.fromkeys(["event_id", "type", *(c for cols in _TYPE_COLUMNS.values() for c in cols)]))


def _by_type(events: pl.DataFrame, first: pl.Series | None) -> dict[str, pl.DataFrame]:
    """The first copy of each event, by type, with the columns the join reads of that type.
    Filtered column by column (a partition_by gathered every column of every type: 38-45
    against 18-28 ms a partition, docs/performance.md); the completions, which hold the token lists, are
    then made contiguous once (a partition holds one chunk per parsed block), as the prompt
    step and the final gather want them."""
    types = events.get_column("type")
    out = {}
    for etype, columns in _TYPE_COLUMNS.items():
        mask = types == etype if first is None else (types == etype) & first
        out[etype] = events[columns].filter(mask)
    out["completion"] = out["completion"].rechunk()
    return out


def _completions(df: pl.DataFrame, result) -> pl.DataFrame:
    comp = df.select(_COMPLETION)
    n = comp.height
    # Two completion events for one sample_id (distinct event ids) is a logging bug upstream:
    # keep the earliest, count the rest.
    comp = _first_of_each(comp, "sample_id")
    result.duplicate_samples += n - comp.height
    return comp


def _first_of_each(df: pl.DataFrame, key: str) -> pl.DataFrame:
    """One row per `key`: the earliest by (ts, key), whatever order the rows arrived in."""
    first = _first_rows(df, key)
    return df if first is None else df.filter(first)


def _first_rows(df: pl.DataFrame, key: str) -> pl.Series | None:
    """Which rows `_first_of_each` keeps, or None when no key repeats (then all of them).

    Duplicates are rare, so the common case costs one hash pass; when there are some, only the
    rows whose key repeats are sorted, (key, ts, row) of them — never the token-id lists.
    """
    repeated = df.get_column(key).is_duplicated()
    if not repeated.any():
        return None
    rows = pl.int_range(pl.len(), dtype=pl.UInt32).alias("_i")
    first = (
        df.select(rows, key, "ts_ms")
        .filter(repeated)
        .sort(key, "ts_ms", "_i")
        .unique(key, keep="first", maintain_order=True)
        .get_column("_i")
    )
    return ~repeated.scatter(first, False)


def _tool_calls(comp, results, outcomes, config, patterns, result):
    """Join tool calls with their results and edit outcomes; aggregate per sample."""
    listed = (
        comp.select("sample_id", "tool_calls")
        .with_columns(pl.col("tool_calls").fill_null([]))
        .explode("tool_calls")
        .drop_nulls("tool_calls")
        .unnest("tool_calls")
    )
    listed = listed.with_columns(_positions(listed.get_column("sample_id")).alias("pos"))
    latest = (
        results.sort("ts_ms", "event_id")
        .unique(["sample_id", "call_id"], keep="last", maintain_order=True)
        .select("sample_id", "call_id", "status", pl.col("ts_ms").alias("result_ts"))
        .join(comp.select("sample_id"), on="sample_id", how="semi")
    )
    calls = listed.join(latest, on=["sample_id", "call_id"], how="full", coalesce=True)
    # Results for calls the completion did not list are kept, after the listed ones.
    if calls.get_column("pos").null_count():
        calls = calls.with_columns(
            pl.col("pos").fill_null(1_000_000 + pl.col("result_ts").rank("ordinal").over("sample_id"))
        )
    if patterns:
        calls = redact.redact_column(calls, "arguments", patterns, result.redactions)
    edits = (
        outcomes.sort("ts_ms", "event_id")
        .unique(["sample_id", "call_id"], keep="last", maintain_order=True)
        .select("sample_id", "call_id", "lines_proposed", "lines_surviving")
    )
    calls = calls.join(edits, on=["sample_id", "call_id"], how="left")
    is_edit = pl.col("name").is_in(config.edit_tools) & (pl.col("status") == "ok")
    # Sorted by position alone: polars keeps the rows' order within each group, and the groups'
    # order is not read (per_sample is joined on sample_id).
    per_sample = (
        calls.sort("pos")
        .group_by("sample_id")
        .agg(
            pl.struct(_CALL_FIELDS).alias("tool_calls"),
            (pl.col("status") == "invalid").sum().cast(pl.Int32).alias("n_invalid_tool_calls"),
            pl.col("status").is_in(["error", "timeout"]).sum().cast(pl.Int32).alias("n_tool_errors"),
            pl.col("lines_proposed").sum().cast(pl.Int32).alias("edit_lines_proposed"),
            pl.col("lines_surviving").sum().cast(pl.Int32).alias("edit_lines_surviving"),
            pl.col("lines_proposed").is_not_null().any().alias("_has_outcome"),
            (is_edit & pl.col("lines_proposed").is_null()).sum().cast(pl.Int32).alias("edit_outcomes_missing"),
        )
        .with_columns(
            # No outcome at all: the edit columns are null (unknown), not 0.
            pl.when(pl.col("_has_outcome")).then(pl.col(c)).alias(c)
            for c in ("edit_lines_proposed", "edit_lines_surviving")
        )
        .drop("_has_outcome")
    )
    return calls, per_sample


def _positions(keys: pl.Series) -> pl.Series:
    """0, 1, 2, ... within each run of equal adjacent keys: a call's position in its sample's
    list, the sample ids being unique and each one's calls adjacent after the explode (the
    same as `int_range(len).over(key)` without hashing the keys)."""
    n = keys.len()
    if not n:
        return pl.Series([], dtype=pl.Int64)
    starts = np.flatnonzero(np.r_[True, (keys.slice(1) != keys.slice(0, n - 1)).to_numpy()])
    return pl.Series(np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n])), dtype=pl.Int64)


def _episode_signals(comp, messages, feedback, patterns, result) -> pl.DataFrame:
    first_msg = (
        messages.sort("ts_ms", "event_id")
        .unique("episode_id", keep="first", maintain_order=True)
        .select("episode_id", pl.col("text").alias("followup_text"))
    )
    if patterns:
        first_msg = redact.redact_column(first_msg, "followup_text", patterns, result.redactions)
    fb = feedback.sort("ts_ms", "event_id")
    by_sample = fb.filter(pl.col("sample_id").is_not_null()).unique("sample_id", keep="last", maintain_order=True)
    by_episode = fb.filter(pl.col("sample_id").is_null()).unique("episode_id", keep="last", maintain_order=True)
    comp = (
        comp.join(first_msg, on="episode_id", how="left")
        .join(
            by_sample.select("sample_id", pl.col("value").alias("_fs"), pl.col("kind").alias("_fsk")),
            on="sample_id",
            how="left",
        )
        .join(
            by_episode.select("episode_id", pl.col("value").alias("_fe"), pl.col("kind").alias("_fek")),
            on="episode_id",
            how="left",
        )
    )
    return comp.with_columns(
        pl.coalesce("_fs", "_fe").cast(pl.Float32).alias("feedback"),
        pl.when(pl.col("_fs").is_not_null())
        .then(pl.lit("sample"))
        .when(pl.col("_fe").is_not_null())
        .then(pl.lit("episode"))
        .alias("feedback_scope"),
        pl.when(pl.col("_fs").is_not_null()).then("_fsk").otherwise("_fek").alias("feedback_kind"),
        (pl.col("turn") == pl.col("turn").max().over("episode_id")).alias("is_final_turn"),
        pl.len().over("episode_id").cast(pl.Int32).alias("n_turns"),
        pl.col("ts_ms").min().over("episode_id").alias("_ep_start"),
        pl.col("ts_ms").max().over("episode_id").alias("_ep_end"),
        pl.col("edit_outcomes_missing").fill_null(0).sum().over("episode_id").alias("_ep_missing"),
    ).drop("_fs", "_fsk", "_fe", "_fek")


def _count_orphans(by_type, comp, result) -> None:
    """Events whose sample or episode is not in this input (e.g. late outcomes of old logs)."""
    samples = comp.select("sample_id") if comp.height else pl.DataFrame(schema={"sample_id": pl.String})
    episodes = comp.select("episode_id").unique() if comp.height else pl.DataFrame(schema={"episode_id": pl.String})
    for etype in ("tool_result", "edit_outcome"):
        n = by_type[etype].join(samples, on="sample_id", how="anti").height
        if n:
            result.orphans[etype] += n
    n = by_type["user_message"].join(episodes, on="episode_id", how="anti").height
    if n:
        result.orphans["user_message"] += n
    fb = by_type["feedback"]
    n = fb.filter(pl.col("sample_id").is_not_null()).join(samples, on="sample_id", how="anti").height
    n += fb.filter(pl.col("sample_id").is_null()).join(episodes, on="episode_id", how="anti").height
    if n:
        result.orphans["feedback"] += n


def _mature_and_filter(comp, config, as_of_ms, since_ms, until_ms, result) -> pl.DataFrame:
    maturity_ms = int(config.maturity_s * 1000)
    held = (pl.col("_ep_missing") > 0) & ((as_of_ms - pl.col("_ep_end")) < maturity_ms)
    comp = comp.with_columns(held.alias("_held"))
    keep = pl.lit(True)
    if config.policy_versions:
        keep = keep & pl.col("policy_version").is_in(config.policy_versions)
    if since_ms is not None:
        keep = keep & (pl.col("_ep_start") >= since_ms)
    if until_ms is not None:
        keep = keep & (pl.col("_ep_start") < until_ms)
    comp = comp.with_columns(keep.alias("_keep"))
    stats = comp.group_by("policy_version").agg(
        pl.len().alias("samples_in"),
        (~pl.col("_keep")).sum().alias("filtered"),
        (pl.col("_keep") & pl.col("_held")).sum().alias("held_back_samples"),
        pl.col("episode_id").filter(pl.col("_keep") & pl.col("_held")).n_unique().alias("held_back_episodes"),
        (pl.col("_keep") & ~pl.col("_held")).sum().alias("samples_out"),
        pl.col("episode_id").filter(pl.col("_keep") & ~pl.col("_held")).n_unique().alias("episodes_out"),
        pl.col("n_invalid_tool_calls").filter(pl.col("_keep") & ~pl.col("_held")).sum().alias("invalid_tool_calls"),
    )
    for row in stats.iter_rows(named=True):
        version = row.pop("policy_version")
        counter: Any = result.per_policy_version[version]
        for key, value in row.items():
            counter[key] += int(value or 0)
        result.filtered_samples += int(row["filtered"])
        result.held_back_samples += int(row["held_back_samples"])
        result.held_back_episodes += int(row["held_back_episodes"])
        result.samples_out += int(row["samples_out"])
        result.episodes_out += int(row["episodes_out"])
    return comp.filter(pl.col("_keep") & ~pl.col("_held"))


def _in_output_order(comp: pl.DataFrame) -> pl.DataFrame:
    # Hash first: partitions are hash ranges, so this order is global (see Partitioner).
    order = comp.select(SESSION_HASH.alias("_h"), "session_id", "episode_id", "turn", "sample_id")
    return comp[order.with_row_index("_i").sort("_h", "session_id", "episode_id", "turn", "sample_id")["_i"]]


def _finish(comp: pl.DataFrame) -> pl.DataFrame:
    return comp.select(
        "sample_id",
        "episode_id",
        "session_id",
        "turn",
        "policy_version",
        pl.col("ts_ms").cast(pl.Datetime("ms", "UTC")).alias("ts"),
        "prompt_ids",
        "prompt_parent",
        "prompt_shared",
        "prompt_added",
        "completion_ids",
        "behavior_logprobs",
        "tool_calls",
        pl.col("n_invalid_tool_calls").fill_null(0),
        "edit_lines_proposed",
        "edit_lines_surviving",
        "followup_text",
        "feedback",
        "latency_ms",
        "is_final_turn",
        pl.col("n_tool_errors").fill_null(0),
        pl.col("edit_outcomes_missing").fill_null(0),
        "feedback_scope",
        "feedback_kind",
        "temperature",
        "n_turns",
        "max_new_tokens",
        "greedy",
        "top_p",
        "pair_key",
        "retried",
    )
