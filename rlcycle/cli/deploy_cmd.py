"""`rlcycle deploy`, `rlcycle rollback`, `rlcycle deploy-vllm` (the vLLM hook) and `rlcycle registry ...`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt

registry_app = typer.Typer(
    help="The model registry: checkpoints by content id, aliases, deployment history.\n\n"
    "Example:\n\n  rlcycle registry ls",
    no_args_is_help=True,
)


def _hook_option():
    return typer.Option(None, "--hook", help="Serving hook: shell command or http(s) URL (JSON POST).")


def _hook_key_option():
    return typer.Option(
        None, "--hook-api-key-env", help="Env var holding the key sent to an http(s) hook as `Authorization: Bearer`."
    )


def deploy(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory to promote."),
    verdict: Path = typer.Option(None, "--verdict", help="verdict.json from `rlcycle eval`."),
    alias: str = typer.Option(None, "--alias", help="Alias to promote into (default production)."),
    force: bool = typer.Option(None, "--force", help="Deploy without a passing verdict (recorded)."),
    canary: float = typer.Option(None, "--canary", help="Serve to this fraction of traffic first (0-1)."),
    hook: str = _hook_option(),
    hook_api_key_env: str = _hook_key_option(),
    _help_config: bool = config_help.option("deploy"),
    config: Path = opt.config("deploy"),
    set_: list[str] = opt.sets(help="Override a config key: --set hook_timeout_s=30."),
    as_json: bool = opt.json_flag("Print one JSON result object."),
) -> None:
    """Promote a checkpoint in the model registry if its verdict passed; notify serving.

    Refuses (exit 3) without an accepting verdict unless --force, which is recorded. If the serving hook fails, the
    aliases are moved back.

    Examples:

      rlcycle deploy runs/c1/checkpoint --verdict runs/c1/eval/verdict.json

      rlcycle deploy ckpt/ --verdict verdict.json --canary 0.05 --hook 'systemctl reload my-server'

      rlcycle deploy ckpt/ --verdict verdict.json --hook http://127.0.0.1:8080/v1/rlcycle/reload
    --hook-api-key-env RLCYCLE_GATEWAY_API_KEY

      rlcycle deploy ckpt/ --verdict verdict.json --hook 'rlcycle deploy-vllm
    --url http://127.0.0.1:8000'   # docs/vllm.md
    """
    from rlcycle.config import resolve
    from rlcycle.deploy import stage

    flags = {
        "alias": alias,
        "force": force,
        "canary_fraction": canary,
        "hook": hook,
        "hook_api_key_env": hook_api_key_env,
    }
    cfg = resolve(stage.DeployConfig, config, set_, flags, section="deploy")
    result = stage.STAGE.run(cfg, stage.DeployArgs(checkpoint, verdict, opt.open_registry()))
    # The summary is the result (stdout); deploy writes no file to put its config beside.
    output.finish(result, as_json=as_json, text=stage.format_summary(result))


def rollback(
    alias: str = typer.Option(None, "--alias", help="Alias to roll back (default production)."),
    note: str = typer.Option(None, "--note", help="Why (recorded in the history)."),
    hook: str = _hook_option(),
    hook_api_key_env: str = _hook_key_option(),
    config: Path = opt.config("deploy"),
    set_: list[str] = opt.sets(help="Override a config key: --set hook_timeout_s=30."),
    as_json: bool = opt.json_flag("Print one JSON result object."),
) -> None:
    """Point an alias back at the previous checkpoint; then the serving hook, as deploy calls it.

    If the hook fails, the rollback is undone (recorded) and it exits 1.

    Examples:

      rlcycle rollback --alias production

      rlcycle rollback --hook 'rlcycle deploy-vllm --url http://127.0.0.1:8000'
    """
    from rlcycle import deploy as stage
    from rlcycle.config import resolve

    flags = {"alias": alias, "hook": hook, "hook_api_key_env": hook_api_key_env}
    cfg = resolve(stage.DeployConfig, config, set_, flags, section="deploy")
    result = stage.rollback(opt.open_registry(), cfg.alias, note=note, config=cfg)
    output.finish(result, as_json=as_json, text=stage.format_summary(result))


def deploy_vllm(
    url: str = typer.Option(..., "--url", help="The server, e.g. http://127.0.0.1:8000 (with or without /v1)."),
    api_key_env: str = typer.Option(
        None, "--api-key-env", help="Environment variable holding the server's API key (sent as Bearer)."
    ),
    tolerance: float = typer.Option(
        0.05, "--tolerance", help="Largest allowed |served - local| per-token logprob, in nats."
    ),
    mean_tolerance: float = typer.Option(
        None, "--mean-tolerance", help="Also require the mean |served - local| logprob to be at most this."
    ),
    relative: bool = typer.Option(
        False,
        "--relative",
        help="Also require the server to show at least half of this checkpoint's update from its base and from "
        "every other loaded version, in its own numerics (a bf16 server with a loose --tolerance; docs/vllm.md).",
    ),
    checkpoint: str = typer.Option(
        None, "--checkpoint", help="Checkpoint directory (default: $RLCYCLE_CHECKPOINT_DIR)."
    ),
    id_: str = typer.Option(None, "--id", help="Checkpoint id (default: $RLCYCLE_CHECKPOINT_ID, else computed)."),
    path_map: str = typer.Option(
        None, "--path-map", help="LOCAL=REMOTE: rewrite the adapter path's prefix for a server on another host."
    ),
    device: str = typer.Option("cpu", "--device", help="Device of the local reference model."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per HTTP request."),
) -> None:
    """Deploy hook for vLLM: hot-load the checkpoint's LoRA adapter into a running vLLM under its per-version name
    rlcycle-<12 hex of its id>, check the served logprobs against the checkpoint's own (merged weights, float32, on
    --device), then unload the older rlcycle-* adapters (not on a canary deploy). Exit 0: served and checked; 1: the
    check failed (the new adapter is unloaded and `rlcycle deploy` moves the aliases back); 2: usage (no adapter, bad
    options). One JSON line on stdout says what it did. The checkpoint comes from $RLCYCLE_CHECKPOINT_DIR, which
    `rlcycle deploy` sets for its hook, unless --checkpoint is given (docs/vllm.md).

    Examples:

      rlcycle deploy runs/c1/checkpoint --verdict runs/c1/eval/verdict.json --hook 'rlcycle deploy-vllm --url
    http://127.0.0.1:8000 --api-key-env VLLM_API_KEY'

      rlcycle deploy-vllm --url http://127.0.0.1:8000 --checkpoint runs/c1/checkpoint --tolerance 0.6 --relative
    """
    import sys

    from rlcycle.deploy import vllm
    from rlcycle.errors import EXIT_FAILURE

    options = vllm.HookOptions(
        url, api_key_env, tolerance, mean_tolerance, relative, checkpoint, id_, path_map, device, timeout
    )
    report, summary = vllm.hook(options)
    opt.emit_json(dataclasses.asdict(report))
    sys.stdout.flush()
    sys.stderr.write(summary + "\n")
    if not report.passed:
        raise typer.Exit(EXIT_FAILURE)


@registry_app.command(
    "ls",
    help="List checkpoints, aliases and recent history.\n\nExample:\n\n  rlcycle registry ls --json",
)
def registry_ls(
    as_json: bool = opt.json_flag("Print one JSON object."),
    history: int = typer.Option(10, "--history", help="How many recent deployments to show."),
) -> None:
    reg = opt.open_registry()
    hist = reg.history().to_pylist()[-history:] if history else []
    state = reg.state()
    if as_json:
        opt.emit_json(
            {
                "root": str(reg.root),
                "aliases": state["aliases"],
                "canary": state.get("canary"),
                "checkpoints": reg.checkpoints(),
                "history": hist,
            }
        )
        return
    typer.echo(f"registry: {reg.root}")
    for c in reg.checkpoints():
        typer.echo(f"  {c['id']}  {','.join(c['aliases']) or '-':<28} parent={c['parent'] or '-'}")
    if state.get("canary"):
        typer.echo(f"  canary: {json.dumps(state['canary'])}")
    for h in hist:
        typer.echo(
            f"  {h['ts']:%Y-%m-%d %H:%M:%S} {h['action']:<9} {h['alias']:<11} {h['checkpoint_id']} {h['note'] or ''}"
        )


@registry_app.command(
    "show",
    help="Show one checkpoint's lineage (rlcycle.json).\n\nExample:\n\n  rlcycle registry show production",
)
def registry_show(
    ref: str = typer.Argument(..., help="Alias, checkpoint id, or directory."),
) -> None:
    from rlcycle.policy.registry import checkpoint_id

    path = opt.open_registry().resolve(ref)
    meta_path = path / "rlcycle.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    opt.emit_json({"id": checkpoint_id(path), "path": str(path), **meta})


@registry_app.command(
    "add",
    help="Register a checkpoint, optionally under an alias.\n\nExample:\n\n  rlcycle registry add models/tiny --alias production",
)
def registry_add(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory."),
    alias: str = typer.Option(None, "--alias", help="Set this alias to it (e.g. production)."),
) -> None:
    from rlcycle import deploy as stage

    typer.echo(stage.register(checkpoint, alias, opt.open_registry()))


@registry_app.command(
    "verify",
    help="Re-hash checkpoints and check them against their manifests and ids.\n\n"
    "One line per checkpoint on stdout: `ok` or the files that changed, went missing or appeared. "
    "Exit 1 if any changed, 2 if a REF names nothing.\n\n"
    "Examples:\n\n  rlcycle registry verify\n\n  rlcycle registry verify production runs/c1/checkpoint --json",
)
def registry_verify(
    refs: list[str] = typer.Argument(
        None, metavar="[REF]...", help="Aliases, checkpoint ids or directories (default: every checkpoint)."
    ),
    as_json: bool = opt.json_flag('Print {"ok", "checkpoints": [...]} as one JSON object.'),
) -> None:
    checks = opt.open_registry().verify(refs or [])
    ok = all(c.ok for c in checks)
    if as_json:
        opt.emit_json({"ok": ok, "checkpoints": [c.__dict__ for c in checks]})
    else:
        for c in checks:
            typer.echo(_verify_line(c))
    if not ok:
        raise typer.Exit(1)


def _verify_line(c) -> str:
    """`ok  ID  (aliases; N files, X MB)` or `CHANGED  ID  file: what; file: what`."""
    if not c.ok:
        return f"CHANGED  {c.id or c.ref}  {c.path}: " + "; ".join(c.problems)
    note = "" if c.recorded else "; no manifest: checked against its pre-manifest id"
    names = f"{','.join(c.aliases)}; " if c.aliases else ""
    return f"ok       {c.id}  ({names}{c.files} files, {c.bytes / 1e6:.1f} MB, {c.seconds:.2f} s{note})"
