"""Every Arrow contract of rlcycle in one place (docs/design.md "Artifacts" and "Events").

Each contract is a versioned `pyarrow.Schema` whose metadata carries `rlcycle.schema` (its name)
and `rlcycle.schema_version`. Column names are public interface: extend, never rename.

`validate(schema_or_table, contract, source)` returns *every* problem at once (missing columns,
mistyped columns), each naming the file; `check()` raises one InputError listing them all.
Extra columns are allowed (stages extend contracts); a struct column declared open (e.g.
`reward_parts`, one field per configured signal) only has to be a struct.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from rlcycle.errors import InputError

NAME_KEY = b"rlcycle.schema"
VERSION_KEY = b"rlcycle.schema_version"

# Tool calls as collect joins them with their results.
TOOL_CALL = pa.struct(
    [
        ("call_id", pa.string()),
        ("name", pa.string()),
        ("arguments", pa.string()),
        ("status", pa.string()),  # ok / error / invalid / timeout, null if no result arrived
    ]
)
# Tool calls as production logs them (no status yet).
LOGGED_TOOL_CALL = pa.struct([("call_id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])

EVENT_TYPES = ("completion", "tool_result", "edit_outcome", "user_message", "feedback")
TOOL_STATUSES = ("ok", "error", "invalid", "timeout")
FEEDBACK_KINDS = ("thumbs", "accept", "reject")


@dataclass(frozen=True)
class Contract:
    """A named, versioned schema; `open_structs` are struct columns whose fields may vary."""

    name: str
    version: int
    schema: pa.Schema
    open_structs: tuple[str, ...] = ()
    doc: str = ""
    # Columns a file written before they existed may lack (read as null; `conform` adds them).
    optional: tuple[str, ...] = ()

    @property
    def arrow(self) -> pa.Schema:
        """The schema with rlcycle's name/version metadata attached."""
        return self.schema.with_metadata({NAME_KEY: self.name.encode(), VERSION_KEY: str(self.version).encode()})


def _fields(*pairs: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=True) for n, t in pairs])


# A completion's prompt stored once (rlcycle/prompts.py, docs/design.md "Prompts stored once"):
# what it adds to an earlier sample of its session. `prompt_ids` is null in this layout.
PROMPT_DELTA = (
    ("prompt_parent", pa.string()),  # sample_id of an earlier sample of the session; null: a root
    ("prompt_shared", pa.int32()),  # leading tokens of the parent's context (prompt + completion) kept
    ("prompt_added", pa.list_(pa.int32())),  # the prompt's tokens after them (a root: all of it)
)
DELTA_NAMES = tuple(n for n, _ in PROMPT_DELTA)

