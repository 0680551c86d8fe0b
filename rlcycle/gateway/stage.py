"""`rlcycle gateway`: start the production side (router, event log, HTTP server) and run it.

In: a validated `GatewayConfig` (and, from Python, optionally a policy object to serve as it is
instead of the registry's alias: `start(config, policy=obj, checkpoint=DIR)`, engine.Fixed).
Out: a listening uvicorn server (`serve`, blocking until
Ctrl-C / SIGTERM, then the log is flushed and closed), or a `Running` handle whose server runs
in a background thread (`start`: tests and benches use it; `close()` stops it the same way).

    rlcycle gateway --alias production --log-dir logs/gateway --port 8100
    rlcycle gateway --upstream http://127.0.0.1:8000 --log-dir logs/gateway   # behind vLLM / serve

The socket is bound here, before uvicorn starts, so `--port 0` knows its port at once and a
bind error is an `RlcycleError` naming the address.

Stopping: SIGINT and SIGTERM both stop uvicorn gracefully (no new connections, in-flight requests
answered), then the engines are closed and the log is flushed and fsync'd; only then does the
process exit (SIGTERM: exit 0, SIGINT: 130). Every completion a client received was queued
before its response was written, so after a graceful stop it is on disk. Why this needs code:
uvicorn re-raises the signal it caught once it has stopped, with the handler that was there
before it started; for SIGTERM that is the default action, which ends the process at once and
skipped the flush of the last batch (issue 24). `serve` installs a handler that turns the
re-raised SIGTERM into an exception, and ignores further signals while it flushes.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcycle.collect import redact
from rlcycle.errors import InputError, RlcycleError
from rlcycle.gateway.app import Gateway
from rlcycle.gateway.config import GatewayConfig
from rlcycle.gateway.engine import Fixed, Models
from rlcycle.gateway.logwriter import EventLog


def build(config: GatewayConfig, policy: Any = None, checkpoint: Any = None) -> Gateway:
    """The router (checkpoints loaded), the event log and the app; nothing listens yet.

    `policy`: serve this object (a `Policy` with a `tokenizer`) instead of the registry's alias,
    `checkpoint` naming the directory it came from, if any (engine.Fixed)."""
    problems = config.validate()
    if problems:
        raise InputError(
            "gateway config: " + "; ".join(problems), hint="see `rlcycle gateway --help` and docs/gateway.md"
        )
    patterns = redact.patterns_with(config.secret_patterns) if config.redact else None
    models = Models(config) if policy is None else Fixed(config, policy, Path(checkpoint) if checkpoint else None)
    log = (
        EventLog(
            config.log_dir, config.flush_interval_s, config.rotate_bytes, config.rotate_s, patterns, config.log_buckets
        )
        if config.logging
        else None
    )
    return Gateway(config, models, log)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RlcycleError(
            f"cannot listen on {host}:{port}: {e}", hint="choose another --port (0 picks a free one)"
        ) from None
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _server(gw: Gateway) -> Any:
    import uvicorn

    cfg = uvicorn.Config(
        gw.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30, limit_concurrency=4096
    )
    return uvicorn.Server(cfg)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class Running:
    """A gateway serving from a background thread."""

    gateway: Gateway
    url: str
    server: Any
    thread: threading.Thread
    sock: socket.socket

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        shutdown(self.gateway)


def shutdown(gw: Gateway) -> None:
    """Close the engines (queued work runs first), then flush and close the log, even if closing failed."""
    try:
        gw.models.close()
    finally:
        if gw.log is not None:
            gw.log.close()


class Terminated(Exception):
    """SIGTERM arrived: stop like Ctrl-C does, but exit 0 (a service manager asked for it)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def start(config: GatewayConfig, policy: Any = None, checkpoint: Any = None) -> Running:
    """Build and serve in a background thread; returns once the server accepts connections
    (`policy`, `checkpoint`: see `build`)."""
    gw = build(config, policy, checkpoint)
    sock = bind(config.host, config.port)
    server = _server(gw)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gw-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        shutdown(gw)
        raise RlcycleError("the gateway's HTTP server did not start", hint="run with RLCYCLE_DEBUG=1")
    gw.models.start_watch()
    return Running(gw, url_of(sock), server, thread, sock)


def serve(config: GatewayConfig, on_listening: Any = None) -> None:
    """Build, bind, call `on_listening(url, gateway)`, serve until interrupted, flush the log."""
    gw = build(config)
    sock = bind(config.host, config.port)
    if on_listening is not None:
        on_listening(url_of(sock), gw)
    gw.models.start_watch()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    try:
        _server(gw).run(sockets=[sock])
    except Terminated:
        pass
    finally:
        if main:  # a second signal must not cut the flush short (kill -9 still can)
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            sock.close()
            shutdown(gw)
        finally:
            if main:
                signal.signal(signal.SIGINT, old_int)
                signal.signal(signal.SIGTERM, previous)
    if gw.log is not None:
        from rlcycle import console

        console.info(f"gateway: stopped; {gw.log.stats.written} events written to {gw.config.log_dir}")
