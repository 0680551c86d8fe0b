"""The in-container executor: one long-lived process per sandbox that runs the tool calls.

It is the container's main process (under docker's init, which reaps zombies), started once,
and reads requests from its stdin, which the host reaches through the container's attached
socket. So a tool call costs a pipe round trip and a fork, not docker's ~100 ms `exec`.

Protocol (both directions): a 4-byte big-endian length, then that many bytes of UTF-8 JSON.
Requests carry `op` and `id`; every reply echoes `id` and has `ok` (false: `error` says why).

    {"op": "exec", "cmd": "pytest -q" | ["argv", ...], "timeout": 30, "cwd": "sub/dir",
     "env": {"K": "V"}, "max_output": 65536}
      -> {"status": "ok"|"nonzero"|"timeout"|"oom", "exit_code", "signal", "stdout", "stderr",
          "stdout_bytes", "stderr_bytes", "truncated", "duration_ms"}
    {"op": "write", "files": {"rel/path": "<base64>"}}           -> {"written": n}
    {"op": "read", "paths": ["rel/path"], "max_bytes": n}         -> {"files": {path: b64|null}}
    {"op": "reset"}   kill every process, empty /workspace and /tmp -> {}
    {"op": "ping"}                                                -> {"pid": ...}

Each command runs in its own session (process group), with its OOM score raised so the kernel
kills it rather than the executor. At its deadline the whole group is SIGKILLed. When the
command returns, every other process in the container is killed as well (kill(-1)), so nothing
started in the background outlives its tool call. Output is kept at head and tail, with a flag.

Stdlib only, Python >= 3.8: it runs on whatever python3 the image has. The host side is
rlcycle/sandbox/sandbox.py; this file is copied into the image at /opt/rlcycle/executor.py.
"""

import base64
import json
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time

WORKSPACE = os.environ.get("RLCYCLE_WORKSPACE", "/workspace")
CLEAN_DIRS = (WORKSPACE, "/tmp")
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",  # the root filesystem is read-only; git and pip want a writable home
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_AUTHOR_NAME": "sandbox",
    "GIT_AUTHOR_EMAIL": "sandbox@rlcycle.invalid",
    "GIT_COMMITTER_NAME": "sandbox",
    "GIT_COMMITTER_EMAIL": "sandbox@rlcycle.invalid",
}
SHELL = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
CHUNK = 1 << 16
OWN_OOM_SCORE = None  # set by main(): the executor's own score, restored after each spawn


def sweep_allowed():
    """kill(-1) kills every process we may signal: only safe inside our own container.

    The image sets RLCYCLE_SANDBOX=1 and runs us as a non-root user; anywhere else (a unit
    test on the host, or root) the sweep would hit unrelated processes, so it is skipped.
    """
    return os.environ.get("RLCYCLE_SANDBOX") == "1" and os.getuid() != 0


# --- framing ----------------------------------------------------------------------------


def read_exact(fd, n):
    """Read exactly n bytes from fd; None at EOF (the host went away)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_message(fd):
    header = read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    body = read_exact(fd, size)
    return None if body is None else json.loads(body.decode("utf-8"))


def write_message(fd, obj):
    data = json.dumps(obj).encode("utf-8")
    data = struct.pack(">I", len(data)) + data
    while data:
        n = os.write(fd, data)
        data = data[n:]


# --- output capture ---------------------------------------------------------------------


class Capture:
    """Keep the first and last `cap // 2` bytes of a stream and count the rest.

    Memory stays bounded however much a command prints (1 GB of `yes` costs nothing here).
    """

    def __init__(self, cap):
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            # Trim lazily (at twice the size) so a stream of small chunks stays linear.
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    @property
    def truncated(self):
        return self.total > len(self.head) + min(len(self.tail), self.half)

    def text(self):
        tail = bytes(self.tail[-self.half :]) if self.tail else b""
        dropped = self.total - len(self.head) - len(tail)
        if dropped <= 0:
            return (bytes(self.head) + tail).decode("utf-8", "replace")
        marker = f"\n[... {dropped} bytes truncated by rlcycle sandbox ...]\n"
        return bytes(self.head).decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


# --- processes --------------------------------------------------------------------------


def oom_kills():
    """The memory cgroup's OOM-kill counter (v1 or v2), or None when it cannot be read."""
    for path in OOM_FILES:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def set_oom_score_adj(value):
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(value)
    except OSError:
        pass


def read_oom_score_adj():
    try:
        with open("/proc/self/oom_score_adj") as f:
            return f.read().strip()
    except OSError:
        return None


def sweep():
    """SIGKILL every process in the container except init and us; True if any was found.

    Loops because a fork bomb forks while it is being killed, and killed processes stay
    visible (as zombies) until init reaps them.
    """
    if not sweep_allowed():
        return False
    found = False
    for _ in range(400):
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return found
        found = True
        time.sleep(0.005)
    return found


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def resolve_cwd(cwd):
    if not cwd:
        return WORKSPACE
    return os.path.normpath(os.path.join(WORKSPACE, cwd))


