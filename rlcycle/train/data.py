"""Examples in, micro-batches out: filtering, staleness, the step schedule, packing, normalisers.

Reading (`load_examples`): the columns train needs from one or more examples files (Arrow or
Parquet; memory-mapped), as flat numpy arrays + row offsets (no per-row Python lists). Logged
token ids are used as they are; nothing is ever re-tokenised. Every row that cannot be trained
on is dropped *and counted by reason*, in this order (a row counts once, for its first reason):

    excluded                 `excluded` is not null (distill's reason is counted too)
    no_completion            completion_ids null or empty
    no_prompt                prompt_ids null or empty (the first sampled token needs a context)
    logprob_length_mismatch  len(behavior_logprobs) != len(completion_ids) (never guessed)
    bad_behavior_logprob     a logged logprob is NaN, infinite or > 0
    loss_mask_length_mismatch / no_loss_tokens   the optional `loss_mask` column
    no_advantage             advantage null or not finite
    bad_weight               weight not finite or < 0 (a null weight means 1)
    greedy_sampling          `greedy` is true or `temperature` is 0: argmax decoding, so the behaviour
                             policy was a point mass and the logged logprobs (log_softmax at T=1) are
                             not its probabilities; no importance ratio exists for it
    truncated_sampling       `top_p` < 1 (gateway `allow_truncated_sampling`): the logged logprobs are
                             the renormalised nucleus's, train scores the full vocabulary
    bad_temperature          use_sample_temperature and `temperature` <= 0 or not finite
    token_out_of_vocab       an id outside the model's embedding table
    too_long                 prompt + completion longer than max_seq_len (none: the model's context
                             length, set by train's stage; a row longer than one pass still trains)
    unknown_policy_version   `policy_version` not in the known version list
    stale                    more than max_policy_lag versions behind the newest

Staleness rule: the known versions, oldest first, are `policy_versions` from the config when
given, else the base checkpoint's rlcycle.json `lineage` (ids, oldest first, ending with the
base's own id), else just the base's id. A row's lag is (index of the newest) - (index of its
version); a version matches an entry exactly or as a prefix of at least 8 characters (short
checkpoint ids).
`max_policy_lag = none` (or -1) skips the check and the version lookup.

Scheduling (`Schedule`): each epoch's row order is a permutation drawn from (seed, epoch), the
same whatever the process count; step k takes the next `batch_size` rows. So a step's global
batch, and hence its update, depends only on the config and the data.

Within a step (`plan_step`): the global batch is split over processes, balanced by tokens
(longest first to the least-loaded process), then each process's share is cut into forward
passes under a token budget (lines x longest line <= micro_batch_tokens). `packed` concatenates
whole sequences into lines as long as the share's longest sequence (first-fit decreasing;
position ids restart per sequence, and transformers builds a block-diagonal causal mask, or
uses varlen flash-attention); lines no longer than that keep sdpa's quadratic attention cost
near what the sequences alone would cost. `bucketed` sorts rows by length and pads; `padded`
takes rows in schedule order, `micro_batch_size` at a time (the naive baseline). The normaliser ν_i of loss.py is computed
here from the *whole* global batch, before any forward pass.

Shared prefixes (`share_prefix`, default on; prefix.py): rows whose prompts start with the same
>= `min_shared_prefix` tokens (the system prompt and tools of agent rows) are grouped into passes
that run that prefix once, with gradient, under the same token budget counting it once; the
other rows are packed/bucketed as above. Metrics do not change meaning: `tokens` counts every
row's prompt + completion (a shared prefix once per row, as if it were run per row) and
`padding_fraction` is padding / (tokens + padding).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlcycle import io as rio
from rlcycle import prompts as PR
from rlcycle.errors import InputError
from rlcycle.train import segments as SG
from rlcycle.train.config import TrainConfig
from rlcycle.train.prefix import SharedPass, padded_pass, shared_passes

REQUIRED = {
    "prompt_ids": pa.list_(pa.int32()),
    "completion_ids": pa.list_(pa.int32()),
    "behavior_logprobs": pa.list_(pa.float32()),
    "policy_version": pa.string(),
    "advantage": pa.float32(),
}
OPTIONAL = {
    "weight": pa.float32(),
    "excluded": pa.string(),
    "loss_mask": pa.list_(pa.int8()),
    "temperature": pa.float32(),
    "max_new_tokens": pa.int32(),  # the sampler's per-call token limit (Dr. GRPO's M)
    "greedy": pa.bool_(),  # argmax decoding (collect carries it from the gateway's events)
    "top_p": pa.float32(),  # nucleus truncation of the sampler (null = none)
    "session_id": pa.string(),  # segments per session (train's summary)
    "hint": pa.string(),  # distill's hint on its target row (train/hints.py; null = none)
}
# The delta prompt layout (rlcycle/prompts.py), read when a file has it; prompt_ids is then
# optional (null in that layout).
DELTA = {
    "sample_id": pa.string(),
    "prompt_parent": pa.string(),
    "prompt_shared": pa.int32(),
    "prompt_added": pa.list_(pa.int32()),
}
MIN_VERSION_PREFIX = 8


@dataclass
class Ragged:
    """A list column as flat values + offsets: row i is values[offsets[i]:offsets[i+1]]."""

    values: np.ndarray
    offsets: np.ndarray

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class Examples:
    """The usable rows, compacted; `dropped` counts the others by reason."""

    prompt: Ragged
    completion: Ragged
    behavior: np.ndarray  # float32, aligned with completion.offsets
    loss_mask: np.ndarray | None  # float32 0/1, aligned with completion.offsets
    advantage: np.ndarray
    weight: np.ndarray
    temperature: np.ndarray | None
    rows_in: int = 0
    dropped: Counter = field(default_factory=Counter)
    excluded_reasons: Counter = field(default_factory=Counter)
    version_counts: Counter = field(default_factory=Counter)
    max_new_tokens: int | None = None  # the largest logged sampler limit of the usable rows
    # The delta layout (segments.py): the resolved prompts of every row read, the kept rows'
    # indices in them, and the kept rows' segments (None: every row is its own sequence).
    prompts: PR.Prompts | None = None
    source: np.ndarray | None = None
    segments: list[np.ndarray] | None = None
    sessions: list | None = None  # session_id per kept row (None: not in the file)
    hint: list[str | None] | None = None  # per usable row, the `hint` column (None: no hint anywhere)

    def __len__(self) -> int:
        return len(self.advantage)

    @cached_property
    def _members(self) -> dict[int, list[int]]:
        return {int(s[-1]): [int(r) for r in s] for s in self.segments or []}

    def members(self, r: int) -> list[int]:
        """The rows one sequence scores: its segment's (r its last member), else r alone."""
        return self._members.get(r, [r])

    @cached_property
    def is_last(self) -> np.ndarray:
        """Per row: it ends its segment (the rows that are the step's sequences)."""
        out = np.ones(len(self), dtype=bool)
        for s in self.segments or []:
            out[s[:-1]] = False
        return out

    @cached_property
    def prompt_lens(self) -> np.ndarray:
        return np.asarray(self.prompt.lengths, np.int64)

    def first_prompt_len(self, r: int) -> int:
        """Prompt length of the first row sequence r scores (a shared prefix ends before it)."""
        return int(self.prompt_lens[self.members(r)[0]])

    def sequence(self, r: int) -> np.ndarray:
        """Row r's prompt + completion (for a segment's last row: the segment's sequence)."""
        if self.prompts is not None:
            return self.prompts.context(int(self.source[r])).astype(np.int64, copy=False)
        return np.concatenate([self.prompt.row(r), self.completion.row(r)])

    def session_of(self, r: int):
        """Row r's session: its session_id, else the root of its prompt chain, else itself."""
        if self.sessions is not None and self.sessions[r] is not None:
            return self.sessions[r]
        if self.prompts is None:
            return ("row", r)
        i = int(self.source[r])
        while self.prompts.parent[i] >= 0:
            i = int(self.prompts.parent[i])
        return ("root", i)

    @cached_property
    def seq_len(self) -> np.ndarray:
        return self.prompt.lengths + self.completion.lengths

    @cached_property
    def loss_tokens(self) -> np.ndarray:
        """n_i: loss tokens per row (the completion, minus what loss_mask masks)."""
        if self.loss_mask is None:
            return self.completion.lengths.astype(np.int64)
        return _segment_sum(self.loss_mask, self.completion.offsets).astype(np.int64)


