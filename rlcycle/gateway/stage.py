"""`rlcycle gateway`: start the production side (router, event log, HTTP server) and run it.

In: a validated `GatewayConfig`. Out: a listening uvicorn server (`serve`, blocking until
Ctrl-C / SIGTERM, then the log is flushed and closed), or a `Running` handle whose server runs
in a background thread (`start`: tests and benches use it; `close()` stops it the same way).

    rlcycle gateway --alias production --log-dir logs/gateway --port 8100
    rlcycle gateway --upstream http://127.0.0.1:8000 --log-dir logs/gateway   # behind vLLM / serve

The socket is bound here, before uvicorn starts, so `--port 0` knows its port at once and a
bind error is an `RlcycleError` naming the address.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from rlcycle.collect import redact
from rlcycle.errors import InputError, RlcycleError
from rlcycle.gateway.app import Gateway
from rlcycle.gateway.config import GatewayConfig
from rlcycle.gateway.engine import Models
from rlcycle.gateway.logwriter import EventLog


def build(config: GatewayConfig) -> Gateway:
    """The router (checkpoints loaded), the event log and the app; nothing listens yet."""
    problems = config.validate()
    if problems:
        raise InputError(
            "gateway config: " + "; ".join(problems), hint="see `rlcycle gateway --help` and docs/gateway.md"
        )
    patterns = redact.patterns_with(config.secret_patterns) if config.redact else None
    models = Models(config)
    log = (
        EventLog(config.log_dir, config.flush_interval_s, config.rotate_bytes, config.rotate_s, patterns)
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
    gw.models.close()
    if gw.log is not None:
        gw.log.close()


def start(config: GatewayConfig) -> Running:
    """Build and serve in a background thread; returns once the server accepts connections."""
    gw = build(config)
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
    try:
        _server(gw).run(sockets=[sock])
    finally:
        sock.close()
        shutdown(gw)
