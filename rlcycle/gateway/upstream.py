"""The upstream as the gateway sees it: up or down, back again, and serving what it should.

In: the router (`Models`: its upstream engines, each an `HTTPPolicy` bound to one checkpoint)
and the config (`upstream_probe_s`, `upstream_probe_timeout_s`). Out: an `UpstreamWatch`:
`check(engine)` before a request is sent, `failed(engine, exc)` when one fails (it returns the
`Unavailable` the client gets), `describe()` for /health and /v1/rlcycle/stats, and a thread
that probes.

What a client gets (always OpenAI's error shape, `{"error": {"message", "type", "param",
"code"}}`, and never a logged event: events are queued only after every choice is sampled):
- 502 `upstream_error`: the upstream failed *during* this request (the connection was refused,
  dropped or timed out, or it answered 5xx). The gateway does not resend it itself: a restarted
  upstream must be re-identified before it serves anything (below), and the OpenAI SDK retries
  502/503 on its own.
- 503 `upstream_unavailable` with `Retry-After`: the upstream is known to be down; the request
  is refused at once, nothing is sent upstream.
- 503 `adapter_not_loaded`: the upstream answers but does not serve this request's checkpoint
  (a restart drops the adapters the deploy hook loaded at runtime): the message names the
  checkpoint, the adapter and the command that loads it. Never samples of the base model logged
  as the checkpoint.
A streamed request gets the same status and JSON body: the gateway streams finished
completions, so no stream has started when the upstream fails, and the SDK raises
`APIStatusError` instead of yielding a truncated stream.

What marks the upstream down: a request that fails as above, a probe that cannot reach it, or
no answer when the gateway starts (`identify_at_start`: it starts beside a vLLM that is still
loading or restarting instead of refusing to start).
The probe is one `GET /v1/models` with a short timeout: every `upstream_probe_s` while the
upstream is up (a dead upstream is noticed without traffic, and a served name that vanished,
e.g. an adapter unloaded, is re-checked), and while it is down on a back-off from 0.25 s
doubling to `upstream_probe_s`: one light request at a time, never a burst.

Coming back: before anything is served again, every engine's identity is re-checked
(`HTTPPolicy.reidentify`: /v1/models and the identity probe; the processed-logprobs check runs
again before the next T != 1 sample), since a restarted server may serve something else under
the same URL. An engine whose checkpoint is not served there stays unserved (503
`adapter_not_loaded`) and is re-checked at every probe, so it serves again by itself once the
deploy hook has loaded its adapter. The gateway process is never restarted for any of this.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from rlcycle.agent.events import iso
from rlcycle.errors import RlcycleError
from rlcycle.policy.http import RequestRefused, UpstreamError
from rlcycle.policy.served import NotServed, load_hint

FIRST_RETRY_S = 0.25  # the first probe after the upstream went down; doubles up to upstream_probe_s


@dataclass(eq=False)  # exceptions stay hashable (tracebacks keep them in sets)
class Unavailable(Exception):
    """What a client gets instead of a completion: `status`, OpenAI's `code`, a message."""

    status: int
    code: str
    message: str
    retry_after_s: float | None = None

    def __str__(self) -> str:
        return self.message


def _text(e: BaseException) -> str:
    if isinstance(e, RlcycleError):
        return f"{e.message}. Hint: {e.hint}" if e.hint else e.message
    return f"{type(e).__name__}: {e}"


