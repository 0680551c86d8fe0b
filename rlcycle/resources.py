"""resources: paths to the small data that ships inside the package, for defaults.

What goes in: nothing (or a name under `rlcycle/data/`). What comes out: a filesystem `Path`
into the installed package, found with `importlib.resources`, so the defaults of
`rlcycle cycle`, `init-model` and the scripted policies work from any directory after a plain
`pip install` (no source checkout needed):

    tokenizer()    rlcycle/data/tokenizer/       the default tokenizer (HF format)
    reward_spec()  rlcycle/data/rewards.toml     the default reward spec of distill
    tasks()        rlcycle/data/tasks/           a small task suite (two clusters)
    events()       rlcycle/data/events/          a small production event log (JSONL)
    sandbox_images() rlcycle/data/sandbox_images/ the sandbox image's build context

    cycle_config(name)  rlcycle/configs/NAME.toml   a packaged cycle config (`rlcycle cycle --config demo`)

`rlcycle/data/` is generated from the repository's `sample_data/` (the full tokenizer and
reward spec, two of the six task clusters, every 32nd session of the event log) and
`sandbox_images/` (the Dockerfile and the offline base script) by
`scripts/gen_package_data.py`; `tests/test_wheel.py` fails when the two disagree. The large
sample data (the whole event log, the OTel export, all six clusters) stays in `sample_data/`.
Ground floor: imports nothing of rlcycle's but the error types.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from rlcycle.errors import InputError, RlcycleError

PACKAGE = "rlcycle"
DATA_DIR = "data"
CONFIGS_DIR = "configs"


def data_path(*parts: str) -> Path:
    """The path of `rlcycle/data/<parts...>` in the installed package (it must exist)."""
    root = files(PACKAGE).joinpath(DATA_DIR, *parts)
    # A wheel installs unpacked, so this is a real path; a zipped import would need a copy,
    # and nothing in rlcycle needs that, so say what is wrong instead of extracting.
    path = Path(str(root))
    if not path.exists():
        raise RlcycleError(
            f"packaged data {'/'.join((PACKAGE, DATA_DIR, *parts))} is missing at {path}",
            hint="reinstall rlcycle (pip install --force-reinstall rlcycle) from a wheel or a checkout",
        )
    return path


def tokenizer() -> Path:
    """The default tokenizer directory (byte-level BPE, ChatML, HF format)."""
    return data_path("tokenizer")


def reward_spec() -> Path:
    """The default reward spec of distill (TOML)."""
    return data_path("rewards.toml")


def tasks() -> Path:
    """The default task suite directory (a few tasks of sample_data/tasks)."""
    return data_path("tasks")


def events() -> Path:
    """The default production event log directory (a slice of sample_data/events)."""
    return data_path("events")


def sandbox_images() -> Path:
    """The sandbox image's build context directory (Dockerfile, build_base_offline.sh)."""
    return data_path("sandbox_images")


def packaged_configs() -> list[str]:
    """The names of the cycle configs shipped in rlcycle/configs/ (demo, cron, ...)."""
    root = Path(str(files(PACKAGE).joinpath(CONFIGS_DIR)))
    return sorted(p.stem for p in root.glob("*.toml"))


def cycle_config(path: str | Path | None) -> Path | None:
    """`path` as given when it is a file (or None); a bare name that is not a file (no `/`, no
    suffix: `demo`) names the packaged rlcycle/configs/NAME.toml; an unknown name is an error
    listing the packaged ones."""
    if path is None:
        return None
    p = Path(path)
    if p.exists() or "/" in str(path) or p.suffix:
        return p
    found = Path(str(files(PACKAGE).joinpath(CONFIGS_DIR, f"{path}.toml")))
    if found.is_file():
        return found
    raise InputError(
        f"--config {path}: no such file, and not a packaged config",
        hint=f"packaged configs: {', '.join(packaged_configs()) or 'none'}; or give the path of a TOML file",
    )
