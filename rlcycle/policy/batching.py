"""One batching worker for a server that runs an in-process policy (the gateway).

In: items submitted from any thread (`submit(item) -> Future`). Out: each Future resolves to the
result `run(batch)` returned for that item, or raises the exception `run` raised for its batch.

    from rlcycle.policy.batching import Batcher, generate_batch
    batcher = Batcher(generate_batch(policy), max_batch_size=16, batch_wait_ms=5.0)
    gen = batcher.submit((prompt_ids, SamplingParams(max_new_tokens=64))).result()
    batcher.close()

The rule, in the one worker thread: block until one item is queued; then take what else is
queued, waiting at most `batch_wait_ms` (measured from the first item) for more, up to
`max_batch_size` items; call `run` once with all of them, in submission order; repeat. A full
batch starts at once (the wait is an upper bound, never a delay on a full batch), and a
`batch_wait_ms` of 0 still takes everything already queued. The policies take one
SamplingParams per prompt, so one `run` may mix any requests, and each result is independent
of what else was batched (see hf.py).

Grouping: with `key`, a batch is split by `key(item)` (groups in order of first appearance,
items in submission order) and `run` is called once per group (e.g. by model, when a LoRA
adapter is active for a whole `generate`). `max_batch_size` bounds the
batch taken, not each group.

Failure: when `run` raises, or returns a different number of results than items, every Future
of that call (the batch, or its group) gets the exception, and the worker goes on. A Future
the caller cancelled before its batch started (a client that went away) is left out.

`close()` stops taking new items, lets every item queued before it run (a batch waiting for
more stops waiting), then joins the worker.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy.base import Generation, SamplingParams

T = TypeVar("T")
R = TypeVar("R")
_STOP = object()  # queued by close(): the worker runs what is before it, then returns


class Batcher(Generic[T, R]):
    """Calls `run(items) -> results` on batches of submitted items (see the module docstring).

    `key(item)`, when given, splits a batch into one `run` per key (it is called in `submit`,
    so a key that fails, fails there). `clock` (seconds, monotonic) measures the
    `batch_wait_ms` window; tests pass a fake one.
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R]],
        max_batch_size: int,
        batch_wait_ms: float,
        name: str = "rlcycle-batcher",
        key: Callable[[T], Hashable] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_batch_size < 1 or batch_wait_ms < 0:
            raise InputError(
                f"batcher: max_batch_size={max_batch_size} must be >= 1 and batch_wait_ms={batch_wait_ms} >= 0",
                hint="set max_batch_size >= 1 and batch_wait_ms >= 0",
            )
        self.run = run
        self.max_batch_size = max_batch_size
        self.wait_s = batch_wait_ms / 1000.0
        self.key = key
        self.batches = 0  # batches taken and run so far (for stats and tests)
        self._clock = clock
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # orders submit() against close()
        self._worker = threading.Thread(target=self._loop, name=name, daemon=True)
        self._worker.start()

    def submit(self, item: T) -> Future[R]:
        """Queue one item; the Future resolves to its result."""
        fut: Future[R] = Future()
        with self._lock:
            if self._closed:
                raise RlcycleError(
                    "the batcher is closed: no more requests are taken",
                    hint="submit before close(), or start a new Batcher",
                )
            self._queue.put((item, fut, None if self.key is None else self.key(item)))
        return fut

    def close(self, timeout: float | None = None) -> None:
        """Take no more items, run every queued one, stop the worker (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout)

    # --- the worker ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            batch, stop = self._take()
            # set_running_or_notify_cancel() is False for a Future cancelled while queued: it is
            # dropped here, and from then on cancel() fails, so setting its result is safe.
            live = [job for job in batch if job[1].set_running_or_notify_cancel()]
            if live:
                self.batches += 1
                groups: dict[Hashable, list[tuple[T, Future[R]]]] = {}
                for item, fut, k in live:  # one group when there is no key (k is None)
                    groups.setdefault(k, []).append((item, fut))
                for group in groups.values():
                    self._run(group)
            if stop:
                return

    def _take(self) -> tuple[list[tuple[T, Future[R], Hashable]], bool]:
        """(the next batch, whether close() was reached): blocks for the first item only."""
        first = self._queue.get()
        if first is _STOP:
            return [], True
        batch = [first]
        deadline = self._clock() + self.wait_s
        while len(batch) < self.max_batch_size:
            remaining = deadline - self._clock()
            try:  # past the deadline, still take what is already queued (no wait)
                nxt = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is _STOP:  # close() while waiting for more: run this batch, then stop
                return batch, True
            batch.append(nxt)
        return batch, False

    def _run(self, live: list[tuple[T, Future[R]]]) -> None:
        """One `run` call; its results, or its exception, go to the Futures of `live`."""
        try:
            results = list(self.run([item for item, _ in live]))
            if len(results) != len(live):
                raise RlcycleError(
                    f"the batch function returned {len(results)} results for {len(live)} items",
                    hint="run(items) must return one result an item",
                )
        except Exception as e:  # every request of this call gets the error; the worker goes on
            for _, fut in live:
                fut.set_exception(e)
            return
        for (_, fut), result in zip(live, results, strict=True):
            fut.set_result(result)


def generate_batch(
    policy: Any,
) -> Callable[[list[tuple[list[int], SamplingParams]]], list[Generation]]:
    """The `run` of a policy server: items are (prompt ids, params), one `generate` for all."""

    def run(jobs: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
        return policy.generate([prompt for prompt, _ in jobs], [params for _, params in jobs])

    return run
