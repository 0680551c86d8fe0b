"""The shared batcher (rlcycle/policy/batching.py): what a batch holds, grouping, errors,
cancellation, close.

Batch composition is made deterministic without timing: a `run` that blocks its first batch
until the test releases it, so everything submitted meanwhile is queued when the next batch is
taken. The `batch_wait_ms` bound is checked with a fake clock (a window of an hour that the
clock jumps past), so no test waits on, or asserts, wall time. The last test runs the real
tiny transformers model through `generate_batch`.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy.base import SamplingParams
from rlcycle.policy.batching import Batcher, generate_batch

HOUR_MS = 3_600_000.0
GUARD_S = 30  # a hang guard on result(), not a timing assertion


class Gated:
    """run(items) -> inner(items), by default [item * 10 ...]: records every batch; the first
    one blocks until `release()`; a batch holding `fail_on` raises."""

    def __init__(self, fail_on: object = None, inner=None):
        self.batches: list[list] = []
        self.entered = threading.Event()
        self._gate = threading.Event()
        self.fail_on, self.inner = fail_on, inner

    def __call__(self, items: list) -> list:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.entered.set()
            assert self._gate.wait(GUARD_S), "the test never released the first batch"
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError(f"bad item {self.fail_on}")
        return self.inner(items) if self.inner else [i * 10 for i in items]

    def release(self) -> None:
        self._gate.set()


def hold_first(run: Gated, batcher: Batcher, first=0):
    """Submit `first` and return once its batch is running (blocked in `run`)."""
    fut = batcher.submit(first)
    assert run.entered.wait(GUARD_S)
    return fut


class FakeClock:
    """Every reading is `step` seconds after the previous one; the test may change `step`."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def waiting_batcher(run: Gated, max_batch_size: int) -> tuple[Batcher, Future]:
    """A batcher with an hour-long window, its first batch (of item 0) running and blocked.

    The clock jumps two hours a reading until item 0's batch has started (so it runs alone at
    once), then stands still: from then on a batch ends only when it is full or at close().
    """
    clock = FakeClock(step=7200.0)
    b = Batcher(run, max_batch_size=max_batch_size, batch_wait_ms=HOUR_MS, clock=clock)
    first = hold_first(run, b)
    clock.step = 0.0
    return b, first


def test_results_go_to_their_own_futures_in_submission_order():
    run = Gated()
    b, f0 = waiting_batcher(run, max_batch_size=16)
    futs = [b.submit(i) for i in range(1, 8)]
    run.release()
    b.close()  # ends the hour-long wait of the second batch
    assert f0.result(GUARD_S) == 0
    assert [f.result(GUARD_S) for f in futs] == [10 * i for i in range(1, 8)]
    assert run.batches == [[0], list(range(1, 8))]  # one batch, in the order submitted


def test_max_batch_size_is_respected_and_a_full_batch_does_not_wait():
    run = Gated()
    b, f0 = waiting_batcher(run, max_batch_size=4)
    futs = [b.submit(i) for i in range(1, 9)]
    run.release()
    # batches 2 and 3 are full, so they run without waiting for the hour to pass
    assert [f.result(GUARD_S) for f in futs] == [10 * i for i in range(1, 9)]
    assert f0.result(GUARD_S) == 0
    assert run.batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8]]
    b.close()


def test_the_wait_ends_at_batch_wait_ms_on_the_clock():
    # the window is an hour, but each clock reading is two hours later: a lone item must run
    # alone as soon as its window has passed, without waiting on the queue for company
    run = Gated()
    run.release()
    b = Batcher(run, max_batch_size=8, batch_wait_ms=HOUR_MS, clock=FakeClock(7200.0))
    assert b.submit(1).result(GUARD_S) == 10
    assert b.submit(2).result(GUARD_S) == 20
    assert run.batches == [[1], [2]]
    b.close()


def test_zero_wait_still_takes_what_is_queued():
    run = Gated()
    b = Batcher(run, max_batch_size=16, batch_wait_ms=0)
    hold_first(run, b)
    futs = [b.submit(i) for i in range(1, 6)]
    run.release()
    assert [f.result(GUARD_S) for f in futs] == [10, 20, 30, 40, 50]
    assert run.batches == [[0], [1, 2, 3, 4, 5]]
    b.submit(6).result(GUARD_S)  # nothing else queued: a batch of one, at once
    assert run.batches[-1] == [6] and b.batches == 3
    b.close()


def test_an_error_reaches_every_future_of_its_batch_and_the_worker_goes_on():
    run = Gated(fail_on=2)
    b = Batcher(run, max_batch_size=16, batch_wait_ms=0)
    f0 = hold_first(run, b)
    futs = [b.submit(i) for i in (1, 2, 3)]
    run.release()
    assert f0.result(GUARD_S) == 0
    for f in futs:
        with pytest.raises(RuntimeError, match="bad item 2"):
            f.result(GUARD_S)
    assert b.submit(4).result(GUARD_S) == 40  # the next batch is served
    b.close()


