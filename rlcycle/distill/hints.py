"""Hints from follow-ups: what the user said was wrong, attached to the turn it answers.

In:  the trajectories table, distill's features (the episodes' follow-up text and score, the
     samples' edit flags) and a `HintConfig` (`[distill.hints]`, `--set hints.enabled=true`).
Out: `Hints`: the `hint` column of the examples (the hint text on each episode's *target row*,
     null everywhere else) and the report's `hints` section (counts, acceptance per version).

Which episodes get a hint: the follow-up is dissatisfied (the `dissatisfied_followup` score,
built-in rules or the classifier hook, is < 0; after a clarifying question the follow-up is an
answer, not a verdict, and is skipped) and it *says something*: with the complaint phrases
("still fails", "revert", ...) and a few filler words ("no", "that", "please", ...) removed, at
least `min_words` words are left. "no, revert that" and "that's wrong, it still fails" say
nothing a teacher could use; "revert that, src/nodes.py must keep the old default" does.

The judge hook (`judge`), like the follow-up classifier's: a dotted path `"pkg.mod:fn"` to a
function that takes the list of candidate texts (each distinct text once) and returns, per
text, the hint to use (one to three actionable sentences) or None to reject it; or the base URL
of an OpenAI-compatible endpoint (`http://host:8000/v1`, model `judge_model`), asked with
`JUDGE_PROMPT` to rewrite or answer REJECT. No judge: the follow-up text itself (redacted by
collect, as every text field) is the hint.

The target row (`target`), per episode, the turn the follow-up answers:
    last_edit  the episode's last sample with an ok edit call (what the user saw changed),
               else its final sample (the reply the user answered)
    final      the episode's final sample
A hint teaches one turn: earlier turns of the episode keep only the scalar reward.

The control (`shuffle`, the *shuffled hints* arm of docs/hints.md): every accepted hint moves to
another session's hinted episode (a rotation over the hinted episodes sorted by a seeded
session order), so the words no longer match the turn. Counted in the report.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from rlcycle.config import cfg, check_range
from rlcycle.distill import followup
from rlcycle.distill.features import Features, Segments
from rlcycle.distill.spec import RewardSpec, resolve_callable
from rlcycle.errors import InputError, RlcycleError

TARGETS = ("last_edit", "final")
# Words that carry no information once the complaint is gone ("no, revert that" -> nothing).
FILLER = (
    "no nope yes ok okay please pls that this it its it's the a an and or but so now again just "
    "still also you your i me my we is are was were be been do does did not what why how hmm "
    "wrong right sorry really very"
).split()
JUDGE_PROMPT = (
    "A user of a coding assistant replied to the assistant's last change. Rewrite the reply as a "
    "hint for the assistant: one to three short, actionable sentences that say what is wrong, "
    "keeping every concrete detail (file, function, call, value, error). Do not invent a fix the "
    "user did not state. If the reply says nothing actionable, answer exactly REJECT."
)


@dataclass
class HintConfig:
    """Hints from follow-ups (docs/hints.md): off by default until the experiment supports them."""

    enabled: bool = cfg(
        False, help="Emit a hint (the `hint` column) for episodes whose dissatisfied follow-up says something."
    )
    judge: str = cfg(
        "",
        help="Rewrite or reject each hint: a dotted path 'pkg.mod:fn' (list[str] -> list[str | None]) or an "
        "OpenAI-compatible base URL (http://host:8000/v1); empty = the follow-up text as it is.",
    )
    judge_model: str = cfg("judge", help="Model name sent to a judge endpoint.")
    judge_timeout_s: float = cfg(60.0, help="Seconds one judge request may take.")
    min_words: int = cfg(
        3, help="Words a follow-up needs beyond its complaint phrases and filler words to count as saying something."
    )
    max_chars: int = cfg(600, help="Longer hints are cut to this many characters (at a word boundary).")
    target: str = cfg(
        "last_edit",
        help="The turn a hint teaches: last_edit (the episode's last sample with an ok edit, else its final "
        "sample) or final.",
    )
    shuffle: bool = cfg(
        False, help="Control arm: move every hint to another session's hinted episode (the words no longer fit)."
    )
    shuffle_seed: int = cfg(0, help="Seed of the shuffle's session order.")

    def validate(self) -> list[str]:
        problems: list[str] = []
        if self.target not in TARGETS:
            problems.append(f"target={self.target!r}: expected one of {', '.join(TARGETS)}")
        check_range(problems, self, ("min_words",), ge=0)
        check_range(problems, self, ("max_chars",), ge=1)
        check_range(problems, self, ("judge_timeout_s",), gt=0)
        if self.judge and not _is_url(self.judge):
            try:
                resolve_callable(self.judge)
            except InputError as e:
                problems.append(f"judge: {e.message}")
        return problems


@dataclass
class Hints:
    column: pa.Array  # string per row: the hint on target rows, null elsewhere
    report: dict[str, Any] = field(default_factory=dict)


def build(table: pa.Table, feats: Features, spec: RewardSpec, config: HintConfig) -> Hints:
    """The hint column and report section (see the module docstring)."""
    n = table.num_rows
    if not config.enabled:
        return Hints(pa.nulls(n, pa.string()), {"enabled": False})
    e, s = feats.episodes, feats.samples
    phrases = spec.params_of("dissatisfied_followup")["phrases"]
    dissatisfied = (e.get_column("score").fill_null(0) < 0) & ~e.get_column("asked")
    text = e.get_column("followup")
    says = informative(text, phrases, config.min_words).fill_null(False)
    candidates = dissatisfied & says
    hint = pl.Series([None] * e.height, dtype=pl.String)
    judged = _judge(text.filter(candidates), config) if candidates.any() else []
    hint = hint.scatter(np.flatnonzero(candidates.to_numpy()), pl.Series(judged, dtype=pl.String))
    hint = hint.map_elements(lambda t: _cut(t, config.max_chars), return_dtype=pl.String)
    accepted = hint.is_not_null()
    report: dict[str, Any] = {
        "enabled": True,
        "target": config.target,
        "judge": config.judge or None,
        "episodes": e.height,
        "dissatisfied": int(dissatisfied.sum()),
        "candidates": int(candidates.sum()),  # dissatisfied and saying something
        "rejected_by_rule": int((dissatisfied & ~says).sum()),
        "rejected_by_judge": int((candidates & ~accepted).sum()),
        "accepted": int(accepted.sum()),
    }
    if config.shuffle:
        hint, report["shuffle"] = _shuffle(hint, e.get_column("session_id"), config.shuffle_seed)
    report["per_policy_version"] = _per_version(e.get_column("_v").to_numpy(), dissatisfied, accepted, feats.versions)
    rows = target_rows(s, config.target)
    values: list[str | None] = [None] * n
    for ep, row in enumerate(rows):
        if accepted[ep] and row >= 0:
            values[int(row)] = hint[ep]
    return Hints(pa.array(values, pa.string()), report)


def informative(text: pl.Series, phrases: Sequence[str], min_words: int) -> pl.Series:
    """True where `text`, its complaint phrases and filler words removed, keeps >= min_words words."""
    rest = followup.normalise(pl.col("t")).str.replace_all(followup.any_of(phrases), " ")
    words = rest.str.extract_all(r"[^\s,;!?]+").list.eval(pl.element().str.strip_chars(".:'\"()"))
    content = words.list.eval(pl.element().filter(~pl.element().is_in(FILLER) & (pl.element().str.len_chars() > 0)))
    return pl.DataFrame({"t": text}).select(ok=content.list.len() >= min_words).to_series()


def target_rows(samples: pl.DataFrame, target: str) -> np.ndarray:
    """Per episode (by `_ep`), the row its hint goes on (module docstring), -1 for none."""
    seg = Segments(samples.get_column("_ep").to_numpy(), samples.get_column("turn").fill_null(0).to_numpy())
    final = seg.last_rows()
    if target == "final":
        return final
    edit = seg.last_valid(samples.get_column("edited").to_numpy())
    return np.where(edit >= 0, edit, final)


# --- the judge -----------------------------------------------------------------------------------


def _judge(texts: pl.Series, config: HintConfig) -> list[str | None]:
    """Per text, the hint (rewritten by the judge, if any) or None (rejected)."""
    values = texts.to_list()
    if not config.judge:
        return values
    distinct = list(dict.fromkeys(values))
    if _is_url(config.judge):
        out = [endpoint_judge(t, config.judge, config.judge_model, config.judge_timeout_s) for t in distinct]
    else:
        out = _call_hook(resolve_callable(config.judge), distinct)
    verdict = dict(zip(distinct, out, strict=True))
    return [verdict[t] for t in values]


def _call_hook(hook: Callable, texts: list[str]) -> list[str | None]:
    name = getattr(hook, "__qualname__", repr(hook))
    try:
        out = list(hook(texts))
    except Exception as e:  # user code: name it
        raise RlcycleError(
            f"hint judge {name} failed: {type(e).__name__}: {e}",
            hint="run it on a few texts by hand, or drop hints.judge to use the follow-up text as it is",
        ) from e
    if len(out) != len(texts) or any(x is not None and not isinstance(x, str) for x in out):
        raise InputError(
            f"hint judge {name} returned {len(out)} values for {len(texts)} texts (expected one str or None each)"
        )
    return [x.strip() or None if x is not None else None for x in out]


def endpoint_judge(text: str, base_url: str, model: str, timeout_s: float) -> str | None:
    """Ask an OpenAI-compatible chat endpoint to rewrite `text` as a hint (None: REJECT)."""
    body = {
        "model": model,
        "temperature": 0,
        "max_tokens": 160,
        "messages": [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": text}],
    }
    url = base_url.rstrip("/") + "/chat/completions"
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            doc = json.loads(resp.read())
        reply = doc["choices"][0]["message"]["content"] or ""
    except Exception as e:  # network, HTTP or a malformed answer: name the endpoint
        raise RlcycleError(
            f"hint judge endpoint {url} failed: {type(e).__name__}: {e}",
            hint="check the server is up (curl it), or set hints.judge to a dotted path or empty",
        ) from e
    reply = reply.strip()
    if not reply or reply.upper().startswith("REJECT"):
        return None
    return " ".join(re.split(r"(?<=[.!?])\s+", reply)[:3])  # at most three sentences


def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))


def _cut(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    head = text[:limit]
    return head.rsplit(" ", 1)[0] if " " in head else head


# --- the control and the report ------------------------------------------------------------------


def _shuffle(hint: pl.Series, sessions: pl.Series, seed: int) -> tuple[pl.Series, dict[str, int]]:
    """Every accepted hint onto another session's hinted episode: the hinted episodes, grouped
    by session in a seeded order, take the hint `m` places on (m = the largest session's count),
    so no hint stays in its session unless one session holds more than half of them."""
    idx = np.flatnonzero(hint.is_not_null().to_numpy())
    if idx.size < 2:
        return hint, {"moved": 0, "same_session": int(idx.size)}
    ses = sessions.gather(idx).fill_null("").to_list()
    rng = np.random.default_rng(seed)
    order_of = {s: k for k, s in enumerate(rng.permutation(sorted(set(ses))))}
    order = idx[np.lexsort((rng.random(idx.size), [order_of[s] for s in ses]))]
    m = max(ses.count(s) for s in set(ses))
    moved = np.roll(order, m)  # moved[i]'s hint goes to order[i]
    out = hint.to_list()
    src = hint.to_list()
    for dst, frm in zip(order, moved, strict=True):
        out[dst] = src[frm]
    same = sum(sessions[int(a)] == sessions[int(b)] for a, b in zip(order, moved, strict=True))
    return pl.Series(out, dtype=pl.String), {"moved": int(idx.size - same), "same_session": int(same)}


def _per_version(v: np.ndarray, dissatisfied: pl.Series, accepted: pl.Series, versions: list[str]) -> dict:
    """Per policy version: dissatisfied episodes, hints accepted, and the acceptance rate."""
    out = {}
    d, a = dissatisfied.to_numpy(), accepted.to_numpy()
    for k, name in enumerate(versions):
        mine = v == k
        nd, na = int((d & mine).sum()), int((a & mine).sum())
        out[name] = {"dissatisfied": nd, "accepted": na, "acceptance": round(na / nd, 6) if nd else None}
    return out
