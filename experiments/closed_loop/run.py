"""The closed-loop experiment: `rlcycle.cycle.Cycle` N times in a row on simulated users, per
arm, in this process, then the online A/B tables and "did the loop learn" (docs/closed_loop.md).

    python experiments/closed_loop/run.py                           # treatment + control, 3 cycles
    python experiments/closed_loop/run.py --arms treatment --out runs/closed_loop1
    python experiments/closed_loop/run.py --start runs/warm --tasks sample_data/edit_tasks/train \\
        --cycles 3 --episodes 96 --seed 1 --out runs/exp_s1
    python experiments/closed_loop/run.py --out runs/exp_s1 --report-only --json
    python experiments/closed_loop/run.py --set train.lr=1e-4 --set eval.max_tasks=20

Read top to bottom, the program does this:
  1. the cycle config of every run, resolved by rlcycle.config as `rlcycle cycle` resolves its
     own: this experiment's sizes (BASE; WARM with a start checkpoint) and the run's traffic
     seed and session count < `--set KEY=VALUE` (the keys of `rlcycle cycle --set`:
     `train.lr=1e-4`, `reward_spec=PATH`) < the arm's distill switch;
  2. the start every arm starts from: `--start DIR`, `--warm-start` (`init-model --warm-start
     TASKS` into OUT/start, once), or the tiny default model (random weights, seed 0) made into
     OUT/start;
  3. per arm (`--arms treatment,control[,naive]`) its own registry home `OUT/<arm>/home`, the
     start registered there as `production` (rlcycle.policy.registry's public API); then cycle
     k runs in `OUT/<arm>/cycle-k`: simulate (the arm's production on the suite) -> collect ->
     distill -> train -> eval -> deploy, with simulate seed 1000*seed + k in every arm (the same
     traffic), so cycle k serves what cycle k-1 deployed: on-policy. The arms differ only in
     distill:
       treatment  the reward spec as it is
       control    `permute_rewards`: rewards shuffled across the samples of each distill batch
       naive      `discard_invalid`: samples with an invalid tool call dropped (the first hack)
     Cycle 1 of every arm serves the start on the same seed, so the arms after the first reuse
     the first arm's cycle-1 simulate and collect outputs (the cycle's own cache finds them);
  4. `OUT/<arm>/measure` (the cycle until distill, seed 1000*seed + 900, no arm switch) measures
     the version the arm deployed last on fresh traffic; with `--start` or `--warm-start`,
     `OUT/v0/measure` measures the start on the same sessions, and the differences are paired
     by session (the `pair_key` simulate writes); with `--heldout DIR`, `OUT/<arm>/measure-heldout`
     (seed 1000*seed + 901) measures v0 and every arm's last version the same way on tasks no arm
     trained on (kept out of the arm's per-version report: a separate block of the experiment's);
  5. the report (report.py per arm, compare.py across arms): online metrics per version with 95%
     CIs, each last version minus v0 and minus control's, each cycle's eval decision, seconds
     per stage, the verdicts; `rlcycle report` of the real run directories into
     OUT/report.html (the v0 run first, then each arm's measure run).

Output: the report on stdout (`--json`: one JSON object), progress on stderr; OUT/runs.json (the
record), OUT/report.txt, OUT/report.json and OUT/report.html. Exit 0 when every cycle ended in a
decision (accept or refuse), 1 when one failed, 2 for bad options or config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the checkout root (two folders up) on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import typer  # noqa: E402

from experiments.closed_loop import compare, report  # noqa: E402
from rlcycle import console  # noqa: E402
from rlcycle.cli import options as opt  # noqa: E402
from rlcycle.config import resolve, save_resolved  # noqa: E402
from rlcycle.cycle import Cycle, CycleConfig  # noqa: E402
from rlcycle.errors import EXIT_GATE_REFUSED, InputError, RlcycleError  # noqa: E402
from rlcycle.stage import RunLayout  # noqa: E402

# This experiment's cycle config under the user's (`rlcycle cycle --set` keys). Sized for minutes
# on 2 busy cores with the tiny model: short completions, one pass of training over the collected
# samples (`epochs` decide, not a step cap), the cycle's quick eval with its CPU latency tolerance.
BASE: dict[str, Any] = {
    "source": "simulate",
    "simulate.runner.max_new_tokens": 48,
    "simulate.runner.max_turns": 3,
    "simulate.sandboxes": 4,
    "train.batch_size": 16,
    "train.epochs": 1,
    "train.max_steps": 100000,
    "train.lr": 1e-5,
    "train.max_policy_lag": -1,
    "train.save_every": 1,
    "eval.attempts": 1,
    "eval.max_tasks": 12,
    "eval.runner.max_new_tokens": 48,
    "eval.runner.max_turns": 3,
    "eval.sandboxes": 2,
    "eval.gates.min_paired_tasks": 5,
    "eval.gates.latency_noise_ms": 10000.0,
}
WARM: dict[str, Any] = {
    "simulate.runner.max_new_tokens": 160,
    "eval.runner.max_new_tokens": 160,
}  # a tool call: ~50-150 tokens
# What each arm changes (everything else is identical); `permute_seed` is the cycle's traffic
# seed, so each cycle's batches get their own shuffle.
ARMS: dict[str, list[str]] = {
    "treatment": [],
    "control": ["distill.permute_rewards=true", "distill.permute_seed={seed}"],
    "naive": ["distill.discard_invalid=true"],
}
V0 = compare.V0  # OUT/v0/measure: the start on the measure traffic
MEASURE = compare.MEASURE
HELDOUT = compare.HELDOUT
MEASURE_SEED = 900  # + 1000 * seed: the fresh traffic every arm's last version is measured on
HELDOUT_SEED = 901  # + 1000 * seed: the same on the held-out tasks
TINY_SEED = 0  # the tiny default model's seed when no start is given


def seeds(seed: int, cycles: int, heldout: bool = False) -> list[tuple[str, int]]:
    """(run name, simulate seed) of the cycles, the measure run and (`heldout`) the held-out
    measure run: the same in every arm."""
    runs = [(f"cycle-{k}", 1000 * seed + k) for k in range(1, cycles + 1)] + [(MEASURE, 1000 * seed + MEASURE_SEED)]
    return runs + ([(HELDOUT, 1000 * seed + HELDOUT_SEED)] if heldout else [])


def cycle_config(
    run_dir: Path,
    home: Path,
    arm: str | None,
    seed: int,
    episodes: int,
    tasks: str,
    warm: bool,
    sets: list[str],
    config: str | None = None,
) -> CycleConfig:
    """The CycleConfig of one run (module docstring, step 1) in the registry `home`; `arm` None:
    no arm switch; `config`: a cycle config file (its `[cycle]` table) over the experiment's
    sizes and under `sets`."""
    data = {**BASE, **(WARM if warm else {}), "tasks": tasks, "simulate.episodes": episodes, "simulate.seed": seed}
    switch = [s.format(seed=seed) for s in ARMS[arm]] if arm else []
    return resolve(
        CycleConfig,
        config,
        [*sets, *switch],
        {"run_dir": str(run_dir), "registry_home": str(home)},
        section="cycle",
        data=data,
        data_origin="the experiment's defaults (experiments/closed_loop/run.py BASE)",
    )


# --- the start and the registry homes ------------------------------------------------------------


def make_start(out: Path, start: Path | None, warm_start: bool, tasks: str, log: Any) -> dict[str, Any]:
    """The checkpoint every arm starts from: --start, a warm start made once, or the tiny default
    model. `paired`: whether v0 is measured on the measure traffic (a start that was chosen)."""
    from rlcycle import model_init

    if start is not None:
        return {"path": str(start.resolve()), "origin": f"--start {start}", "paired": True}
    path = out / "start"
    started = time.monotonic()
    if not warm_start:
        if not (path / "config.json").exists():
            model_init.init_model(path, seed=TINY_SEED, force=True)
        return {"path": str(path), "origin": "tiny default model (random weights)", "paired": False}
    if not (path / "config.json").exists():
        log(f"warm start: init-model --warm-start {tasks} (minutes on CPU)")
        model_init.run(model_init.InitModelConfig(warm_start=tasks), path, force=True)
    return {"path": str(path), "origin": "warm start", "seconds": round(time.monotonic() - started, 1), "paired": True}


def register_start(home: Path, start: dict[str, Any]) -> None:
    """A copy of the start registered as `production` in the arm's registry (once)."""
    from rlcycle.deploy import register
    from rlcycle.policy.registry import Registry

    reg = Registry(home / "registry")
    if "production" not in reg.aliases():
        register(start["path"], "production", reg)