class UpstreamWatch:
    """Up/down state of the upstream and the probing thread (see the module docstring)."""

    def __init__(self, models: Any, url: str, probe_s: float, probe_timeout_s: float):
        self.models, self.url = models, url
        self.probe_s, self.probe_timeout_s = probe_s, probe_timeout_s
        self.up = True
        self.error: str | None = None  # why it went down (the first failure of this outage)
        self.since = time.time()  # when `up` last changed (the gateway's start, at first)
        self.outages = 0
        self.last_outage_s: float | None = None  # how long the last outage lasted
        self.last_probe: float | None = None
        self.failed_requests = 0
        self._delay = probe_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    # --- the request path -----------------------------------------------------------------
    def check(self, engine: Any) -> None:
        """Raise `Unavailable` when this engine cannot serve now (the upstream down, or its
        checkpoint not served there); nothing is sent upstream then."""
        if not self.up:
            ago = time.time() - self.since
            raise Unavailable(
                503,
                "upstream_unavailable",
                f"the upstream {self.url} is down since {iso(self.since * 1000)} ({ago:.0f} s ago: {self.error}); "
                "the gateway probes it and serves again by itself once it answers and its identity is "
                "re-checked; nothing was logged for this request",
                max(1.0, self._delay),
            )
        if engine.unserved is not None:
            raise Unavailable(503, "adapter_not_loaded", engine.unserved + "; nothing was logged for this request")

    def failed(self, engine: Any, e: BaseException) -> Unavailable:
        """A request to the upstream failed: mark what it tells, wake the prober, and say what
        the client gets."""
        with self._lock:
            self.failed_requests += 1
        if isinstance(e, UpstreamError):
            self._down(e.message)
            return Unavailable(
                502,
                "upstream_error",
                f"the upstream {self.url} failed during this request ({e.message}); nothing was logged for it; "
                "retry it (the gateway re-checks the upstream's identity before serving again)",
            )
        if (isinstance(e, RequestRefused) and e.status == 404) or isinstance(e, NotServed):
            # the model this engine asks for is gone (an adapter unloaded, a server restarted
            # with other models): unserved until a probe finds it listed and re-identified
            if isinstance(e, NotServed):
                why = _text(e)
            else:
                why = (
                    f"{self.url} no longer serves checkpoint {engine.checkpoint_id} ({e.message}). "
                    f"Hint: {load_hint(self.url, engine.path)}"
                )
            self._unserved(engine, why)
            self._wake.set()
            return Unavailable(503, "adapter_not_loaded", why + "; nothing was logged for this request")
        return Unavailable(502, "upstream_error", f"the upstream {self.url} failed: {_text(e)}"[:2000])

    def identify_at_start(self, engine: Any) -> None:
        """Identify an engine the starting gateway loads. An upstream that does not answer yet
        (vLLM still loading, or restarting) does not stop the gateway: it starts down and answers
        503 until the probe finds the upstream; a checkpoint the upstream does not serve yet (its
        adapter not loaded) leaves that engine unserved until it is. Anything else raises. (A
        reload later identifies strictly: a failure there keeps the old checkpoint serving.)"""
        try:
            engine.policy.identify()
        except UpstreamError as e:
            self._down(e.message + " (at load; check the URL if it never answers)")
        except NotServed as e:
            self._unserved(engine, _text(e))
            self._wake.set()

    # --- state ------------------------------------------------------------------------------
    def _down(self, error: str) -> None:
        with self._lock:
            if not self.up:
                return
            self.up, self.error, self.since = False, error, time.time()
            self.outages += 1
            self._delay = FIRST_RETRY_S
        from rlcycle import console

        console.warn(f"gateway: upstream {self.url} is down ({error}); answering 503 until it is back")
        self._wake.set()

    def _back(self) -> None:
        with self._lock:
            now = time.time()
            self.last_outage_s = now - self.since
            self.up, self.error, self.since = True, None, now
            self._delay = self.probe_s
        from rlcycle import console

        console.info(f"gateway: upstream {self.url} is back after {self.last_outage_s:.1f} s (identity re-checked)")

    @staticmethod
    def _unserved(engine: Any, why: str | None) -> None:
        if why != engine.unserved:
            engine.unserved, engine.unserved_since = why, (time.time() if why else None)
            from rlcycle import console

            if why:
                console.warn(f"gateway: {engine.role} ({engine.checkpoint_id}) is not served: {why}")
            else:
                console.info(f"gateway: {engine.role} ({engine.checkpoint_id}) is served again")

    # --- probing --------------------------------------------------------------------------
    def probe(self) -> None:
        """One probe: list the upstream's models; after an outage (or for an engine whose model
        is not listed or was unserved) re-identify; mark up or down."""
        engines = self.models.engines()
        if not engines:
            return
        self.last_probe = time.time()
        try:
            listed = {
                str(m.get("id")) for m in engines[0].policy.get("/v1/models", self.probe_timeout_s, 0).get("data") or []
            }
        except (UpstreamError, RequestRefused) as e:
            self._down(e.message)
            return
        was_down = not self.up
        for engine in engines:
            if was_down or engine.unserved is not None or engine.policy.model_name not in listed:
                try:
                    engine.policy.reidentify()
                except NotServed as e:
                    self._unserved(engine, _text(e))
                    continue
                except RlcycleError as e:  # it went away again mid-check, or answers garbage
                    self._down(e.message)
                    return
                self._unserved(engine, None)
        if was_down:
            self._back()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gw-upstream-watch", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        from rlcycle import console

        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            if self._closed:
                return
            try:
                self.probe()
            except Exception as e:  # never let the prober die: it is how the gateway recovers
                console.warn(f"gateway: probing {self.url} failed: {type(e).__name__}: {e}")
            if not self.up:
                self._delay = min(self.probe_s, max(FIRST_RETRY_S, self._delay * 2))

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    # --- reporting ------------------------------------------------------------------------
    def healthy(self) -> bool:
        return self.up and all(e.unserved is None for e in self.models.engines())

    def describe(self) -> dict[str, Any]:
        """The upstream's state for /health and /v1/rlcycle/stats."""
        engines = self.models.engines()
        unserved = [e for e in engines if e.unserved is not None]
        now = time.time()
        since = self.since if not self.up or not unserved else min(e.unserved_since for e in unserved)
        error = self.error if not self.up else (unserved[0].unserved if unserved else None)
        return {
            "url": self.url,
            "ok": self.up and not unserved,
            "reachable": self.up,
            "error": error,
            "since": iso(since * 1000),
            "for_s": round(now - since, 3),
            "outages": self.outages,
            "last_outage_s": None if self.last_outage_s is None else round(self.last_outage_s, 3),
            "last_probe": None if self.last_probe is None else iso(self.last_probe * 1000),
            "next_probe_s": round(self._delay, 3),
            "failed_requests": self.failed_requests,
            "engines": [
                {
                    "role": e.role,
                    "checkpoint_id": e.checkpoint_id,
                    "model": e.policy.model_name,
                    "served": e.unserved is None,
                    "error": e.unserved,
                }
                for e in engines
            ],
        }


def retry_after(u: Unavailable) -> dict[str, str] | None:
    """The Retry-After header of a 503 (whole seconds, as HTTP wants; the OpenAI SDK honours it)."""
    return None if u.retry_after_s is None else {"Retry-After": str(math.ceil(u.retry_after_s))}
