"""Reading a run directory for the report: every missing piece becomes a reason, not a crash.

A run directory (rlcycle/cycle.py; every path of it from `rlcycle.stage.RunLayout`) holds
`run.json` and one folder per stage, each with its outputs and a `manifest.json` written last. A stage that never ran has no folder; one that
crashed has a folder but no manifest; outputs are written atomically, so a file that exists is
whole. `Unavailable` carries the sentence the report shows in place of a section.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from rlcycle import io as rio
from rlcycle.errors import InputError
from rlcycle.stage import RunLayout

RUN_FILES = RunLayout.FILES  # name -> (stage, path in the run directory)


class Unavailable(Exception):
    """A piece of the report cannot be drawn; `str(e)` says why, for a reader."""


class RunDir:
    """Lazy, cached access to a run directory's files by name (RunLayout.FILES)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.layout = RunLayout(self.path)
        if not self.path.exists():
            raise InputError(
                f"run directory {self.path}: no such directory",
                hint="pass the --run-dir of an `rlcycle cycle` run, e.g. `rlcycle report runs/cycle`",
            )
        if not self.path.is_dir():
            raise InputError(
                f"run directory {self.path}: is a file, expected a directory",
                hint="pass the directory that holds run.json and the stage folders",
            )
        if not self.layout.run_json.exists() and not any(self.layout.stage_dir(s).is_dir() for s in RunLayout.STAGES):
            raise InputError(
                f"{self.path}: not a run directory (no run.json and no stage folder)",
                hint="run `rlcycle cycle --run-dir DIR` first, then `rlcycle report DIR`",
            )
        self._cache: dict[str, Any] = {}

    # --- manifests ----------------------------------------------------------------------------

    def manifest(self, stage: str) -> dict[str, Any] | None:
        """The stage's manifest, or None when it did not finish (or is unreadable)."""
        try:
            return self._json(self.layout.manifest(stage))
        except Unavailable:
            return None

    def stage_state(self, stage: str) -> str:
        """finished | unfinished (folder, no manifest) | not run (no folder)."""
        if self.manifest(stage) is not None:
            return "finished"
        return "unfinished" if self.layout.stage_dir(stage).is_dir() else "not run"

    def run_info(self) -> dict[str, Any]:
        try:
            return self._json(self.layout.run_json)
        except Unavailable:
            return {}

    # --- files by name ------------------------------------------------------------------------

    def file(self, name: str) -> Path:
        """The path of a named output; Unavailable with the reason when it is not there."""
        stage, rel = RunLayout.stage_of(name), RunLayout.relative(name)
        path = self.layout.file(name)
        if path.exists():
            return path
        state = self.stage_state(stage)
        if state == "not run":
            raise Unavailable(f"the {stage} stage did not run ({self.layout.stage_dir(stage)} does not exist)")
        if state == "unfinished":
            raise Unavailable(f"the {stage} stage did not finish (no {stage}/manifest.json; {rel} is missing)")
        raise Unavailable(f"{rel} is missing although the {stage} stage finished (was it moved or deleted?)")

    def json(self, name: str) -> dict[str, Any]:
        if name not in self._cache:
            self._cache[name] = self._json(self.file(name))
        return self._cache[name]

    def table(self, name: str, columns: list[str], optional: tuple[str, ...] = ()) -> pl.DataFrame:
        """The named Arrow file's `columns` (+ those of `optional` it has) as a polars frame."""
        key = f"{name}:{','.join(columns)}:{','.join(optional)}"
        if key in self._cache:
            return self._cache[key]
        path = self.file(name)
        try:
            table = rio.read_table(path)  # memory-mapped: unread columns cost nothing
        except (InputError, OSError, pa.ArrowException) as e:
            raise Unavailable(f"{path} is unreadable ({e})") from None
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise Unavailable(f"{path} lacks the column(s) {', '.join(missing)}")
        keep = [*columns, *(c for c in optional if c in table.column_names)]
        self._cache[key] = frame = pl.from_arrow(table.select(keep))
        return frame

    @staticmethod
    def _json(path: Path) -> dict[str, Any]:
        if not path.exists():
            raise Unavailable(f"{path} does not exist")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise Unavailable(f"{path} is unreadable ({e})") from None
        if not isinstance(data, dict):
            raise Unavailable(f"{path} does not hold a JSON object")
        return data