def spawn(req):
    """Start the command in its own session, with an OOM score the kernel prefers to ours.

    The score is raised on the executor for the instant of the fork and lowered back (an
    unprivileged process may return to its starting value): children inherit it, and a
    preexec_fn doing the same would double the cost of every spawn (~1 ms).
    """
    cmd = req["cmd"]
    argv = [SHELL, "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
    env = dict(BASE_ENV)
    env.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
    if OWN_OOM_SCORE is not None:
        set_oom_score_adj("1000")
    try:
        return subprocess.Popen(
            argv,
            cwd=resolve_cwd(req.get("cwd")),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: one killpg stops the whole tree
        )
    finally:
        if OWN_OOM_SCORE is not None:
            set_oom_score_adj(OWN_OOM_SCORE)


def pump(proc, captures, deadline):
    """Read the command's pipes until it exits and they close, or until the deadline.

    Returns True when the deadline passed. A background child may keep the pipes open after
    the command itself exited; then the caller's sweep kills it and the pipes close.
    """
    sel = selectors.DefaultSelector()
    for pipe, cap in zip((proc.stdout, proc.stderr), captures):  # noqa: B905 (py3.8)
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ, cap)
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            exited = proc.poll() is not None
            # Poll often only once the command exited: then the pipes wait on leftovers.
            events = sel.select(min(remaining, 0.02 if exited else 0.05))
            for key, _ in events:
                try:
                    chunk = os.read(key.fd, CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    key.data.add(chunk)
                else:
                    sel.unregister(key.fileobj)
            if exited and not events:
                return False  # command done, pipes idle: leftovers hold them; sweep them
        return proc.poll() is None and _wait(proc, deadline)
    finally:
        sel.close()


def _wait(proc, deadline):
    """Wait for proc until the deadline; True when it passed."""
    try:
        proc.wait(max(deadline - time.monotonic(), 0))
        return False
    except subprocess.TimeoutExpired:
        return True


def drain(proc, captures, limit_s=1.0):
    """Read what is left in the pipes after everything holding them was killed."""
    end = time.monotonic() + limit_s
    for pipe, cap in zip((proc.stdout, proc.stderr), captures):  # noqa: B905 (py3.8)
        while time.monotonic() < end:
            try:
                chunk = os.read(pipe.fileno(), CHUNK)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            except OSError:
                break
            if not chunk:
                break
            cap.add(chunk)
        pipe.close()


def run_command(req):
    """Run one command to completion or deadline; return the reply fields."""
    timeout = float(req.get("timeout") or 60)
    cap = int(req.get("max_output") or 65536)
    captures = (Capture(cap), Capture(cap))
    start = time.monotonic()
    oom_before = oom_kills()
    try:
        proc = spawn(req)
    except OSError as e:  # command or cwd not found, or no pids left
        return {
            "status": "nonzero",
            "exit_code": 127 if isinstance(e, FileNotFoundError) else 126,
            "signal": None,
            "stdout": "",
            "stderr": f"rlcycle sandbox: {e}\n",
            "stdout_bytes": 0,
            "stderr_bytes": 0,
            "truncated": False,
            "duration_ms": (time.monotonic() - start) * 1000,
        }
    timed_out = pump(proc, captures, start + timeout)
    if timed_out:
        kill_group(proc.pid)
    code = proc.wait()  # reap it first: sweep() waits for zombies to vanish
    sweep()  # the command's leftovers, including ones that escaped its process group
    kill_group(proc.pid)  # when sweeping is not allowed (outside a sandbox)
    drain(proc, captures)
    oom_after = oom_kills()
    if oom_before is not None and oom_after is not None:
        oom = oom_after > oom_before
    else:  # no counter: an unexplained SIGKILL is most likely the OOM killer
        oom = code == -signal.SIGKILL and not timed_out
    status = "timeout" if timed_out else "oom" if oom else "ok" if code == 0 else "nonzero"
    return {
        "status": status,
        "exit_code": code if code >= 0 else 128 - code,
        "signal": -code if code < 0 else None,
        "stdout": captures[0].text(),
        "stderr": captures[1].text(),
        "stdout_bytes": captures[0].total,
        "stderr_bytes": captures[1].total,
        "truncated": captures[0].truncated or captures[1].truncated,
        "duration_ms": (time.monotonic() - start) * 1000,
    }


# --- files ------------------------------------------------------------------------------


def safe_path(rel):
    """An absolute path inside the workspace for `rel`, refusing escapes (also via symlinks)."""
    path = os.path.realpath(os.path.join(WORKSPACE, rel))
    root = os.path.realpath(WORKSPACE)
    if path != root and not path.startswith(root + os.sep):
        raise ValueError(f"path {rel!r} escapes the workspace")
    return path


def write_files(req):
    for rel, b64 in req["files"].items():
        path = safe_path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(b64))
    return {"written": len(req["files"])}


def read_files(req):
    limit = int(req.get("max_bytes") or 16 << 20)
    out = {}
    for rel in req["paths"]:
        try:
            with open(safe_path(rel), "rb") as f:
                data = f.read(limit + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            out[rel] = None
            continue
        if len(data) > limit:
            raise ValueError(f"{rel} is larger than {limit} bytes")
        out[rel] = base64.b64encode(data).decode("ascii")
    return {"files": out}


def reset(req):
    """Kill every process and empty the workspace and /tmp: the next user starts clean."""
    sweep()
    for top in CLEAN_DIRS:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
    return {}


# --- main loop --------------------------------------------------------------------------

HANDLERS = {
    "exec": run_command,
    "write": write_files,
    "read": read_files,
    "reset": reset,
    "ping": lambda req: {"pid": os.getpid(), "python": sys.version.split()[0]},
}


def main():
    """Serve requests from stdin until EOF (the host detached: then the container exits)."""
    global OWN_OOM_SCORE
    OWN_OOM_SCORE = read_oom_score_adj() if sweep_allowed() else None
    inp, out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    # Nothing else may write to the protocol stream: point fds 1 and 2 at /dev/null.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    while True:
        req = read_message(inp)
        if req is None:
            return 0
        handler = HANDLERS.get(req.get("op"))
        try:
            if handler is None:
                raise ValueError(f"unknown op {req.get('op')!r}")
            reply = handler(req)
            reply["ok"] = True
        except Exception as e:  # report, never die: a dead executor costs a container
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        reply["id"] = req.get("id")
        write_message(out, reply)


if __name__ == "__main__":
    sys.exit(main())
