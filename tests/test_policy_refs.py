"""Every command that takes a policy takes every kind of reference, opened by one function
(rlcycle/policy/open.py): a registry alias, a checkpoint id, a checkpoint directory,
`scripted:*` and an http(s) server, here and on Ray, with the same names wherever it runs.

The matrix, as the tests below assert it:

| command          | alias | id | directory | scripted:     | http(s)://     |
|------------------|-------|----|-----------|---------------|----------------|
| open_policy      | yes   | yes| yes       | yes           | yes            |  local and ray: one name, one run key
| simulate         | yes   | yes| yes       | yes           | yes            |  (Docker)
| eval             | yes   | yes| yes       | yes           | yes            |  (Docker)
| train --base     | yes   | yes| yes       | refused (2)   | refused (2)    |  training needs weights
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_runner import make_suite
from train_data import make_rows, write_examples

from rlcycle.cli.options import registry_dir
from rlcycle.deploy.stage import register
from rlcycle.errors import InputError
from rlcycle.model_init import init_model
from rlcycle.policy.open import PolicyConfig, open_policy, open_spec
from rlcycle.policy.registry import Registry, checkpoint_id

CHECKPOINT_KINDS = ("alias", "id", "dir")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("refs") / "tiny"
    init_model(path, seed=0)
    return path


@pytest.fixture
def refs(model, rlcycle_home):
    """Each kind of reference to the tiny model (the scripted one names itself)."""
    register(model, "production", Registry(registry_dir()))
    return {"alias": "production", "id": checkpoint_id(model), "dir": str(model), "scripted": "scripted:reference"}


@pytest.mark.parametrize("kind", [*CHECKPOINT_KINDS, "scripted"])
def test_a_reference_opens_here_and_for_ray_under_one_name(refs, model, kind):
    cid = checkpoint_id(model)
    local = open_policy(refs[kind], PolicyConfig(), registry_dir())
    ray = open_policy(refs[kind], PolicyConfig(), registry_dir(), where="ray")
    try:
        assert local.policy is not None and ray.policy is None  # Ray: named here, loaded by the workers
        assert (local.name, local.checkpoint_id, local.run_key) == (ray.name, ray.checkpoint_id, ray.run_key)
        if kind == "scripted":
            assert (local.name, local.checkpoint_id, ray.spec.ref) == ("scripted:reference", None, "scripted:reference")
        else:  # named by content, pinned to the directory: a deploy moving the alias changes nothing
            assert local.name == cid and local.run_key is None  # float32 on a CPU: the trainer's numerics
            pinned = Path(ray.spec.ref)  # the directory itself, or the registry's copy the alias names now
            assert pinned.is_absolute() and checkpoint_id(pinned) == cid and ray.spec.dtype == "float32"
        worker_policy, renderer = open_spec(ray.spec)  # what a Ray worker runs
        assert worker_policy is not None and renderer is not None
        worker_policy.close()
    finally:
        local.close()


def test_dtype_auto_is_resolved_once_so_local_and_ray_runs_share_a_run_key(refs, model):
    """The bug this fixes: `auto` named a local run `<id>@bfloat16` on a bf16 GPU and a Ray run
    `<id>`. Resolved where the run starts, both carry the dtype that runs."""
    cid = checkpoint_id(model)
    for where in ("local", "ray"):
        opened = open_policy(refs["dir"], PolicyConfig(dtype="bfloat16"), where=where)
        assert (opened.name, opened.run_key, opened.spec.dtype) == (cid, f"{cid}@bfloat16", "bfloat16")
        opened.close()


def test_bad_references_are_clear_errors(refs, tmp_path):
    with pytest.raises(InputError, match="'candidate' is not a registry alias"):
        open_policy("candidate", PolicyConfig(), registry_dir())
    with pytest.raises(InputError, match="not a directory, and no registry was given"):
        open_policy(str(tmp_path / "missing"))
    with pytest.raises(InputError, match="unknown scripted policy"):
        open_policy("scripted:genius")
    with pytest.raises(InputError, match="is a server and comes without a tokenizer"):
        open_policy("http://127.0.0.1:9/v1")
    with pytest.raises(InputError, match="executor=ray takes a policy reference"):
        open_policy(object(), where="ray")


@pytest.fixture
def examples(model, tmp_path):
    return write_examples(tmp_path / "ex.arrow", model, make_rows(4, seed=2), versions=[checkpoint_id(model)] * 4)


@pytest.mark.parametrize("kind", CHECKPOINT_KINDS)
def test_train_base_takes_every_checkpoint_reference(cli, refs, model, examples, tmp_path, kind):
    out = tmp_path / "ck"
    r = cli(["train", examples, "--base", refs[kind], "-o", out, "--max-steps", 1, "--set", "batch_size=4", "--json"])
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "rlcycle.json").read_text())
    assert meta["parent"] == checkpoint_id(model) == checkpoint_id(meta["base"])


@pytest.mark.parametrize("ref", ["scripted:reference", "http://127.0.0.1:9/v1"])
def test_train_base_refuses_a_policy_without_weights(cli, refs, examples, tmp_path, ref):
    r = cli(["train", examples, "--base", ref, "-o", tmp_path / "ck"])
    assert r.exit_code == 2 and "a checkpoint is needed here" in r.error and not (tmp_path / "ck").exists()


@pytest.fixture
def suite(tmp_path):
    make_suite(tmp_path / "suite")
    return tmp_path / "suite"


@pytest.mark.docker
@pytest.mark.parametrize("kind", [*CHECKPOINT_KINDS, "scripted"])
def test_simulate_and_eval_take_every_reference(cli, refs, model, suite, tmp_path, docker_client, kind):
    name = "scripted:reference" if kind == "scripted" else checkpoint_id(model)
    events = tmp_path / "e.jsonl"
    small = ["--set", "runner.max_turns=1", "--set", "runner.max_new_tokens=8", "--sandboxes", 1]
    r = cli(["simulate", "-p", refs[kind], "-t", suite, "-o", events, "-n", 1, *small, "--json", "-q"])
    assert r.exit_code == 0, r.output
    versions = {e["policy_version"] for e in map(json.loads, events.read_text().splitlines()) if "policy_version" in e}
    assert json.loads(r.stdout)["policy"] == name and versions == {name}
    out = tmp_path / "eval" / "eval_results.arrow"
    args = ["eval", "--candidate", refs[kind], "--baseline", "scripted:nothing", "--tasks", suite, "-o", out]
    sets = ["--set", "max_tasks=1", "--set", "gates.min_paired_tasks=1", "--set", "runner.max_turns=1"]
    r = cli([*args, "--attempts", 1, "--sandboxes", 1, *sets, "--json"])
    assert r.exit_code in (0, 3), r.output  # accepted or refused: both mean it ran
    verdict = json.loads((out.parent / "verdict.json").read_text())
    assert verdict["candidate_ref"] == refs[kind] and verdict["candidate_id"] == (None if kind == "scripted" else name)


def test_a_checkpoint_changed_on_disk_is_refused_when_opened_to_sample_or_train(cli, model, examples, tmp_path):
    """The cheap check on open (sizes and mtimes against the manifest; a moved file is re-hashed):
    64 bytes zeroed in place after the checkpoint was made are caught, naming the file."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model, copy, copy_function=shutil.copy2)  # copy2 keeps the mtimes the manifest records
    assert open_policy(copy, where="ray").checkpoint_id == checkpoint_id(model)
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(4096)
        f.write(bytes(64))
    for where in ("local", "ray"):
        with pytest.raises(InputError, match="model.safetensors: changed"):
            open_policy(copy, where=where)
    r = cli(["train", examples, "--base", copy, "-o", tmp_path / "ck"])
    assert r.exit_code == 2 and "model.safetensors: changed" in r.error and not (tmp_path / "ck").exists()
