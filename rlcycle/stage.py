"""The stage contract: what a stage declares to `rlcycle cycle` and its own command, and the one
run-directory layout.

In:  nothing (definitions). Out: `Stage` (a Protocol: torchtune's recipe_interfaces style, no
base class to inherit from), `StageContext` (what the loop hands every stage), `StageResult`
(what a stage's `record` returns for the manifest), `RunLayout` (the only place a run
directory's paths are written down: rlcycle/cycle.py writes them, `rlcycle report` reads them)
and the input keys of caching.

A stage (rlcycle/simulate, collect, distill, train, evaluation, deploy each define one) declares:

    name          its folder in the run directory and its name for --from/--until
    config_class  its config dataclass: the `[cycle.<name>]` table of the cycle config
    cacheable     False: it runs every time (deploy: its effect lives in the registry, not here)
    gate          True: its result's `decision` decides whether the cycle goes on (eval)
    publishes     True: its result's `checkpoint_id` is what the cycle deployed (deploy)
    inputs(ctx)   {name: key}: the content keys of what it reads (`content_key`, `checkpoint_key`)
    outputs(lay)  {name: path}: what it writes, all inside the RunLayout
    args(ctx)     its `Args` (a small dataclass of explicit paths and references, defined beside
                  it) for a run inside the layout
    run(cfg, args) -> its own result (CollectResult, TrainResult, ...): the one entry point;
                  `rlcycle <stage>` builds the Args from its arguments, the cycle from `args(ctx)`
    record(result) -> StageResult: `as_dict()` is the manifest's `result` (what `cycle --json`
                  shows), `summary()` a line for a reader

So a CLI command and the cycle run a stage the same way, only the Args differ:

    STAGE.run(config, CollectArgs(["logs/"], "traj.arrow"))      # rlcycle collect logs/ -o traj.arrow
    STAGE.record(STAGE.run(config, STAGE.args(ctx)))              # rlcycle cycle

Everything else (cache keys, manifests, resume, the lock, dry runs, exit codes) is the loop's,
once, in rlcycle/cycle.py.

    layout = RunLayout("runs/cycle")
    layout.file("verdict")          # runs/cycle/eval/verdict.json
    layout.manifest("train")        # runs/cycle/train/manifest.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rlcycle import digest
from rlcycle import io as rio
from rlcycle.errors import InputError

PENDING = "pending"  # the key of an input an earlier stage has not written yet


class RunLayout:
    """The paths of one run directory: `run.json`, a folder per stage with its files and a
    `manifest.json` written last (its presence means the stage finished)."""

    STAGES: ClassVar[tuple[str, ...]] = ("simulate", "collect", "distill", "train", "eval", "deploy")
    # name -> (stage, path relative to the run directory)
    FILES: ClassVar[dict[str, tuple[str, str]]] = {
        "events": ("simulate", "simulate/events.jsonl"),
        "trajectories": ("collect", "collect/trajectories.arrow"),
        "examples": ("distill", "distill/examples.arrow"),
        "reward_report": ("distill", "distill/reward_report.json"),
        "checkpoint": ("train", "train/checkpoint"),
        "train_metrics": ("train", "train/checkpoint/train_metrics.arrow"),
        "checkpoint_meta": ("train", "train/checkpoint/rlcycle.json"),
        "eval_results": ("eval", "eval/eval_results.arrow"),
        "verdict": ("eval", "eval/verdict.json"),
    }

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def run_json(self) -> Path:
        """`run.json`: the pinned base checkpoint of this run directory."""
        return self.root / "run.json"

    def stage_dir(self, stage: str) -> Path:
        return self.root / stage

    def manifest(self, stage: str) -> Path:
        return self.root / stage / "manifest.json"

    def file(self, name: str) -> Path:
        """The path of a named file (FILES)."""
        return self.root / self.FILES[name][1]

    @classmethod
    def stage_of(cls, name: str) -> str:
        return cls.FILES[name][0]

    @classmethod
    def relative(cls, name: str) -> str:
        return cls.FILES[name][1]

    def read_manifest(self, stage: str) -> dict[str, Any] | None:
        path = self.manifest(stage)
        return json.loads(path.read_text()) if path.exists() else None

    def write_manifest(self, stage: str, manifest: dict[str, Any]) -> None:
        rio.atomic_write_text(self.manifest(stage), json.dumps(manifest, indent=2, default=str) + "\n")

    def read_run(self) -> dict[str, Any] | None:
        return json.loads(self.run_json.read_text()) if self.run_json.exists() else None

    def write_run(self, info: dict[str, Any]) -> None:
        rio.atomic_write_text(self.run_json, json.dumps(info, indent=2) + "\n")


@dataclass(frozen=True)
class StageContext:
    """What the loop hands every stage: the layout, the pinned base checkpoint, the registry
    (a directory: aliases resolve in it, deploy writes it) and the cycle's shared inputs."""

    layout: RunLayout
    base_path: Path
    base_id: str
    registry: Path
    tasks: str
    reward_spec: str
    events: tuple[str, ...]  # what collect reads: simulate's events, or the production logs
    quiet: bool = False


class StageResult(Protocol):
    def as_dict(self) -> dict[str, Any]: ...

    def summary(self) -> str: ...


@dataclass
class Outcome:
    """A StageResult: `record` is what the manifest keeps (a `status` key, when present,
    is the stage's status in the cycle summary; else `ran`); `text` the stage's own summary."""

    record: dict[str, Any]
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return self.record

    def summary(self) -> str:
        return self.text


class Stage(Protocol):
    name: str
    config_class: type
    cacheable: bool
    gate: bool
    publishes: bool

    def inputs(self, ctx: StageContext) -> dict[str, str]: ...

    def outputs(self, layout: RunLayout) -> dict[str, Path]: ...

    def args(self, ctx: StageContext) -> Any: ...

    def run(self, config: Any, args: Any) -> Any: ...

    def record(self, result: Any) -> StageResult: ...


# --- input keys -------------------------------------------------------------------------------


def content_hash(paths: list[str | Path]) -> str:
    """sha256 over files' names and bytes: a directory's files by relative name (sorted), a
    file by its base name, so moving a run directory keeps its cache keys."""
    entries = []
    for p in map(Path, paths):
        entries += digest.tree_files(p) if p.is_dir() else [(p.name, p)]
    return digest.files_sha256(entries)


def content_key(paths: list[str | Path], *, pending_ok: bool = False) -> str:
    """The key of files read as input; `pending_ok`: PENDING while one is not there yet (an
    earlier stage's output in a dry run or before it ran), else missing files are an error."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing and pending_ok:
        return PENDING
    if missing:
        raise InputError(
            f"input {', '.join(missing)}: no such file or directory", hint="check the cycle config's paths"
        )
    return content_hash(paths)


def checkpoint_key(path: Path) -> str:
    """The checkpoint id of a checkpoint directory an earlier stage writes (PENDING until then)."""
    from rlcycle.policy.registry import checkpoint_id

    return checkpoint_id(path) if (path / "config.json").exists() else PENDING
