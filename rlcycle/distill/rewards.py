"""From signals to rewards: credit assignment, transform, clip, weight, then the share caps.

For each signal s and sample i (all vectorised, one column per signal):

    raw[s,i]    the signal's value (rlcycle/distill/signals.py), null where it says nothing
    credited    episode signals under credit "final": null on every turn but the episode's
                last (except rows the signal marks as the sample's own, e.g. feedback given
                on that very sample); under "all": unchanged. Sample signals: unchanged.
    part[s,i]   weight[s] * clip(transform(credited))      null -> 0

Share caps (batch-wide): signal s's share of the total is A_s / sum_t A_t with A_s = sum_i
|part[s,i]|. When a share exceeds its cap, that signal is scaled by c_s < 1 so its share
equals the cap, *after* the rescaling. Capping one signal raises everyone else's share, so the
capped set is found by water-filling: with U the mass of the uncapped signals and K the sum of
the caps of the capped ones, the new total is T' = U / (1 - K); every uncapped signal with
A_s > cap_s * T' joins the capped set; repeat until none does. Then c_s = cap_s * T' / A_s.
If the capped signals carry all the mass (U = 0), their shares must sum to 1 and cannot all
fit under caps summing to less: their shares are then set in proportion to their caps (one
lone signal keeps its reward unscaled), and the report says so.

    reward[i] = sum_s c_s * part[s,i]

Custom signals (`fn = "module:function"`) are called once, as fn(frame, **params), with the
trajectory columns they ask for (`columns`, default: every column that is not a token list)
and return one value per row (a polars Series, numpy array or list; None for "no value").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa

from rlcycle.distill.signals import BUILTINS, TRANSFORMS
from rlcycle.distill.spec import RewardSpec, SignalSpec, resolve_callable
from rlcycle.errors import InputError, RlcycleError

C = pl.col
TOKEN_LISTS = ("prompt_ids", "prompt_added", "completion_ids", "behavior_logprobs")


@dataclass
class Rewards:
    parts: dict[str, np.ndarray]  # signal -> capped part per sample (float32, as written)
    reward: np.ndarray  # float64, sum of the parts
    coverage: dict[str, int]  # samples where the signal had a value (after credit)
    scale: dict[str, float]  # the cap's factor c_s (1.0: not capped)
    share_before: dict[str, float]  # shares of the total |reward| before the caps
    mass: dict[str, float]  # sum of |part| over the batch, after the caps
    notes: list[str] = field(default_factory=list)


def compute(samples: pl.DataFrame, episodes: pl.DataFrame, table: pa.Table, spec: RewardSpec, credit: str) -> Rewards:
    """Every signal's part and the reward of every sample (module docstring)."""
    exprs = []
    ep = samples.get_column("_ep")
    for s in spec.signals:
        if not s.builtin:
            raw = pl.lit(_custom_values(s, table, samples.height))
        elif BUILTINS[s.name].on_episodes:  # one value per episode, copied onto its samples
            raw = pl.lit(episodes.select(_raw_expr(s).cast(pl.Float32)).to_series().gather(ep))
        else:
            raw = _raw_expr(s)
        exprs.append(_shape(_credited(raw, s, credit).cast(pl.Float32), s).alias(s.name))
    # One pass, the signals in parallel, in float32 as written (the sums below are float64).
    shaped = samples.select(exprs)
    coverage = {name: shaped.height - shaped.get_column(name).null_count() for name in spec.names()}
    # Null (no value) and NaN (e.g. a NaN latency) both count as 0.
    parts = {name: _zero_missing(shaped.get_column(name)) for name in spec.names()}
    del shaped
    mass = {name: float(np.add.reduce(np.abs(v), dtype=np.float64)) for name, v in parts.items()}
    total = sum(mass.values())
    share_before = {n: (m / total if total > 0 else 0.0) for n, m in mass.items()}
    scale, notes = cap_scales(mass, {s.name: s.cap for s in spec.signals})
    for name, c in scale.items():
        if c != 1.0:
            parts[name] = (parts[name] * c).astype(np.float32)
    reward = np.zeros(samples.height, dtype=np.float64)
    for name in spec.names():  # a fixed order: the same sum, bit for bit, every run
        reward += parts[name]
    mass_after = {n: m * scale[n] for n, m in mass.items()}
    return Rewards(parts, reward, coverage, scale, share_before, mass_after, notes)


