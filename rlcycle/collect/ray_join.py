"""collect's pass 2 on Ray: one Ray task per job (partition or bucket), polars inside each.

    for joined in joined_on_ray(jobs, settings, address=None):   # in job order
        ...

The driver joins the cluster (`address`, else RAY_ADDRESS, else a local Ray: the rollout's
rules, rlcycle.rollout.import_ray), submits every job at once (Ray runs as many as there are
CPUs) and hands back the results in job order, so the caller writes the output in the same
order as a local run. Tasks read their input by path: pass 1's partition files beside the
output, or a bucketed log's files. Every node must see those paths (one machine, or a shared
filesystem); a task that cannot fails with an error that says so. A result comes back through
Ray's object store as an Arrow table (results of every job finished ahead of the one being
written wait there, spilled to disk if need be).

A task that raises (bad input found in a bucket, a polars error) stops the run with that error,
as locally; a task whose worker died is retried by Ray (`max_retries`), then fails the run:
collect writes nothing half-done either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from rlcycle.collect.partitions import Job, Joined, JoinSettings, run_job
from rlcycle.errors import RlcycleError
from rlcycle.rollout import import_ray

_RETRIES = 2  # reruns of a job whose worker died (the job is pure: rerunning is safe)


def _task(job: Job, settings: JoinSettings, new_counts: Callable[[], Any]) -> Joined:
    return run_job(job, settings, new_counts())


def joined_on_ray(
    jobs: list[Job], settings: JoinSettings, address: str | None, new_counts: Callable[[], Any]
) -> Iterator[Joined]:
    """Each job's `Joined`, in job order, computed by Ray tasks; `new_counts()` makes the
    empty CollectResult each task counts into."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(max_retries=_RETRIES)(_task)
        settings_ref = ray.put(settings)
        refs = [remote.remote(job, settings_ref, new_counts) for job in jobs]
        done = 0
        try:
            for ref in refs:
                yield _get(ray, ref)
                done += 1
        finally:
            for ref in refs[done + 1 :]:  # the run stopped early: the rest is not needed
                ray.cancel(ref)
    finally:
        if started:
            ray.shutdown()


def _get(ray: Any, ref: Any) -> Joined:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # the job's own error, as a local run raises it
        if isinstance(e.cause, RlcycleError):
            raise e.cause from None
        raise RlcycleError(
            f"a collect task on Ray failed: {type(e.cause).__name__}: {str(e.cause)[:300]}",
            hint="RLCYCLE_DEBUG=1 and the Ray logs (/tmp/ray/session_latest/logs) show more",
        ) from None
    except ray.exceptions.RayError as e:  # its worker or node died, past the retries
        raise RlcycleError(
            f"a collect task on Ray was lost: {type(e).__name__}: {str(e)[:300]}",
            hint="rerun: collect's output is written only when every partition was joined",
        ) from None