# --- reading ------------------------------------------------------------------------------------


def read_columns(paths: list[str]) -> pa.Table:
    """The columns train reads from every file, cast to one schema; all problems at once."""
    tables, problems = [], []
    for path in paths:
        if path == rio.STDIO:
            raise InputError(
                "train reads examples from files, not stdin (every process needs random access)",
                hint="write distill's output to a file: rlcycle distill ... -o examples.arrow",
            )
        table = rio.read_table(path)
        cols = []
        delta = PR.has_delta(table)
        for name, tp in {**REQUIRED, **OPTIONAL, **DELTA}.items():
            if name not in table.column_names:
                if name in REQUIRED and not (delta and name == "prompt_ids"):
                    problems.append(f"{path}: missing column {name!r} ({tp})")
                cols.append(pa.nulls(len(table), tp))
                continue
            try:
                cols.append(table.column(name).cast(tp))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                problems.append(f"{path}: column {name!r} is {table.schema.field(name).type}, expected {tp} ({e})")
        if not problems:
            tables.append(pa.Table.from_arrays(cols, names=[*REQUIRED, *OPTIONAL, *DELTA]))
    if problems:
        raise InputError(
            f"{len(problems)} problem(s) in the examples:\n  " + "\n  ".join(problems),
            hint="train reads distill's examples.arrow (`rlcycle inspect FILE` shows its schema)",
        )
    table = pa.concat_tables(tables).combine_chunks()
    if pc.all(pc.is_null(table["prompt_parent"])).as_py() and pc.all(pc.is_null(table["prompt_added"])).as_py():
        table = table.drop_columns(list(DELTA))  # the old layout only: as before
    return table


