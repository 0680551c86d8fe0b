"""The Ray executor on a real local Ray: the same rows as a local run with 1, 2 and 4 workers,
a killed worker's episodes retried (or reported as infrastructure errors), no container left.

Unit tests share one in-process `ray.init()` (2 CPUs, small object store, no dashboard); the
integration test starts a two-node cluster on loopback (`ray.cluster_utils.Cluster`). Both
"nodes" share this machine's Docker engine, so the per-node cleanup is checked by labels."""

from __future__ import annotations

import json
import os
import signal

import pytest
from optional import require, two_node_ray
from test_runner import make_suite, scrub, without_delta

from rlcycle.agent.runner import RunnerConfig
from rlcycle.prompts import events_with_full_prompts
from rlcycle.rollout import PolicySpec, RolloutConfig, open_executor
from rlcycle.sandbox.cleanup import list_leftovers
from rlcycle.simulate import SimulateConfig, run

ray = require("ray")
pytestmark = pytest.mark.docker

STORE = 80 * 1024 * 1024  # bytes of object store per node: results are small


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    return root, make_suite(root)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, object_store_memory=STORE, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def rows(results):
    return sorted(json.dumps(r.to_row() | {"latency_ms": None}, sort_keys=True) for r in results)


def stable(events):
    # Prompts after a run_tests call hold pytest's own duration ("1 passed in 0.03s"): whole
    # prompts (rebuilt from the delta layout) are compared at turn 0 only.
    return sorted(
        json.dumps({k: v for k, v in e.items() if k != "prompt_ids" or e["turn"] == 0}, sort_keys=True)
        for e in without_delta(scrub(events_with_full_prompts(events)))
    )


def leftovers(docker_client, prefix):
    return [x for x in list_leftovers(docker_client) if x.run.startswith(prefix)]


def test_simulate_events_are_the_same_rows_locally_and_on_1_2_4_workers(suite, tmp_path, docker_client, local_ray):
    root, _ = suite
    base = dict(episodes=6, sandboxes=2, seed=3)
    got = {}
    for name, extra in [
        ("local", {}),
        *[(f"ray{w}", {"rollout": RolloutConfig("ray", workers_per_node=w)}) for w in (1, 2, 4)],
    ]:
        out = tmp_path / f"{name}.jsonl"
        result = run(SimulateConfig(**base, **extra), "scripted:reference", root, out, quiet=True)
        assert (result.episodes, result.passed, result.errors) == (6, 6, 0), name
        events = [json.loads(line) for line in out.read_text().splitlines()]
        # Written in job order whoever ran what: task i mod 2, attempt i div 2.
        sessions = list(dict.fromkeys(e["session_id"] for e in events))
        assert [s.split("-", 2)[2] for s in sessions][:3] == [
            "calc-add-a0",
            "greet-a0",
            "calc-add-a1",
        ]
        got[name] = stable(events)
    assert got["ray1"] == got["local"] and got["ray2"] == got["local"] and got["ray4"] == got["local"]
    assert leftovers(docker_client, "ray-") == []


def test_eval_results_are_the_same_rows_on_ray(cli, suite, tmp_path, docker_client, local_ray):
    root, _ = suite
    tables = {}
    for name, extra in [
        ("local", []),
        ("ray", ["--executor", "ray", "--set", "rollout.workers_per_node=2"]),
    ]:
        out = tmp_path / name / "eval_results.arrow"
        r = cli(
            [
                "eval",
                "--candidate",
                "scripted:reference",
                "--baseline",
                "scripted:nothing",
                "--tasks",
                root,
                "-o",
                out,
                "--attempts",
                "2",
                "--sandboxes",
                "2",
                "--set",
                "gates.min_paired_tasks=2",
                "--json",
                *extra,
            ]
        )
        assert r.exit_code in (0, 3), r.output
        import polars as pl

        df = pl.read_ipc(out).drop("latency_ms").sort("policy", "task_id", "attempt")
        tables[name] = df
    assert tables["ray"].equals(tables["local"]) and tables["local"].height == 8


