"""Stage configs: one dataclass per stage, resolved with one precedence rule.

defaults < config file (TOML) < `--set key=value` < explicit CLI flags.

Every field carries help text (`field(metadata={"help": ...})`). Unknown keys are rejected and
every problem is reported at once, naming where the value came from (docs/design.md, "Conventions every command follows").
The resolved config is saved beside the outputs with `save_resolved()`.

Shared by every config: `read_toml` (the one TOML reader; a syntax error names the file, line
and column) and `check_range` (the one "x must be in [a, b]" check of `validate()` methods).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import tomllib

from rlcycle.errors import InputError

T = TypeVar("T")


def cfg(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A config field with help text; mutable defaults go through default_factory.

    A nested config's default is an instance (`lora: LoraConfig = cfg(LoraConfig(), help=...)`),
    copied for each new object."""
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata={"help": help}, **kw)
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        instance = default
        return dataclasses.field(default_factory=lambda: copy.deepcopy(instance), metadata={"help": help}, **kw)
    return dataclasses.field(default=default, metadata={"help": help}, **kw)


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


# --- TOML ------------------------------------------------------------------------------------


def loads_toml(text: str, source: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error raises InputError `SOURCE:LINE:COL: not valid TOML (why)`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line, col, why = _toml_position(e, text)
        raise InputError(f"{source}:{line}:{col}: not valid TOML ({why})", hint="fix the TOML syntax") from None


def read_toml(path: str | Path, what: str = "config file", hint: str = "check the --config path") -> dict[str, Any]:
    """A TOML file as a dict. Errors name `what` and the file (and the line and column of a
    syntax error); `hint` is for a file that cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {p} does not exist", hint=hint) from None
    except IsADirectoryError:
        raise InputError(f"{what} {p} is a directory, not a TOML file", hint=hint) from None
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {p}: not UTF-8 text (byte {e.start})", hint="TOML files are UTF-8") from None
    return loads_toml(text, f"{what} {p}")


def _toml_position(e: tomllib.TOMLDecodeError, text: str) -> tuple[int, int, str]:
    """(line, column, reason) of a TOML error: attributes on Python 3.14+, the message before."""
    if getattr(e, "lineno", None) is not None:
        return e.lineno, e.colno, e.msg  # type: ignore[attr-defined]
    message = str(e)
    m = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message, flags=re.S)
    if m:
        return int(m.group(2)), int(m.group(3)), m.group(1)
    lines = text.splitlines() or [""]  # "(at end of document)": the position after the last character
    return len(lines), len(lines[-1]) + 1, message.removesuffix(" (at end of document)")


def load_toml(path: str | Path | None, section: str | None = None) -> dict[str, Any]:
    """A config file's table `section` (the whole file when it has none); {} for no file."""
    if path is None:
        return {}
    data = read_toml(path)
    if section and section in data and isinstance(data[section], dict):
        return data[section]
    return data


# --- validate() helpers -----------------------------------------------------------------------


DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


def check_dtype(problems: list[str], dtype: str, key: str = "dtype") -> None:
    """Append a problem when `dtype` is not one a model can be loaded in."""
    if dtype not in DTYPE_NAMES:
        problems.append(f"{key}={dtype!r}: use {', '.join(DTYPE_NAMES)}")


def check_range(
    problems: list[str],
    obj: Any,
    names: str | Iterable[str],
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    optional: bool = False,
    finite: bool = False,
) -> None:
    """Append `name=value: must be ...` to `problems` for each field of `obj` out of range.

    Bounds: `ge` (>=) or `gt` (>) below, `le` (<=) or `lt` (<) above; NaN is always out of
    range, `finite=True` rejects infinities too, `optional=True` lets None pass.

        check_range(p, self, ("batch_size", "epochs"), ge=1)   # batch_size=0: must be >= 1
        check_range(p, self, "top_p", gt=0, le=1)              # top_p=0: must be in (0, 1]
    """
    lo, lo_open = (gt, True) if gt is not None else (ge, False)
    hi, hi_open = (lt, True) if lt is not None else (le, False)
    for name in (names,) if isinstance(names, str) else names:
        value = getattr(obj, name)
        if value is None and optional:
            continue
        ok = value is not None and not (finite and not math.isfinite(value))
        ok = ok and (lo is None or (value > lo if lo_open else value >= lo))
        ok = ok and (hi is None or (value < hi if hi_open else value <= hi))
        if not ok:
            problems.append(
                f"{name}={value}: must be {_range_text(lo, lo_open, hi, hi_open, finite)}"
                + (" (or none)" if optional else "")
            )


def _range_text(lo: float | None, lo_open: bool, hi: float | None, hi_open: bool, finite: bool) -> str:
    num = "a finite number " if finite else ""
    if lo is not None and hi is not None:
        return f"{num}in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{num}{'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f"{num}{'<' if hi_open else '<='} {hi:g}"
    return "a finite number" if finite else "set"


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
    the file, with `data_origin` naming it in error messages.

    A field typed as a dataclass (`lora: LoraConfig`) is a nested config: a table for it (TOML
    `[train.lora]`, `data={"lora": {...}}`, `--set lora={r = 16}`) or a dotted key at any depth
    (`--set lora.r=16`, flags `{"runner.max_new_tokens": 512}`) sets only the keys it names, over
    the field's default. Unknown keys (with a did-you-mean), values of the wrong type and each
    level's `validate()` problems are reported all at once with their dotted path."""
    layers: list[tuple[str, dict[str, Any]]] = [
        (data_origin, dict(data or {})),
        (f"config file {file}" if file else "config file", load_toml(file, section)),
        ("--set", parse_sets(sets)),
        ("flag", {k: v for k, v in (flags or {}).items() if v is not None}),
    ]
    values: dict[str, Any] = {}
    problems: list[str] = []
    unknown_in: dict[str, type] = {}  # dotted prefix -> class where an unknown key was given
    for origin, layer in layers:
        for key, raw in layer.items():
            _assign(cls, values, key.split("."), raw, origin, origin == "--set", "", problems, unknown_in)
    if problems:
        raise InputError(
            f"{len(problems)} problem(s) in the {cls.__name__}:\n  " + "\n  ".join(problems),
            hint=_keys_hint(cls, unknown_in),
        )
    try:
        obj = _build(cls, None, values)
    except TypeError as e:  # a field without a default that no layer set
        raise InputError(f"{cls.__name__}: {e}", hint="set every required key") from None
    ensure_valid(obj)
    return obj


def ensure_valid(obj: Any) -> None:
    """Raise InputError listing every problem of `validate_all(obj)` (none: return)."""
    found = validate_all(obj)
    if found:
        raise InputError(
            f"{len(found)} problem(s) in the {type(obj).__name__}:\n  " + "\n  ".join(found),
            hint="fix the values above (defaults < --config < --set < flags)",
        )


def validate_all(obj: Any, prefix: str = "") -> list[str]:
    """Problems of `obj.validate()` and of every nested config's, each named by its dotted path
    (`lora.r=-1: must be >= 0`); nested configs first, in field order."""
    found: list[str] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found += validate_all(value, f"{prefix}{f.name}.")
    check = getattr(obj, "validate", None)
    own = list(check()) if check is not None else []
    if prefix:
        names = {f.name for f in dataclasses.fields(obj)}
        own = [f"{prefix}{p}" if _names_field(p, names) else f"{prefix[:-1]}: {p}" for p in own]
    return found + own


def nested_class(tp: Any) -> type | None:
    """The dataclass a field type names (`LoraConfig`, `LoraConfig | None`), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _names_field(problem: str, names: set[str]) -> bool:
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", problem)
    return bool(m and m.group(0) in names)


def _assign(
    cls: type,
    values: dict[str, Any],
    path: list[str],
    raw: Any,
    origin: str,
    from_string: bool,
    prefix: str,
    problems: list[str],
    unknown_in: dict[str, type],
) -> None:
    """Put `raw` at `path` (a dotted key, split) of the value tree of `cls`, coerced to the
    field's type; a problem (naming `origin` and the dotted key) goes to `problems`."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    head, rest = path[0], path[1:]
    dotted = prefix + ".".join(path)
    if head not in fields:
        close = _nested_name(cls, head) or _closest(head, set(fields))
        problems.append(
            f"{origin}: unknown key {prefix + head!r}" + (f" (did you mean {prefix + close!r}?)" if close else "")
        )
        unknown_in.setdefault(prefix, cls)
        return
    tp = typing.get_type_hints(cls)[head]
    sub = nested_class(tp)
    if sub is not None:
        if not rest and from_string and isinstance(raw, str):
            raw, from_string = _toml_value(raw), False  # `--set lora={r = 16}`
        if not rest and isinstance(raw, sub):
            raw = {f.name: getattr(raw, f.name) for f in dataclasses.fields(raw)}
        if not rest and raw is None and typing.get_origin(tp) in (typing.Union, types.UnionType):
            values[head] = None
            return
        if not rest and not isinstance(raw, dict):
            problems.append(f"{origin}: {dotted}={raw!r}: expected a table of {sub.__name__} keys")
            return
        table = values.get(head)
        if not isinstance(table, dict):
            values[head] = table = {}
        items = [(rest, raw)] if rest else [(k.split("."), v) for k, v in raw.items()]
        for subpath, v in items:
            _assign(sub, table, subpath, v, origin, from_string, f"{prefix}{head}.", problems, unknown_in)
        return
    if rest and typing.get_origin(tp) is dict:
        # `--set meta.k=v` on a plain table field: one key of the table, merged over what is there.
        table = values.get(head)
        values[head] = table = dict(_field_default(cls, head) if table is None else table)
        table[".".join(rest)] = _toml_value(raw) if from_string else raw
        return
    if rest:
        problems.append(f"{origin}: unknown key {dotted!r} ({prefix + head!r} is not a table)")
        return
    try:
        values[head] = _coerce(raw, tp, from_string=from_string)
    except (TypeError, ValueError) as e:
        problems.append(f"{origin}: {dotted}={raw!r}: {e}")


def _nested_name(cls: type, name: str, prefix: str = "") -> str | None:
    """The dotted key of a field called `name` in a nested config of `cls` (`runner.top_p` for
    `top_p`), depth first; None when there is none."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = nested_class(hints[f.name])
        if sub is None:
            continue
        if name in {g.name for g in dataclasses.fields(sub)}:
            return f"{prefix}{f.name}.{name}"
        found = _nested_name(sub, name, f"{prefix}{f.name}.")
        if found:
            return found
    return None


def _build(cls: type, base: Any, values: dict[str, Any]) -> Any:
    """An instance of `cls`: `base` (or the class defaults) with `values` over it; a nested
    config's table of values goes over that field's own default, key by key."""
    kwargs: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        sub = nested_class(hints[name])
        if sub is not None and isinstance(value, dict):
            inner = getattr(base, name) if base is not None else _default_of(cls, name)
            kwargs[name] = _build(sub, inner, value)
        else:
            kwargs[name] = value
    if base is not None:
        return dataclasses.replace(base, **kwargs)
    return cls(**kwargs)


def _default_of(cls: type, name: str) -> Any:
    """The default value of field `name` of `cls` (None when it has none)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _keys_hint(cls: type, unknown_in: dict[str, type]) -> str:
    if not unknown_in or list(unknown_in) == [""]:
        return f"valid keys: {', '.join(sorted(f.name for f in dataclasses.fields(cls)))}"
    parts = [
        f"valid keys{' of ' + prefix[:-1] if prefix else ''}: "
        + ", ".join(prefix + n for n in sorted(f.name for f in dataclasses.fields(c)))
        for prefix, c in unknown_in.items()
    ]
    return "; ".join(parts)


def _field_default(cls: type, name: str) -> dict[str, Any]:
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return dict(field.default_factory())
    return dict(field.default) if isinstance(field.default, dict) else {}


def _toml_value(raw: str) -> Any:
    """A `--set table.key=value` value read as TOML (16, 1e-4, true, "x"), else the string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


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
        # `bool | str` (gradient_checkpointing = true / "auto"): the first type that takes it.
        for arg in args[:-1]:
            try:
                return _coerce(value, arg, from_string)
            except (TypeError, ValueError):
                continue
        return _coerce(value, args[-1], from_string)
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


# --- help ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class KeyHelp:
    """One key of a config as `--help-config` and docs/config.md show it."""

    key: str  # dotted for a nested config's keys: runner.max_new_tokens
    type: str  # int, float | none, list[str], table (a nested config)
    default: str  # TOML-like: 256, "local", none, ["all-linear"]; "" for a table
    help: str


def describe(cls: type, prefix: str = "") -> list[KeyHelp]:
    """Every key of `cls` in field order: a nested config's own row (type `table`), then its
    keys, dotted. Defaults are the instance defaults (a nested field's default instance, so a
    table whose default differs from its class shows what this config really starts from)."""
    return _describe(cls, _default_instance(cls), prefix)


def _describe(cls: type, obj: Any, prefix: str) -> list[KeyHelp]:
    rows: list[KeyHelp] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, value = prefix + f.name, getattr(obj, f.name, dataclasses.MISSING)
        sub = nested_class(hints[f.name])
        if sub is not None and (value is None or dataclasses.is_dataclass(value)):
            rows.append(KeyHelp(key, f"table ({sub.__name__})", "" if value is not None else "none", _help(f)))
            rows += _describe(sub, value if value is not None else _default_instance(sub), key + ".")
            continue
        rows.append(KeyHelp(key, type_name(hints[f.name]), _default_text(value), _help(f)))
    return rows


def _default_instance(cls: type) -> Any:
    """`cls()` when every field has a default, else an object with the defaults there are."""
    try:
        return cls()
    except TypeError:
        given = {
            f.name: _default_of(cls, f.name)
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        }
        return types.SimpleNamespace(**given)


def _help(f: dataclasses.Field) -> str:
    return " ".join(str(f.metadata.get("help", "")).split())


def type_name(tp: Any) -> str:
    """A field type as a reader spells it: `int`, `float | none`, `list[str]`, `table`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("none" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        (item, *_) = typing.get_args(tp) or (str,)
        return f"list[{type_name(item)}]"
    if origin is dict:
        return "table"
    return getattr(tp, "__name__", str(tp))


def _default_text(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_default_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_default_text(v)}" for k, v in value.items()) + "}"
    return repr(value)