def _ragged(col: pa.ChunkedArray | pa.Array, dtype) -> tuple[Ragged, np.ndarray]:
    """(Ragged, is_null) of a list column; null rows have length 0."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return Ragged(values, offsets), arr.is_null().to_numpy(zero_copy_only=False)


def _segment_sum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-row sums of a flat array (rows may be empty)."""
    n = len(offsets) - 1
    seg = np.repeat(np.arange(n), np.diff(offsets))
    return np.bincount(seg, weights=values.astype(np.float64), minlength=n)


def _floats(col, fill: float) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    null = arr.is_null().to_numpy(zero_copy_only=False)
    return pc.fill_null(arr, fill).to_numpy(zero_copy_only=False).astype(np.float32), null


# --- filtering ----------------------------------------------------------------------------------


def load_examples(paths: list[str], config: TrainConfig, versions: list[str], vocab_size: int) -> Examples:
    """Read, check and filter the examples (see the module docstring for the drop rules)."""
    t = read_columns(paths)
    delta = PR.has_delta(t)
    if delta:  # every row's prompt resolved, none materialised (segments.py)
        prompts = PR.from_table(t, ", ".join(paths))
        t = t.drop_columns(["prompt_ids", "prompt_added"])
        t = t.append_column("prompt_ids", pa.nulls(len(t), pa.list_(pa.int32())))
    prompt, prompt_null = _ragged(t["prompt_ids"], np.int64)
    if delta:
        prompt_null = np.zeros(len(t), dtype=bool)
    comp, comp_null = _ragged(t["completion_ids"], np.int64)
    beh, beh_null = _ragged(t["behavior_logprobs"], np.float32)
    mask, mask_null = _ragged(t["loss_mask"], np.float32)
    adv, adv_null = _floats(t["advantage"], np.nan)
    weight, _ = _floats(t["weight"], 1.0)  # a null weight means 1
    n = len(t)
    excluded = t["excluded"].to_pylist()
    clen, plen = comp.lengths, (prompts.prompt_lens if delta else prompt.lengths)
    lengths_ok = (beh.lengths == clen) & ~beh_null
    # Per-row flags computed on the flat arrays, then reduced per row.
    bad_lp = ~np.isfinite(beh.values) | (beh.values > 1e-4)
    bad_lp_rows = lengths_ok & (_segment_sum(bad_lp, beh.offsets) > 0)
    has_mask = ~mask_null
    mask_len_ok = ~has_mask | (mask.lengths == clen)
    mask_sum = _segment_sum(mask.values != 0, mask.offsets)
    oov = _segment_sum((prompt.values < 0) | (prompt.values >= vocab_size), prompt.offsets) + _segment_sum(
        (comp.values < 0) | (comp.values >= vocab_size), comp.offsets
    )
    if delta:
        oov = oov + SG.out_of_vocab(prompts, vocab_size)
    lag = _lags(t["policy_version"].to_pylist(), versions, config.max_policy_lag)
    temps, _ = _floats(t["temperature"], 1.0)  # a null temperature means 1
    bad_temp = (~np.isfinite(temps) | (temps <= 0)) & config.use_sample_temperature
    greedy = pc.fill_null(t["greedy"], False).to_numpy(zero_copy_only=False).astype(bool) | (temps == 0)
    top_p, _ = _floats(t["top_p"], 1.0)  # a null top_p means no truncation
    checks = [
        ("excluded", np.array([e is not None for e in excluded], dtype=bool)),
        ("no_completion", comp_null | (clen == 0)),
        ("no_prompt", prompt_null | (plen == 0)),
        ("logprob_length_mismatch", ~lengths_ok),
        ("bad_behavior_logprob", bad_lp_rows),
        ("loss_mask_length_mismatch", ~mask_len_ok),
        ("no_loss_tokens", has_mask & mask_len_ok & (mask_sum == 0)),
        ("no_advantage", adv_null | ~np.isfinite(adv)),
        ("bad_weight", ~np.isfinite(weight) | (weight < 0)),
        ("greedy_sampling", greedy),
        ("truncated_sampling", top_p < 1),
        ("bad_temperature", bad_temp),
        ("token_out_of_vocab", oov > 0),
        ("too_long", (plen + clen) > (config.max_seq_len or np.iinfo(np.int64).max)),  # none: no limit
        ("unknown_policy_version", lag == -1),
        ("stale", lag == -2),
    ]
    ok = np.ones(n, dtype=bool)
    dropped: Counter = Counter()
    for reason, bad in checks:
        hit = ok & bad
        if hit.any():
            dropped[reason] = int(hit.sum())
        ok &= ~bad
    keep = np.flatnonzero(ok)
    ex = _compact(keep, prompt, comp, beh, mask if has_mask[keep].any() else None, has_mask)
    ex.advantage, ex.weight = adv[keep], weight[keep]
    ex.temperature = temps[keep] if config.use_sample_temperature else None
    ex.rows_in, ex.dropped = n, dropped
    if delta:
        ex.prompt, ex.prompts, ex.source = SG.DeltaPrompt(prompts, keep), prompts, keep
        segs = SG.build(prompts, keep) if config.segments else []
        ex.segments = segs if any(len(s) > 1 for s in segs) else None
    if "session_id" in t.column_names and t["session_id"].null_count < len(t):
        ids = t["session_id"].to_pylist()
        ex.sessions = [ids[i] for i in keep]
    ex.excluded_reasons = Counter(e for e in excluded if e is not None)
    ex.version_counts = Counter(v for i, v in enumerate(t["policy_version"].to_pylist()) if ok[i])
    limits, limits_null = _floats(t["max_new_tokens"], 0.0)
    logged = limits[keep][~limits_null[keep] & (limits[keep] > 0)]
    ex.max_new_tokens = int(logged.max()) if len(logged) else None
    if t["hint"].null_count < n:
        ex.hint = t["hint"].take(keep).to_pylist()
    return ex