def test_a_killed_worker_without_retries_makes_its_episodes_infrastructure_errors(suite, docker_client, local_ray):
    _, tasks = suite
    killed = []
    with open_executor(RolloutConfig("ray", workers_per_node=2, worker_retries=0), sandboxes=1) as ex:

        def kill_a_busy_one(r):
            if not killed and (busy := ex.worker_pids(busy_only=True)):
                killed.append(busy[0])
                os.kill(busy[0], signal.SIGKILL)

        results = ex.run(
            PolicySpec("scripted:reference"),
            "scripted:reference",
            tasks,
            RunnerConfig(),
            attempts=3,
            on_result=kill_a_busy_one,
        )
        label = ex.run_label
        assert ex.stats["worker_deaths"] == 1
    assert sorted(r.index for r in results) == list(range(6))  # nothing lost, nothing twice
    errors = [r for r in results if r.status == "error"]
    assert len(errors) == 1 and errors[0].error.startswith("infrastructure: Ray worker pid")
    assert errors[0].events == [] and errors[0].end_reason == "error"
    assert all(r.status == "pass" for r in results if r.status != "error")  # never a `fail`
    assert leftovers(docker_client, label) == []


def test_a_policy_error_stops_the_run_with_that_error_and_leaves_nothing(suite, docker_client, local_ray):
    """Not a worker death: the run stops with the policy's own error (as locally), the shards
    still running on other workers are abandoned, and their containers are swept."""
    from rlcycle.errors import InputError

    _, tasks = suite
    with open_executor(RolloutConfig("ray", workers_per_node=2), sandboxes=1) as ex:
        label = ex.run_label
        with pytest.raises(InputError, match="scripted:genius") as e:
            ex.run(PolicySpec("scripted:genius"), "x", tasks, RunnerConfig(), attempts=2)
        assert type(e.value) is InputError and e.value.hint  # the error itself, hint and all
        assert ex.stats["worker_deaths"] == 0
    assert leftovers(docker_client, label) == []


@pytest.fixture
def two_nodes():
    with two_node_ray(STORE) as cluster:
        yield cluster


def test_two_nodes_a_worker_killed_mid_run_is_retried_elsewhere(suite, docker_client, two_nodes):
    _, tasks = suite
    runner = RunnerConfig()
    with open_executor(RolloutConfig("ray"), sandboxes=1) as ex:
        reference = ex.run(PolicySpec("scripted:reference"), "scripted:reference", tasks, runner, attempts=4)
        assert ex.stats["workers"] == 2  # one per node
        killed = []

        def kill_a_busy_one(r):
            if not killed and (busy := ex.worker_pids(busy_only=True)):
                killed.append(busy[0])
                os.kill(busy[0], signal.SIGKILL)

        results = ex.run(
            PolicySpec("scripted:reference"), "scripted:reference", tasks, runner, attempts=4, on_result=kill_a_busy_one
        )
        label = ex.run_label
        assert killed and ex.stats["worker_deaths"] == 1 and ex.stats["retried_episodes"] >= 1
        assert killed[0] not in ex.worker_pids() and len(ex.worker_pids()) == 2  # replaced
    assert [r.index for r in results] == list(range(8))
    assert all(r.status == "pass" for r in results)  # the retry passed: nothing lost, no `fail`
    assert rows(results) == rows(reference)  # and it is the very same rows
    assert leftovers(docker_client, label) == []


def test_two_nodes_a_node_lost_mid_run_has_its_shard_rerun_on_the_other(suite, docker_client, two_nodes):
    """The second node goes down (all its processes killed) while its worker runs a shard: the
    shard is rerun on the head node's worker, no worker replaces the lost one, and the rows
    are an undisturbed run's."""
    _, tasks = suite
    runner = RunnerConfig()
    head = two_nodes.head_node.node_id
    other = next(n for n in two_nodes.list_all_nodes() if n.node_id != head)
    with open_executor(RolloutConfig("ray"), sandboxes=1) as ex:
        reference = ex.run(PolicySpec("scripted:reference"), "scripted:reference", tasks, runner, attempts=6)
        removed = []

        def remove_the_other_node_while_busy(r):
            busy = [h for h, _ in ex._busy.values() if h.node == other.node_id]
            if not removed and busy:
                removed.append(busy[0].pid)
                two_nodes.remove_node(other, allow_graceful=False)

        results = ex.run(
            PolicySpec("scripted:reference"),
            "scripted:reference",
            tasks,
            runner,
            attempts=6,
            on_result=remove_the_other_node_while_busy,
        )
        label = ex.run_label
        assert removed and ex.stats["worker_deaths"] == 1 and ex.stats["retried_episodes"] >= 1
        assert len(ex.workers) == 1 and ex.workers[0].node == head  # none on the lost node
    assert [r.index for r in results] == list(range(12))
    assert all(r.status == "pass" for r in results)
    assert rows(results) == rows(reference)
    assert leftovers(docker_client, label) == []  # one engine here: the sweep sees the lost node's
