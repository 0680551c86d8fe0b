"""No leaks: labels on everything, cleanup on every way out, and `gc` for crashed runs.

Every container and volume rlcycle creates carries three labels:

- `rlcycle.owner`   `user@host:pid` of the process that created it
- `rlcycle.run`     the run id (RLCYCLE_RUN_ID, or one made per process)
- `rlcycle.expires` epoch seconds after which `gc` may remove it

Layers of defence, from the normal path to a `kill -9` of the host process:

1. `Sandbox.close()` / `SandboxPool.close()`, called by their `with` blocks (normal exit and
   exceptions, including KeyboardInterrupt from SIGINT).
2. `track()`ed objects are closed at interpreter exit (atexit), and SIGTERM is turned into
   SystemExit so `finally` blocks and atexit run (`install_signal_handlers()`).
3. Containers are started with stdin-once and auto-remove: when the host process dies its
   attach socket closes, the executor reads EOF and exits, and docker removes the container.
4. What is left (the workspace volumes of a killed process) is found by its labels:
   `rlcycle sandbox gc` removes expired items; `gc --all` everything of rlcycle.
"""

from __future__ import annotations

import atexit
import getpass
import os
import signal
import socket
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from rlcycle.io import pid_alive

LABEL_OWNER = "rlcycle.owner"
LABEL_RUN = "rlcycle.run"
LABEL_EXPIRES = "rlcycle.expires"

_RUN_ID = os.environ.get("RLCYCLE_RUN_ID") or uuid.uuid4().hex[:12]


def run_id() -> str:
    """This process's run id: RLCYCLE_RUN_ID when set, else a random id fixed at import."""
    return _RUN_ID


def owner() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (some containers)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def labels(ttl_s: float, run: str | None = None) -> dict[str, str]:
    """The three rlcycle labels for a new container or volume."""
    return {
        LABEL_OWNER: owner(),
        LABEL_RUN: run or run_id(),
        LABEL_EXPIRES: str(int(time.time() + ttl_s)),
    }


# --- closing on every way out -----------------------------------------------------------


class Closable(Protocol):
    def close(self) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_atexit_done = False
_signals_done = False


def track(obj: Closable) -> None:
    """Close `obj` at interpreter exit if nobody did before; installs the handlers once."""
    with _lock:
        _live.add(obj)
    install_signal_handlers()


def untrack(obj: Closable) -> None:
    with _lock:
        _live.discard(obj)


def close_all() -> None:
    """Close every tracked object (atexit, or a signal); errors are swallowed: best effort."""
    with _lock:
        objs = list(_live)
    for obj in objs:
        try:
            obj.close()
        except Exception:
            pass


def install_signal_handlers() -> None:
    """atexit closes leftovers; SIGTERM becomes SystemExit(143) so `finally` blocks run.

    SIGINT already raises KeyboardInterrupt in Python, which unwinds `with` blocks. Signal
    handlers can only be set from the main thread; until a main-thread call comes, atexit
    alone has to do. A SIGTERM handler someone else installed is left alone.
    """
    global _atexit_done, _signals_done
    with _lock:
        if not _atexit_done:
            _atexit_done = True
            atexit.register(close_all)
        if _signals_done or threading.current_thread() is not threading.main_thread():
            return
        _signals_done = True
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_term)


def _on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


# --- listing and gc ---------------------------------------------------------------------


@dataclass
class Leftover:
    """One labelled container or volume on one engine."""

    kind: str  # "container" | "volume"
    name: str
    owner: str
    run: str
    expires: int
    status: str
    host: str

    def expired(self, now: float | None = None) -> bool:
        return self.expires <= (time.time() if now is None else now)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _leftover(kind: str, name: str, lab: dict[str, str], status: str, host: str) -> Leftover:
    try:
        expires = int(lab.get(LABEL_EXPIRES, "0"))
    except ValueError:  # a mangled label: treat as expired, it is ours and unreadable
        expires = 0
    return Leftover(kind, name, lab.get(LABEL_OWNER, "?"), lab.get(LABEL_RUN, "?"), expires, status, host)


def list_leftovers(client: Any, run: str | None = None) -> list[Leftover]:
    """Every rlcycle-labelled container (running or not) and volume on one engine."""
    host = getattr(client.api, "base_url", "local")
    flt = {"label": [LABEL_OWNER] + ([f"{LABEL_RUN}={run}"] if run else [])}
    found = []
    for c in client.api.containers(all=True, filters=flt):
        name = (c.get("Names") or [c["Id"][:12]])[0].lstrip("/")
        found.append(_leftover("container", name, c.get("Labels") or {}, c.get("State", "?"), host))
    for v in client.api.volumes(filters=flt).get("Volumes") or []:
        found.append(_leftover("volume", v["Name"], v.get("Labels") or {}, "-", host))
    return found


def owner_alive(owner_label: str) -> bool:
    """True when the owner is a live process on this host (its resources are in use)."""
    who, _, pid = owner_label.rpartition(":")
    host = who.partition("@")[2]
    return host == socket.gethostname() and pid.isdigit() and pid_alive(int(pid))


def gc(client: Any, everything: bool = False, dry_run: bool = False) -> list[Leftover]:
    """Remove expired leftovers (or all rlcycle ones with `everything`); return what went.

    Expired items whose owner still runs on this host are kept: a long-lived pool outlives
    its TTL. Containers go first, since a volume cannot be removed while mounted.
    """
    now = time.time()
    chosen = [x for x in list_leftovers(client) if everything or (x.expired(now) and not owner_alive(x.owner))]
    if dry_run:
        return chosen
    for x in sorted(chosen, key=lambda x: x.kind != "container"):
        remove(client, x.kind, x.name)
    return chosen


def remove(client: Any, kind: str, name: str, attempts: int = 20) -> None:
    """Remove a container (forced) or a volume; gone already counts as done.

    A volume stays busy for a moment after its auto-removed container went, so volume
    removal is retried briefly.
    """
    import docker.errors

    for i in range(attempts):
        try:
            if kind == "container":
                client.api.remove_container(name, force=True, v=True)
            else:
                client.api.remove_volume(name, force=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as e:
            # 409: removal already in progress (auto-remove) or volume still in use.
            if e.status_code != 409 or i == attempts - 1:
                raise
            time.sleep(0.05 * (i + 1))