def _gather_index(offsets: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat source index of every value of the kept rows, the kept rows' new offsets)."""
    lens = np.diff(offsets)[keep]
    new = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(lens, out=new[1:])
    # value j of kept row k sits at offsets[keep[k]] + j and lands at new[k] + j.
    src = np.repeat(offsets[keep] - new[:-1], lens) + np.arange(new[-1])
    return src.astype(np.int64), new


def _compact(keep, prompt: Ragged, comp: Ragged, beh: Ragged, mask: Ragged | None, has_mask) -> Examples:
    """Gather the kept rows into contiguous arrays (rows without a loss_mask get all-ones)."""
    p_src, p_off = _gather_index(prompt.offsets, keep)
    c_src, c_off = _gather_index(comp.offsets, keep)
    b_src, _ = _gather_index(beh.offsets, keep)  # same lengths as the completions (checked)
    m = None
    if mask is not None:
        m_src, _ = _gather_index(mask.offsets, keep)  # empty for rows with no mask
        m = np.ones(c_off[-1], dtype=np.float32)
        with_mask = np.repeat(has_mask[keep], np.diff(c_off))
        m[with_mask] = (mask.values[m_src] != 0).astype(np.float32)
    return Examples(
        Ragged(prompt.values[p_src], p_off),
        Ragged(comp.values[c_src], c_off),
        beh.values[b_src],
        m,
        np.zeros(0),
        np.zeros(0),
        None,
    )


def _lags(row_versions: list, known: list[str], max_lag: int | None) -> np.ndarray:
    """Per row: its lag behind the newest known version, -1 unknown, -2 stale (0 if unchecked)."""
    out = np.zeros(len(row_versions), dtype=np.int64)
    if max_lag is None or max_lag < 0:
        return out
    cache: dict = {}
    for i, v in enumerate(row_versions):
        if v not in cache:
            idx = version_index(v, known)
            lag = -1 if idx is None else len(known) - 1 - idx
            cache[v] = lag if lag <= max_lag else -2
        out[i] = cache[v]
    return out


def version_index(version: str | None, known: list[str]) -> int | None:
    """Index of `version` in `known` (exact, else a unique prefix of >= 8 characters)."""
    if not version:
        return None
    if version in known:
        return len(known) - 1 - known[::-1].index(version)
    if len(version) >= MIN_VERSION_PREFIX:
        hits = [i for i, k in enumerate(known) if k.startswith(version) or version.startswith(k)]
        if len(hits) == 1:
            return hits[0]
    return None


# --- the schedule -------------------------------------------------------------------------------


class Schedule:
    """Which rows each optimizer step takes: a pure function of (n rows, config[, segments]).

    With segments (the delta layout; segments.py) the unit drawn is a segment: each epoch
    permutes the segments and a step takes whole ones until it holds batch_size rows or more."""

    def __init__(self, n_rows: int, config: TrainConfig, segments: list[np.ndarray] | None = None):
        self.n, self.c = n_rows, config
        self.segments = segments
        self._orders: dict[int, np.ndarray] = {}
        if segments is not None:
            self._bounds = [self._segment_bounds(e) for e in range(config.epochs)]
            total = sum(len(b) for b in self._bounds)
            self.n_steps = min(total, config.max_steps) if config.max_steps else total
            return
        per_epoch = n_rows // config.batch_size if config.drop_last else -(-n_rows // config.batch_size)
        self.steps_per_epoch = per_epoch
        total = per_epoch * config.epochs
        self.n_steps = min(total, config.max_steps) if config.max_steps else total

    def _segment_bounds(self, epoch: int) -> list[tuple[int, int]]:
        sizes = np.array([len(s) for s in self.segments], np.int64)[self._order(epoch)]
        return SG.step_bounds(sizes, self.c.batch_size, self.c.drop_last)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            n = self.n if self.segments is None else len(self.segments)
            if self.c.shuffle:
                rng = np.random.default_rng([self.c.seed, epoch])
                self._orders[epoch] = rng.permutation(n)
            else:
                self._orders[epoch] = np.arange(n)
        return self._orders[epoch]

    def rows(self, step: int) -> tuple[int, np.ndarray]:
        """(epoch, row indices) of step `step` (0-based)."""
        if self.segments is not None:
            epoch = 0
            while step >= len(self._bounds[epoch]):
                step -= len(self._bounds[epoch])
                epoch += 1
            a, b = self._bounds[epoch][step]
            picked = [self.segments[i] for i in self._order(epoch)[a:b]]
            return epoch, np.concatenate(picked).astype(np.int64)
        epoch, k = divmod(step, self.steps_per_epoch)
        bs = self.c.batch_size
        return epoch, self._order(epoch)[k * bs : (k + 1) * bs]


# --- one step: normalisers, split over processes, micro-batches, tensors ------------------------


def max_completion_tokens(ex: Examples, config: TrainConfig) -> int:
    """M of the Dr. GRPO constant: the config's, else the sampler's logged `max_new_tokens`
    (the largest over the usable rows; never below the longest completion), else the longest
    completion in the data."""
    longest = int(ex.completion.lengths.max(initial=1))
    return config.max_completion_tokens or max(ex.max_new_tokens or 0, longest)


def normalisers(ex: Examples, rows: np.ndarray, norm: str, m_tokens: int) -> np.ndarray:
    """ν_i for each row of one *global* batch (loss.py): fixed before any forward pass."""
    n_i = ex.loss_tokens[rows].astype(np.float64)
    if norm == "token":
        return np.full(len(rows), 1.0 / max(n_i.sum(), 1.0))  # 1 / loss tokens in the batch
    if norm == "sequence":
        return 1.0 / (np.maximum(n_i, 1.0) * len(rows))  # 1 / (n_i · S)
    return np.full(len(rows), 1.0 / (len(rows) * m_tokens))  # constant: 1 / (S · M)


def split_over_processes(rows: np.ndarray, lengths: np.ndarray, world: int) -> list[list[int]]:
    """Longest row first to the least-loaded process (ties: lowest rank, then row order)."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(rows)), key=lambda k: (-int(lengths[k]), k)):
        p = min(range(world), key=lambda r: (load[r], r))
        shares[p].append(int(rows[i]))
        load[p] += int(lengths[i])
    return shares


def micro_batches(rows: list[int], seq_len: np.ndarray, config: TrainConfig) -> list[list[list[int]]]:
    """Cut one process's rows into forward passes: a pass is a list of lines (tensor rows),
    a line a list of example rows (several only when packed). See the module docstring."""
    if config.batching == "padded":
        size = config.micro_batch_size
        return [[[r] for r in rows[k : k + size]] for k in range(0, len(rows), size)]
    by_len = sorted(rows, key=lambda r: (-int(seq_len[r]), r))
    if config.batching == "bucketed":
        lines = [[r] for r in by_len]
    else:
        # Pack into lines as long as the longest sequence here: attention costs L² per line
        # with sdpa's block-diagonal mask, so one huge line would waste most of its compute.
        lines = pack_lines(by_len, seq_len, int(seq_len[by_len[0]]))
    return group_lines(lines, seq_len, config.micro_batch_tokens)


def pack_lines(by_len: list[int], seq_len: np.ndarray, capacity: int) -> list[list[int]]:
    """First-fit decreasing bin packing of whole sequences into lines of `capacity` tokens."""
    lines: list[list[int]] = []
    room: list[int] = []
    for r in by_len:
        n = int(seq_len[r])
        slot = next((b for b, free in enumerate(room) if free >= n), None)
        if slot is None:
            lines.append([r])
            room.append(capacity - n)
        else:
            lines[slot].append(r)
            room[slot] -= n
    return lines


def group_lines(lines: list[list[int]], seq_len: np.ndarray, budget: int) -> list[list[list[int]]]:
    """Lines, longest first, into passes while (lines x the pass's longest line) fits the budget."""
    length = [int(sum(seq_len[r] for r in line)) for line in lines]
    order = sorted(range(len(lines)), key=lambda k: (-length[k], k))
    passes: list[list[int]] = []
    for k in order:
        if passes and (len(passes[-1]) + 1) * length[passes[-1][0]] <= budget:
            passes[-1].append(k)
        else:
            passes.append([k])
    return [[lines[k] for k in p] for p in passes]


def forward_passes(ex: Examples, rows: list[int], config: TrainConfig) -> list[list[list[int]] | SharedPass]:
    """One process's rows as forward passes: shared-prefix passes (when on) and ordinary ones."""
    seq_len = ex.seq_len
    if not config.shares_prefix:
        return micro_batches(rows, seq_len, config)
    if config.batching == "padded":
        size = config.micro_batch_size
        return [padded_pass(ex, rows[k : k + size], config.min_shared_prefix) for k in range(0, len(rows), size)]
    shared, rest = shared_passes(ex, rows, seq_len, config.micro_batch_tokens, config.min_shared_prefix)
    return [*shared, *(micro_batches(rest, seq_len, config) if rest else [])]


@dataclass
class StepPlan:
    """What one process does in one optimizer step."""

    epoch: int
    rows: np.ndarray  # the global batch
    coef_of: dict[int, float]  # row -> w_i · ν_i
    micro: list[list[list[int]] | SharedPass]  # this process's forward passes: lines of rows, or shared
    dummy: bool  # this process got no rows: one zero-coefficient pass keeps collectives in step
    seq_tokens: int  # prompt + completion tokens of the global batch
    loss_tokens: int  # loss tokens of the global batch
    sequences: int = 0  # sequences the global batch runs: its segments (rows without segments)
    unique_tokens: int = 0  # unique tokens of the global batch's contexts (segments.unique_tokens)


def plan_step(
    ex: Examples, schedule: Schedule, step: int, config: TrainConfig, world: int, rank: int, m_tokens: int
) -> StepPlan:
    epoch, rows = schedule.rows(step)
    nu = normalisers(ex, rows, config.norm, m_tokens)
    coef_of = {int(r): float(ex.weight[r]) * float(v) for r, v in zip(rows, nu, strict=True)}
    seq_len = ex.seq_len
    units = rows[ex.is_last[rows]]  # the step's sequences: a segment's last row stands for it (segments.py)
    share = split_over_processes(units, seq_len[units], world)[rank]
    dummy = not share
    micro = forward_passes(ex, share, config) if share else [[[int(units[0])]]]
    plan = StepPlan(epoch, rows, coef_of, micro, dummy, int(seq_len[rows].sum()), int(ex.loss_tokens[rows].sum()))
    plan.sequences, plan.unique_tokens = len(units), SG.unique_tokens(ex, rows)
    return plan


@dataclass
class Batch:
    """Tensors of one forward pass. Completion tokens are flat, in row-major order of `keep`."""

    input_ids: object  # LongTensor [B, L]
    position_ids: object  # restarting at 0 for each sequence (and for a line's padding)
    attention_mask: object | None  # bucketed/padded: 1 on real tokens; packed: None
    keep: object  # BoolTensor [B, L]: the positions whose logits score a completion token
    labels: object  # LongTensor [T]: the completion tokens
    behavior: object  # FloatTensor [T]: b_t
    advantage: object  # [T]
    coef: object  # [T]: m_t · w_i · ν_i
    mask: object  # [T]: m_t
    temperature: object | None  # [T] or None
    tokens: int  # real tokens in the pass (a shared prefix counted once per row)
    slots: int  # tokens + padding (B x L when nothing is shared)
    prefix_ids: object | None = None  # LongTensor [P]: the shared prefix (prefix.py), None if none
    row: object | None = None  # LongTensor [T]: the sequence (0..rows-1 of this pass) of each token
    forward: int = 0  # tokens the forward runs (a shared prefix once, padding not counted)


def collate(
    ex: Examples, lines: list[list[int]] | SharedPass, coef_of: dict[int, float], packed: bool, dummy: bool = False
) -> Batch:
    """The tensors of one forward pass: one tensor row per line, right-padded.

    Packed lines carry position ids restarting at 0 for each sequence and no attention mask:
    transformers turns the restarts into a block-diagonal causal mask. Padding after the last
    sequence of a line is a segment of its own, after every real token, so nothing attends to
    it. Unpacked lines get an attention mask instead. A SharedPass has one row per line holding
    the row's tokens after the shared prefix P: position ids P, P+1, ... and a [B, P + L]
    attention mask (the prefix, then the row's own tokens); `prefix_ids` is the prefix.
    """
    import torch

    shared = isinstance(lines, SharedPass)
    cut = lines.prefix if shared else 0  # the tokens of each row that the prefix forward runs
    if shared:
        lines, packed = [[r] for r in lines.rows], False
    rows = [r for line in lines for r in line]  # row-major: the order `keep` flattens in
    seq = {r: ex.sequence(r)[cut:] for r in rows}
    plen, clen = ex.prompt_lens, ex.completion.lengths
    widths = [sum(len(seq[r]) for r in line) for line in lines]
    b, L = len(lines), max(widths)
    ids = np.zeros((b, L), dtype=np.int64)
    keep = np.zeros((b, L), dtype=bool)
    pos = np.zeros((b, L), dtype=np.int64)
    att = np.zeros((b, cut + L), dtype=np.int64)
    att[:, :cut] = 1
    for k, line in enumerate(lines):
        o = 0
        for r in line:
            n = len(seq[r])
            ids[k, o : o + n] = seq[r]
            pos[k, o : o + n] = cut + np.arange(n)
            att[k, cut + o : cut + o + n] = 1
            # The logit at position j predicts token j+1: completion token c (at p + c) is
            # scored by the logit at p + c - 1, so positions p-1 .. p+len-2 of the sequence
            # (p >= 1: a shared prefix leaves every row its last prompt token). A segment
            # (segments.py) scores each member's completion, in order, from the one sequence.
            for m in ex.members(r):
                p = int(plen[m]) - cut
                keep[k, o + p - 1 : o + p + int(clen[m]) - 1] = True
            o += n
        # Packed: the padding is a segment of its own; shared: masked, positions run on.
        pos[k, o:] = cut + o + np.arange(L - o) if shared else np.arange(L - o)
    tokens = sum(widths) + cut * len(rows)  # as if every row ran its whole sequence
    padding = b * L - sum(widths)
    rows = [m for r in rows for m in ex.members(r)]  # the rows scored, in `keep` order
    c_rows = [ex.completion.row(r) for r in rows]
    lo = [slice(ex.completion.offsets[r], ex.completion.offsets[r + 1]) for r in rows]
    mask = np.concatenate(
        [
            ex.loss_mask[s] if ex.loss_mask is not None else np.ones(len(c), np.float32)
            for s, c in zip(lo, c_rows, strict=True)
        ]
    )
    per_tok = lambda vals: np.concatenate([np.full(len(c), v, np.float64) for v, c in zip(vals, c_rows, strict=True)])  # noqa: E731
    coef = per_tok([0.0 if dummy else coef_of[r] for r in rows]) * mask
    t = torch.from_numpy
    return Batch(
        input_ids=t(ids),
        position_ids=t(pos),
        attention_mask=None if packed else t(att),
        keep=t(keep),
        labels=t(np.concatenate(c_rows).astype(np.int64)),
        behavior=t(np.concatenate([ex.behavior[s] for s in lo]).astype(np.float32)),
        advantage=t(per_tok([ex.advantage[r] for r in rows]).astype(np.float32)),
        coef=t(coef.astype(np.float32)),
        mask=t((mask * (0.0 if dummy else 1.0)).astype(np.float32)),
        temperature=None
        if ex.temperature is None
        else t(per_tok([ex.temperature[r] for r in rows]).astype(np.float32)),
        tokens=0 if dummy else int(tokens),
        slots=0 if dummy else int(tokens + padding),
        forward=0 if dummy else int(sum(widths) + cut),
        prefix_ids=t(np.ascontiguousarray(ex.prompt.row(rows[0])[:cut]).astype(np.int64)) if shared else None,
        row=t(np.concatenate([np.full(len(c), i, np.int64) for i, c in enumerate(c_rows)])),
    )
