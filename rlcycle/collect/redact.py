"""Secret redaction for text that collect writes (trajectories and quarantine files).

In: strings (a polars column, or a list of texts such as quarantined records) and the patterns.
Out: the same strings with every match replaced, and the number of replacements per pattern
added to a `Counter`. Every text field collect writes (follow-up messages, tool-call arguments,
tool errors, the raw text and reason of quarantined records) passes through here first.

A match becomes `[REDACTED:<name>]` (for passwords in URLs only the password is replaced).
Extend the list in a collect config: `[collect.secret_patterns] my_token = "myco_[0-9a-f]{32}"`.

Linear time on every input: all matching runs in polars' regex engine (Rust `regex`, finite
automata, no backtracking), so a 5 MB record costs a few passes over 5 MB. Python's `re` is not
used: patterns such as the e-mail one backtrack over a long run of letters, quadratic in its
length (a 200 KB bad line took 90 s). A user pattern must therefore be valid Rust-regex syntax
(no look-around, no back-references); it is checked when the config is read.

What this cannot redact, by design:
- token ids (`prompt_ids`, `completion_ids`): a secret the model read or wrote is also present
  as token ids, which are kept verbatim because training must see exactly what was sampled.
  Redact at the source (the serving gateway) if secrets must never reach training data.
- secrets that match no pattern (custom formats, split across fields, base64-wrapped).
- prompt text (`prompt_messages`) and `completion_text` are not written by collect at all.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl

from rlcycle.errors import InputError


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: str  # Rust-regex syntax (polars)
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
    """The default patterns plus user ones (validated by the engine that runs them)."""
    out = list(DEFAULT_PATTERNS)
    problems = []
    probe = pl.Series([""], dtype=pl.String)
    for name, regex in (extra or {}).items():
        try:
            probe.str.contains(regex)
        except pl.exceptions.PolarsError as e:
            detail = " ".join(str(e).split("This error occurred")[0].split())[:300]
            problems.append(f"secret pattern {name!r}: not a valid regex ({detail})")
            continue
        out.append(Pattern(name, regex))
    if problems:
        raise InputError(
            "; ".join(problems),
            hint="fix the regex in [collect.secret_patterns] (Rust regex syntax: no look-around or back-references)",
        )
    return tuple(out)


def _replacement(p: Pattern) -> str:
    tag = f"[REDACTED:{p.name}]".replace("$", "$$")  # `$` starts a group reference in polars
    if not p.keep_prefix_group:
        return tag
    suffix = "@" if p.name == "url_password" else ""
    return "${1}" + tag + suffix


def _any_secret(patterns: tuple[Pattern, ...]) -> str:
    return "|".join(f"(?:{p.regex})" for p in patterns)


def redact_series(values: pl.Series, patterns: tuple[Pattern, ...], counts: Counter) -> pl.Series:
    """Redact a string Series; add the number of replacements per pattern to `counts`.

    One vectorised pass finds the rows that may hold a secret (few, in practice); only those
    get the per-pattern passes, in order, each counted before it replaces (so the counts are
    what was replaced, pattern by pattern, exactly as a sequence of substitutions would give).
    """
    if not patterns or values.len() == 0:
        return values
    mask = values.str.contains(_any_secret(patterns)).fill_null(False)
    if not mask.any():
        return values
    idx = mask.arg_true()
    hits = values.filter(mask)
    for p in patterns:
        n = hits.str.count_matches(p.regex).sum()
        if n:
            counts[p.name] += int(n)
            hits = hits.str.replace_all(p.regex, _replacement(p))
    return values.clone().scatter(idx, hits)


def redact_column(df: pl.DataFrame, column: str, patterns: tuple[Pattern, ...], counts: Counter) -> pl.DataFrame:
    """Redact one string column of a frame (see `redact_series`)."""
    if df.height == 0 or column not in df.columns:
        return df
    return df.with_columns(redact_series(df.get_column(column), patterns, counts).alias(column))


def redact_texts(texts: list[str | None], patterns: tuple[Pattern, ...], counts: Counter) -> list[str | None]:
    """Redact a batch of strings (quarantined records and reasons) in one engine call."""
    if not patterns or not texts:
        return list(texts)
    return redact_series(pl.Series(texts, dtype=pl.String), patterns, counts).to_list()
