"""Moved: the closed-loop experiment is experiments/closed_loop/run.py (docs/closed_loop.md).

This pointer runs it with the same arguments, so old command lines keep working:

    .venv/bin/python experiments/closed_loop/run.py --help
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    program = Path(__file__).resolve().parent.parent / "experiments" / "closed_loop" / "run.py"
    print(f"scripts/closed_loop.py moved: running {program}", file=sys.stderr)
    sys.argv[0] = str(program)
    runpy.run_path(str(program), run_name="__main__")