def share_first_cycle(src: Path, dst: Path) -> bool:
    """Copy the first arm's cycle-1 simulate and collect outputs into another arm's cycle-1:
    the same start on the same seed gives the same sessions, and the cycle's cache (keyed by the
    policy id, the tasks and the config) then skips recomputing them."""
    a, b = RunLayout(src), RunLayout(dst)
    if not a.manifest("collect").exists() or dst.exists():
        return False
    for stage in ("simulate", "collect"):
        shutil.copytree(a.stage_dir(stage), b.stage_dir(stage))
    return True


# --- running --------------------------------------------------------------------------------------


def run_cycle(cfg: CycleConfig, until: str | None, quiet: bool, log: Any) -> dict[str, Any]:
    """One cycle in this process against the arm's registry (`cfg.registry_home`): its result
    as `rlcycle cycle --json` prints it; a stage error ends it with the error's exit code."""
    try:
        return Cycle(cfg, until_stage=until, quiet=quiet).run().as_dict()
    except RlcycleError as e:
        log(f"error: {e.message}" + (f" (hint: {e.hint})" if e.hint else ""))
        return {"decision": None, "stages": [], "exit_code": e.exit_code, "error": e.message}


def plan(arm: str, o: dict[str, Any], out: Path, paired: bool) -> list[tuple[str, int, CycleConfig]]:
    """(run name, traffic seed, cycle config) of an arm's runs, in order (arm V0: just the
    measure run, of the start: the row every arm's last version is paired with)."""
    runs = seeds(o["seed"], o["cycles"], bool(o.get("heldout")))
    cycles = [r for r in runs if r[0].startswith("cycle-")]
    measures = [r for r in runs if not r[0].startswith("cycle-")]
    runs = measures if arm == V0 else cycles if o["no_measure"] else cycles + measures
    configs = []
    for name, seed in runs:
        measure = name in (MEASURE, HELDOUT)
        episodes = (o["measure_episodes"] or o["episodes"]) if measure else o["episodes"]
        # The measure run only measures: the same config in every arm (no switch), until distill,
        # so the version's mean reward under the plain spec is known.
        cfg = cycle_config(
            out / arm / name,
            out / arm / "home",
            None if measure else arm,
            seed,
            episodes,
            o["heldout"] if name == HELDOUT else o["tasks"],
            paired,
            o["sets"],
            o.get("config"),
        )
        configs.append((name, seed, cfg))
    return configs


