"""`python -m rlcycle ...`: the same CLI as the `rlcycle` console script, through rlcycle.cli.run.

The torchrun children of `rlcycle train --processes N` start this way (rlcycle/train/launch.py).
"""

import sys

from rlcycle.cli import run

if __name__ == "__main__":
    sys.exit(run())