def test_a_key_splits_a_batch_into_one_run_per_group_and_errors_stay_in_their_group():
    # as `rlcycle serve` groups by model: items are (model, n)
    run = Gated(fail_on=("b", 4), inner=lambda items: [n * 10 for _, n in items])
    b = Batcher(run, max_batch_size=16, batch_wait_ms=0, key=lambda item: item[0])
    hold_first(run, b, first=("a", 0))
    futs = {item: b.submit(item) for item in [("a", 1), ("b", 2), ("a", 3), ("b", 4), ("c", 5)]}
    run.release()
    assert futs["a", 1].result(GUARD_S) == 10 and futs["a", 3].result(GUARD_S) == 30
    assert futs["c", 5].result(GUARD_S) == 50
    for item in (("b", 2), ("b", 4)):
        with pytest.raises(RuntimeError, match="bad item"):
            futs[item].result(GUARD_S)
    # groups in order of first appearance, items in submission order; one batch taken
    assert run.batches == [[("a", 0)], [("a", 1), ("a", 3)], [("b", 2), ("b", 4)], [("c", 5)]]
    assert b.batches == 2
    b.close()


def test_a_wrong_number_of_results_fails_the_batch():
    b = Batcher(lambda items: items[:-1], max_batch_size=4, batch_wait_ms=0)
    with pytest.raises(RlcycleError, match="returned 0 results for 1 items"):
        b.submit("x").result(GUARD_S)
    b.close()


def test_a_future_cancelled_while_queued_is_left_out():
    run = Gated()
    b = Batcher(run, max_batch_size=16, batch_wait_ms=0)
    running = hold_first(run, b)
    keep, gone, last = b.submit(1), b.submit(2), b.submit(3)
    assert gone.cancel()
    assert not running.cancel()  # too late once its batch runs: its result still arrives
    run.release()
    assert running.result(GUARD_S) == 0
    assert keep.result(GUARD_S) == 10 and last.result(GUARD_S) == 30 and gone.cancelled()
    assert run.batches == [[0], [1, 3]]
    b.close()


def test_close_drains_the_queue_then_refuses_new_items():
    run = Gated()
    b, f0 = waiting_batcher(run, max_batch_size=2)
    futs = [b.submit(i) for i in range(1, 6)]
    b.close(timeout=0)  # closed while everything is still queued behind the blocked batch
    with pytest.raises(RlcycleError, match="closed"):
        b.submit(99)
    run.release()
    b.close()  # again (idempotent): joins the worker, so every queued item has run
    assert f0.result(0) == 0 and [f.result(0) for f in futs] == [10, 20, 30, 40, 50]
    assert run.batches == [[0], [1, 2], [3, 4], [5]]  # the last one did not wait for company


def test_bad_sizes_are_refused():
    with pytest.raises(InputError, match="max_batch_size=0"):
        Batcher(lambda items: items, max_batch_size=0, batch_wait_ms=0)
    with pytest.raises(InputError, match="batch_wait_ms=-1"):
        Batcher(lambda items: items, max_batch_size=1, batch_wait_ms=-1)


def test_generate_batch_with_the_tiny_model_matches_unbatched_generation(tmp_path: Path):
    """The real model: one batch of three (mixed params) gives what each prompt gives alone."""
    from rlcycle import model_init
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

    path = model_init.run(model_init.InitModelConfig(seed=0), tmp_path / "m").path
    policy = HFPolicy.from_pretrained(path, HFPolicyConfig(num_threads=1))
    prompts = [policy.tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("def f(x):", "Fix app.py", "x")]
    params = [SamplingParams(max_new_tokens=6, temperature=t, seed=s) for t, s in ((1.0, 1), (0.7, 2), (0.0, None))]
    run = Gated(inner=generate_batch(policy))
    b = Batcher(run, max_batch_size=8, batch_wait_ms=0)
    hold_first(run, b, first=(prompts[0], params[0]))
    futs = [b.submit((p, sp)) for p, sp in zip(prompts, params, strict=True)]
    run.release()
    batched = [f.result(GUARD_S) for f in futs]
    b.close()
    assert [len(batch) for batch in run.batches] == [1, 3]  # the three ran as one batch
    for p, sp, g in zip(prompts, params, batched, strict=True):
        [alone] = policy.generate([p], sp)
        assert g.token_ids == alone.token_ids and len(g.logprobs) == len(g.token_ids)
        assert max(abs(x - y) for x, y in zip(g.logprobs, alone.logprobs, strict=True)) < 1e-4
    policy.close()
