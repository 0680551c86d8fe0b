"""edits: what coding agents changed in a git repository, and whether it lasted.

`rlcycle edits` reads the gateway's log and a working tree, attributes the lines each episode
added to the logged tool calls that carried them, and hours later emits `edit_outcome` events
(lines proposed, lines surviving) that collect joins onto those calls. See docs/edits.md.

    stage.py   the stage: snapshot, record finished episodes, observe due proposals
    git.py     the git plumbing (temporary index snapshots, bounded diffs, blob reads)
    lines.py   line keys and hashes, and which call wrote a line
    state.py   the state file: snapshots, episodes handled, proposals (hashes, never code)
"""

from rlcycle.edits.stage import STAGE, EditsArgs, EditsConfig, EditsResult, run

__all__ = ["STAGE", "EditsArgs", "EditsConfig", "EditsResult", "run"]
