"""Write docs/config.md: every config key of every command, from the config dataclasses.

The same rows `rlcycle <command> --help-config` prints (rlcycle.cli.config_help), as Markdown.
tests/test_config_docs.py fails when the checked-in file differs from what this writes.

    .venv/bin/python scripts/gen_config_docs.py            # rewrite docs/config.md
    .venv/bin/python scripts/gen_config_docs.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="Exit 1 when docs/config.md is stale; write nothing.")
    args = ap.parse_args(argv)
    from rlcycle.cli.config_help import render_markdown

    text = render_markdown()
    if args.check:
        stale = not DOC.exists() or DOC.read_text(encoding="utf-8") != text
        if stale:
            print(f"{DOC} is stale: run python scripts/gen_config_docs.py", file=sys.stderr)
        return int(stale)
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
