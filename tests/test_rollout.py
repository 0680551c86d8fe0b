"""The executor choice without Ray: shards of a run are the run's own rows, the local executor is
today's `run_episodes`, a bad executor is a usage error before any sandbox starts, the keys
reach the cycle's tables, and the prefix cache budget reaches the policies simulate and eval
load (tests/test_rollout_ray.py runs the Ray executor itself)."""

from __future__ import annotations

import json

import pytest
from test_runner import make_suite, scrub

from rlcycle import resources
from rlcycle.agent.runner import RunnerConfig, run_episodes
from rlcycle.cli.options import registry_dir
from rlcycle.errors import InputError
from rlcycle.evaluation import stage as eval_stage
from rlcycle.evaluation.verdict import GateConfig
from rlcycle.policy.open import PolicyConfig, open_policy, open_spec
from rlcycle.policy.scripted import ReferencePolicy, load_tokenizer
from rlcycle.rollout import PolicySpec, RolloutConfig, open_executor
from rlcycle.sandbox import SandboxPool
from rlcycle.simulate import run as simulate
from rlcycle.simulate.stage import SimulateConfig


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("suite")


@pytest.fixture(scope="module")
def tasks(root):
    return make_suite(root)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny default model (random weights), and a second one to be the eval baseline."""
    from rlcycle.model_init import init_model

    base = tmp_path_factory.mktemp("models")
    init_model(base / "a", seed=0)
    init_model(base / "b", seed=1)
    return base / "a", base / "b"


def rows(results):
    return [json.dumps(r.to_row() | {"latency_ms": None}, sort_keys=True) for r in results]


# --- the executor choice -------------------------------------------------------------------


def test_rollout_config_reports_every_problem():
    problems = RolloutConfig(executor="slurm", workers_per_node=0, worker_retries=-1).validate()
    assert len(problems) == 3 and "executor='slurm'" in problems[0]
    with pytest.raises(InputError, match="slurm"):
        open_executor(RolloutConfig(executor="slurm"), sandboxes=1)


def test_bad_executor_exits_2_before_any_sandbox_starts(cli, tmp_path, root, tasks):
    out = tmp_path / "e.jsonl"
    r = cli(["simulate", "-p", "scripted:reference", "-t", root, "-o", out, "--executor", "slurm"])
    assert r.exit_code == 2 and "executor='slurm'" in r.error and not out.exists()
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
            tmp_path / "r.arrow",
            "--executor",
            "slurm",
        ]
    )
    assert r.exit_code == 2 and "executor='slurm'" in r.error


def test_ray_needs_a_reference_and_a_servers_tokenizer_before_ray_starts(tmp_path, tasks):
    ray = SimulateConfig(rollout=RolloutConfig(executor="ray"))
    with pytest.raises(InputError, match="not a loaded Policy"):
        simulate(ray, ReferencePolicy(load_tokenizer(None), tasks), tasks, tmp_path / "e.jsonl")
    with pytest.raises(InputError, match="without a tokenizer"):
        simulate(ray, "http://127.0.0.1:9/v1", tasks, tmp_path / "e.jsonl")
    assert not (tmp_path / "e.jsonl").exists()


def test_the_cycles_simulate_and_eval_tables_take_the_keys():
    """The cycle's stage tables are the stages' own configs (typed): no key list of its own, so
    the executor keys come through, checked like any other key, over the stage defaults."""
    from rlcycle.config import resolve
    from rlcycle.cycle import CycleConfig

    tables = {"rollout": {"executor": "ray", "ray_address": "auto", "workers_per_node": 2, "worker_retries": 1}}
    cycle = resolve(CycleConfig, data={"simulate": tables, "eval": dict(tables, policy={"prefix_cache_tokens": 0})})
    sim, ev = cycle.simulate, cycle.eval
    for c in (sim, ev):
        assert c.rollout == RolloutConfig("ray", "auto", 2, 1)
    assert sim.episodes is None and ev.max_tasks is None  # the stage defaults apply, not the demo's
    assert (sim.policy.prefix_cache_tokens, ev.policy.prefix_cache_tokens) == (0, 0)
    with pytest.raises(InputError, match="rollout.executor='slurm'") as e:
        resolve(CycleConfig, data={"eval": {"rollout.executor": "slurm", "rollout": {"workers_per_node": 0}}})
    assert "rollout.workers_per_node=0" in str(e.value)  # every problem at once
    with pytest.raises(InputError, match="unknown key 'eval.executor' \\(did you mean 'eval.rollout.executor'\\?\\)"):
        resolve(CycleConfig, data={"eval": {"executor": "ray"}})


def pin_policy(ref, registry=None):
    """(what a Ray worker opens, the name, the checkpoint id): a reference opened for Ray."""
    opened = open_policy(ref, PolicyConfig(tokenizer=str(resources.tokenizer())), registry, where="ray")
    assert opened.policy is None  # named here, loaded by each worker
    return opened.spec.ref, opened.name, opened.checkpoint_id


def test_a_reference_opened_for_ray_is_named_without_loading_it(tiny):
    from rlcycle.deploy.stage import register
    from rlcycle.policy.registry import Registry, checkpoint_id

    assert pin_policy("scripted:reference") == ("scripted:reference", "scripted:reference", None)
    model, _ = tiny
    cid = checkpoint_id(model)
    # A server is named by what it serves (its listed root's checkpoint), never by its URL.
    from rlcycle.gateway import GatewayConfig, start
    from rlcycle.policy.hf import HFPolicy

    srv = start(GatewayConfig(port=0, logging=False), policy=HFPolicy.from_pretrained(model), checkpoint=model)
    try:
        assert pin_policy(srv.url + "/v1") == (srv.url + "/v1", cid, cid)
    finally:
        srv.close()
    assert pin_policy(str(model)) == (str(model.resolve()), cid, cid)
    # An alias is pinned to the directory it names now: workers load that very checkpoint.
    register(model, "production", Registry(registry_dir()))
    ref, name, got = pin_policy("production", registry_dir())
    assert (name, got) == (cid, cid) and checkpoint_id(ref) == cid and ref != "production"
    with pytest.raises(InputError):
        pin_policy("candidate", registry_dir())  # not set in this registry


def test_an_out_of_range_or_repeated_shard_is_refused(tasks):
    policy = ReferencePolicy(load_tokenizer(None), tasks)
    for only in ([0, 0], [4]):
        with pytest.raises(InputError, match="job positions"):
            run_episodes(policy, "p", tasks, None, RunnerConfig(), attempts=2, only=only)


@pytest.mark.docker
def test_shards_are_the_full_runs_rows_and_local_is_run_episodes(tasks, docker_client):
    policy = ReferencePolicy(load_tokenizer(None), tasks)
    runner = RunnerConfig()
    with SandboxPool(size=2) as pool:
        full = run_episodes(policy, "scripted:reference", tasks, pool, runner, attempts=2, seed=5)
        shards = [
            run_episodes(policy, "scripted:reference", tasks, pool, runner, attempts=2, seed=5, only=o)
            for o in ([3, 1], [0], [2])
        ]
    assert [r.index for r in shards[0]] == [3, 1]  # in the order asked
    pieces = sorted((r for s in shards for r in s), key=lambda r: r.index)
    assert rows(pieces) == rows(full)
    first = [r.events[0]["session_id"] for r in pieces]
    assert first == [r.events[0]["session_id"] for r in full]
    with open_executor(RolloutConfig(), sandboxes=2) as ex:
        assert ex.kind == "local"
        spec = PolicySpec(None, policy=policy)
        local = ex.run(spec, "scripted:reference", tasks, runner, attempts=2, seed=5)
    assert rows(local) == rows(full)


# --- the prefix cache budget ---------------------------------------------------------------


def test_the_prefix_cache_budget_reaches_every_policy_simulate_and_eval_load(tiny):
    model, _ = tiny

    def budget(policy):
        return None if policy.prefix is None else policy.prefix.budget

    def opened(config, where="local"):
        return open_policy(str(model), config.policy, where=where)

    assert budget(opened(SimulateConfig()).policy) is None  # simulate: off by default (see the test below)
    assert budget(opened(SimulateConfig(policy=PolicyConfig(prefix_cache_tokens=64))).policy) == 64
    assert budget(opened(eval_stage.EvalConfig()).policy) == 16384  # eval: on by default
    assert budget(opened(eval_stage.EvalConfig(policy=PolicyConfig(prefix_cache_tokens=0))).policy) is None
    # Ray: the driver only names the policy; a worker opens it with the budget it is given.
    ray = opened(SimulateConfig(policy=PolicyConfig(prefix_cache_tokens=32)), where="ray")
    assert ray.policy is None and ray.spec.prefix_cache_tokens == 32
    assert budget(open_spec(ray.spec)[0]) == 32
    ray_eval = opened(eval_stage.EvalConfig(), where="ray")
    assert ray_eval.policy is None and ray_eval.spec.prefix_cache_tokens == 16384
    # Scripted policies and servers have no in-process cache: the budget is no error there.
    assert open_spec(PolicySpec("scripted:nothing", prefix_cache_tokens=64))[0] is not None
    with pytest.raises(InputError, match="prefix_cache_tokens=-1"):
        simulate(SimulateConfig(policy=PolicyConfig(prefix_cache_tokens=-1)), str(model), [], "-")


@pytest.mark.docker
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded-sampling"])
def test_with_the_prefix_cache_eval_rows_are_identical_and_events_differ_only_in_logprobs(
    root, tiny, tmp_path, docker_client, one_thread, temperature
):
    """Why eval turns the cache on and simulate does not: reused keys/values equal a fresh
    prefill only up to float rounding, so the sampled ids (and with them every eval row) are
    the same, but the logprobs simulate writes into its events move by ~1e-6: not bitwise."""
    import polars as pl

    cand, base = tiny
    tables = []
    for n in (0, 16384):
        out = tmp_path / f"eval{n}" / "eval_results.arrow"
        config = eval_stage.EvalConfig(
            attempts=2,
            sandboxes=2,
            runner=RunnerConfig(max_turns=2, max_new_tokens=24, temperature=temperature),
            gates=GateConfig(min_paired_tasks=2),
            policy=PolicyConfig(prefix_cache_tokens=n),
        )
        eval_stage.run(config, str(cand), str(base), root, out)
        tables.append(pl.read_ipc(out).drop("latency_ms").sort("policy", "task_id", "attempt"))
    assert tables[0].height == 8 and tables[1].equals(tables[0])
    events = []
    for n in (0, 16384):
        out = tmp_path / f"sim{n}.jsonl"
        config = SimulateConfig(
            episodes=4,
            sandboxes=2,
            runner=RunnerConfig(max_turns=2, max_new_tokens=24, temperature=temperature),
            seed=3,
            policy=PolicyConfig(prefix_cache_tokens=n),
        )
        simulate(config, str(cand), root, out, quiet=True)
        events.append(scrub([json.loads(line) for line in out.read_text().splitlines()]))
    cold, warm = ([e for e in evs if e["type"] == "completion"] for evs in events)
    assert len(cold) == len(warm) >= 4
    assert [e["completion_ids"] for e in warm] == [e["completion_ids"] for e in cold]
    for a, b in zip(warm, cold, strict=True):
        assert a["completion_logprobs"] == pytest.approx(b["completion_logprobs"], abs=1e-5)
    strip = [{k: v for k, v in e.items() if k != "completion_logprobs"} for e in events[0]]
    assert [{k: v for k, v in e.items() if k != "completion_logprobs"} for e in events[1]] == strip
