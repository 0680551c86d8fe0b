"""SandboxPool: N warm sandboxes per image, over one or more Docker engines.

    with SandboxPool(size=4) as pool:                 # starts 4 containers, in parallel
        with pool.acquire() as sb:                     # ~microseconds when one is idle
            sb.write_files({"x.py": "print(1)"})
            sb.exec("python3 x.py")
        # released: workspace emptied, every process killed, back in the pool

What goes in: a size, the images (default: `ensure_image()` on every engine), a config whose
`hosts` lists the engines (round-robin; empty: the local one). What comes out: sandboxes that
are always clean when handed out. A sandbox that broke (executor killed, host deadline passed,
reset failed) is never handed out again: it is removed and a new one is started in the
background. `close()` (the `with` block, atexit, SIGTERM) removes every container and volume.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from rlcycle.sandbox import cleanup
from rlcycle.sandbox.config import SandboxConfig
from rlcycle.sandbox.sandbox import Sandbox, SandboxError

REPLACE_ATTEMPTS = 3


class SandboxPool:
    def __init__(
        self,
        size: int | None = None,
        images: list[str] | None = None,
        config: SandboxConfig | None = None,
        clients: list[Any] | None = None,
        run: str | None = None,
        start: bool = True,
    ):
        """`size` warm sandboxes for each of `images` spread over `clients` (default: one
        client per `config.hosts`). `start=False` defers creating them to `start()`."""
        from rlcycle.sandbox.engine import docker_clients
        from rlcycle.sandbox.images import ensure_image

        self.config = config or SandboxConfig()
        self.size = size or self.config.pool_size
        self.clients = clients or docker_clients(self.config.hosts)
        self.run = run
        # Every engine needs the image; ensure_image is a no-op where the tag exists.
        if images is None:
            images = [ensure_image(c, self.config) for c in self.clients][:1]
        self.images = list(images)
        self.errors: list[str] = []  # why background replacements failed, newest last
        self._idle: dict[str, queue.Queue[Sandbox]] = {i: queue.Queue() for i in self.images}
        self._all: set[Sandbox] = set()
        self._lock = threading.Lock()
        self._hosts = itertools.count()
        self._workers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rlcycle-pool")
        self._closed = False
        cleanup.track(self)
        if start:
            self.start()

    def start(self) -> None:
        """Create every warm sandbox (in parallel); on any failure close all and raise."""
        futures = [self._workers.submit(self._spawn, img) for img in self.images for _ in range(self.size)]
        problems = [str(f.exception()) for f in futures if f.exception() is not None]
        if problems:
            self.close()
            raise SandboxError(
                f"could not start the sandbox pool ({len(problems)} of {len(futures)} failed): {problems[0]}",
                hint="check `docker info` and `rlcycle sandbox ls`; lower --set pool_size",
            )

    @contextmanager
    def acquire(self, image: str | None = None, timeout: float | None = None) -> Iterator[Sandbox]:
        """Lend a clean sandbox for the `with` block; it is reset (or replaced) afterwards.

        Blocks until one is idle; SandboxError after `timeout` (default start_timeout_s)."""
        image = image or self.images[0]
        if image not in self._idle:
            raise SandboxError(f"this pool holds no sandboxes of image {image!r}", hint=f"one of {self.images}")
        wait = self.config.start_timeout_s if timeout is None else timeout
        try:
            sb = self._idle[image].get(timeout=wait)
        except queue.Empty:
            last = f"; last failure: {self.errors[-1]}" if self.errors else ""
            raise SandboxError(f"no sandbox of {image} became free within {wait:.0f}s{last}") from None
        try:
            yield sb
        finally:
            self._release(sb, image)

    def close(self) -> None:
        """Remove every sandbox of the pool, idle or lent; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            victims = list(self._all)
            self._all.clear()
        cleanup.untrack(self)
        # Spawns in flight see _closed and close their own sandbox.
        self._workers.shutdown(wait=True, cancel_futures=True)
        with ThreadPoolExecutor(max_workers=8) as ex:
            list(ex.map(lambda sb: sb.close(), victims))

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """How many sandboxes exist and sit idle per image, and failures so far."""
        return {
            "total": len(self._all),
            "idle": {img: q.qsize() for img, q in self._idle.items()},
            "hosts": len(self.clients),
            "errors": len(self.errors),
        }

    # --- internals ----------------------------------------------------------------------

    def _spawn(self, image: str) -> Sandbox:
        client = self.clients[next(self._hosts) % len(self.clients)]
        sb = Sandbox.start(client, image, self.config, self.run)
        with self._lock:
            if not self._closed:
                self._all.add(sb)
                self._idle[image].put(sb)
                return sb
        sb.close()
        return sb

    def _release(self, sb: Sandbox, image: str) -> None:
        if self._closed:
            sb.close()
            return
        if not sb.broken:
            try:
                sb.reset()
                self._idle[image].put(sb)
                return
            except SandboxError:
                pass  # reset failed: treat as broken
        with self._lock:
            self._all.discard(sb)
        try:
            self._workers.submit(self._replace, sb, image)
        except RuntimeError:  # shut down meanwhile
            sb.close()

    def _replace(self, sb: Sandbox, image: str) -> None:
        """Close a broken sandbox and start its successor, retrying a few times."""
        sb.close()
        for _ in range(REPLACE_ATTEMPTS):
            if self._closed:
                return
            try:
                self._spawn(image)
                return
            except SandboxError as e:
                self.errors.append(e.message)
