"""The reward spec: which signals make the reward, each with its weight, transform, clip and cap.

A spec is a TOML file (documented in docs/distill.md; the shipped sample is
sample_data/rewards.toml):

    [distill]                      # optional: DistillConfig keys (--set overrides them)
    normalization = "loo"

    [signals.invalid_tool_call]    # a built-in signal, by name; unset keys take its defaults
    weight = -1.0
    clip = [0.0, 3.0]

    [signals.mine]                 # a custom signal, by dotted path
    fn = "mypkg.rewards:mine"
    weight = 0.2
    params = { threshold = 3 }

Keys of every signal: `weight` (number), `transform` (identity, sign, tanh, log1p, sqrt),
`clip` ([low, high] applied after the transform, before the weight), `cap` (the most this
signal may make of the batch's total |reward|, in (0, 1]) and, for episode signals, `credit`
(all / final). Built-in signals take their own params as plain keys (`budget_ms = 4000`);
custom ones take `fn`, `scope` (sample / episode), `columns` and a `params` table.

Only the signals listed are used. No spec at all means every built-in with its defaults.
`parse_spec` reports every problem of a spec at once: unknown signals and keys (with a "did
you mean"), wrong types, a negative cap, a clip upside down, an import path that does not load.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlcycle.config import read_toml
from rlcycle.distill.signals import BUILTINS, TRANSFORMS
from rlcycle.errors import InputError

COMMON_KEYS = ("weight", "transform", "clip", "cap", "credit")
CUSTOM_KEYS = ("fn", "scope", "columns", "params")
TOP_KEYS = ("signals", "distill")
CREDITS = ("all", "final")
SCOPES = ("sample", "episode")


@dataclass
class SignalSpec:
    """One signal of the reward, fully resolved (defaults filled in)."""

    name: str
    weight: float
    transform: str = "identity"
    clip: tuple[float, float] | None = None
    cap: float = 1.0
    credit: str | None = None  # episode signals: all / final; None = the stage's `credit`
    scope: str = "sample"
    params: dict[str, Any] = field(default_factory=dict)
    fn: str | None = None  # custom signals: "module:function"
    columns: list[str] | None = None  # custom signals: the columns its function receives

    @property
    def builtin(self) -> bool:
        return self.fn is None


@dataclass
class RewardSpec:
    signals: list[SignalSpec]
    distill: dict[str, Any] = field(default_factory=dict)  # the [distill] table, if any
    source: str = "<built-in defaults>"

    def names(self) -> list[str]:
        return [s.name for s in self.signals]

    def get(self, name: str) -> SignalSpec | None:
        return next((s for s in self.signals if s.name == name), None)

    def params_of(self, name: str) -> dict[str, Any]:
        """A built-in's params from the spec, else its defaults (features need some always)."""
        s = self.get(name)
        return dict(s.params) if s is not None else dict(BUILTINS[name].params)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "signals": [asdict(s) for s in self.signals], "distill": self.distill}

    def digest(self) -> str:
        """A content hash of the resolved spec (recorded in the output's metadata)."""
        body = json.dumps(
            {"signals": [asdict(s) for s in self.signals], "distill": self.distill}, sort_keys=True, default=str
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def default_spec() -> RewardSpec:
    """Every built-in signal with its defaults."""
    return RewardSpec([_builtin_spec(name, {}, []) for name in BUILTINS])


def load_spec(path: str | Path | None) -> RewardSpec:
    """Read and validate a spec file; None gives `default_spec()`."""
    if path is None:
        return default_spec()
    data = read_toml(path, "reward spec", hint="pass --spec sample_data/rewards.toml")
    return parse_spec(data, str(path))


def parse_spec(data: dict[str, Any], source: str = "<spec>") -> RewardSpec:
    """Validate a spec's TOML data; raise one InputError listing every problem."""
    problems: list[str] = []
    for key in data:
        if key not in TOP_KEYS:
            problems.append(f"unknown top-level key {key!r}{_did_you_mean(key, TOP_KEYS)}")
    tables = data.get("signals", {})
    if not isinstance(tables, dict) or not tables:
        problems.append("no [signals.NAME] tables: name at least one signal")
        tables = {}
    specs = []
    for name, table in tables.items():
        found: list[str] = []
        if not isinstance(table, dict):
            found.append("expected a table of keys")
        elif "fn" in table:
            specs.append(_custom_spec(name, table, found))
        elif name in BUILTINS:
            specs.append(_builtin_spec(name, table, found))
        else:
            found.append(
                f"unknown signal{_did_you_mean(name, BUILTINS)}; built-ins: {', '.join(BUILTINS)}; "
                "a custom signal needs fn = 'module:function'"
            )
        problems += [f"[signals.{name}] {p}" for p in found]
    distill = data.get("distill", {})
    if not isinstance(distill, dict):
        problems.append("[distill] must be a table")
    if problems:
        raise InputError(
            f"{len(problems)} problem(s) in reward spec {source}:\n  " + "\n  ".join(problems),
            hint="see docs/distill.md for every signal and key; sample_data/rewards.toml is a valid spec",
        )
    return RewardSpec([s for s in specs if s is not None], distill if isinstance(distill, dict) else {}, source)


# --- one signal ------------------------------------------------------------------------------


def _builtin_spec(name: str, table: dict[str, Any], problems: list[str]) -> SignalSpec:
    b = BUILTINS[name]
    allowed = (*COMMON_KEYS, *b.params)
    for key in table:
        if key not in allowed:
            extra = " (custom signals only)" if key in CUSTOM_KEYS else ""
            problems.append(f"unknown key {key!r}{_did_you_mean(key, allowed)}{extra}")
    params = {}
    for key, default in b.params.items():
        params[key] = _typed(table.get(key, default), default, key, problems)
    if params.get("classifier"):  # a dotted-path hook: it must load now, not mid-run
        try:
            resolve_callable(params["classifier"])
        except InputError as e:
            problems.append(f"classifier: {e.message}")
    spec = SignalSpec(name, weight=b.weight, clip=b.clip, cap=b.cap, credit=b.credit, scope=b.scope, params=params)
    _common(spec, table, problems)
    return spec


def _custom_spec(name: str, table: dict[str, Any], problems: list[str]) -> SignalSpec:
    allowed = (*COMMON_KEYS, *CUSTOM_KEYS)
    for key in table:
        if key not in allowed:
            problems.append(f"unknown key {key!r}{_did_you_mean(key, allowed)}")
    fn = table["fn"]
    if not isinstance(fn, str):
        problems.append(f"fn={fn!r}: expected 'module:function'")
    else:
        try:
            resolve_callable(fn)
        except InputError as e:
            problems.append(e.message)
    scope = table.get("scope", "sample")
    if scope not in SCOPES:
        problems.append(f"scope={scope!r}: expected one of {', '.join(SCOPES)}")
    params = table.get("params", {})
    if not isinstance(params, dict):
        problems.append("params: expected a table")
        params = {}
    columns = table.get("columns")
    if columns is not None and not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        problems.append("columns: expected a list of column names")
        columns = None
    spec = SignalSpec(
        name, weight=1.0, scope=scope, params=params, fn=fn if isinstance(fn, str) else None, columns=columns
    )
    _common(spec, table, problems)
    return spec


def _common(spec: SignalSpec, table: dict[str, Any], problems: list[str]) -> None:
    """weight, transform, clip, cap, credit: checked and set on `spec`."""
    if "weight" in table:
        w = table["weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            problems.append(f"weight={w!r}: expected a finite number")
        else:
            spec.weight = float(w)
    t = table.get("transform", spec.transform)
    if t not in TRANSFORMS:
        problems.append(f"transform={t!r}: expected one of {', '.join(TRANSFORMS)}{_did_you_mean(str(t), TRANSFORMS)}")
    else:
        spec.transform = t
    if "clip" in table:
        spec.clip = _clip(table["clip"], problems)
    if "cap" in table:
        cap = table["cap"]
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not (0 < cap <= 1):
            problems.append(
                f"cap={cap!r}: must be a share of the total in (0, 1] (negative or zero caps make no sense)"
            )
        else:
            spec.cap = float(cap)
    if "credit" in table:
        if spec.scope != "episode":
            problems.append("credit: only episode signals take a credit setting (sample signals stay on their sample)")
        elif table["credit"] not in CREDITS:
            problems.append(f"credit={table['credit']!r}: expected one of {', '.join(CREDITS)}")
        else:
            spec.credit = table["credit"]


def _clip(value: Any, problems: list[str]) -> tuple[float, float] | None:
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    )
    if not ok:
        problems.append(f"clip={value!r}: expected [low, high] (use -inf / inf for one side)")
        return None
    lo, hi = float(value[0]), float(value[1])
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        problems.append(f"clip={value!r}: low must be <= high")
        return None
    return lo, hi


def _typed(value: Any, default: Any, key: str, problems: list[str]) -> Any:
    """`value` checked against the type of the param's default."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, list):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        ok = isinstance(value, str)
    if not ok:
        problems.append(f"{key}={value!r}: expected {type(default).__name__} like {default!r}"[:160])
    return value if ok else default


def _did_you_mean(key: str, names) -> str:
    match = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


# --- dotted paths ----------------------------------------------------------------------------


def resolve_callable(path: str) -> Callable:
    """`"pkg.mod:attr"` (or `"pkg.mod.attr"`) to the object; InputError naming what failed."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise InputError(f"fn={path!r}: expected 'module:function'")
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # ImportError, or the module's own import-time failure
        raise InputError(f"{path!r}: cannot import {module!r} ({type(e).__name__}: {e})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{path!r}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(f"{path!r} is not callable")
    return obj
