"""The git plumbing `rlcycle edits` needs, read-only for the user's work.

In:  a path inside a git working tree. Out: `Repo`, whose methods run the git CLI and return
plain values: tree snapshots of the working tree, the changed files and added lines between two
trees (bounded in bytes), and file contents by (tree, path).

Nothing here touches the user's index, HEAD, refs or working tree: a snapshot is `git add -A`
into a *temporary* index (`GIT_INDEX_FILE`, seeded with a copy of the real index so only files
whose stat changed are hashed again, as `git stash create` does) and `git write-tree`. The blobs
and the tree it writes are unreferenced objects in the repository's object store; git keeps them
at least `gc.pruneExpire` (two weeks by default), far longer than an edit waits to be observed.

    repo = Repo.open("~/src/project")
    tree = repo.snapshot()                      # the working tree as a tree id, untracked included
    for path, lines in repo.added_lines(before, after, max_bytes=...): ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlcycle.errors import InputError, RlcycleError

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's well-known empty tree


class DiffTooLarge(Exception):
    """A diff read past its byte bound: the caller counts the skip."""


@dataclass
class FileDiff:
    """What one file gained between two trees: its added lines (text, in order) or why not."""

    path: str
    added: list[str]
    binary: bool = False


class Repo:
    """A git working tree, driven through the git CLI (no library: git itself is the contract)."""

    def __init__(self, top: Path, git_dir: Path):
        self.top = top
        self.git_dir = git_dir

    @classmethod
    def open(cls, path: str | Path) -> Repo:
        """The working tree at `path`; exit 2 naming the path when it is not one."""
        p = Path(path).expanduser()
        if not p.is_dir():
            raise InputError(f"--repo {path}: no such directory", hint="pass the path of a git working tree")
        if shutil.which("git") is None:
            raise RlcycleError("git is not installed (rlcycle edits runs the git CLI)", hint="install git")
        r = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "--absolute-git-dir"], cwd=p, capture_output=True, text=True
        )
        if r.returncode != 0 or len(r.stdout.split("\n")) < 2:
            why = (r.stderr.strip().splitlines() or ["not a git repository"])[-1]
            raise InputError(
                f"--repo {path}: not a git working tree ({why})",
                hint="pass the directory the agents edit (where `git status` works)",
            )
        top, git_dir = r.stdout.split("\n")[:2]
        return cls(Path(top), Path(git_dir))

    # --- running git ---------------------------------------------------------------------------
    def git(self, *args: str, env: dict[str, str] | None = None, input: bytes | None = None) -> bytes:
        r = subprocess.run(
            ["git", "-c", "core.quotepath=off", *args],
            cwd=self.top,
            capture_output=True,
            env={**os.environ, **(env or {})},
            input=input,
        )
        if r.returncode != 0:
            raise RlcycleError(
                f"git {' '.join(args)} failed in {self.top}: {r.stderr.decode(errors='replace').strip()}",
                hint="check the repository with `git status`",
            )
        return r.stdout

    def _stream(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            ["git", "-c", "core.quotepath=off", *args], cwd=self.top, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    # --- state of the repository ---------------------------------------------------------------
    def head(self) -> str | None:
        """HEAD's commit id; None on a repository with no commit yet."""
        r = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=self.top, capture_output=True, text=True)
        return r.stdout.strip() or None

    def tree_of(self, ref: str) -> str:
        """The tree id of a commit-ish (`main`, `origin/main`, a commit id); exit 2 if unknown."""
        r = subprocess.run(
            ["git", "rev-parse", "--verify", "-q", f"{ref}^{{tree}}"], cwd=self.top, capture_output=True, text=True
        )
        if r.returncode != 0:
            raise InputError(
                f"target {ref!r}: not a branch, tag or commit of {self.top}",
                hint='set target = "worktree" or name a branch that exists (git branch -a)',
            )
        return r.stdout.strip()

    def commit_of(self, ref: str) -> str:
        return self.git("rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()

    def has_object(self, oid: str) -> bool:
        r = subprocess.run(["git", "cat-file", "-e", oid], cwd=self.top, capture_output=True)
        return r.returncode == 0

    def is_ancestor(self, older: str, newer: str) -> bool:
        """`older` is in `newer`'s history (the same line of work, not rewritten)."""
        r = subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=self.top, capture_output=True)
        return r.returncode == 0

    def snapshot(self) -> str:
        """The working tree as a tree id (tracked and untracked files, .gitignore honoured),
        through a temporary index: the user's index, HEAD and files are left as they are."""
        with tempfile.TemporaryDirectory(prefix="rlcycle-edits-") as tmp:
            index = Path(tmp) / "index"
            real = self.git_dir / "index"
            if real.exists():
                shutil.copyfile(real, index)  # stat cache: only changed files are hashed again
            env = {"GIT_INDEX_FILE": str(index)}
            self.git("add", "-A", "--", ".", env=env)
            return self.git("write-tree", env=env).decode().strip()

    # --- what changed -----------------------------------------------------------------------
    def changed_paths(self, a: str, b: str) -> list[str]:
        """Files added or modified from tree `a` to tree `b` (what a moved line could have gone to)."""
        out = self.git("diff-tree", "-r", "--no-renames", "--diff-filter=AM", "--name-only", "-z", a, b)
        return [p for p in out.decode(errors="surrogateescape").split("\0") if p]

    def added_lines(self, a: str, b: str, max_bytes: int) -> Iterator[FileDiff]:
        """Per file changed from tree `a` to `b`: the lines `b` added or changed (a changed line is
        a removed one plus an added one), from `git diff -U0`. Binary files come as `binary`.
        Reading stops with DiffTooLarge past `max_bytes` of diff, so the cost is bounded."""
        proc = self._stream(
            "diff", "--no-color", "--no-ext-diff", "--no-renames", "-U0", "--src-prefix=a/", "--dst-prefix=b/", a, b
        )
        assert proc.stdout is not None
        read = 0
        current: FileDiff | None = None
        try:
            for raw in proc.stdout:
                read += len(raw)
                if read > max_bytes:
                    raise DiffTooLarge(f"diff of {a[:12]}..{b[:12]} is over {max_bytes:,} bytes")
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                if line.startswith("diff --git "):
                    if current is not None:
                        yield current
                    current = FileDiff(_b_path(line), [])
                elif current is None:
                    continue
                elif line.startswith("+++ "):
                    if line != "+++ /dev/null":
                        current.path = _unquote(line[4:])[2:]
                elif line.startswith("Binary files ") or line.startswith("GIT binary patch"):
                    current.binary = True
                elif line.startswith("+"):
                    current.added.append(line[1:])
            if current is not None:
                yield current
        finally:
            proc.stdout.close()
            proc.kill()
            proc.wait()

    def read_blobs(self, tree: str, paths: list[str], max_bytes: int) -> Iterator[tuple[str, bytes | None]]:
        """(path, content) of each path in `tree` (None: not there), through one
        `git cat-file --batch`; DiffTooLarge past `max_bytes` read in all."""
        if not paths:
            return
        query = "".join(f"{tree}:{p}\n" for p in paths).encode(errors="surrogateescape")
        proc = subprocess.Popen(
            ["git", "cat-file", "--batch"],
            cwd=self.top,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            # paths are short; write them all, then read the answers in order
            proc.stdin.write(query)
            proc.stdin.close()
            read = 0
            for p in paths:
                header = proc.stdout.readline().decode(errors="replace").split()
                if len(header) != 3 or header[1] != "blob":  # "<name> missing" or a directory
                    yield p, None
                    continue
                size = int(header[2])
                read += size
                if read > max_bytes:
                    raise DiffTooLarge(f"files to observe are over {max_bytes:,} bytes")
                data = proc.stdout.read(size)
                proc.stdout.read(1)  # the newline after each object
                yield p, data
        finally:
            proc.stdout.close()
            proc.kill()
            proc.wait()


def _b_path(header: str) -> str:
    """The new path of a `diff --git a/x b/x` header (overwritten by the +++ line when present)."""
    rest = header[len("diff --git ") :]
    half = rest.find(" b/")
    return _unquote(rest[half + 1 :])[2:] if half >= 0 else rest


def _unquote(path: str) -> str:
    """Git quotes paths with unusual bytes ("a/t\\303\\251st"); undo C-style quoting."""
    if not (path.startswith('"') and path.endswith('"')):
        return path
    body = path[1:-1].encode("latin-1", errors="backslashreplace").decode("unicode_escape")
    return body.encode("latin-1", errors="replace").decode("utf-8", errors="replace")
