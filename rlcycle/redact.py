"""Secret redaction for text that collect writes (trajectories and quarantine files).

Every text field collect writes (follow-up messages, tool-call arguments, tool errors, the raw
text of quarantined records) passes through `redact_column` (vectorised, polars) or
`redact_text` (Python) before anything is written; each replacement is counted per pattern.

A match becomes `[REDACTED:<name>]` (for passwords in URLs only the password is replaced).
Extend the list in a collect config: `[collect.secret_patterns] my_token = "myco_[0-9a-f]{32}"`.

What this cannot redact, by design:
- token ids (`prompt_ids`, `completion_ids`): a secret the model read or wrote is also present
  as token ids, which are kept verbatim because training must see exactly what was sampled.
  Redact at the source (the serving gateway) if secrets must never reach training data.
- secrets that match no pattern (custom formats, split across fields, base64-wrapped).
- prompt text (`prompt_messages`) and `completion_text` are not written by collect at all.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: str  # Rust-regex and Python-re compatible
    keep_prefix_group: bool = False  # replace only what follows group 1


# Order matters: URL passwords before e-mail addresses (user:pass@host looks like an address).
DEFAULT_PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "private_key",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    ),
    Pattern("anthropic_key", r"sk-ant-[A-Za-z0-9_\-]{20,}"),
    Pattern("openai_key", r"sk-(?:proj-)?[A-Za-z0-9_\-]{20,}"),
    Pattern("github_token", r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    Pattern("aws_access_key", r"(?:AKIA|ASIA)[0-9A-Z]{16}"),
    Pattern("google_api_key", r"AIza[0-9A-Za-z_\-]{35}"),
    Pattern("slack_token", r"xox[abprs]-[A-Za-z0-9\-]{10,}"),
    Pattern("stripe_key", r"[sr]k_live_[0-9A-Za-z]{24,}"),
    Pattern("huggingface_token", r"hf_[A-Za-z0-9]{30,}"),
    Pattern("jwt", r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"),
    Pattern("bearer_token", r"((?i:bearer)\s+)[A-Za-z0-9._~+/=\-]{20,}", keep_prefix_group=True),
    Pattern("url_password", r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/\s@]+:)[^@\s/]+(?:@)", keep_prefix_group=True),
    Pattern("email", r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}"),
)


def patterns_with(extra: dict[str, str] | None) -> tuple[Pattern, ...]:
    """The default patterns plus user ones (validated: a bad regex is an input error)."""
    from rlcycle.errors import InputError

    out = list(DEFAULT_PATTERNS)
    problems = []
    for name, regex in (extra or {}).items():
        try:
            re.compile(regex)
        except re.error as e:
            problems.append(f"secret pattern {name!r}: {e}")
            continue
        out.append(Pattern(name, regex))
    if problems:
        raise InputError("; ".join(problems), hint="fix the regex in [collect.secret_patterns]")
    return tuple(out)


def _replacement(p: Pattern, polars: bool) -> str:
    tag = f"[REDACTED:{p.name}]"
    if not p.keep_prefix_group:
        return tag
    suffix = "@" if p.name == "url_password" else ""
    return ("${1}" if polars else r"\1") + tag + suffix


def redact_column(
    df: pl.DataFrame, column: str, patterns: tuple[Pattern, ...], counts: Counter
) -> pl.DataFrame:
    """Redact one string column; add the number of replacements per pattern to `counts`.

    One vectorised pass finds the rows that may hold a secret (few, in practice); only those
    go through `redact_text`, so the counts match what was replaced, pattern by pattern.
    """
    if df.height == 0 or column not in df.columns:
        return df
    any_secret = "|".join(f"(?:{p.regex})" for p in patterns)
    mask = df.get_column(column).str.contains(any_secret).fill_null(False)
    if not mask.any():
        return df
    idx = mask.arg_true()
    values = df.get_column(column).to_list()
    for i in idx.to_list():
        values[i] = redact_text(values[i], patterns, counts)
    return df.with_columns(pl.Series(column, values, dtype=pl.String))


_compiled: dict[str, re.Pattern[str]] = {}


def redact_text(text: str | None, patterns: tuple[Pattern, ...], counts: Counter) -> str | None:
    """Redact one string (quarantine records, error messages)."""
    if not text:
        return text
    for p in patterns:
        rx = _compiled.get(p.regex) or _compiled.setdefault(p.regex, re.compile(p.regex))
        text, n = rx.subn(_replacement(p, polars=False), text)
        if n:
            counts[p.name] += n
    return text
