"""`rlcycle sandbox ...`: run one command in a hardened sandbox, build the image, list, gc.

Thin glue over rlcycle.sandbox; exit statuses of `exec` follow `timeout(1)` and `docker run`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from rlcycle import console
from rlcycle.cli import options as opt
from rlcycle.errors import InputError, RlcycleError

# `rlcycle sandbox exec` exit statuses besides the command's own (as timeout(1), docker run).
EXIT_TIMEOUT = 124
EXIT_INFRA = 125
EXIT_OOM = 137

app = typer.Typer(
    help=(
        "Hardened Docker sandboxes for the agent's tool calls: run a command, build the image, "
        "list and remove leftovers.\n\n"
        "Example:\n\n"
        "  rlcycle sandbox build\n\n"
        "  rlcycle sandbox exec --timeout 10 -- python3 -c 'print(6 * 7)'"
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
)

CONFIG_OPT = opt.config("sandbox")
SET_OPT = opt.sets("memory_mb=1024")
JSON_OPT = opt.json_flag("Print one JSON object on stdout.")


def _config(config: Path | None, sets: list[str] | None, flags: dict | None = None):
    from rlcycle.config import resolve
    from rlcycle.sandbox.config import SandboxConfig

    return resolve(SandboxConfig, config, sets, flags or {}, section="sandbox")


@app.command(
    "exec",
    help=(
        "Run one command in a fresh hardened sandbox, print its output, exit with its status, "
        "and leave nothing behind.\n\n"
        "Exit status: the command's own; 124 when it timed out; 137 when it ran out of memory; "
        "125 when the sandbox itself failed (an infrastructure error, never the command's).\n\n"
        "Examples:\n\n"
        "  rlcycle sandbox exec -- python3 -c 'print(6 * 7)'\n\n"
        "  rlcycle sandbox exec --copy tests/ --timeout 60 -- pytest -q"
    ),
)
def exec_cmd(
    cmd: list[str] = typer.Argument(
        ..., help="The command and its arguments (after --). One argument runs through bash."
    ),
    image: str = typer.Option(None, "--image", help="Image to run (default: the built rlcycle-sandbox image)."),
    timeout: float = typer.Option(None, "--timeout", help="Seconds before the command is killed (default 60)."),
    copy: list[Path] = typer.Option(
        None, "--copy", help="Local file or directory to copy into /workspace first (repeatable)."
    ),
    env: list[str] = typer.Option(None, "--env", "-e", help="KEY=VALUE in the command's environment (repeatable)."),
    config: Path = CONFIG_OPT,
    set_: list[str] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    from rlcycle.sandbox import Status, run_once

    cfg = _config(config, set_, {"image": image, "timeout_s": timeout})
    files = _local_files(copy or [])
    command: str | list[str] = cmd[0] if len(cmd) == 1 else list(cmd)
    result = run_once(command, cfg, files=files, env=_env_pairs(env or []))
    if as_json:
        opt.emit_json(result.to_dict())
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
    if result.status is Status.INFRA:
        raise RlcycleError(
            f"the sandbox failed (infrastructure error, not the command's): {result.error}",
            hint="retry; `rlcycle sandbox ls` shows what runs, `docker info` checks the engine",
            exit_code=EXIT_INFRA,
        )
    if result.truncated and not as_json:
        console.warn("output was truncated (head and tail kept); raise --set max_output_bytes=N to see more")
    if result.status is Status.TIMEOUT:
        console.info(f"rlcycle sandbox: timed out after {cfg.timeout_s:g}s (killed; exit {EXIT_TIMEOUT})")
        raise typer.Exit(EXIT_TIMEOUT)
    if result.status is Status.OOM:
        console.info(f"rlcycle sandbox: out of memory (limit {cfg.memory_mb} MiB; exit {EXIT_OOM})")
        raise typer.Exit(EXIT_OOM)
    raise typer.Exit(result.exit_code or 0)


@app.command(
    "build",
    help=(
        "Build the sandbox image from sandbox_images/ on every configured engine; a no-op when "
        "the content-hashed tag exists. Without a registry the base is made with debootstrap.\n\n"
        "Examples:\n\n"
        "  rlcycle sandbox build\n\n"
        "  rlcycle sandbox build --offline --force"
    ),
)
def build_cmd(
    force: bool = typer.Option(False, "--force", help="Rebuild even when the tag exists."),
    offline: bool = typer.Option(False, "--offline", help="Never try the registry: build the base with debootstrap."),
    config: Path = CONFIG_OPT,
    set_: list[str] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    from rlcycle.sandbox.engine import docker_clients
    from rlcycle.sandbox.images import ensure_image, image_exists, image_tag

    cfg = _config(config, set_, {"offline_base": "always" if offline else None})
    built = []
    for client in docker_clients(cfg.hosts):
        host = client.api.base_url
        tag = cfg.image or image_tag(cfg)
        existed = image_exists(client, tag) and not force
        start = time.monotonic()
        tag = ensure_image(client, cfg, force=force, log=console.info)
        state = "up to date" if existed else f"built in {time.monotonic() - start:.1f}s"
        console.info(f"{tag} on {host}: {state}")
        built.append({"host": host, "image": tag, "built": not existed})
    if as_json:
        opt.emit_json({"images": built})
    else:
        for b in {b["image"] for b in built}:
            print(b)


@app.command(
    "ls",
    help=(
        "List every rlcycle sandbox container and volume (running, stopped, expired) on every "
        "configured engine.\n\n"
        "Examples:\n\n"
        "  rlcycle sandbox ls\n\n"
        "  rlcycle sandbox ls --run 3f2a9c1b0d4e --json"
    ),
)
def ls_cmd(
    run: str = typer.Option(None, "--run", help="Only this run id (the rlcycle.run label)."),
    config: Path = CONFIG_OPT,
    set_: list[str] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    from rlcycle.sandbox.cleanup import list_leftovers
    from rlcycle.sandbox.engine import docker_clients

    cfg = _config(config, set_)
    items = [x for c in docker_clients(cfg.hosts) for x in list_leftovers(c, run)]
    if as_json:
        opt.emit_json({"items": [x.as_dict() for x in items]})
        return
    _print_table(items)
    console.info(f"{len(items)} rlcycle item(s); {sum(x.expired() for x in items)} expired")


@app.command(
    "gc",
    help=(
        "Remove expired leftovers of crashed runs (containers, then volumes), or with --all "
        "everything rlcycle made. Items of a still-running local owner are kept.\n\n"
        "Examples:\n\n"
        "  rlcycle sandbox gc\n\n"
        "  rlcycle sandbox gc --all --dry-run"
    ),
)
def gc_cmd(
    all_: bool = typer.Option(False, "--all", help="Remove every rlcycle container and volume, expired or not."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
    config: Path = CONFIG_OPT,
    set_: list[str] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    from rlcycle.sandbox.cleanup import gc
    from rlcycle.sandbox.engine import docker_clients

    cfg = _config(config, set_)
    removed = [x for c in docker_clients(cfg.hosts) for x in gc(c, everything=all_, dry_run=dry_run)]
    if as_json:
        opt.emit_json({"removed": [x.as_dict() for x in removed], "dry_run": dry_run})
        return
    _print_table(removed)
    verb = "would remove" if dry_run else "removed"
    console.info(f"gc: {verb} {len(removed)} item(s)")


def _print_table(items) -> None:
    now = time.time()
    for x in items:
        left = x.expires - now
        when = f"in {left / 60:.0f}m" if left > 0 else f"{-left / 60:.0f}m ago"
        print(f"{x.kind:9}  {x.name:40}  run={x.run:14}  {x.status:8}  expires {when:10}  {x.owner}")


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--env {item!r}: expected KEY=VALUE", hint="e.g. --env PYTHONHASHSEED=0")
        out[key] = value
    return out


def _local_files(paths: list[Path], limit: int = 64 << 20) -> dict[str, bytes]:
    """{relative path: bytes} of local files/directories for --copy; symlinks skipped."""
    files: dict[str, bytes] = {}
    total = 0
    for root in paths:
        if not root.exists():
            raise InputError(f"--copy {root}: no such file or directory", hint="check the path")
        entries = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in entries:
            if p.is_symlink():
                continue
            rel = p.name if p == root else str(p.relative_to(root))
            files[rel] = p.read_bytes()
            total += len(files[rel])
            if total > limit:
                raise InputError(f"--copy: more than {limit >> 20} MiB of files", hint="copy less")
    return files
