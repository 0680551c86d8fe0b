"""Closed loop: `rlcycle cycle` N times in a row on simulated users, then the online A/B table.

A thin caller of rlcycle/closed_loop.py (what it does, the metrics, the output: see there and
docs/closed_loop.md).

    .venv/bin/python scripts/closed_loop.py                          # 3 cycles, ~8 min, 2 cores
    .venv/bin/python scripts/closed_loop.py --cycles 5 --episodes 84 --out runs/closed_loop5
    .venv/bin/python scripts/closed_loop.py --warm-start --out runs/closed_loop_warm
    .venv/bin/python scripts/closed_loop.py --out runs/closed_loop --report-only --json
    .venv/bin/python scripts/closed_loop.py --set train.lr=1e-4 --set eval.max_tasks=20
"""

from __future__ import annotations

import sys

from rlcycle.closed_loop import main

if __name__ == "__main__":
    sys.exit(main())