def _zero_missing(col: pl.Series) -> np.ndarray:
    """The column as numpy with null and NaN as 0 (copied only when there is one)."""
    values = col.to_numpy()  # nulls come out as NaN (a fresh, writable array)
    if col.null_count() or np.isnan(values).any():
        values = np.nan_to_num(values, nan=0.0, copy=not values.flags.writeable)
    return values


def _raw_expr(s: SignalSpec) -> pl.Expr:
    return BUILTINS[s.name].raw(s.params)


def _credited(raw: pl.Expr, s: SignalSpec, default_credit: str) -> pl.Expr:
    if s.scope != "episode" or (s.credit or default_credit) == "all":
        return raw
    # credit = final: the episode's outcome rewards the turn that handed control back.
    keep = C("is_final")
    own = BUILTINS[s.name].own_rows if s.builtin else None
    if own is not None:
        keep = keep | own
    return pl.when(keep).then(raw)


def _shape(x: pl.Expr, s: SignalSpec) -> pl.Expr:
    y = TRANSFORMS[s.transform](x)
    if s.clip is not None:
        y = y.clip(s.clip[0], s.clip[1])
    # + 0.0 turns the -0.0 of a negative weight times 0 into 0.0.
    return (y * pl.lit(s.weight, pl.Float32) + pl.lit(0.0, pl.Float32)).cast(pl.Float32)


def cap_scales(mass: dict[str, float], caps: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """The factor c_s of each signal so that no share exceeds its cap (water-filling, above)."""
    capped: set[str] = set()
    while True:
        free_mass = sum(m for n, m in mass.items() if n not in capped)
        cap_sum = sum(caps[n] for n in capped)
        if free_mass <= 0 or cap_sum >= 1.0:
            break
        total = free_mass / (1.0 - cap_sum)  # T': the total once the capped ones sit at their caps
        over = {n for n, m in mass.items() if n not in capped and m > caps[n] * total * (1 + 1e-12)}
        if not over:
            return {n: (caps[n] * total / mass[n] if n in capped else 1.0) for n in mass}, []
        capped |= over
    if not capped:
        return {n: 1.0 for n in mass}, []
    # The capped signals carry all the reward, so their shares must sum to 1 and cannot all sit
    # under caps that sum to less: shares in proportion to the caps, the closest fit (a single
    # signal keeps its reward as it is).
    whole = sum(mass[n] for n in capped)
    scale = {n: (caps[n] / cap_sum * whole / mass[n] if n in capped else 1.0) for n in mass}
    names = ", ".join(sorted(capped))
    return scale, [
        f"caps of {names} (sum {cap_sum:g}) cannot all hold: they carry all the reward, shares set in proportion to the caps"
    ]


def _custom_values(s: SignalSpec, table: pa.Table, n: int) -> pl.Series:
    """Call a custom signal's function once over the whole batch."""
    fn = resolve_callable(s.fn or "")
    columns = s.columns or [c for c in table.column_names if c not in TOKEN_LISTS]
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(f"[signals.{s.name}] asks for columns the input lacks: {', '.join(missing)}")
    frame = pl.from_arrow(table.select(columns))
    try:
        out = fn(frame, **s.params)
    except Exception as e:  # user code: name it
        raise RlcycleError(
            f"custom signal {s.name} ({s.fn}) failed: {type(e).__name__}: {e}",
            hint="call it by hand on a small trajectories file to debug it",
        ) from e
    values = pl.Series(s.name, out, dtype=pl.Float64, strict=False)
    if values.len() != n:
        raise InputError(f"custom signal {s.name} ({s.fn}) returned {values.len()} values for {n} samples")
    return values
