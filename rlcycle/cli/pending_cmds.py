"""Pipeline commands whose issues have not landed: they exist, explain themselves, exit 1.

Each one is replaced by its real module when its issue lands; none fakes any behaviour.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle.errors import NotBuiltYet


def register(app: typer.Typer) -> None:
    @app.command(
        "distill",
        help=(
            "Turn trajectories into rewarded, advantage-normalised training examples.\n\n"
            "Example:\n\n  rlcycle distill trajectories.arrow -o examples.arrow --spec rewards.toml\n\n"
            "Not built yet (issue #5)."
        ),
    )
    def distill(
        trajectories: Path = typer.Argument(..., help="trajectories.arrow, or - for stdin."),
        out: Path = typer.Option(..., "-o", "--out", help="examples.arrow to write."),
        spec: Path = typer.Option(None, "--spec", help="Reward spec (TOML)."),
    ) -> None:
        raise NotBuiltYet("distill", 5)

    @app.command(
        "cycle",
        help=(
            "Chain collect, distill, train, eval and deploy in one run directory.\n\n"
            "Example:\n\n  rlcycle cycle sample_data/events --run-dir runs/$(date +%F-%H)\n\n"
            "Not built yet (issue #8)."
        ),
    )
    def cycle(
        events: list[str] = typer.Argument(..., help="Event logs: files, directories, globs or -."),
    ) -> None:
        raise NotBuiltYet("cycle", 8)