# --- events: the union of all event types, one row per event (Arrow/Parquet logs) ---------
EVENTS = Contract(
    "events",
    1,
    _fields(
        ("event_id", pa.string()),
        ("type", pa.string()),
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("session_id", pa.string()),
        ("episode_id", pa.string()),
        ("sample_id", pa.string()),
        ("turn", pa.int32()),
        ("policy_version", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        *PROMPT_DELTA,
        ("completion_ids", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float32())),
        ("prompt_messages", pa.list_(MESSAGE)),
        ("completion_text", pa.string()),
        ("tool_calls", pa.list_(LOGGED_TOOL_CALL)),
        ("latency_ms", pa.float64()),
        ("temperature", pa.float32()),
        ("max_new_tokens", pa.int32()),  # extension: the sampler's per-call token limit
        ("greedy", pa.bool_()),  # extension: argmax decoding (the gateway at temperature 0)
        ("top_p", pa.float32()),  # extension: nucleus truncation the sampler applied (1 = none)
        ("pair_key", pa.string()),  # extension: names the same session across policy versions
        ("call_id", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("duration_ms", pa.float64()),
        ("lines_proposed", pa.int32()),
        ("lines_surviving", pa.int32()),
        ("observed_after_s", pa.float64()),
        ("text", pa.string()),
        ("value", pa.float32()),
        ("kind", pa.string()),
        ("request_id", pa.string()),  # extension: the client request a completion answered
    ),
    doc="Production events (input of collect); `type` says which fields apply.",
    optional=("prompt_parent", "prompt_shared", "prompt_added", "request_id"),
)

# Fields each event type must carry (beyond event_id, type, ts, session_id).
REQUIRED_BY_TYPE: dict[str, tuple[str, ...]] = {
    "completion": ("episode_id", "sample_id", "turn", "policy_version", "completion_ids"),
    "tool_result": ("sample_id", "call_id", "status"),
    "edit_outcome": ("sample_id", "call_id", "lines_proposed", "lines_surviving"),
    "user_message": ("episode_id", "text"),
    "feedback": ("value",),  # plus sample_id or episode_id, checked by collect
}

# --- trajectories: one row per model sample, feedback joined -------------------------------
_TRAJECTORY_FIELDS = (
    ("sample_id", pa.string()),
    ("episode_id", pa.string()),
    ("session_id", pa.string()),
    ("turn", pa.int32()),
    ("policy_version", pa.string()),
    ("ts", pa.timestamp("ms", tz="UTC")),
    ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())),
    ("behavior_logprobs", pa.list_(pa.float32())),
    ("tool_calls", pa.list_(TOOL_CALL)),
    ("n_invalid_tool_calls", pa.int32()),
    ("edit_lines_proposed", pa.int32()),
    ("edit_lines_surviving", pa.int32()),
    ("followup_text", pa.string()),
    ("feedback", pa.float32()),
    ("latency_ms", pa.float64()),
    ("is_final_turn", pa.bool_()),
)
# Extensions of the docs/design.md contract (added, nothing renamed):
_TRAJECTORY_EXTENSIONS = (
    ("n_tool_errors", pa.int32()),  # tool results with status error or timeout
    ("edit_outcomes_missing", pa.int32()),  # ok edit calls whose outcome never arrived
    ("feedback_scope", pa.string()),  # "sample" or "episode": where `feedback` came from
    ("feedback_kind", pa.string()),  # thumbs / accept / reject
    ("temperature", pa.float32()),
    ("n_turns", pa.int32()),  # samples in the episode
    ("max_new_tokens", pa.int32()),  # the sampler's per-call token limit (Dr. GRPO's M)
    # How the sample was drawn when it was not plain sampling (null = not logged, i.e. plain):
    # greedy samples and top_p < 1 samples are left out of train's importance-corrected update.
    ("greedy", pa.bool_()),
    ("top_p", pa.float32()),
    ("pair_key", pa.string()),  # the completion's `pair_key`: the same session across versions
    # A client retry's orphan: a later call of the session re-sent this sample's prompt and no
    # call ever continued its completion, so the user never saw it (train leaves it out).
    ("retried", pa.bool_()),
)
# Version 2: prompts stored as deltas (PROMPT_DELTA; `prompt_ids` null) and `retried`.
TRAJECTORIES = Contract(
    "trajectories",
    2,
    _fields(*_TRAJECTORY_FIELDS, *PROMPT_DELTA, *_TRAJECTORY_EXTENSIONS),
    doc="One row per model sample with its feedback joined (output of collect).",
    optional=(*DELTA_NAMES, "retried"),
)

# --- examples: trajectories + rewards and advantages (output of distill) -------------------
EXAMPLES = Contract(
    "examples",
    2,
    _fields(
        *_TRAJECTORY_FIELDS,
        *PROMPT_DELTA,
        ("reward", pa.float32()),
        ("reward_parts", pa.struct([])),
        ("group_key", pa.string()),
        ("advantage", pa.float32()),
        ("weight", pa.float32()),
        ("excluded", pa.string()),
        ("hint", pa.string()),  # extension: the follow-up's hint on its target turn (docs/hints.md)
    ),
    open_structs=("reward_parts",),
    doc="Training examples: trajectory columns, reward parts, advantage (output of distill).",
    optional=DELTA_NAMES,
)

EVAL_RESULTS = Contract(
    "eval_results",
    1,
    _fields(
        ("task_id", pa.string()),
        ("cluster", pa.string()),
        ("policy", pa.string()),
        ("attempt", pa.int32()),
        ("status", pa.string()),  # pass / fail / error (error = infrastructure, not the model)
        ("reward", pa.float32()),
        ("turns", pa.int32()),
        ("n_tool_calls", pa.int32()),
        ("n_invalid_tool_calls", pa.int32()),
        ("edited", pa.bool_()),
        ("asked_clarification", pa.bool_()),
        ("tokens", pa.int64()),
        ("latency_ms", pa.float64()),
    ),
    doc="One row per (task, policy, attempt) of an eval run.",
)

