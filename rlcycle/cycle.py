"""cycle: collect, distill, train, eval and deploy, in one run directory, resumable and cached.

In:  a cycle config (TOML; every key has a default that runs on the bundled sample data and
     the tiny default model), the event source: `simulate` (the default: the production
     policy on the task suite, so the first cycle is on-policy) or production event logs.
Out: `RUN_DIR/<stage>/...` outputs with a `manifest.json` per stage written last, `RUN_DIR/run.json`
     (the pinned base checkpoint), a registry update when the gate accepted, and a
     `CycleResult` (exit code 3 when the gate refused: nothing was deployed).

    rlcycle cycle                                   # sample data, tiny model, runs/cycle
    rlcycle cycle --config cycle.toml --run-dir runs/$(date +%F-%H)   # from cron

Rules:
- a stage is skipped when its manifest holds the same key: a hash of its resolved config and
  the content of its inputs (files, directories, checkpoint ids). `deploy` is never cached, but
  it is a no-op when the alias already points at the checkpoint;
- a crashed cycle resumes at its first unfinished stage (no manifest = not finished; outputs
  are atomic; train resumes its own optimizer state);
- the base checkpoint is pinned in `run.json` on the first run, so rerunning a run directory
  after its deploy moved `production` still finds every stage cached; a new cycle is a new
  run directory;
- one cycle at a time per registry home (`registry_home`; the CLI's default is $RLCYCLE_HOME,
  else ~/.rlcycle): a non-blocking `rlcycle.io.FileLock` (flock) on `<home>/cycle.lock`. The kernel drops the lock when its process dies, so a crashed cycle's lock is
  taken over at once; the file names the last holder for the error message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlcycle import digest, resources
from rlcycle import io as rio
from rlcycle.config import cfg, resolve
from rlcycle.console import info
from rlcycle.errors import EXIT_GATE_REFUSED, InputError, RlcycleError
from rlcycle.faults import crash_point

STAGES = ("simulate", "collect", "distill", "train", "eval", "deploy")


@dataclass
class CycleConfig:
    run_dir: str = cfg("runs/cycle", help="Run directory: one per cycle (reruns of it are cached).")
    # simulate by default: the demo then trains on samples of the very model it updates
    # (behaviour logprobs from the base: on-policy); a production cron sets source = "logs".
    source: str = cfg(
        "simulate",
        help="Where events come from: simulate (the production policy on `tasks`, the default) or logs (the `events` paths).",
    )
    events: list[str] = cfg(
        [str(resources.events())], help="Event logs for source=logs (default: the small log shipped in rlcycle/data)."
    )
    base: str = cfg("production", help="Base policy: a registry alias or a checkpoint directory.")
    registry_home: str | None = cfg(
        None,
        help="Home of the registry the cycle reads and deploys to (registry/, cycle.lock, models/); "
        "None: the CLI's default, $RLCYCLE_HOME or ~/.rlcycle.",
    )
    bootstrap_seed: int = cfg(
        0, help="With an empty registry and base=production: create the tiny default model with this seed."
    )
    tasks: str = cfg(
        str(resources.tasks()),
        help="Task suite for eval and simulate (default: the small suite shipped in rlcycle/data).",
    )
    reward_spec: str = cfg(
        str(resources.reward_spec()), help="Reward spec for distill (default: rlcycle/data/rewards.toml)."
    )
    simulate: dict[str, Any] = cfg({"episodes": 16, "max_new_tokens": 64}, help="SimulateConfig keys.")
    collect: dict[str, Any] = cfg({}, help="CollectConfig keys.")
    distill: dict[str, Any] = cfg({}, help="DistillConfig keys.")
    train: dict[str, Any] = cfg(
        {"max_steps": 2, "batch_size": 8, "lr": 1e-5, "max_policy_lag": -1, "save_every": 1},
        help="TrainConfig keys (the defaults keep the sample cycle to minutes on CPU).",
    )
    # latency_noise_ms: on a CPU the first calls at each new prompt shape cost seconds, which
    # swamps the tiny model's ~0.2 s calls; the sample cycle tolerates that, production configs
    # (GPU serving) should keep the EvalConfig default of 20 ms.
    eval: dict[str, Any] = cfg(
        {
            "attempts": 1,
            "max_tasks": 12,
            "max_new_tokens": 48,
            "max_turns": 4,
            "sandboxes": 2,
            "min_paired_tasks": 5,
            "latency_noise_ms": 10000.0,
        },
        help="EvalConfig keys (gates included; see the latency note in rlcycle/cycle.py).",
    )
    deploy: dict[str, Any] = cfg({}, help="DeployConfig keys (hook, canary_fraction, ...).")

    def validate(self) -> list[str]:
        problems = []
        if self.source not in ("logs", "simulate"):
            problems.append(f"source={self.source!r}: must be logs or simulate")
        if self.source == "logs" and not self.events:
            problems.append("events: source=logs needs at least one event path")
        return problems


@dataclass
class StageRun:
    name: str
    status: str  # ran | cached | skipped | refused | up_to_date | planned
    seconds: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class CycleResult:
    run_dir: str
    stages: list[StageRun]
    decision: str | None = None
    deployed: str | None = None
    exit_code: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "decision": self.decision,
            "deployed": self.deployed,
            "exit_code": self.exit_code,
            "stages": [dataclasses.asdict(s) for s in self.stages],
        }


def format_summary(r: CycleResult) -> str:
    """The lines `rlcycle cycle` prints on stdout: one per stage, then the decision."""
    lines = [
        f"{s.name:<9} {s.status:<10} {s.seconds:7.1f}s  " + " ".join(f"{k}={v}" for k, v in s.outputs.items())
        for s in r.stages
    ]
    return "\n".join([*lines, f"decision: {r.decision}  deployed: {r.deployed}"])


# --- hashing --------------------------------------------------------------------------------


def content_hash(paths: list[str | Path]) -> str:
    """sha256 over files' names and bytes: a directory's files by relative name (sorted), a
    file by its base name, so moving a run directory keeps its cache keys."""
    entries = []
    for p in map(Path, paths):
        entries += digest.tree_files(p) if p.is_dir() else [(p.name, p)]
    return digest.files_sha256(entries)


def _key(stage: str, config: Any, inputs: dict[str, str]) -> str:
    blob = json.dumps(
        {"stage": stage, "config": dataclasses.asdict(config), "inputs": inputs}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()


# --- the lock -------------------------------------------------------------------------------


class CycleLock:
    """One cycle at a time: a non-blocking lock on `cycle.lock`, released by the kernel if the
    holder dies; a refused cycle names the holder (its pid and start time, written in the file)."""

    def __init__(self, home: Path):
        self.path = home / "cycle.lock"
        self._lock: rio.FileLock | None = None

    def __enter__(self) -> CycleLock:
        since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        lock = rio.FileLock(self.path, wait=False, holder=f"pid {os.getpid()} since {since}")
        try:
            lock.__enter__()
        except rio.LockBusy as e:
            raise RlcycleError(
                f"another cycle is running ({e.holder or 'another process'}; lock {self.path})",
                hint="wait for it; a crashed cycle's lock is released by the kernel",
            ) from None
        self._lock = lock
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.__exit__(*exc)
            self._lock = None


# --- the cycle ------------------------------------------------------------------------------


class Cycle:
    """Runs the stages in order; each `_stage_*` returns (config, inputs, outputs, work)."""

    def __init__(
        self,
        config: CycleConfig,
        force: bool = False,
        dry_run: bool = False,
        from_stage: str | None = None,
        until_stage: str | None = None,
        quiet: bool = False,
    ):
        for name, value in (("--from", from_stage), ("--until", until_stage)):
            if value is not None and value not in STAGES:
                raise InputError(f"{name} {value!r}: not a stage", hint=f"stages: {', '.join(STAGES)}")
        self.config, self.force, self.dry_run, self.quiet = config, force, dry_run, quiet
        self.run_dir = Path(config.run_dir)
        order = [s for s in STAGES if s != "simulate" or config.source == "simulate"]
        lo = order.index(from_stage) if from_stage in order else 0
        hi = order.index(until_stage) if until_stage in order else len(order) - 1
        self.selected = set(order[lo : hi + 1])
        self.order = order
        self.result = CycleResult(str(self.run_dir), [])

    def run(self) -> CycleResult:
        with CycleLock(self._home()):
            self.base_path, self.base_id = self._pinned_base()
            for name in self.order:
                if self._step(name):
                    break
        return self.result

    # --- plumbing -----------------------------------------------------------------------------

    def _step(self, name: str) -> bool:
        """Run or skip one stage; True when the cycle must stop here (gate refused)."""
        if name not in self.selected:
            self.result.stages.append(StageRun(name, "skipped"))
            return False
        cfg_obj, inputs, outputs, work = getattr(self, f"_stage_{name}")()
        key = _key(name, cfg_obj, inputs)
        manifest = self.run_dir / name / "manifest.json"
        old = json.loads(manifest.read_text()) if manifest.exists() else None
        cached = old is not None and old.get("key") == key and name != "deploy" and not self.force
        if cached or self.dry_run:
            status = "cached" if cached else "planned"
            self.result.stages.append(StageRun(name, status, 0.0, outputs, (old or {}).get("result", {})))
            self._log(f"{name}: {status}")
            return self._after(name, (old or {}).get("result", {})) if cached else False
        self._log(f"{name}: running")
        started = time.monotonic()
        (self.run_dir / name).mkdir(parents=True, exist_ok=True)
        result = work()
        crash_point(f"cycle:{name}")  # fault injection for the resume tests
        seconds = time.monotonic() - started
        rio.atomic_write_text(
            manifest,
            json.dumps(
                {
                    "stage": name,
                    "key": key,
                    "inputs": inputs,
                    "outputs": outputs,
                    "config": dataclasses.asdict(cfg_obj),
                    "result": result,
                    "seconds": round(seconds, 3),
                    "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                },
                indent=2,
                default=str,
            )
            + "\n",
        )
        self.result.stages.append(StageRun(name, result.get("status", "ran"), seconds, outputs, result))
        return self._after(name, result)

    def _after(self, name: str, result: dict[str, Any]) -> bool:
        if name == "eval":
            self.result.decision = result.get("decision")
            if self.result.decision == "refuse":
                self.result.exit_code = EXIT_GATE_REFUSED
                return True
            if self.result.decision != "accept":
                self.result.exit_code = 1
                return True
        if name == "deploy":
            self.result.deployed = result.get("checkpoint_id")
        return False

    def _home(self) -> Path:
        if self.config.registry_home is None:
            raise InputError(
                "cycle config: registry_home is not set",
                hint="set registry_home = DIR; `rlcycle cycle` defaults it to $RLCYCLE_HOME or ~/.rlcycle",
            )
        return Path(self.config.registry_home)

    def _registry(self) -> Any:
        from rlcycle.policy.registry import Registry

        return Registry(self._home() / "registry")

    def _log(self, msg: str) -> None:
        if not self.quiet:
            info(f"[cycle] {msg}")

    def _sub(self, cls: type, table: str) -> Any:
        # A [cycle.<stage>] table in a config file adds to the sample defaults, key by key.
        default = next(f for f in dataclasses.fields(CycleConfig) if f.name == table).default_factory()  # type: ignore[misc]
        return resolve(cls, data={**default, **getattr(self.config, table)}, data_origin=f"cycle config [{table}]")

    def _path(self, stage: str, name: str) -> Path:
        return self.run_dir / stage / name

    def _pinned_base(self) -> tuple[Path, str]:
        """The base checkpoint of this run dir: recorded on the first run, reused after."""
        from rlcycle.policy.registry import checkpoint_id

        pin = self.run_dir / "run.json"
        if pin.exists():
            data = json.loads(pin.read_text())
            path = Path(data["base_path"])
            if path.is_dir():
                return path, data["base_id"]
        reg = self._registry()
        if self.config.base == "production" and "production" not in reg.aliases():
            self._bootstrap(reg)
        path = reg.resolve(self.config.base) if not Path(self.config.base).is_dir() else Path(self.config.base)
        cid = checkpoint_id(path)
        if not self.dry_run:
            rio.atomic_write_text(
                pin, json.dumps({"base": self.config.base, "base_path": str(path), "base_id": cid}, indent=2) + "\n"
            )
        return path, cid

    def _bootstrap(self, reg: Any) -> None:
        """An empty registry: the tiny default model becomes production (no model hub needed)."""
        from rlcycle.deploy import register
        from rlcycle.model_init import init_model

        self._log("registry has no production model: creating the tiny default model")
        out = reg.root.parent / "models" / f"tiny-seed{self.config.bootstrap_seed}"
        if not (out / "config.json").exists():
            init_model(out, seed=self.config.bootstrap_seed, force=True)
        register(out, "production", reg)

    # --- the stages ---------------------------------------------------------------------------

    def _stage_simulate(self) -> tuple[Any, dict[str, str], dict[str, str], Callable[[], dict]]:
        from rlcycle import simulate

        c = self._sub(simulate.SimulateConfig, "simulate")
        out = self._path("simulate", "events.jsonl")
        inputs = {"policy": self.base_id, "tasks": content_hash([self.config.tasks])}

        def work() -> dict:
            r = simulate.run(
                c, str(self.base_path), self.config.tasks, out, quiet=self.quiet, registry=self._home() / "registry"
            )
            return {"episodes": r.episodes, "output": str(out)}

        return c, inputs, {"events": str(out)}, work

    def _stage_collect(self):
        from rlcycle import collect

        c = self._sub(collect.CollectConfig, "collect")
        events = (
            [str(self._path("simulate", "events.jsonl"))]
            if self.config.source == "simulate"
            else list(self.config.events)
        )
        out = self._path("collect", "trajectories.arrow")
        inputs = {"events": content_hash(events) if all(Path(e).exists() for e in events) else "pending"}

        def work() -> dict:
            r = collect.run(c, events, str(out), quiet=self.quiet)
            return {
                k: v
                for k, v in r.as_dict().items()
                if k in ("samples_out", "episodes_out", "quarantined", "duplicates", "held_back_episodes")
            }

        return c, inputs, {"trajectories": str(out)}, work

    def _stage_distill(self):
        from rlcycle.config import load_toml
        from rlcycle.distill.spec import load_spec
        from rlcycle.distill.stage import DistillConfig, run

        # The spec's own [distill] table first, then the cycle config's (as the CLI layers them).
        table = {**load_toml(self.config.reward_spec).get("distill", {}), **self.config.distill}  # default: {}
        c = resolve(
            DistillConfig, data=table, data_origin=f"{self.config.reward_spec} [distill] + cycle config [distill]"
        )
        traj = self._path("collect", "trajectories.arrow")
        out = self._path("distill", "examples.arrow")
        inputs = {
            "trajectories": content_hash([traj]) if traj.exists() else "pending",
            "spec": content_hash([self.config.reward_spec]),
        }

        def work() -> dict:
            r = run(c, str(traj), str(out), load_spec(self.config.reward_spec), quiet=self.quiet)
            return {"rows": r.rows, "included": r.included, "excluded": r.excluded}

        return c, inputs, {"examples": str(out), "report": str(out.parent / "reward_report.json")}, work

    def _stage_train(self):
        from rlcycle.train.config import TrainConfig

        c = self._sub(TrainConfig, "train")
        examples = self._path("distill", "examples.arrow")
        out = self._path("train", "checkpoint")
        inputs = {"examples": content_hash([examples]) if examples.exists() else "pending", "base": self.base_id}

        def work() -> dict:
            from rlcycle.train.stage import run  # imports torch: only when train really runs

            r = run(c, str(examples), self.base_path, out, overwrite=True, quiet=self.quiet)
            return {"checkpoint_id": r.checkpoint_id, "steps": r.steps}

        return c, inputs, {"checkpoint": str(out)}, work

    def _stage_eval(self):
        from rlcycle.evaluation.stage import EvalConfig, run

        c = self._sub(EvalConfig, "eval")
        ckpt = self._path("train", "checkpoint")
        out = self._path("eval", "eval_results.arrow")
        inputs = {"candidate": _ckpt_id(ckpt), "baseline": self.base_id, "tasks": content_hash([self.config.tasks])}

        def work() -> dict:
            r = run(c, str(ckpt), str(self.base_path), self.config.tasks, out, registry=self._home() / "registry")
            failed = [g["name"] for g in r.verdict.get("gates", []) if not g["passed"]]
            return {
                "decision": r.decision,
                "failed_gates": failed,
                "verdict": r.verdict_path,
                "status": "refused" if r.decision == "refuse" else "ran",
            }

        return c, inputs, {"results": str(out), "verdict": str(out.parent / "verdict.json")}, work

    def _stage_deploy(self):
        from rlcycle import deploy

        c = self._sub(deploy.DeployConfig, "deploy")
        ckpt = self._path("train", "checkpoint")
        verdict = self._path("eval", "verdict.json")
        inputs = {"checkpoint": _ckpt_id(ckpt)}

        def work() -> dict:
            cid = _ckpt_id(ckpt)
            reg = self._registry()
            if reg.aliases().get(c.alias) == cid:
                return {"status": "up_to_date", "checkpoint_id": cid}
            hist = reg.history().to_pylist()
            if any(h["action"] == "promote" and h["checkpoint_id"] == cid for h in hist):
                # Re-running an old run dir must not roll production back to its checkpoint:
                # that takes an explicit `rlcycle deploy` (or `rlcycle rollback`).
                return {"status": "superseded", "checkpoint_id": cid}
            r = deploy.run(c, ckpt, verdict, reg)
            return {"checkpoint_id": r.checkpoint_id, "previous_id": r.previous_id, "action": r.action}

        return c, inputs, {}, work


def _ckpt_id(path: Path) -> str:
    from rlcycle.policy.registry import checkpoint_id

    return checkpoint_id(path) if (path / "config.json").exists() else "pending"


def load_config(path: str | Path | None, sets: list[str] | None, flags: dict[str, Any]) -> CycleConfig:
    return resolve(CycleConfig, path, sets, flags, section="cycle")
