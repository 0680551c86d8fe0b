"""Sessions and episodes for clients that send no ids: the key, the URL, and message prefixes.

In: the request (headers, URL prefix, bearer key) and its messages in the client's own form.
Out: (session_id, episode_id, turn, rules), where `rules` says which rule gave each id (logged in
every completion event as `id_rules`), and the sample the request continues, if any.

Session, first rule that applies:
    header        `X-Session-Id` (or `metadata.session_id`)
    path          the base URL `.../s/<session>/v1` (the request came to /s/<session>/v1/...)
    key           a bearer key listed in `session_keys` (key -> session name), or with
                  `session_from_key`, any bearer key other than the shared `api_key`
                  ("key-" + 16 hex of its SHA-256: the key itself is never logged)
    continuation  the session of the episode the request continues (below)
    new           a fresh `gw-<uuid>`
Episode: `X-Episode-Id` (or metadata) when given ("header"); else "continuation": the request's
messages start with an earlier request's messages followed by an assistant message (the
client's copy of that answer) — whatever comes after (tool results, observations, format
errors, a new user message) — so it continues that episode at the next turn; else "new": the
session's next episode, `<session>-e<k>` (k counts from 0 per session in this process; a
restarted gateway counts again, so a session id that outlives a restart should come with
episode ids of its own).

Compaction: a client that compacts or summarises its history (Cursor's self-summarisation,
OpenHands condensers) sends a request that continues no earlier one. When the session is known
(header, path or key) and the request keeps the session's latest episode's *task* — the same
messages up to and including the first user message — followed by anything else (a summary,
kept tool results), it continues that episode at the next turn ("compaction"; `parent_sample_id`
is the episode's latest sample). Its prompt does not extend that sample's context, so it starts
a new segment of the same episode, and distill's episode-level rewards reach every segment. A
request that is only the task again (system + that first user message) is a new episode.

Matching is by SHA-256 digests of message prefixes (role, text, tool calls with parsed
arguments), so it costs one hash per message. With an explicit session only that session's
requests are candidates. When several earlier requests match (n > 1 choices, the same task
run twice), the one whose answer equals the assistant message the client sent back wins
(`parent_sample_id` is that choice), else the most recent.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _args(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return raw


def canon(message: dict[str, Any]) -> str:
    """One message as the matcher compares it: role, text, and tool calls by name and parsed arguments."""
    role = {"developer": "system"}.get(message.get("role"), message.get("role"))
    calls = [
        [f.get("name"), _args(f.get("arguments"))]
        for c in message.get("tool_calls") or ()
        if isinstance(c, dict) and isinstance(f := c.get("function"), dict)
    ]
    return json.dumps([role, _text(message.get("content")).strip(), calls], sort_keys=True, ensure_ascii=False)


def prefix_digests(messages: list[dict[str, Any]]) -> list[str]:
    """digests[i] identifies messages[:i] (digests[0] the empty prefix)."""
    h = hashlib.sha256()
    out = [h.hexdigest()]
    for m in messages:
        h.update(canon(m).encode() + b"\0")
        out.append(h.copy().hexdigest())
    return out


@dataclass
class _Seen:
    session: str
    episode: str
    turn: int
    answers: list[tuple[str, str]]  # (sample_id, canon of the assistant message returned)


class Episodes:
    """The index of answered requests by message-prefix digest (bounded, least recent dropped)."""

    def __init__(self, entries: int = 10_000):
        self.entries = entries
        self._by_prefix: OrderedDict[str, list[_Seen]] = OrderedDict()
        self._next_episode: OrderedDict[str, int] = OrderedDict()
        # session -> (task digest, episode, turn, latest sample) of its latest answered request
        self._latest: OrderedDict[str, tuple[str, str, int, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    def resolve(
        self,
        messages: list[dict[str, Any]],
        session: str | None,
        session_rule: str,
        episode: str | None,
        new_session: str,
    ) -> tuple[str, str, int, dict[str, str], str | None]:
        """(session, episode, turn, rules, parent_sample_id) of a request (see the module docstring)."""
        digests = prefix_digests(messages)
        found, parent = self._continues(messages, digests, session)
        if session is None:
            session, session_rule = (found.session, "continuation") if found else (new_session, "new")
        if episode is not None:
            turn = found.turn + 1 if found and found.episode == episode else _turn_by_users(messages)
            return session, episode, turn, {"session": session_rule, "episode": "header"}, parent
        if found is not None:
            return session, found.episode, found.turn + 1, {"session": session_rule, "episode": "continuation"}, parent
        compacted = self._compacted(messages, digests, session) if session_rule != "new" else None
        if compacted is not None:
            ep, turn, last = compacted
            return session, ep, turn + 1, {"session": session_rule, "episode": "compaction"}, last
        with self._lock:
            k = self._next_episode.pop(session, 0)
            self._next_episode[session] = k + 1
            while len(self._next_episode) > self.entries:
                self._next_episode.popitem(last=False)
        return session, f"{session}-e{k}", 0, {"session": session_rule, "episode": "new"}, None

    def _continues(
        self, messages: list[dict[str, Any]], digests: list[str], session: str | None
    ) -> tuple[_Seen | None, str | None]:
        with self._lock:
            for i in range(len(messages) - 1, 0, -1):  # the longest earlier request first
                if messages[i].get("role") != "assistant":
                    continue
                cands = [s for s in self._by_prefix.get(digests[i], ()) if session is None or s.session == session]
                if not cands:
                    continue
                sent = canon(messages[i])
                for s in reversed(cands):
                    for sample_id, answer in s.answers:
                        if answer == sent:
                            return s, sample_id
                return cands[-1], cands[-1].answers[0][0] if cands[-1].answers else None
        return None, None

    def _compacted(
        self, messages: list[dict[str, Any]], digests: list[str], session: str
    ) -> tuple[str, int, str | None] | None:
        """(episode, turn, latest sample) when the request compacts the session's latest episode."""
        task = _task_length(messages)
        if task is None or task == len(messages):
            return None
        with self._lock:
            latest = self._latest.get(session)
        if latest is None or latest[0] != digests[task]:
            return None
        return latest[1], latest[2], latest[3]

    def record(
        self, messages: list[dict[str, Any]], session: str, episode: str, turn: int, answers: list[tuple[str, dict]]
    ) -> None:
        """Remember an answered request: its messages' digest and each choice's assistant message."""
        digests = prefix_digests(messages)
        key = digests[-1]
        seen = _Seen(session, episode, turn, [(sid, canon(msg)) for sid, msg in answers])
        task = _task_length(messages)
        with self._lock:
            if task is not None:
                self._latest[session] = (digests[task], episode, turn, answers[-1][0] if answers else None)
                self._latest.move_to_end(session)
                while len(self._latest) > self.entries:
                    self._latest.popitem(last=False)
            self._by_prefix.setdefault(key, []).append(seen)
            self._by_prefix.move_to_end(key)
            while len(self._by_prefix) > self.entries:
                self._by_prefix.popitem(last=False)


def _task_length(messages: list[dict[str, Any]]) -> int | None:
    """How many leading messages make the task: up to and including the first user message."""
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            return i + 1
    return None


def _turn_by_users(messages: list[dict[str, Any]]) -> int:
    """Model calls since the last user message (the turn when the client names the episode)."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    last = users[-1] if users else -1
    return sum(1 for m in messages[last + 1 :] if m.get("role") == "assistant")


def key_session(authorization: str, api_key: str | None, session_keys: dict[str, str], from_key: bool) -> str | None:
    """The session a bearer key names, or None (see the module docstring)."""
    if not authorization.startswith("Bearer "):
        return None
    key = authorization[len("Bearer ") :].strip()
    if not key:
        return None
    if key in session_keys:
        return session_keys[key]
    if from_key and key != api_key:
        return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return None
