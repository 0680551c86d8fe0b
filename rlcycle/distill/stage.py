"""distill: trajectories in, rewarded and advantage-normalised training examples out.

In:  `trajectories.arrow` (the `trajectories` contract; a path, or `-` for an Arrow stream on
     stdin) and a reward spec (TOML, rlcycle/distill/spec.py; none = built-in defaults).
Out: `examples.arrow` (the `examples` contract: every trajectory column, then `reward`,
     `reward_parts` (one float32 per signal), `group_key`, `advantage`, `weight`, `excluded`,
     `hint` (the follow-up's hint on the turn it answers, null unless `hints.enabled`; hints.py)),
     `reward_report.json` beside it, and a `DistillResult`.

    rlcycle distill runs/demo/trajectories.arrow -o runs/demo/examples.arrow --spec sample_data/rewards.toml

The data flow, top to bottom (each step in its own module):
1. read    memory-map the input; check it against the contract (every problem at once)
2. features  per-sample and per-episode facts (features.py): tool-call flags, episode
           outcome, follow-up scores, next-episode success, prompt hashes
3. rewards each signal's raw value, credit assignment, transform/clip/weight, share caps
           (rewards.py, signals.py)
4. groups  a baseline group per episode: same prompt, a column, or the batch (advantages.py)
5. advantages  loo / mean_std / dr_grpo within each group; flat groups flagged
6. monitors    rates per policy version, warnings and named reward hacks (monitors.py)
7. write   the examples file (atomic), then reward_report.json (atomic)

Nothing is dropped: every input row is in the output, in input order. Rows that cannot teach
are *excluded* — kept with weight 0 and a reason, and counted:
    no_completion  no completion tokens (nothing to train on; not in any baseline)
    discarded_invalid  the sample emitted an invalid tool call and `discard_invalid` is on (the
                   naive arm of the closed-loop experiment; not in any baseline)
    no_group       no group key qualified (only when `group_keys` does not end with batch)
    flat_group     every reward of its group is equal (with `exclude_flat_groups`), unless
                   the sample emitted an invalid tool call: those are never excluded
    retried        a client retry's orphan (collect's `retried`): the user never saw it (not
                   in any baseline)
Prompts pass through in collect's delta layout (rlcycle/prompts.py); nothing here rebuilds
them except the first prompt of an episode that is stored against an earlier sample (features).
Memory: the per-row scalars the steps need (a few dozen bytes a row); the token lists are
memory-mapped and go from input to output without being copied into Python or polars.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlcycle import console
from rlcycle import io as rio
from rlcycle.config import cfg, check_range
from rlcycle.distill import advantages, features, hints, monitors, rewards
from rlcycle.distill.spec import CREDITS, RewardSpec, default_spec, load_spec
from rlcycle.errors import InputError
from rlcycle.schema import EXAMPLES, TRAJECTORIES, check, conform
from rlcycle.stage import Outcome, RunLayout, StageContext, content_key

REPORT_NAME = "reward_report.json"
OUTPUT_COLUMNS = ("reward", "reward_parts", "group_key", "advantage", "weight", "excluded", "hint")
REASONS = (
    "",
    "no_completion",
    "discarded_invalid",
    "no_group",
    "flat_group",
    "retried",
)  # `excluded` values; "" = included


@dataclass
class DistillConfig:
    credit: str = cfg(
        "all",
        help="Which samples carry an episode signal: all (every turn) or final (the last turn); a signal's own `credit` wins.",
    )
    normalization: str = cfg(
        "loo",
        help="Advantage within a group: loo (minus the mean of the others), mean_std (GRPO), dr_grpo (minus the mean).",
    )
    group_keys: list[str] = cfg(
        ["prompt", "batch"], help="Baseline group sources, in order: prompt, a trajectory column (e.g. repo), batch."
    )
    min_group_size: int = cfg(2, help="Episodes a group needs before it is used (fewer: the next source).")
    std_eps: float = cfg(1e-4, help="Added to the group std under mean_std.")
    exclude_flat_groups: bool = cfg(True, help="Exclude (weight 0) samples of groups whose rewards are all equal.")
    flat_tol: float = cfg(1e-6, help="Rewards closer than this count as equal (flat groups).")
    edit_tools: list[str] = cfg(
        ["write_file", "apply_patch", "replace_in_file"], help="Tool names whose ok calls are edits."
    )
    clarify_tools: list[str] = cfg(["ask_user"], help="Tool names that ask the user a clarifying question.")
    success_persistence: float = cfg(
        0.5, help="Edit persistence from which an episode's edits count as success (below: failure)."
    )
    monitor_abs: float = cfg(0.01, help="A rate moved between versions when it changed by at least this (absolute) ...")
    monitor_rel: float = cfg(0.25, help="... and by at least this share of its old value.")
    monitor_min_episodes: int = cfg(20, help="Versions with fewer episodes are reported but not compared.")
    # Experiment switches (the arms of experiments/closed_loop/run.py; docs/closed_loop.md). Off in production.
    permute_rewards: bool = cfg(
        False,
        help="Control arm: shuffle reward and reward_parts (together) among the samples that have a completion, before advantages: the same rewards, no link to behaviour.",
    )
    permute_seed: int = cfg(0, help="Seed of the permute_rewards shuffle (same seed and input, same shuffle).")
    discard_invalid: bool = cfg(
        False,
        help="Naive arm (the seed's first reward hack): exclude samples with an invalid tool call (`discarded_invalid`, weight 0, in no baseline) instead of penalising them.",
    )
    hints: hints.HintConfig = cfg(
        hints.HintConfig(),
        help="Hints from follow-ups for train's hinted self-distillation (docs/hints.md; off by default).",
    )

    def validate(self) -> list[str]:
        problems = []
        if self.credit not in CREDITS:
            problems.append(f"credit={self.credit!r}: expected one of {', '.join(CREDITS)}")
        if self.normalization not in advantages.NORMALIZATIONS:
            problems.append(
                f"normalization={self.normalization!r}: expected one of {', '.join(advantages.NORMALIZATIONS)}"
            )
        if not self.group_keys:
            problems.append("group_keys is empty: name at least one source (prompt, a column, batch)")
        if "batch" in self.group_keys[:-1]:
            problems.append("group_keys: batch takes every sample, so it must be the last source")
        check_range(problems, self, ("min_group_size", "monitor_min_episodes"), ge=1)
        check_range(problems, self, ("std_eps", "flat_tol", "monitor_abs", "monitor_rel"), ge=0)
        check_range(problems, self, "success_persistence", ge=0, le=1)
        return problems


@dataclass
class DistillResult:
    output: str
    report: str
    rows: int = 0
    episodes: int = 0
    included: int = 0
    excluded: dict[str, int] = field(default_factory=dict)
    normalization: str = ""
    credit: str = ""
    groups: dict[str, Any] = field(default_factory=dict)
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)
    reward: dict[str, float] = field(default_factory=dict)
    advantage: dict[str, float] = field(default_factory=dict)
    per_policy_version: dict[str, dict[str, Any]] = field(default_factory=dict)
    version_order: list[str] = field(default_factory=list)  # oldest first (by first sample)
    warnings: list[dict] = field(default_factory=list)
    hacks: list[dict] = field(default_factory=list)
    hints: dict[str, Any] = field(default_factory=dict)  # hints.build's report (docs/hints.md)
    notes: list[str] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 3)
        return {"schema": "reward_report", "version": 1, **d}


def default_report_path(out: str) -> str:
    """reward_report.json beside the output; in the working directory for `-o -`."""
    return REPORT_NAME if out == rio.STDIO else str(Path(out).parent / REPORT_NAME)


# --- the stage ---------------------------------------------------------------------------------


def run(
    config: DistillConfig,
    trajectories: str,
    out: str,
    spec: RewardSpec | None = None,
    report: str | None = None,
    quiet: bool = False,
) -> DistillResult:
    """Distill `trajectories` (path or `-`) into examples at `out` (path or `-`).

    The report goes to `report` (default: beside `out`); warnings and named reward hacks also
    go to stderr unless `quiet`.
    """
    started = time.monotonic()
    spec = spec or default_spec()
    rio.format_for_output(out)  # a bad extension fails before any work
    table = _read(trajectories, config)
    result = DistillResult(
        output=out,
        report=report or default_report_path(out),
        rows=table.num_rows,
        normalization=config.normalization,
        credit=config.credit,
        spec={**spec.as_dict(), "digest": spec.digest()},
        config=asdict(config),
    )
    feats = features.build(table, spec, config)
    rw = rewards.compute(feats.samples, feats.episodes, table, spec, config.credit)
    s = feats.samples
    ep = s.get_column("_ep").to_numpy()
    groups = advantages.assign(feats.episodes, config.group_keys, config.min_group_size)
    group = groups.code.astype(np.int32)[ep] if groups.code.size else np.zeros(0, np.int32)
    no_completion = s.get_column("n_tokens").to_numpy() == 0
    invalid = s.get_column("n_invalid").to_numpy() > 0
    discarded = invalid & config.discard_invalid & ~no_completion
    retried = np.zeros(table.num_rows, bool)
    if "retried" in table.column_names:
        retried = table.column("retried").fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    no_completion = no_completion & ~retried
    discarded = discarded & ~retried
    if config.permute_rewards:
        permute_rewards(rw, ~no_completion, config.permute_seed)
        result.notes.append(
            f"permute_rewards: rewards shuffled among {int((~no_completion).sum()):,} samples "
            f"(seed {config.permute_seed}): a control run, not a training run"
        )
    # The monitors read only the features and the rewards: they run in a thread beside the
    # advantages, the output columns and the write (Arrow, polars and numpy release the GIL).
    with ThreadPoolExecutor(1) as pool:
        monitored = pool.submit(monitors.per_version, feats, rw.parts, rw.reward)
        adv = advantages.compute(
            rw.reward,
            group,
            ~no_completion & ~discarded & ~retried,
            config.normalization,
            config.std_eps,
            config.flat_tol,
        )
        reason = _exclusions(no_completion, discarded, group, adv, invalid, config)
        reason[retried] = REASONS.index("retried")
        columns = _output_columns(spec, rw, groups, group, adv.advantage, reason)
        hinted = hints.build(table, feats, spec, config.hints)
        columns["hint"], result.hints = hinted.column, hinted.report
        _write(table, columns, out, spec, config)
        result.per_policy_version = monitored.result()
    counts = np.bincount(reason, minlength=len(REASONS))
    result.episodes = feats.episodes.height
    result.included = int(counts[0])
    result.excluded = {REASONS[i]: int(c) for i, c in enumerate(counts) if i and c}
    result.groups = _group_summary(groups, adv, config)
    result.signals = _signal_summary(spec, rw, config.credit)
    result.reward = _stats(rw.reward)
    result.advantage = _stats(adv.advantage[reason == 0])
    result.version_order = list(result.per_policy_version)
    result.warnings, result.hacks = monitors.compare(
        result.per_policy_version, config.monitor_abs, config.monitor_rel, config.monitor_min_episodes
    )
    result.notes = result.notes + feats.notes + rw.notes
    result.seconds = time.monotonic() - started
    rio.atomic_write_text(result.report, json.dumps(result.as_dict(), indent=2, sort_keys=False, default=str) + "\n")
    if not quiet:
        for item in (*result.hacks, *result.warnings):
            console.warn(item["message"])
    return result


def _read(path: str, config: DistillConfig) -> pa.Table:
    source = "<stdin>" if path == rio.STDIO else str(path)
    table = rio.read_table(path)
    check(table.schema, TRAJECTORIES, source)
    problems = [
        f"group_keys: no column {k!r} in {source}"
        for k in config.group_keys
        if k not in ("prompt", "batch") and k not in table.column_names
    ]
    if table.num_rows == 0:
        problems.append(f"{source}: no trajectories (0 rows)")
    if table.column("episode_id").null_count:  # episodes are what the rewards are about
        problems.append(f"{source}: episode_id is null in {table.column('episode_id').null_count:,} row(s)")
    if problems:
        raise InputError(
            "; ".join(problems), hint="`rlcycle inspect` the input; group keys are prompt, batch or a column"
        )
    # Re-distilling an examples file would stack a second set of outputs: refuse the ambiguity.
    clash = [c for c in OUTPUT_COLUMNS if c in table.column_names]
    if clash:
        raise InputError(f"{source} already has {', '.join(clash)}: it is not raw trajectories")
    return table


def _exclusions(no_completion, discarded, group, adv: advantages.Advantages, invalid, config) -> np.ndarray:
    """Per sample, the index of its exclusion reason in REASONS (0: included); first one wins.

    A sample with an invalid tool call is never excluded for being in a flat group: its
    penalty is the whole point (docs/design.md, the first reward hack). Only the naive arm's
    `discard_invalid` drops it, to show what that hack does.
    """
    flat = adv.flat_rows & config.exclude_flat_groups & ~invalid
    conditions = [no_completion, discarded, group < 0, flat]
    return np.select(conditions, [np.int8(i) for i in range(1, len(conditions) + 1)], np.int8(0))


def permute_rewards(rw: rewards.Rewards, rows: np.ndarray, seed: int) -> None:
    """Shuffle `reward` and every signal's part, with one permutation (new arrays: the parts
    may be read-only views of Arrow memory), among the
    samples where `rows` is true (those with a completion): the control arm's rewards.

    The multiset of rewards (and of each part, and of the (reward, parts) tuples) is unchanged,
    so the reward distribution, its mean and std, the caps' effect and the advantages' scale
    stay as they were; only which sample gets which reward is random. Whatever the policy
    learns from them is noise (or a bias the reward shape alone carries), which is what the
    treatment arm is compared with.
    """
    idx = np.flatnonzero(rows)
    perm = idx[np.random.default_rng(seed).permutation(idx.size)]
    rw.reward = rw.reward.copy()
    rw.reward[idx] = rw.reward[perm]
    for name, part in list(rw.parts.items()):
        rw.parts[name] = part = part.copy()
        part[idx] = part[perm]


def _output_columns(spec, rw, groups, group, advantage, reason) -> dict[str, pa.Array]:
    excluded = reason > 0
    parts = pa.StructArray.from_arrays([pa.array(rw.parts[n], pa.float32()) for n in spec.names()], names=spec.names())
    # Dictionary arrays (small integer codes + the distinct labels), cast to plain strings.
    labels = groups.labels.to_arrow().cast(pa.string()) if len(groups.labels) else pa.array([""])
    gk = pa.DictionaryArray.from_arrays(pa.array(np.maximum(group, 0).astype(np.int32), mask=group < 0), labels)
    why = pa.DictionaryArray.from_arrays(pa.array(reason.astype(np.int32), mask=~excluded), pa.array(REASONS))
    adv = advantage.astype(np.float32)
    return {
        "reward": pa.array(rw.reward.astype(np.float32)),
        "reward_parts": parts,
        "group_key": gk.cast(pa.string()),
        "advantage": pa.array(adv, mask=np.isnan(adv)),
        "weight": pa.array((~excluded).astype(np.float32)),
        "excluded": why.cast(pa.string()),
    }


def _write(table: pa.Table, columns: dict[str, pa.Array], out: str, spec: RewardSpec, config: DistillConfig) -> None:
    for name, arr in columns.items():
        table = table.append_column(name, arr)
    table = conform(table, EXAMPLES)
    meta = dict(table.schema.metadata or {})
    meta.update(
        {
            b"rlcycle.normalization": config.normalization.encode(),
            b"rlcycle.credit": config.credit.encode(),
            b"rlcycle.reward_signals": ",".join(spec.names()).encode(),
            b"rlcycle.reward_spec": spec.digest().encode(),
        }
    )
    table = table.replace_schema_metadata(meta)
    with rio.ArtifactWriter(out, table.schema) as writer:
        writer.write(table)


# --- report pieces -----------------------------------------------------------------------------


def _group_summary(groups: advantages.Groups, adv: advantages.Advantages, config: DistillConfig) -> dict:
    return {
        "keys": list(config.group_keys),
        "count": adv.n_groups,
        "by_source": dict(sorted(groups.by_source.items())),
        "flat": adv.n_flat_groups,
        "singletons": adv.n_singleton_groups,
        "flat_samples": int(adv.flat_rows.sum()),
        "sizes": adv.group_sizes,
    }


def _signal_summary(spec: RewardSpec, rw: rewards.Rewards, credit: str) -> dict[str, dict]:
    total = sum(rw.mass.values())
    out = {}
    for s in spec.signals:
        out[s.name] = {
            "scope": s.scope,
            "credit": (s.credit or credit) if s.scope == "episode" else "sample",
            "weight": s.weight,
            "transform": s.transform,
            "clip": list(s.clip) if s.clip else None,
            "cap": s.cap,
            "cap_scale": round(rw.scale[s.name], 6),
            "share_before_cap": round(rw.share_before[s.name], 6),
            "share": round(rw.mass[s.name] / total, 6) if total else 0.0,
            "coverage": rw.coverage[s.name],
            "mean": round(float(rw.parts[s.name].mean()), 6) if rw.parts[s.name].size else 0.0,
        }
    return out


def _stats(x: np.ndarray) -> dict[str, float]:
    x = x[~np.isnan(x)]
    if not x.size:
        return {}
    return {
        k: round(float(v), 6) for k, v in (("mean", x.mean()), ("std", x.std()), ("min", x.min()), ("max", x.max()))
    }


def format_summary(r: DistillResult) -> str:
    """The human summary on stderr."""
    lines = [
        f"distill: {r.rows:,} samples in {r.episodes:,} episodes in {r.seconds:.1f}s -> {r.output}",
        f"  included       {r.included:,}; excluded "
        + (", ".join(f"{k}={v:,}" for k, v in r.excluded.items()) or "none"),
        f"  groups         {r.groups['count']:,} ({', '.join(f'{k}={v:,}' for k, v in r.groups['by_source'].items())}); "
        f"{r.groups['flat']:,} flat ({r.groups['singletons']:,} of one sample)",
        f"  advantages     {r.normalization}, credit={r.credit}; reward mean {r.reward.get('mean', 0):+.4f} "
        f"std {r.reward.get('std', 0):.4f}",
        "  signals        share (cap)  coverage",
    ]
    for name, s in r.signals.items():
        capped = f" scaled x{s['cap_scale']:.3f}" if s["cap_scale"] != 1 else ""
        lines.append(f"    {name:22s} {s['share'] * 100:5.1f}% ({s['cap'] * 100:3.0f}%) {s['coverage']:>9,}{capped}")
    lines.append("  per policy version: invalid / clarify / edit rates, mean latency")
    for v, m in r.per_policy_version.items():
        lines.append(
            f"    {v}: {m['samples']:,} samples, invalid {_p(m.get('invalid_tool_call_rate'))}, "
            f"clarify {_p(m.get('clarification_rate'))}, edit {_p(m.get('edit_rate'))}, "
            f"latency {m.get('mean_latency_ms') or 0:,.0f} ms"
        )
    if r.hints.get("enabled"):
        h = r.hints
        lines.append(
            f"  hints          {h['accepted']:,} of {h['dissatisfied']:,} dissatisfied episodes "
            f"({h['rejected_by_rule']:,} said nothing, {h['rejected_by_judge']:,} rejected by the judge)"
            + (f"; shuffled ({h['shuffle']['moved']:,} moved)" if "shuffle" in h else "")
        )
    lines += [f"  note: {n}" for n in r.notes]
    lines.append(f"  report         {r.report}")
    return "\n".join(lines)


def _p(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


# --- the stage object (rlcycle/stage.py): what `rlcycle distill` and the cycle both run --------


@dataclass(frozen=True)
class DistillArgs:
    """What one distill reads and writes: `run`'s arguments past the config."""

    trajectories: str  # trajectories.arrow (or .parquet), or `-`
    out: str  # examples.arrow (or .parquet), or `-`
    spec: RewardSpec | None = None  # default: every built-in signal with its defaults
    report: str | None = None  # default: reward_report.json beside `out`
    quiet: bool = False


class DistillStage:
    """distill as a stage: collect's trajectories and the reward spec -> training examples. In
    a cycle the spec's own [distill] table sits under the cycle's (rlcycle.cycle.load_config)."""

    name = "distill"
    config_class = DistillConfig
    cacheable, gate, publishes = True, False, False

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        traj = ctx.layout.file("trajectories")
        return {"trajectories": content_key([traj], pending_ok=True), "spec": content_key([ctx.reward_spec])}

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {"examples": layout.file("examples"), "report": layout.file("reward_report")}

    def args(self, ctx: StageContext) -> DistillArgs:
        traj, out = ctx.layout.file("trajectories"), ctx.layout.file("examples")
        return DistillArgs(str(traj), str(out), load_spec(ctx.reward_spec), quiet=ctx.quiet)

    def run(self, config: DistillConfig, args: DistillArgs) -> DistillResult:
        return run(config, args.trajectories, args.out, args.spec, report=args.report, quiet=args.quiet)

    def record(self, result: DistillResult) -> Outcome:
        r = result
        return Outcome({"rows": r.rows, "included": r.included, "excluded": r.excluded}, format_summary(r))


STAGE = DistillStage()