def run_arm(arm: str, o: dict[str, Any], out: Path, start: dict[str, Any], first: Path | None) -> dict[str, Any]:
    """One arm: its home, the start as production, its runs (`plan`) one after the other. The
    held-out measure run is kept apart (`runs["heldout"]`): the arm's per-version report reads
    `cycles`, whose versions are measured on the training tasks."""
    home = out / arm / "home"
    runs: dict[str, Any] = {"arm": arm, "started": _now(), "cycles": [], "home": str(home), "start": start}
    (out / arm).mkdir(parents=True, exist_ok=True)
    register_start(home, start)
    for name, seed, cfg in plan(arm, o, out, start["paired"]):
        run_dir, measure = Path(cfg.run_dir), name in (MEASURE, HELDOUT)
        save_resolved(cfg, out / arm / f"{name}.config.json")
        shared = name == "cycle-1" and first is not None and share_first_cycle(first, run_dir)
        o["log"](f"{arm}/{name}: cycle in {run_dir}" + (" (cycle-1 traffic shared)" if shared else ""))
        started = time.monotonic()
        result = run_cycle(cfg, "distill" if measure else None, o["quiet"], o["log"])
        result.update(name=name, seed=seed, wall_s=round(time.monotonic() - started, 1), shared_traffic=shared)
        (out / arm / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        if name == HELDOUT:
            runs["heldout"] = result
        else:
            runs["cycles"].append(result)
        if result["exit_code"] not in (0, EXIT_GATE_REFUSED):  # refused: production stays, the loop goes on
            o["log"](f"{arm}/{name}: failed (exit {result['exit_code']}); stopping this arm")
            break
    runs["wall_s"] = round(
        sum(c["wall_s"] for c in [*runs["cycles"], *([runs["heldout"]] if "heldout" in runs else [])]), 1
    )
    (out / arm / "runs.json").write_text(json.dumps(runs, indent=2) + "\n")
    return runs


def run_experiment(o: dict[str, Any], out: Path) -> dict[str, Any]:
    """Every arm in turn (one at a time: they share the machine), from the same start."""
    started = time.monotonic()
    record: dict[str, Any] = {
        "started": _now(),
        **{k: o[k] for k in ("seed", "cycles", "episodes", "tasks", "heldout", "config", "sets")},
        "arms": {},
    }
    record["start"] = make_start(out, o["start"], o["warm_start"], o["tasks"], o["log"])
    if record["start"]["paired"] and not o["no_measure"]:
        # v0 on the measure traffic: the same sessions every arm's last version serves
        record["v0"] = run_arm(V0, o, out, record["start"], None)
    first: Path | None = None
    for arm in o["arms"]:
        record["arms"][arm] = run_arm(arm, o, out, record["start"], first)
        first = first or out / arm / "cycle-1"
    record["wall_s"] = round(time.monotonic() - started, 1)
    (out / "runs.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def show_plan(o: dict[str, Any], out: Path, as_json: bool) -> None:
    """What `run_experiment` would run, with each run's resolved cycle config; writes nothing."""
    paired = o["start"] is not None or o["warm_start"]
    arms = ([V0] if paired and not o["no_measure"] else []) + o["arms"]
    runs = [
        {"arm": arm, "run": name, "seed": seed, "run_dir": cfg.run_dir, "config": dataclasses.asdict(cfg)}
        for arm in arms
        for name, seed, cfg in plan(arm, o, out, paired)
    ]
    start = o["start"] or ("OUT/start (init-model --warm-start)" if o["warm_start"] else "OUT/start (tiny, seed 0)")
    if as_json:
        opt.emit_json({"out": str(out), "start": str(start), "runs": runs})
        return
    typer.echo(f"out {out}; start {start}; tasks {o['tasks']}")
    for r in runs:
        switch = [s.format(seed=r["seed"]) for s in ARMS.get(r["arm"], [])] if r["run"] != MEASURE else []
        line = f"  {r['arm']}/{r['run']}: seed {r['seed']}, {r['config']['simulate']['episodes']} sessions"
        typer.echo(line + (f", --set {' --set '.join(switch)}" if switch else ""))
    typer.echo("the first run's cycle config (the others differ in run_dir, seed, episodes and the arm's switch):")
    typer.echo(json.dumps(runs[0]["config"], indent=2, default=str))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --- the command ----------------------------------------------------------------------------------

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


@app.command(
    help=(
        "The closed-loop experiment: N cycles in a row on simulated users per arm, then the "
        "online A/B tables (docs/closed_loop.md). Paths are relative to the current directory."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def experiment(
    arms: str = typer.Option("treatment,control", "--arms", help="Arms, comma-separated: treatment, control, naive."),
    cycles: int = typer.Option(3, "--cycles", help="Cycles in a row per arm."),
    episodes: int = typer.Option(42, "--episodes", help="Simulated sessions per cycle (42: each sample task once)."),
    measure_episodes: int = typer.Option(None, "--measure-episodes", help="Sessions of the measure run (--episodes)."),
    seed: int = typer.Option(0, "--seed", help="Cycle k's traffic seed is 1000*seed+k, the measure run's +900."),
    out: Path = typer.Option(Path("runs/closed_loop"), "--out", help="Output directory (must not hold runs yet)."),
    tasks: Path = typer.Option(Path("sample_data/tasks"), "--tasks", help="Task suite for simulate and eval."),
    heldout: Path = typer.Option(
        None, "--heldout", help="Tasks no arm trains on: v0 and each arm's last version measured there too."
    ),
    start: Path = typer.Option(None, "--start", help="Checkpoint every arm starts from (registered as production)."),
    warm_start: bool = typer.Option(False, "--warm-start", help="Start from init-model --warm-start TASKS, made once."),
    no_measure: bool = typer.Option(False, "--no-measure", help="Skip measuring the last versions on fresh traffic."),
    config: Path = typer.Option(
        None, "--config", help="A cycle config file (TOML, its [cycle] table) for every arm, under --set."
    ),
    set_: list[str] = opt.sets(help="A cycle config key for every arm, as `rlcycle cycle --set`: train.lr=1e-4."),
    report_only: bool = typer.Option(False, "--report-only", help="Only print the report of a finished OUT."),
    plan_only: bool = typer.Option(False, "--plan", help="Print the runs and their resolved configs; run nothing."),
    as_json: bool = opt.json_flag("Print the report as one JSON object."),
    quiet: bool = opt.quiet("No progress on stderr."),
) -> int:
    out = out.resolve()
    if report_only:
        if not (out / "runs.json").exists():
            raise InputError(f"{out}/runs.json not found", hint="run the experiment into --out first")
        record = json.loads((out / "runs.json").read_text())
    else:
        o = _options(
            arms, cycles, episodes, measure_episodes, seed, tasks, start, warm_start, set_, out, plan_only, config
        )
        o["heldout"] = _heldout(heldout, o)
        o.update(no_measure=no_measure, quiet=quiet, log=(lambda m: None) if quiet else _log)
        if plan_only:
            show_plan(o, out, as_json)
            return 0
        out.mkdir(parents=True, exist_ok=True)
        with one_thread():
            record = run_experiment(o, out)
    result = compare.build_experiment(out, record)
    result["html"] = compare.write_html(out, record, result)
    text = compare.render_experiment(result)
    (out / "report.txt").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(report.as_json(result), indent=2) + "\n")
    if as_json:
        opt.emit_json(report.as_json(result))
    else:
        typer.echo(text)
    runs = [c for r in record["arms"].values() for c in r["cycles"]] + (record.get("v0") or {}).get("cycles", [])
    return 0 if all(c["exit_code"] in (0, EXIT_GATE_REFUSED) for c in runs) else 1


def _heldout(heldout: Path | None, o: dict[str, Any]) -> str | None:
    """The held-out suite, checked: a directory other than the training tasks, measured only
    where v0 is (a chosen start) and the arms are measured (no --no-measure)."""
    if heldout is None:
        return None
    if not heldout.is_dir():
        raise InputError(f"--heldout {heldout}: no such directory", hint="pass a task suite directory")
    if str(heldout.resolve()) == o["tasks"]:
        raise InputError(f"--heldout {heldout}: the training tasks themselves", hint="pass tasks no arm trains on")
    if o["start"] is None and not o["warm_start"]:
        raise InputError("--heldout needs --start or --warm-start", hint="v0 is measured only from a chosen start")
    return str(heldout.resolve())


def _options(
    arms, cycles, episodes, measure_episodes, seed, tasks, start, warm_start, sets, out, plan_only=False, config=None
):
    """The checked options (every problem at once, exit 2), and the config resolved once. A plan
    does not need the start yet (edit_experiment.sh plans before it makes one)."""
    names = [a.strip() for a in arms.split(",") if a.strip()]
    problems: list[tuple[str, str]] = []  # (what is wrong, what to do)
    if not names or len(set(names)) != len(names) or any(a not in ARMS for a in names):
        problems.append((f"--arms {arms!r}: not distinct arms of {', '.join(ARMS)}", "e.g. --arms treatment,control"))
    if cycles < 1 or episodes < 1 or (measure_episodes is not None and measure_episodes < 1):
        problems.append(("--cycles, --episodes and --measure-episodes must be >= 1", "pass positive counts"))
    if start is not None and warm_start:
        problems.append(("--start and --warm-start: pick one", "drop one of them"))
    if not tasks.is_dir():
        problems.append(
            (
                f"--tasks {tasks}: no such directory (relative to {Path.cwd()})",
                "run from a checkout or pass --tasks DIR",
            )
        )
    if start is not None and not plan_only and not (start / "config.json").exists():
        problems.append(
            (f"--start {start}: not a checkpoint directory (no config.json)", "pass a checkpoint directory")
        )
    if (out / "runs.json").exists() or any(out.glob("*/cycle-*")):
        problems.append((f"--out {out}: holds runs already", "pick another --out, remove it, or use --report-only"))
    if problems:
        raise InputError("; ".join(p for p, _ in problems), hint="; ".join(dict.fromkeys(h for _, h in problems)))
    o = {
        "arms": names,
        "cycles": cycles,
        "episodes": episodes,
        "measure_episodes": measure_episodes,
        "seed": seed,
        "tasks": str(tasks.resolve()),
        "start": start,
        "warm_start": warm_start,
        "sets": list(sets or []),
        "config": str(config.resolve()) if config is not None else None,
    }
    # every config problem now, before any cycle runs (the same resolve each run does)
    cycle_config(
        out / "check",
        out / "home",
        names[0],
        seed,
        episodes,
        o["tasks"],
        start is not None or warm_start,
        o["sets"],
        o["config"],
    )
    return o


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread unless OMP_NUM_THREADS says otherwise (tiny models on busy cores run
    many times faster: docs/simulate.md); the variable and a loaded torch's setting restored
    after (a torch first loaded inside keeps its one thread)."""
    if "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = "1"  # for torch when a stage first imports it
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)
        if torch is not None and before is not None:
            torch.set_num_threads(before)


def _log(msg: str) -> None:
    console.info(f"[closed_loop] {msg}")


def main(argv: list[str] | None = None) -> int:
    """Run the program with `argv` (None: sys.argv[1:]) and return its exit code, with the CLI's
    conventions (rlcycle.cli.run_app): `Error:`/`Hint:` on stderr, exit 2 for bad usage or
    config, 1 for a failure, 130 when interrupted."""
    from rlcycle.cli import run_app

    return run_app(app, argv, "experiments/closed_loop/run.py")


if __name__ == "__main__":
    sys.exit(main())
