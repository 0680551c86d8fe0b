"""The gateway's HTTP API (FastAPI on uvicorn): OpenAI chat completions that log on-policy events.

In: HTTP requests. Out: OpenAI-format responses with `X-Checkpoint-Id`, `X-Session-Id`,
`X-Episode-Id`, `X-Sample-Id` and `X-Request-Id` headers; events appended to the `EventLog`.

    GET  /health                  "ok", or 503 with the upstream's state when it cannot serve (no auth)
    GET  /v1/models               the served alias and checkpoint (its directory as `root`, as vLLM lists it)
    POST /v1/chat/completions     chat completions (tools, tool_choice, stop, n, logprobs, stream)
    POST /v1/completions          vLLM's completions: token ids in, ids and logprobs out (completions.py)
    POST /v1/responses            the Responses API (input items, function tools, stream): responses.py
    POST /v1/rlcycle/events       late signals: edit_outcome, user_message, feedback, tool_result
    POST /v1/rlcycle/reload       re-resolve the aliases now (deploy's HTTP hook can call it)
    GET  /v1/rlcycle/stats        log and router counters

Ids: the session comes from `X-Session-Id` (or `metadata.session_id`), else a new one is made
and returned in the header; the episode from `X-Episode-Id` (or metadata), else the k-th user
message of the session. Idempotency: a request with an `Idempotency-Key` (or `X-Request-Id`)
header seen before gets the first answer again and logs nothing; a request the OpenAI SDK
retries (`x-stainless-retry-count` > 0) without a key is matched to an earlier one by its body.

Refusals: every problem of a request is listed in one 400 (`error.problems`, an extension of
OpenAI's shape; `error.param` is the first), unknown routes get 404 in the same shape, and each
refused request is one stderr line (status, fields, User-Agent) and counted per status and per
field in /v1/rlcycle/stats.

/v1/completions is the raw model API other rlcycle parts use (`HTTPPolicy`: simulate, eval, a
gateway in front of this one): it is served by the alias's checkpoint (never the canary's, so
what /v1/models names is what answers) and logs nothing (the caller logs what it samples).

Upstream failures (upstream.py): a request the upstream fails gets 502 `upstream_error`, one
sent while it is down 503 `upstream_unavailable` (with Retry-After), one whose checkpoint it
does not serve 503 `adapter_not_loaded`; all in OpenAI's error shape, none logged.

Auth: with an api key set, every route but /health needs `Authorization: Bearer KEY`, compared
with `hmac.compare_digest`. Bodies over `max_body_bytes` get 413.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlcycle.agent.events import iso
from rlcycle.collect.events import JSON_SCHEMA
from rlcycle.collect.jsonl import parse_block
from rlcycle.gateway import chat, completions, responses
from rlcycle.gateway.chat import BadRequest
from rlcycle.gateway.config import GatewayConfig
from rlcycle.gateway.contexts import Contexts
from rlcycle.gateway.engine import Fixed, Models
from rlcycle.gateway.episodes import Episodes, key_session
from rlcycle.gateway.finish import finish
from rlcycle.gateway.logwriter import EventLog
from rlcycle.gateway.upstream import Unavailable, retry_after

LATE_TYPES = ("edit_outcome", "user_message", "feedback", "tool_result")
MAX_ID_CHARS = 256


def _error(
    status: int,
    message: str,
    param: str | None = None,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
    code: int | str | None = None,
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status if code is None else code}},
        status_code=status,
        headers=headers,
    )


@dataclass
class _Seen:
    """One request id: the answer (once known), shared by every retry of the request."""

    done: asyncio.Future
    at: float = field(default_factory=time.monotonic)


class Gateway:
    """The app and what it serves from; `app` is the ASGI application."""

    def __init__(self, config: GatewayConfig, models: Models | Fixed, log: EventLog | None):
        self.config, self.models, self.log = config, models, log
        self.model_name = config.alias
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._raw_text: OrderedDict[str, str] = OrderedDict()  # tool-call id -> model's raw text
        self.requests = 0
        self.replayed = 0
        self.refused: Counter = Counter()  # refused requests by status
        self.refused_fields: Counter = Counter()  # ... and by field named (a request may name several)
        self.episodes = Episodes(config.idempotency_entries)
        self.contexts = Contexts(config.prompt_cache_tokens)
        self.app = _SessionPrefix(self._build())

    # --- plumbing -------------------------------------------------------------------------
    def _authorised(self, request: Request) -> bool:
        keys = [k for k in (self.config.api_key, *self.config.session_keys) if k]
        if not keys:
            return True
        given = request.headers.get("authorization", "").encode()
        ok = False
        for key in keys:  # every key compared, in constant time each
            ok |= hmac.compare_digest(given, f"Bearer {key}".encode())
        return ok

    async def _body(self, request: Request) -> bytes:
        cap = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cap:
            raise BadRequest(f"body of {declared} bytes is over the cap of {cap}", None, 413)
        data = bytearray()
        async for piece in request.stream():
            data += piece
            if len(data) > cap:
                raise BadRequest(f"body is over the cap of {cap} bytes", None, 413)
        return bytes(data)

    @staticmethod
    def _json(data: bytes) -> Any:
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the body is not JSON: {e}") from None

    def _request_key(self, request: Request, data: bytes) -> tuple[str | None, bool]:
        """(idempotency key, whether to look it up): explicit keys always; body hashes on retries."""
        key = request.headers.get("idempotency-key") or request.headers.get("x-request-id")
        if key:
            return "k:" + key[:MAX_ID_CHARS], True
        retry = request.headers.get("x-stainless-retry-count", "0")
        auth = request.headers.get("authorization", "")
        digest = hashlib.sha256(auth.encode() + b"\0" + data).hexdigest()
        return "b:" + digest, retry.isdigit() and int(retry) > 0

    def _remember(self, key: str) -> _Seen:
        now = time.monotonic()
        ttl, cap = self.config.idempotency_ttl_s, self.config.idempotency_entries
        while self._seen and (len(self._seen) >= cap or now - next(iter(self._seen.values())).at > ttl):
            self._seen.popitem(last=False)
        seen = _Seen(asyncio.get_running_loop().create_future())
        self._seen[key] = seen
        return seen

    # --- chat completions -----------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        return await self._handle(request, "chat.completions")

    async def responses(self, request: Request) -> Response:
        return await self._handle(request, "responses")

    async def _handle(self, request: Request, api: str) -> Response:
        """Idempotency, checks, sampling and logging shared by both APIs; `api` picks the shape."""
        data = await self._body(request)
        key, lookup = self._request_key(request, data)
        if lookup and key in self._seen and (time.monotonic() - self._seen[key].at) < self.config.idempotency_ttl_s:
            self.replayed += 1
            result, req, raw = await asyncio.shield(self._seen[key].done)
            return self._respond(result, req, api, raw)
        raw = self._json(data)
        body = responses.to_chat(raw) if api == "responses" else raw
        req = chat.parse_request(body, self.config, self._raw_text)
        seen = self._remember(key) if key else None
        try:
            result = await self._complete(request, req, body, key, api)
        except BaseException as e:
            if seen is not None:
                self._seen.pop(key, None)
                seen.done.set_exception(e)
                seen.done.exception()  # retrieved: no "never retrieved" warning
            raise
        if seen is not None:
            seen.done.set_result((result, req, raw))
        return self._respond(result, req, api, raw)

    # --- completions (vLLM's API) ---------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        """Token ids in, token ids and logprobs out, from the alias's checkpoint; logs nothing."""
        body = self._json(await self._body(request))
        engine = self.models.acquire(None)
        try:
            engine.check()  # the upstream down, or this checkpoint not served there: 503 at once
            vocab = getattr(engine.policy, "vocab_size", None)
            req = completions.parse(body, self.config, engine.tokenizer, {self.model_name}, vocab)
            futures = [engine.submit(p, sp) for p, sp in zip(req.prompts, req.params, strict=True)]
            gens = [await asyncio.wrap_future(f) for f in futures]
            # top-k logprobs need another forward pass per choice: off the event loop
            tops = await asyncio.to_thread(completions.top_logprobs, engine.policy, req, gens)
        finally:
            self.models.release(engine)
        answer = completions.response(req, gens, tops, self.model_name, engine.tokenizer)
        return JSONResponse(answer, headers={"X-Checkpoint-Id": engine.checkpoint_id})

    def _model_card(self) -> dict[str, Any]:
        """The served alias in /v1/models, with what clients identify it by (policy/served.py):
        `root`, the checkpoint's directory (as vLLM lists its --model), and `max_model_len`."""
        info = self.models.describe()
        card = {
            "id": self.model_name,
            "object": "model",
            "owned_by": "rlcycle",
            "checkpoint_id": info["checkpoint_id"],
            "candidate_id": info["candidate_id"],
        }
        engine = self.models.primary
        if engine is not None and engine.path is not None:
            card["root"] = str(engine.path)
        if engine is not None and getattr(engine.policy, "max_length", None):
            card["max_model_len"] = engine.policy.max_length
        return card

    def _ids(self, request: Request, req: chat.ChatRequest) -> tuple[str | None, str, str | None]:
        """(session or None, the rule that gave it, episode or None) from headers, URL and key."""
        h, meta, c = request.headers, req.metadata, self.config
        session, rule = h.get("x-session-id"), "header"
        if not session and meta.get("session_id"):
            session, rule = meta["session_id"], "metadata"
        if not session and request.scope.get("rlcycle_session"):
            session, rule = request.scope["rlcycle_session"], "path"
        if not session:
            session, rule = (
                key_session(h.get("authorization", ""), c.api_key, c.session_keys, c.session_from_key),
                "key",
            )
        episode = h.get("x-episode-id") or meta.get("episode_id")
        for name, value in (("session id", session), ("X-Episode-Id", episode)):
            if value is not None and (len(value) > MAX_ID_CHARS or not value.isprintable()):
                raise BadRequest(f"{name} must be printable and at most {MAX_ID_CHARS} characters", name)
        return session or None, rule, episode

    async def _complete(
        self, request: Request, req: chat.ChatRequest, body: dict, key: str | None, api: str = "chat.completions"
    ) -> list[chat.Result]:
        """Sample the request's n choices; each is logged as its own completion before any answer."""
        self.requests += 1
        given, rule, episode = self._ids(request, req)
        session, episode_id, turn, rules, parent = self.episodes.resolve(
            body["messages"], given, rule, episode, f"gw-{uuid.uuid4().hex}"
        )
        base = "gw-" + (
            hashlib.sha256(key.encode()).hexdigest()[:24] if key and key.startswith("k:") else uuid.uuid4().hex[:24]
        )
        engine = self.models.acquire(session)
        try:
            engine.check()  # the upstream down, or this checkpoint not served there: 503 at once
            renderer = engine.renderer(req.tools)
            prompt = await asyncio.to_thread(chat.render_prompt, renderer, req, self.config.max_prompt_tokens)
            seeds = [None if req.params.seed is None else req.params.seed + i for i in range(req.n)]
            futures = [engine.submit(prompt, replace(req.params, seed=sd)) for sd in seeds]
            gens = [await asyncio.wrap_future(f) for f in futures]
            done = [finish(renderer, g, req.tools, req.stop, req.parallel_tool_calls, req.prefill) for g in gens]
            tokens = (
                [[renderer.tokenizer.decode([t], skip_special_tokens=False) for t in d.gen.token_ids] for d in done]
                if req.logprobs
                else [None] * req.n
            )
        finally:
            self.models.release(engine)
        results = []
        for i, d in enumerate(done):
            sample_id = base if req.n == 1 else f"{base}-{i}"
            r = chat.Result(
                sample_id,
                sample_id,
                session,
                episode_id,
                turn,
                engine.checkpoint_id,
                engine.role,
                prompt,
                d.gen,
                d.text,
                d.parsed,
                index=i,
                cut=d.cut,
                logged_text=d.logged_text,
                raw=d.raw,
                tokens=tokens[i],
                id_rules=rules,
                api=api,
                parent_sample_id=parent,
            )
            r.request_id = key[2:] if key and key.startswith("k:") else base
            for j, c in enumerate(d.parsed.calls):
                if c.valid:
                    self._raw_text[r.call_id(j)] = d.raw
            results.append(r)
        while len(self._raw_text) > self.config.idempotency_entries:
            self._raw_text.popitem(last=False)
        self.episodes.record(body["messages"], session, episode_id, turn, [(r.sample_id, r.answer()) for r in results])
        if self.log is not None:
            events = []
            against = self.contexts.parent(session, parent)  # the same for every choice
            for r, sd in zip(results, seeds, strict=True):
                events += chat.completion_events(r, {**req.sampling, "seed": sd}, against)
            self.log.append(*events)
            for r in results:  # after the parent's event is queued: a child is never logged first
                self.contexts.record(session, r.sample_id, r.prompt_ids, r.gen.token_ids)
        return results

    def _respond(self, results: list[chat.Result], req: chat.ChatRequest, api: str, raw: Any) -> Response:
        headers = chat.headers(results)
        if api == "responses":
            if not req.stream:
                return JSONResponse(responses.response_object(results, self.model_name, raw), headers=headers)
            lines = responses.sse(responses.stream_events(results, self.model_name, raw))

            async def events():
                for line in lines:
                    yield line

            return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
        if not req.stream:
            return JSONResponse(chat.response_body(results, self.model_name), headers=headers)
        chunks = chat.stream_chunks(results, self.model_name, req.include_usage)

        async def sse():
            for c in chunks:
                yield f"data: {json.dumps(c, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)

    def _refusal(self, request: Request, status: int, fields: list[str], message: str) -> None:
        """One stderr line per refused request (status, fields, User-Agent), counted per field."""
        self.refused[str(status)] += 1
        self.refused_fields.update(dict.fromkeys(fields, 1))
        ua = request.headers.get("user-agent", "-")[:120]
        line = (
            f"gateway: refused {status} {request.method} {request.url.path} field={','.join(fields)} "
            f"user-agent={json.dumps(ua)}: {message[:300]}"
        )
        # Exactly one line whatever the terminal's width (a rich console would wrap it).
        sys.stderr.write(line.replace("\n", " ") + "\n")
        sys.stderr.flush()

    # --- late signals -------------------------------------------------------------------------
    async def events(self, request: Request) -> Response:
        body = self._json(await self._body(request))
        items = body.get("events") if isinstance(body, dict) and "events" in body else body
        items = items if isinstance(items, list) else [items]
        if not items:
            raise BadRequest("no events given", "events")
        now = iso(time.time() * 1000)
        for i, ev in enumerate(items):
            if not isinstance(ev, dict):
                raise BadRequest(f"events[{i}] must be a JSON object", f"events[{i}]")
            if ev.get("type") not in LATE_TYPES:
                raise BadRequest(
                    f"events[{i}].type must be one of {', '.join(LATE_TYPES)} (completions are "
                    "logged by the gateway itself)",
                    f"events[{i}].type",
                )
            ev.setdefault("event_id", f"gw-ev-{uuid.uuid4().hex}")
            ev.setdefault("ts", now)
            ev.setdefault("session_id", request.headers.get("x-session-id"))
        lines = b"".join(json.dumps(ev).encode() + b"\n" for ev in items)
        chunk = parse_block(lines, "request", 0, schema=JSON_SCHEMA)  # every field checked, not only collect's
        if chunk.bad:
            b = chunk.bad[0]
            field_name = _field_of(b.reason)
            raise BadRequest(
                f"events[{b.line - 1}]: {b.reason}",
                f"events[{b.line - 1}]" + (f".{field_name}" if field_name else ""),
                422,
            )
        if self.log is not None:
            self.log.append(*items)
        return JSONResponse({"accepted": len(items), "event_ids": [ev["event_id"] for ev in items]})

    # --- the app --------------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        app = FastAPI(title="rlcycle gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.middleware("http")
        async def guard(request: Request, call_next):
            if request.url.path != "/health" and not self._authorised(request):
                self._refusal(request, 401, ["authorization"], "missing or wrong API key")
                return _error(
                    401,
                    "missing or wrong API key (Authorization: Bearer KEY)",
                    kind="authentication_error",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            return await call_next(request)

        @app.exception_handler(BadRequest)
        async def bad_request(request: Request, e: BadRequest) -> Response:
            self._refusal(request, e.status, [p or "body" for p, _ in e.problems], str(e))
            body = {"message": str(e), "type": "invalid_request_error", "param": e.param, "code": e.status}
            if len(e.problems) > 1:  # an extension: every problem with its field
                body["problems"] = [{"param": p, "message": m} for p, m in e.problems]
            return JSONResponse({"error": body}, status_code=e.status)

        @app.exception_handler(completions.NotFound)
        async def not_served(request: Request, e: completions.NotFound) -> Response:  # vLLM's answer
            self._refusal(request, 404, ["model"], str(e))
            return _error(404, str(e), "model", kind="NotFoundError")

        @app.exception_handler(StarletteHTTPException)
        async def not_found(request: Request, e: StarletteHTTPException) -> Response:  # 404, 405: OpenAI's shape
            what = "route" if e.status_code == 404 else "method"
            self._refusal(request, e.status_code, [what], f"{request.method} {request.url.path}")
            hint = (
                " (this gateway serves /v1/chat/completions, /v1/responses, /v1/completions, /v1/models and "
                "/v1/rlcycle/*)"
            )
            return _error(
                e.status_code, f"{e.detail}: {request.method} {request.url.path}{hint}", what, headers=e.headers
            )

        @app.exception_handler(Unavailable)
        async def unavailable(request: Request, e: Unavailable) -> Response:  # upstream.py
            return _error(e.status, e.message, kind="server_error", code=e.code, headers=retry_after(e))

        @app.exception_handler(Exception)
        async def failed(request: Request, e: Exception) -> Response:  # the model or upstream failed
            status = 502 if self.config.upstream else 500
            return _error(status, f"{type(e).__name__}: {e}"[:2000], kind="server_error")

        @app.get("/health")
        async def health() -> Response:
            # "ok" while everything serves (unchanged for load balancers); with an upstream that
            # is down or does not serve a checkpoint: 503 and what is wrong since when
            watch = self.models.upstream
            if watch is None or watch.healthy():
                return PlainTextResponse("ok")
            return JSONResponse({"status": "degraded", "upstream": watch.describe()}, status_code=503)

        @app.get("/v1/models")
        async def models() -> Response:
            return JSONResponse({"object": "list", "data": [self._model_card()]})

        app.post("/v1/chat/completions")(self.chat_completions)
        app.post("/v1/completions")(self.completions)
        app.post("/v1/responses")(self.responses)
        app.post("/v1/rlcycle/events")(self.events)

        @app.post("/v1/rlcycle/reload")
        async def reload() -> Response:
            return JSONResponse(await asyncio.to_thread(self.models.reload))

        @app.get("/v1/rlcycle/stats")
        async def stats() -> Response:
            return JSONResponse(
                {
                    "requests": self.requests,
                    "replayed": self.replayed,
                    "refused": sum(self.refused.values()),
                    "refused_by_status": dict(self.refused),
                    "refused_by_field": dict(self.refused_fields),
                    "models": self.models.describe(),
                    "upstream": self.models.upstream.describe() if self.models.upstream else None,
                    "log": self.log.stats.as_dict() if self.log else None,
                }
            )

        return app


class _SessionPrefix:
    """ASGI wrapper: `/s/<session>/v1/...` is served as `/v1/...` with that session (a base URL
    is the one thing every client can change without code)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope.get("type") == "http" else ""
        if path.startswith("/s/"):
            session, sep, rest = path[3:].partition("/")
            if session and sep:
                from urllib.parse import unquote

                scope = {
                    **scope,
                    "path": "/" + rest,
                    "raw_path": ("/" + rest).encode(),
                    "rlcycle_session": unquote(session),
                }
        await self.app(scope, receive, send)


def _field_of(reason: str) -> str | None:
    """The field a collect reason names: "field 'x': ..." or "type: missing x"."""
    if reason.startswith("field '"):
        return reason.split("'")[1]
    if ": missing " in reason:
        return reason.rsplit(": missing ", 1)[1].split()[0]
    for name in ("lines_surviving", "value", "kind", "status", "ts", "sample_id"):
        if name in reason:
            return name
    return None
