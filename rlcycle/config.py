"""Stage configs: one dataclass per stage, resolved with one precedence rule.

defaults < config file (TOML) < `--set key=value` < explicit CLI flags.

Every field carries help text (`field(metadata={"help": ...})`). Unknown keys are rejected and
every problem is reported at once, naming where the value came from (CONVENTIONS.md §4).
The resolved config is saved beside the outputs with `save_resolved()`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import tomllib

from rlcycle.errors import InputError

T = TypeVar("T")


def cfg(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A config field with help text; mutable defaults go through default_factory."""
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata={"help": help}, **kw)
    return dataclasses.field(default=default, metadata={"help": help}, **kw)


def field_help(cls: type) -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def parse_sets(sets: list[str] | None) -> dict[str, str]:
    """`--set key=value` pairs (values stay strings; they are coerced per field type)."""
    out: dict[str, str] = {}
    problems = []
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"--set {item!r}: expected key=value")
            continue
        out[key.strip()] = value
    if problems:
        raise InputError("; ".join(problems), hint="e.g. --set maturity_s=3600")
    return out


def load_toml(path: str | Path | None, section: str | None = None) -> dict[str, Any]:
    if path is None:
        return {}
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"config file {p} does not exist", hint="check the --config path") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"config file {p}: {e}", hint="fix the TOML syntax") from None
    if section and section in data and isinstance(data[section], dict):
        return data[section]
    return data


def resolve(
    cls: type[T],
    file: str | Path | None = None,
    sets: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    section: str | None = None,
    data: dict[str, Any] | None = None,
    data_origin: str = "config",
) -> T:
    """Build `cls` from defaults, a TOML file, `--set` pairs and explicit flags (None = unset).

    `data` is a table given in code (e.g. a stage's table of the cycle config), applied before
    the file, with `data_origin` naming it in error messages."""
    layers: list[tuple[str, dict[str, Any]]] = [
        (data_origin, dict(data or {})),
        (f"config file {file}" if file else "config file", load_toml(file, section)),
        ("--set", parse_sets(sets)),
        ("flag", {k: v for k, v in (flags or {}).items() if v is not None}),
    ]
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    problems: list[str] = []
    for origin, layer in layers:
        for key, raw in layer.items():
            if key not in names:
                close = _closest(key, names)
                problems.append(
                    f"{origin}: unknown key {key!r}" + (f" (did you mean {close!r}?)" if close else "")
                )
                continue
            try:
                values[key] = _coerce(raw, hints[key], from_string=(origin == "--set"))
            except (TypeError, ValueError) as e:
                problems.append(f"{origin}: {key}={raw!r}: {e}")
    if problems:
        raise InputError(
            f"{len(problems)} problem(s) in the {cls.__name__}:\n  " + "\n  ".join(problems),
            hint=f"valid keys: {', '.join(sorted(names))}",
        )
    obj = cls(**values)
    check = getattr(obj, "validate", None)
    if check is not None:
        found = check()
        if found:
            raise InputError(
                f"{len(found)} problem(s) in the {cls.__name__}:\n  " + "\n  ".join(found),
                hint="fix the values above (defaults < --config < --set < flags)",
            )
    return obj


def save_resolved(obj: Any, path: str | Path) -> None:
    from rlcycle.io import atomic_write_text

    atomic_write_text(Path(path), json.dumps(dataclasses.asdict(obj), indent=2, default=str) + "\n")


def _closest(key: str, names: set[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, sorted(names), n=1)
    return match[0] if match else None


def _coerce(value: Any, tp: Any, from_string: bool) -> Any:
    """Coerce a TOML value or a --set string to the field type; raise ValueError with a reason."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (from_string and str(value).lower() in ("none", "null", "")):
            return None
        return _coerce(value, args[0], from_string)
    if origin in (list, tuple):
        (item_tp, *_) = typing.get_args(tp) or (str,)
        if from_string and isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, got {type(value).__name__}")
        return [_coerce(v, item_tp, from_string) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"expected a table, got {type(value).__name__}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_string and str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if from_string and str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError("expected an integer, got a boolean")
        if isinstance(value, int):
            return value
        if from_string:
            return int(value)
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError("expected a number, got a boolean")
        if isinstance(value, (int, float)):
            return float(value)
        if from_string:
            return float(value)
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value
