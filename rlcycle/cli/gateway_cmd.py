"""`rlcycle gateway`: serve a registry alias over the OpenAI chat API and log every completion."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from rlcycle import console
from rlcycle.cli import config_help
from rlcycle.cli import options as opt


def gateway(
    log_dir: Path = typer.Option(None, "--log-dir", help="Directory the events are written to (required)."),
    alias: str = typer.Option(None, "--alias", help="Registry alias, checkpoint id or directory (default production)."),
    upstream: str = typer.Option(
        None,
        "--upstream",
        help="OpenAI-compatible completions server returning token ids + logprobs (vLLM, SGLang, rlcycle serve); default: in-process.",
    ),
    host: str = typer.Option(None, "--host", help="Interface to bind (default 127.0.0.1)."),
    port: int = typer.Option(None, "--port", help="TCP port (default 8100; 0 picks a free one)."),
    api_key: str = typer.Option(
        None,
        "--api-key",
        envvar="RLCYCLE_GATEWAY_API_KEY",
        help="Require this bearer token (required off loopback).",
    ),
    canary: float = typer.Option(
        None, "--canary", help="Share of sessions sent to `candidate` (default: the registry's canary)."
    ),
    device: str = typer.Option(None, "--device", help="In-process: cpu, cuda, cuda:N or auto."),
    _help_config: bool = config_help.option("gateway"),
    config: Path = opt.config("gateway"),
    set_: list[str] = opt.sets("flush_interval_s=0.2"),
    as_json: bool = opt.json_flag('Print {"url", "checkpoint_id", "log_dir"} on stdout once listening.'),
) -> None:
    """Serve a registry alias over an OpenAI-compatible chat completions API (/v1/chat/completions with tools and
    streaming, /v1/models, /health) and log every completion as a `completion` event (exact token ids, behaviour
    logprobs, checkpoint id) in LOG_DIR, which `rlcycle collect LOG_DIR` reads, also while it is written. Late
    signals go to POST /v1/rlcycle/events; alias moves are picked up without a restart. Binds to 127.0.0.1 unless
    --host says otherwise (then --api-key is required). See docs/gateway.md.

    Examples:

      rlcycle gateway --log-dir logs/gateway --port 8100

      rlcycle gateway --upstream http://127.0.0.1:8000 --log-dir logs/gateway --json

      rlcycle gateway --host 0.0.0.0 --api-key $KEY --log-dir /var/log/rlcycle
    """
    from rlcycle.config import resolve
    from rlcycle.gateway import GatewayConfig, serve

    cfg = resolve(
        GatewayConfig,
        config,
        set_,
        {
            "log_dir": str(log_dir) if log_dir else None,
            "alias": alias,
            "upstream": upstream,
            "host": host,
            "port": port,
            "api_key": api_key,
            "canary_fraction": canary,
            "device": device,
        },
        section="gateway",
    )
    if cfg.registry is None:  # the CLI's default registry (rlcycle/cli/options.py)
        cfg = dataclasses.replace(cfg, registry=str(opt.registry_dir()))

    def listening(url: str, gw) -> None:
        info = gw.models.describe()
        if as_json:
            opt.emit_json(
                {
                    "url": url,
                    "checkpoint_id": info["checkpoint_id"],
                    "candidate_id": info["candidate_id"],
                    "log_dir": cfg.log_dir,
                }
            )
        console.info(
            f"gateway: {cfg.alias} ({info['checkpoint_id']}) at {url}/v1, "
            f"logging to {cfg.log_dir or '(nowhere: logging off)'} (Ctrl-C to stop)"
        )

    serve(cfg, on_listening=listening)