DEPLOYMENTS = Contract(
    "deployments",
    1,
    _fields(
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("action", pa.string()),  # promote / rollback
        ("alias", pa.string()),
        ("checkpoint_id", pa.string()),
        ("previous_id", pa.string()),
        ("verdict", pa.string()),  # path of the verdict.json that allowed it
        ("decision", pa.string()),
        ("actor", pa.string()),
        ("note", pa.string()),
    ),
    doc="Registry history: one row per promotion or rollback.",
)

CONTRACTS: dict[str, Contract] = {c.name: c for c in (EVENTS, TRAJECTORIES, EXAMPLES, EVAL_RESULTS, DEPLOYMENTS)}


def contract_of(schema: pa.Schema) -> Contract | None:
    """The contract named in a schema's metadata, if any."""
    name = (schema.metadata or {}).get(NAME_KEY)
    return CONTRACTS.get(name.decode()) if name else None


def _type_ok(actual: pa.DataType, expected: pa.DataType, open_struct: bool) -> bool:
    if open_struct:
        return pa.types.is_struct(actual)
    if actual.equals(expected):
        return True
    # Large/small variants carry the same data; readers like polars write large_string etc.
    widen = {
        pa.string(): (pa.large_string(), pa.string_view()),
    }
    if expected in widen and actual in widen[expected]:
        return True
    if pa.types.is_list(expected) and (pa.types.is_list(actual) or pa.types.is_large_list(actual)):
        return _type_ok(actual.value_type, expected.value_type, False)
    if pa.types.is_struct(expected) and pa.types.is_struct(actual):
        got = {f.name: f.type for f in actual}
        return all(f.name in got and _type_ok(got[f.name], f.type, False) for f in expected)
    return False


def validate(obj: pa.Schema | pa.Table, contract: Contract, source: str = "<input>") -> list[str]:
    """Every problem of `obj` against `contract`, each naming `source`; [] when it conforms."""
    schema = obj.schema if isinstance(obj, pa.Table) else obj
    problems = []
    declared = contract_of(schema)
    if declared is not None and declared.name != contract.name:
        problems.append(f"{source}: is a {declared.name!r} file, expected {contract.name!r}")
    version = (schema.metadata or {}).get(VERSION_KEY)
    if declared is not None and version and int(version) > contract.version:
        problems.append(
            f"{source}: schema version {int(version)} is newer than this rlcycle reads ({contract.version})"
        )
    names = set(schema.names)
    for f in contract.schema:
        if f.name not in names and f.name in contract.optional:
            continue
        if f.name not in names:
            problems.append(f"{source}: missing column {f.name!r} ({f.type})")
            continue
        actual = schema.field(f.name).type
        if not _type_ok(actual, f.type, f.name in contract.open_structs):
            problems.append(f"{source}: column {f.name!r} is {actual}, expected {f.type}")
    return problems


def check(obj: pa.Schema | pa.Table, contract: Contract, source: str = "<input>") -> None:
    """Raise one InputError that lists every problem found by `validate`."""
    problems = validate(obj, contract, source)
    if problems:
        raise InputError(
            f"{len(problems)} schema problem(s):\n  " + "\n  ".join(problems),
            hint=f"`rlcycle inspect {source}` shows its schema; expected the "
            f"{contract.name} v{contract.version} contract (see docs/design.md)",
        )


def conform(table: pa.Table, contract: Contract) -> pa.Table:
    """Select and order the contract's columns (extras kept after them), cast, tag metadata."""
    names = [f.name for f in contract.schema]
    extras = [n for n in table.column_names if n not in names]
    cols, fields = [], []
    for f in contract.schema:
        col = table.column(f.name) if f.name in table.column_names else pa.nulls(len(table), f.type)
        if f.name not in contract.open_structs and not col.type.equals(f.type):
            col = col.cast(f.type)
        cols.append(col)
        fields.append(pa.field(f.name, col.type))
    for n in extras:
        cols.append(table.column(n))
        fields.append(table.schema.field(n))
    schema = pa.schema(fields).with_metadata(contract.arrow.metadata)
    return pa.Table.from_arrays(cols, schema=schema)
