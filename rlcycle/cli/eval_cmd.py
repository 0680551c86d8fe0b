"""`rlcycle eval`: candidate vs baseline on a task suite, with a statistical gate."""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle import console
from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt
from rlcycle.errors import EXIT_GATE_REFUSED, RlcycleError


def eval_(
    candidate: str = typer.Option(
        ...,
        "--candidate",
        help="Checkpoint dir, registry alias, URL (URL#MODEL: a served name or an alias whose adapter it "
        "lists), or scripted:reference|nothing.",
    ),
    baseline: str = typer.Option("production", "--baseline", help="Same forms; default the registry's production."),
    tasks: Path = typer.Option(Path("sample_data/tasks"), "--tasks", help="Task suite directory."),
    out: Path = opt.out("eval_results.arrow to write (verdict.json goes beside it)."),
    attempts: int = typer.Option(None, "--attempts", "-k", help="Attempts per task and policy (default 2)."),
    sandboxes: int = typer.Option(None, "--sandboxes", help="Sandboxes running at once (default 4)."),
    executor: str = opt.executor(),
    ray_address: str = opt.ray_address(),
    _help_config: bool = config_help.option("eval"),
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="Tokenizer directory (needed for an http policy: the served model's)."
    ),
    config: Path = opt.config("eval"),
    set_: list[str] = opt.sets(help="Override a config key: --set gates.max_clarification_rate_increase=0.05."),
    as_json: bool = opt.json_flag("Print the verdict as one JSON object on stdout."),
) -> None:
    """Run a candidate and a baseline as agents on a task suite in Docker sandboxes, compare them with confidence
    intervals, and decide whether the candidate may ship.

    Writes eval_results.arrow and verdict.json beside it. Exit 3 when a gate refuses the candidate.

    Examples:

      rlcycle eval --candidate runs/c1/checkpoint --baseline production --tasks sample_data/tasks
    -o runs/c1/eval/eval_results.arrow

      rlcycle eval --candidate scripted:reference --baseline scripted:nothing --tasks sample_data/tasks
    -o /tmp/e.arrow --json

      rlcycle eval --candidate runs/c1/checkpoint --tasks /shared/suite --executor ray --ray-address auto
    -o runs/c1/eval/eval_results.arrow

      rlcycle eval --candidate 'http://127.0.0.1:8311#candidate' --baseline 'http://127.0.0.1:8311#production'
    --tokenizer runs/base --tasks sample_data/tasks -o /tmp/e.arrow   # two adapters of one vLLM
    """
    from rlcycle.config import resolve
    from rlcycle.evaluation import stage

    flags = {
        "attempts": attempts,
        "sandboxes": sandboxes,
        **opt.rollout_flags(executor, ray_address),
        "policy.tokenizer": tokenizer,
    }
    cfg = resolve(stage.EvalConfig, config, set_, flags, section="eval")
    result = stage.STAGE.run(cfg, stage.EvalArgs(candidate, baseline, tasks, out, registry=opt.registry_dir()))
    console.err.print(stage.verdict_table(result.verdict))  # with --json too: the table is for people
    output.finish(result, as_json=as_json, data=result.verdict, error=_gate_error(result))


def _gate_error(result) -> RlcycleError | None:
    """Exit 3 when a gate refused the candidate, 1 when eval gave no verdict; None when it passed."""
    if result.decision == "refuse":
        failed = [g["name"] for g in result.verdict["gates"] if not g["passed"]]
        return RlcycleError(
            f"the gate refused the candidate (failed: {', '.join(failed)})",
            hint=f"see {result.verdict_path}",
            exit_code=EXIT_GATE_REFUSED,
        )
    if result.decision == "no_verdict":
        return no_verdict(result.verdict)
    return None


def no_verdict(verdict: dict, what: str = "no verdict", path: str | Path | None = None) -> RlcycleError:
    """The error of an eval that gave no verdict: the verdict's reason and its hint (the fix),
    as `rlcycle eval` and `rlcycle cycle` both say it; `path`: the verdict.json to read more in."""
    hint = verdict.get("hint") or "check sandbox health (`rlcycle sandbox ls`) and rerun"
    return RlcycleError(
        f"{what}: {verdict.get('reason') or 'the eval stage recorded no reason'}",
        hint=hint + (f"; see {path}" if path else ""),
    )
