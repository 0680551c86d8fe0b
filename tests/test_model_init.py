"""`init-model`: deterministic random weights, loadable by transformers as they are."""

from __future__ import annotations

import json

import pytest

from rlcycle.errors import InputError
from rlcycle.model_init import init_model
from rlcycle.policy.manifest import content_id, read_manifest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices gain nothing from more threads, and a busy machine makes them slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def seed0(tmp_path_factory):
    out = tmp_path_factory.mktemp("init") / "seed0"
    return init_model(out, seed=0)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path, seed0):
    again = init_model(tmp_path / "again", seed=0)
    other = init_model(tmp_path / "other", seed=1)
    first = f"{seed0.path}/model.safetensors"
    assert open(first, "rb").read() == (tmp_path / "again" / "model.safetensors").read_bytes()
    assert again.checkpoint_id == seed0.checkpoint_id
    assert other.checkpoint_id != seed0.checkpoint_id


def test_loads_with_auto_classes_as_is(seed0):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(seed0.path)
    tok = AutoTokenizer.from_pretrained(seed0.path)
    c = model.config
    assert (
        c.model_type,
        c.hidden_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.intermediate_size,
        c.max_position_embeddings,
    ) == ("qwen2", 256, 4, 4, 2, 704, 4096)
    assert c.vocab_size == len(tok) == 4096 and c.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert tok.convert_ids_to_tokens([2, 3, 7]) == ["<|im_end|>", "<tool_call>", "<|pad|>"]
    assert tok.chat_template and 2 in model.generation_config.eos_token_id
    lineage = json.loads(open(f"{seed0.path}/rlcycle.json").read())
    # the id covers every file the model is (weights, configs, tokenizer): rlcycle/policy/manifest.py
    assert (
        lineage["id"] == content_id(seed0.path) == read_manifest(seed0.path).id == seed0.checkpoint_id
        and lineage["parent"] is None
        and lineage["lineage"] == [lineage["id"]]
    )
    assert 3_900_000 < seed0.n_params < 4_100_000


def test_global_rng_is_left_alone(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    init_model(tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_refuses_to_overwrite_without_force(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty") as e:
        init_model(tmp_path / "m")
    assert "--force" in e.value.hint
    init_model(tmp_path / "m", seed=2, force=True)
    assert not (tmp_path / "m" / "keep.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temp or old directories left


def test_cli_init_model_json(cli, tmp_path):
    result = cli(["init-model", "-o", tmp_path / "m", "--seed", 3, "--size", "tiny", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["seed"] == 3 and out["size"] == "tiny" and out["checkpoint_id"].startswith("sha256:")
    assert (tmp_path / "m" / "config.json").exists()


def test_cli_rejects_bad_size_with_exit_2(cli, tmp_path):
    result = cli(["init-model", "-o", tmp_path / "m", "--size", "huge"])
    assert result.exit_code == 2 and result.error.startswith("Error: ") and "size='huge'" in result.error
    assert not (tmp_path / "m").exists()


def test_cli_warm_start_trains_on_reference_transcripts(cli, tmp_path):
    """A few steps only: this checks the wiring (suite -> harness -> loss -> lineage)."""
    from rlcycle.tasks.suite import Task, write_task

    for i, (old, new) in enumerate([("a - b", "a + b"), ("a * b", "a + b")]):
        write_task(
            Task(
                id=f"add-{i}",
                instruction="Fix add() in calc.py.",
                cluster="calc",
                difficulty=1,
                repo={"calc.py": f"def add(a, b):\n    return {old}\n"},
                hidden_tests={"test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
                solution={"calc.py": f"def add(a, b):\n    return {new}\n"},
            ),
            tmp_path / "suite",
        )
    result = cli(
        ["init-model", "-o", tmp_path / "m", "--warm-start", tmp_path / "suite", "--warm-start-steps", 2, "--json"]
    )
    assert result.exit_code == 0, result.output
    warm = json.loads(result.stdout.strip().splitlines()[-1])["warm_start"]
    assert warm["tasks"] == 2 and warm["steps"] == 2 and warm["tokens_trained"] > 0
    assert warm["first_loss"] > 5 and 0 <= warm["valid_first_calls"] <= 2
    lineage = json.loads((tmp_path / "m" / "rlcycle.json").read_text())
    assert lineage["metrics"]["warm_start"]["demos_sha256"] == lineage["data"][0]["sha256"]
