"""The recent contexts the gateway served: what it stores each new prompt against.

In: every logged completion's sample id, session, prompt and completion ids (`record`, after
its event is queued for the log). Out: for a new request, the `Parent` its prompt is stored
against (`parent`): the sample it continues (`parent_sample_id`, episodes.py) when that one is
still here, else the session's most recent sample. The event then holds only what the prompt
adds (`rlcycle.agent.events.prompt_fields`), so a session's log costs its unique tokens instead
of the square of its length (docs/design.md, "Prompts stored once").

Bounded: at most `max_tokens` ids are kept (least recently used dropped first). A parent that
fell out, a gateway restart, a new UTC day or a prompt sharing nothing gives a root — the whole
prompt once, never a wrong reference. The day rule keeps every reference inside one UTC day of
log files, so collect reading whole days of the log always finds the parent it names.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlcycle.agent.events import Parent


def utc_day(ts_s: float | None = None) -> int:
    return int((time.time() if ts_s is None else ts_s) // 86400)


@dataclass
class _Entry:
    session: str
    day: int
    context: np.ndarray  # int32: prompt + completion


class Contexts:
    """Recent contexts by sample id, bounded by tokens; thread-safe."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._by_sample: OrderedDict[str, _Entry] = OrderedDict()
        self._latest: dict[str, str] = {}  # session -> its most recent sample id here
        self._tokens = 0
        self._lock = threading.Lock()

    def parent(self, session: str, continues: str | None, day: int | None = None) -> Parent | None:
        """The sample a new prompt of `session` is stored against, or None (a root)."""
        day = utc_day() if day is None else day
        with self._lock:
            for sample_id in (continues, self._latest.get(session)):
                e = self._by_sample.get(sample_id) if sample_id else None
                if e is not None and e.session == session and e.day == day:
                    self._by_sample.move_to_end(sample_id)
                    return Parent(sample_id, e.context)
        return None

    def record(
        self, session: str, sample_id: str, prompt: Sequence[int], completion: Sequence[int], day: int | None = None
    ) -> None:
        if self.max_tokens <= 0:
            return
        context = np.asarray([*prompt, *completion], dtype=np.int32)
        if len(context) > self.max_tokens:
            return
        with self._lock:
            old = self._by_sample.pop(sample_id, None)
            if old is not None:
                self._tokens -= len(old.context)
            self._by_sample[sample_id] = _Entry(session, utc_day() if day is None else day, context)
            self._latest[session] = sample_id
            self._tokens += len(context)
            while self._tokens > self.max_tokens:
                gone_id, gone = self._by_sample.popitem(last=False)
                self._tokens -= len(gone.context)
                if self._latest.get(gone.session) == gone_id:
                    del self._latest[gone.session]

    @property
    def tokens(self) -> int:
        return self._tokens
