"""cycle: simulate, collect, distill, train, eval and deploy in one run directory, resumable and cached.

In:  a cycle config (TOML; `[cycle]` table or top level; every stage table defaults to that
     stage's production defaults, `rlcycle/configs/demo.toml` holds the demo's small sizes), the
     event source: `simulate` (the production policy on the task suite, so the first cycle is
     on-policy) or production event logs (`source = "logs"`), and a registry home.
Out: `RUN_DIR/<stage>/...` outputs with a `manifest.json` per stage written last, `RUN_DIR/run.json`
     (the pinned base checkpoint), a registry update when the gate accepted, and a
     `CycleResult` (exit code 3 when the gate refused: nothing was deployed). Every path in the
     run directory comes from `rlcycle.stage.RunLayout`.

    rlcycle cycle --config demo                     # the demo: sample data, tiny model, runs/cycle
    rlcycle cycle --config cycle.toml --run-dir runs/$(date +%F-%H)   # from cron

`Cycle` is a loop over the stage objects (`STAGE_OBJECTS`, each the `Stage` of rlcycle/stage.py
defined beside its stage, the same object its `rlcycle <stage>` command runs); the rules live
here once, driven by what each stage declares:
- a stage is skipped when its manifest holds the same key: a hash of its resolved config and
  the keys of its declared inputs (file contents, checkpoint ids). A stage that is not
  `cacheable` (deploy) runs every time; deploy itself is a no-op when the alias already points
  at the checkpoint (and refuses to move it back to one promoted before: `superseded`);
- a `gate` stage's `decision` (eval) decides whether the cycle goes on: refuse stops it with
  exit code 3, no verdict with 1; a `publishes` stage's checkpoint is the cycle's `deployed`;
- a crashed cycle resumes at its first unfinished stage (no manifest = not finished; outputs
  are atomic; train resumes its own optimizer state);
- the base checkpoint is pinned in `run.json` on the first run, so rerunning a run directory
  after its deploy moved `production` still finds every stage cached; a new cycle is a new
  run directory;
- an empty registry with `base = "production"` stops with exit 2, unless `bootstrap = true`
  (the demo's config) lets the cycle create the tiny default model as production;
- `--dry-run` writes nothing anywhere: no run.json, no bootstrap, no registry, no lock file
  (an existing lock is probed, so a running cycle is still reported);
- one cycle at a time per registry home (`registry_home`; the CLI's default is $RLCYCLE_HOME,
  else ~/.rlcycle): a non-blocking `rlcycle.io.FileLock` (flock) on `<home>/cycle.lock`. The
  kernel drops the lock when its process dies, so a crashed cycle's lock is taken over at once;
  the file names the last holder for the error message.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlcycle import io as rio
from rlcycle import resources
from rlcycle.collect.stage import STAGE as COLLECT
from rlcycle.collect.stage import CollectConfig
from rlcycle.config import cfg, load_toml, resolve
from rlcycle.console import info
from rlcycle.deploy.stage import STAGE as DEPLOY
from rlcycle.deploy.stage import DeployConfig
from rlcycle.distill.stage import STAGE as DISTILL
from rlcycle.distill.stage import DistillConfig
from rlcycle.errors import EXIT_GATE_REFUSED, InputError, RlcycleError
from rlcycle.evaluation.stage import STAGE as EVAL
from rlcycle.evaluation.stage import EvalConfig
from rlcycle.faults import crash_point
from rlcycle.simulate.stage import STAGE as SIMULATE
from rlcycle.simulate.stage import SimulateConfig
from rlcycle.stage import PENDING, RunLayout, Stage, StageContext, content_hash
from rlcycle.train import STAGE as TRAIN
from rlcycle.train import TrainConfig

STAGES = RunLayout.STAGES
# The stages in order, one object each (rlcycle/stage.py); their names are RunLayout.STAGES.
STAGE_OBJECTS: tuple[Stage, ...] = (SIMULATE, COLLECT, DISTILL, TRAIN, EVAL, DEPLOY)
assert tuple(s.name for s in STAGE_OBJECTS) == STAGES

__all__ = ["STAGES", "STAGE_OBJECTS", "Cycle", "CycleConfig", "CycleResult", "content_hash", "load_config"]


@dataclass
class CycleConfig:
    run_dir: str = cfg("runs/cycle", help="Run directory: one per cycle (reruns of it are cached).")
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
    bootstrap: bool = cfg(
        False,
        help="With an empty registry and base=production: create the tiny default model as production "
        "(the demo's config sets it; off, an empty registry is an error).",
    )
    bootstrap_seed: int = cfg(0, help="Seed of the tiny default model `bootstrap` creates.")
    tasks: str = cfg(
        str(resources.tasks()),
        help="Task suite for eval and simulate (default: the small suite shipped in rlcycle/data).",
    )
    reward_spec: str = cfg(
        str(resources.reward_spec()), help="Reward spec for distill (default: rlcycle/data/rewards.toml)."
    )
    serving_url: str | None = cfg(
        None,
        help="An OpenAI-compatible server (vLLM: `rlcycle serve --policy production`) serving "
        "the base: sets simulate.policy.server and eval.policy.server where they are not set, so simulate samples the base "
        "and eval runs both arms there, each checkpoint asked for by its served identity (its adapter "
        "rlcycle-<12 hex>, or full weights rooted at its directory). `{serving_url}` and `{python}` (this "
        "interpreter) in deploy.hook are replaced, e.g. `{python} -m rlcycle deploy-vllm --url {serving_url}`. "
        "Needs train.lora.r > 0 (vLLM hot-loads adapters). None: every stage in-process (docs/vllm.md).",
    )
    # The stage tables: each stage's own defaults (production defaults) under what a table sets.
    simulate: SimulateConfig = cfg(SimulateConfig(), help="[cycle.simulate]: SimulateConfig keys (rlcycle simulate).")
    collect: CollectConfig = cfg(CollectConfig(), help="[cycle.collect]: CollectConfig keys (rlcycle collect).")
    distill: DistillConfig = cfg(
        DistillConfig(),
        help="[cycle.distill]: DistillConfig keys, over the reward spec's own [distill] table (rlcycle distill).",
    )
    train: TrainConfig = cfg(TrainConfig(), help="[cycle.train]: TrainConfig keys (rlcycle train).")
    eval: EvalConfig = cfg(EvalConfig(), help="[cycle.eval]: EvalConfig keys, gates included (rlcycle eval).")
    deploy: DeployConfig = cfg(DeployConfig(), help="[cycle.deploy]: DeployConfig keys (hook, canary_fraction, ...).")

    def validate(self) -> list[str]:
        problems = []
        if self.source not in ("logs", "simulate"):
            problems.append(f"source={self.source!r}: must be logs or simulate")
        if self.source == "logs" and not self.events:
            problems.append("events: source=logs needs at least one event path")
        if self.serving_url is not None and not self.serving_url.startswith(("http://", "https://")):
            problems.append(f"serving_url={self.serving_url!r}: an http(s):// URL")
        if self.serving_url is None and "{serving_url}" in (self.deploy.hook or ""):
            problems.append("deploy.hook names {serving_url}, but serving_url is not set")
        if self.serving_url is not None and self.train.lora.r == 0:
            problems.append(
                "serving_url: train.lora.r = 0 trains full weights, which a running vLLM cannot hot-load; "
                "set train.lora.r (e.g. 16) or drop serving_url (full weights: docs/vllm.md, restart)"
            )
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


def _key(stage: str, config: Any, inputs: dict[str, str]) -> str:
    blob = json.dumps(
        {"stage": stage, "config": dataclasses.asdict(config), "inputs": inputs}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()


# --- the lock -------------------------------------------------------------------------------


class CycleLock:
    """One cycle at a time: a non-blocking lock on `cycle.lock`, released by the kernel if the
    holder dies; a refused cycle names the holder (its pid and start time, written in the file).
    `probe` (a dry run): only check that no cycle holds it, creating and writing nothing."""

    def __init__(self, home: Path, probe: bool = False):
        self.path = home / "cycle.lock"
        self.probe = probe
        self._lock: rio.FileLock | None = None

    def __enter__(self) -> CycleLock:
        if self.probe:
            self._probe()
            return self
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

    def _probe(self) -> None:
        if not self.path.exists():
            return  # no cycle ever ran in this home, so none holds it
        with open(self.path) as fh:  # read-only: flock needs no write access
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RlcycleError(
                    f"another cycle is running ({fh.read().strip() or 'another process'}; lock {self.path})",
                    hint="wait for it; a crashed cycle's lock is released by the kernel",
                ) from None
            fcntl.flock(fh, fcntl.LOCK_UN)

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.__exit__(*exc)
            self._lock = None


# --- the cycle ------------------------------------------------------------------------------


class Cycle:
    """The loop over the stage objects (rlcycle/stage.py): per stage a cache key from its config
    and declared inputs, a manifest written last, the stage's own `run` in between."""

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
        self.layout = RunLayout(self.run_dir)
        # `source` names where events come from: the simulate stage, or production logs.
        self.stages = [s for s in STAGE_OBJECTS if s.name != "simulate" or config.source == "simulate"]
        order = [s.name for s in self.stages]
        lo = order.index(from_stage) if from_stage in order else 0
        hi = order.index(until_stage) if until_stage in order else len(order) - 1
        self.selected = set(order[lo : hi + 1])
        self.order = order
        self.result = CycleResult(str(self.run_dir), [])

    def run(self) -> CycleResult:
        self._pinned_base(check_only=True)  # before the lock: a wrong home gets nothing written
        with CycleLock(self._home(), probe=self.dry_run):
            base_path, base_id = self._pinned_base()
            events = [self.layout.file("events")] if self.config.source == "simulate" else self.config.events
            ctx = StageContext(
                self.layout,
                base_path,
                base_id,
                self._home() / "registry",
                self.config.tasks,
                self.config.reward_spec,
                tuple(str(e) for e in events),
                self.quiet,
            )
            for stage in self.stages:
                if self._step(stage, ctx):
                    break
        return self.result

    # --- the loop -------------------------------------------------------------------------------

    def _step(self, stage: Stage, ctx: StageContext) -> bool:
        """Run or skip one stage; True when the cycle must stop here (a gate said no)."""
        name = stage.name
        if name not in self.selected:
            self.result.stages.append(StageRun(name, "skipped"))
            return False
        config = stage_config(self.config, stage)
        inputs = stage.inputs(ctx)
        outputs = {k: str(v) for k, v in stage.outputs(self.layout).items()}
        key = _key(name, config, inputs)
        old = self.layout.read_manifest(name)
        cached = old is not None and old.get("key") == key and stage.cacheable and not self.force
        if cached or self.dry_run:
            status = "cached" if cached else "planned"
            self.result.stages.append(StageRun(name, status, 0.0, outputs, (old or {}).get("result", {})))
            self._log(f"{name}: {status}")
            return self._after(stage, (old or {}).get("result", {})) if cached else False
        self._log(f"{name}: running")
        started = time.monotonic()
        self.layout.stage_dir(name).mkdir(parents=True, exist_ok=True)
        result = stage.record(stage.run(config, stage.args(ctx))).as_dict()  # as `rlcycle <stage>` runs it
        crash_point(f"cycle:{name}")  # fault injection for the resume tests
        seconds = time.monotonic() - started
        self.layout.write_manifest(
            name,
            {
                "stage": name,
                "key": key,
                "inputs": inputs,
                "outputs": outputs,
                "config": dataclasses.asdict(config),
                "result": result,
                "seconds": round(seconds, 3),
                "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            },
        )
        self.result.stages.append(StageRun(name, result.get("status", "ran"), seconds, outputs, result))
        return self._after(stage, result)

    def _after(self, stage: Stage, result: dict[str, Any]) -> bool:
        """What a stage's result means for the cycle: a gate's decision, a deploy's checkpoint."""
        if stage.gate:
            self.result.decision = result.get("decision")
            if self.result.decision == "refuse":
                self.result.exit_code = EXIT_GATE_REFUSED
                return True
            if self.result.decision != "accept":
                self.result.exit_code = 1
                return True
        if stage.publishes:
            self.result.deployed = result.get("checkpoint_id")
        return False

    def _log(self, msg: str) -> None:
        if not self.quiet:
            info(f"[cycle] {msg}")

    # --- the home: lock, registry, the pinned base ------------------------------------------------

    def _home(self) -> Path:
        if self.config.registry_home is None:
            raise InputError(
                "cycle config: registry_home is not set",
                hint="set registry_home = DIR; `rlcycle cycle` defaults it to $RLCYCLE_HOME or ~/.rlcycle",
            )
        return Path(self.config.registry_home)

    def _pinned_base(self, check_only: bool = False) -> tuple[Path, str]:
        """The base checkpoint of this run dir: recorded on the first run, reused after. A dry
        run (and `check_only`: only raise when there is no base to be had) reads the registry
        without opening it for writing, and records nothing."""
        from rlcycle.policy.registry import Registry, checkpoint_id

        pin = self.layout.read_run()
        if pin is not None and Path(pin["base_path"]).is_dir():
            return Path(pin["base_path"]), pin["base_id"]
        reg = Registry(self._home() / "registry", readonly=self.dry_run or check_only)
        if self.config.base == "production" and "production" not in reg.aliases():
            if not self.config.bootstrap:
                raise InputError(
                    f'registry {reg.root} has no production model (base = "production")',
                    hint="register one (`rlcycle registry add DIR --alias production`), point registry_home "
                    "(or RLCYCLE_HOME) at the right home, or run the demo: `rlcycle cycle --config demo`",
                )
            if self.dry_run or check_only:
                if check_only:
                    return self._bootstrap_dir(), PENDING
                self._log("registry has no production model: the run would create the tiny default model")
                return self._bootstrap_dir(), PENDING
            self._bootstrap(reg)
        if check_only:
            return Path(self.config.base), PENDING
        path = reg.resolve(self.config.base) if not Path(self.config.base).is_dir() else Path(self.config.base)
        cid = checkpoint_id(path)
        if not self.dry_run:
            self.layout.write_run({"base": self.config.base, "base_path": str(path), "base_id": cid})
        return path, cid

    def _bootstrap_dir(self) -> Path:
        return self._home() / "models" / f"tiny-seed{self.config.bootstrap_seed}"

    def _bootstrap(self, reg: Any) -> None:
        """An empty registry and `bootstrap = true` (the demo): the tiny default model becomes
        production (no model hub needed)."""
        from rlcycle.deploy import register
        from rlcycle.model_init import init_model

        self._log("registry has no production model: creating the tiny default model")
        out = self._bootstrap_dir()
        if not (out / "config.json").exists():
            init_model(out, seed=self.config.bootstrap_seed, force=True)
        register(out, "production", reg)


def stage_config(config: CycleConfig, stage: Stage) -> Any:
    """The stage's config: the cycle config's `[cycle.<name>]` table, already typed, with
    `serving_url` filled in (`_served`)."""
    table = getattr(config, stage.name)
    if not isinstance(table, stage.config_class):
        raise InputError(
            f"cycle config: {stage.name} is a {type(table).__name__}, expected a {stage.config_class.__name__}",
            hint="build CycleConfig with load_config() or resolve(), or pass the stage's config class",
        )
    return _served(config.serving_url, table)


def _served(url: str | None, table: Any) -> Any:
    """A stage table with the cycle's serving URL: a `policy.server` key it leaves unset (simulate,
    eval) gets the URL; a `hook` (deploy) gets `{serving_url}` and `{python}` replaced (the
    interpreter running the cycle: a cron job's PATH need not hold rlcycle's venv)."""
    policy = getattr(table, "policy", None)
    if url is not None and policy is not None and policy.server is None:
        return dataclasses.replace(table, policy=dataclasses.replace(policy, server=url))
    hook = getattr(table, "hook", None)
    if isinstance(hook, str):
        hook = hook.replace("{python}", sys.executable)
        return dataclasses.replace(table, hook=hook if url is None else hook.replace("{serving_url}", url))
    return table


def load_config(
    path: str | Path | None = None,
    sets: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    data_origin: str = "config",
) -> CycleConfig:
    """The cycle config: defaults < the reward spec's [distill] table (for `distill`, as
    `rlcycle distill` layers it) < `data` (a table given in code, e.g. an experiment's) < the
    file < `--set` < flags. `path` may name a packaged config (`demo`: rlcycle/configs/demo.toml,
    resources.cycle_config). Build a CycleConfig this way rather than by hand, or the spec's
    [distill] table is not layered."""
    path = resources.cycle_config(path)
    first = resolve(CycleConfig, path, sets, flags, section="cycle", data=data, data_origin=data_origin)
    # A spec that is not there has no table to layer; the distill stage says so when it runs.
    spec = Path(first.reward_spec)
    spec_table = load_toml(spec).get("distill", {}) if spec.is_file() else {}
    if not spec_table:
        return first
    return resolve(
        CycleConfig,
        path,
        sets,
        flags,
        section="cycle",
        data=_under(spec_table, data or {}),
        data_origin=f"{spec} [distill] / {data_origin}",
    )


def _under(spec_table: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the spec's [distill] table under its own `distill` keys (a table or dotted)."""
    own = data.get("distill")
    return {**data, "distill": {**spec_table, **own}} if isinstance(own, dict) else {"distill": spec_table, **data}
