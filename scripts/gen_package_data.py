"""Write rlcycle/data/ (the defaults a wheel ships) from sample_data/, or check that they agree.

In:  sample_data/ (tokenizer/, rewards.toml, tasks/, events/) and sandbox_images/.
Out: rlcycle/data/ with
       tokenizer/          a copy of sample_data/tokenizer/
       rewards.toml        a copy of sample_data/rewards.toml
       tasks/<cluster>/    copies of the TASK_CLUSTERS of sample_data/tasks/
       events/events.jsonl every line of sample_data/events/*.jsonl (files in name order, lines
                           in file order) whose session is one of every SESSION_STRIDE-th session
                           in order of first appearance: whole sessions over the whole day, so
                           both policy versions and the late edit outcomes are in it
       sandbox_images/     a copy of sandbox_images/ (the sandbox image's build context, so
                           `rlcycle sandbox build` and simulate/eval work from a wheel)
     or, with --check, exit 1 listing every file that differs, is missing or is extra.

    .venv/bin/python scripts/gen_package_data.py            # after changing sample_data/
    .venv/bin/python scripts/gen_package_data.py --check    # what tests/test_wheel.py runs

sample_data/ and sandbox_images/ are the source; rlcycle/data/ is never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data"
IMAGES = REPO / "sandbox_images"
DATA = REPO / "rlcycle" / "data"
TASK_CLUSTERS = ("calc", "textutils")
SESSION_STRIDE = 32
SKIPPED = {"__pycache__", ".pytest_cache", ".DS_Store"}


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` by its relative name (run leftovers skipped)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not SKIPPED.intersection(p.relative_to(root).parts)
    }


def _event_slice(events_dir: Path) -> bytes:
    lines = [line for f in sorted(events_dir.glob("*.jsonl")) for line in f.read_bytes().splitlines(keepends=True)]
    order: dict[str, int] = {}
    sessions = [json.loads(line)["session_id"] for line in lines]
    for s in sessions:
        order.setdefault(s, len(order))
    return b"".join(line for line, s in zip(lines, sessions, strict=True) if order[s] % SESSION_STRIDE == 0)


def expected() -> dict[str, bytes]:
    """rlcycle/data/ as it should be, by relative file name."""
    out = {f"tokenizer/{k}": v for k, v in _tree(SAMPLE / "tokenizer").items()}
    out["rewards.toml"] = (SAMPLE / "rewards.toml").read_bytes()
    for cluster in TASK_CLUSTERS:
        out.update({f"tasks/{cluster}/{k}": v for k, v in _tree(SAMPLE / "tasks" / cluster).items()})
    out["events/events.jsonl"] = _event_slice(SAMPLE / "events")
    out.update({f"sandbox_images/{k}": v for k, v in _tree(IMAGES).items()})
    return out


def differences(want: dict[str, bytes], have: dict[str, bytes]) -> list[str]:
    missing = [f"missing: {k}" for k in sorted(want.keys() - have.keys())]
    extra = [f"extra:   {k}" for k in sorted(have.keys() - want.keys())]
    changed = [f"differs: {k}" for k in sorted(want.keys() & have.keys()) if want[k] != have[k]]
    return missing + extra + changed


def write(want: dict[str, bytes]) -> None:
    if DATA.exists():
        shutil.rmtree(DATA)
    for name, blob in want.items():
        path = DATA / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on any difference")
    args = ap.parse_args(argv)
    want = expected()
    if args.check:
        diff = differences(want, _tree(DATA) if DATA.is_dir() else {})
        for line in diff:
            print(line, file=sys.stderr)
        if diff:
            print(
                "rlcycle/data/ disagrees with sample_data/ or sandbox_images/: run scripts/gen_package_data.py",
                file=sys.stderr,
            )
        return 1 if diff else 0
    write(want)
    print(
        f"wrote {len(want)} files ({sum(map(len, want.values())) / 1e6:.1f} MB) to {DATA.relative_to(REPO)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
