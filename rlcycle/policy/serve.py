"""`rlcycle serve`: a small OpenAI-compatible completions server over the in-process backend.

What goes in: an `HFPolicy` (a model directory) and a `ServeConfig`. What comes out: an HTTP
server, on 127.0.0.1 unless told otherwise, that speaks the subset of the OpenAI/vLLM
completions API that `http.HTTPPolicy` sends, so (a) and (b) return the same ids and logprobs.

Endpoints:
    GET  /health            200 "ok"
    GET  /v1/models         {"object": "list", "data": [{"id": NAME, ...}]}
    POST /v1/completions    OpenAI completions with vLLM's token-id extensions

Request fields read: `prompt` (token ids, a list of them, a string or list of strings),
`max_tokens` (16), `temperature` (1.0), `top_p` (1.0), `seed`, `stop_token_ids`, `logprobs`,
`return_tokens_as_token_ids`, `skip_special_tokens` (true), `n` (must be 1), `stream` (must be
false), `echo` (must be false). Fields that would change the sampling distribution are refused
with 400 unless neutral (`top_k` -1/0, `min_p` 0, `repetition_penalty` 1, `presence_penalty`
and `frequency_penalty` 0, `stop` empty, `best_of` 1): silently ignoring them would make the
returned logprobs lie. Unknown fields are ignored, as vLLM does.

Each choice carries `token_ids` (always; vLLM only with `return_token_ids`), `text`,
`finish_reason`, `stop_reason` (the stop token id) and, when `logprobs` is set,
`logprobs.tokens` ("token_id:N" with `return_tokens_as_token_ids`, else the token text),
`logprobs.token_logprobs` and `logprobs.top_logprobs` (the sampled token only).

Requests from many connections are batched: a worker takes what is queued (up to
`max_batch_size`, waiting at most `batch_wait_ms` for more) and runs one `generate` over all of
them with one SamplingParams per prompt, so results do not depend on what else was queued
(see hf.py for what that guarantees).

Threat model: no TLS and, by default, no authentication; it binds to loopback. Anyone who can
reach the port can use the model. `api_key` requires `Authorization: Bearer KEY`. Request
bodies are capped at `max_body_bytes` and `max_tokens` at `max_new_tokens_cap`.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlcycle.config import cfg
from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy.base import Generation, SamplingParams

NEUTRAL = {"top_k": (-1, 0, None), "min_p": (0, 0.0, None), "repetition_penalty": (1, 1.0, None),
           "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
           "best_of": (1, None), "stop": (None, [], "")}


@dataclass
class ServeConfig:
    """Options of `rlcycle serve`."""

    host: str = cfg("127.0.0.1", help="Interface to bind (loopback by default).")
    port: int = cfg(8000, help="TCP port (0 picks a free one).")
    name: str | None = cfg(None, help="Model name reported by /v1/models (default: the directory name).")
    max_batch_size: int = cfg(16, help="Prompts generated together.")
    batch_wait_ms: float = cfg(5.0, help="How long the batcher waits for more requests.")
    max_new_tokens_cap: int = cfg(4096, help="Largest max_tokens accepted.")
    max_body_bytes: int = cfg(32 << 20, help="Largest request body accepted.")
    api_key: str | None = cfg(None, help="Require `Authorization: Bearer KEY` when set.")


class BadRequest(Exception):
    """A request the server refuses with 400 and this message."""


@dataclass
class _Job:
    prompt: list[int]
    params: SamplingParams
    future: Future


class PolicyServer:
    """The HTTP server and its batching worker. Use `start()` (background) or `serve_forever()`."""

    def __init__(self, policy: Any, config: ServeConfig | None = None):
        self.policy = policy
        self.config = config or ServeConfig()
        self.name = self.config.name or getattr(policy, "name", "rlcycle-policy")
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        try:
            self._httpd = ThreadingHTTPServer((self.config.host, self.config.port), _handler(self))
        except OSError as e:
            raise RlcycleError(f"cannot listen on {self.config.host}:{self.config.port}: {e}",
                               hint="choose another --port (0 picks a free one)") from None
        self._httpd.daemon_threads = True
        self._worker = threading.Thread(target=self._batch_loop, name="rlcycle-batcher", daemon=True)
        self._worker.start()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:8000 (the client appends /v1/...)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> PolicyServer:
        """Serve from a background thread; returns self."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until `close()` or KeyboardInterrupt."""
        try:
            self._httpd.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        """Stop accepting requests, stop the worker, release the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread = None
        self._httpd.server_close()
        self._jobs.put(None)

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- batching ---------------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams) -> Future:
        """Queue one prompt; the Future resolves to its Generation."""
        fut: Future = Future()
        self._jobs.put(_Job(prompt, params, fut))
        return fut

    def _batch_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch = [job]
            deadline = time.monotonic() + self.config.batch_wait_ms / 1000.0
            while len(batch) < self.config.max_batch_size:
                try:
                    nxt = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                batch.append(nxt)
            try:
                gens = self.policy.generate([j.prompt for j in batch], [j.params for j in batch])
            except Exception as e:  # each waiting request gets the error
                for j in batch:
                    j.future.set_exception(e)
                continue
            for j, g in zip(batch, gens, strict=True):
                j.future.set_result(g)

    # --- the completions endpoint -------------------------------------------------------
    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one /v1/completions request body (raises BadRequest)."""
        prompts = self._prompts(body.get("prompt"))
        params = _params(body, self.config.max_new_tokens_cap)
        n_lp = body.get("logprobs")
        if n_lp is not None and (not isinstance(n_lp, int) or isinstance(n_lp, bool) or n_lp < 0):
            raise BadRequest("logprobs must be a non-negative integer")
        futures = [self.submit(p, _seeded(params, i)) for i, p in enumerate(prompts)]
        gens = [f.result() for f in futures]
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        skip = body.get("skip_special_tokens", True) is not False
        choices = [self._choice(i, g, n_lp, as_ids, skip) for i, g in enumerate(gens)]
        n_prompt = sum(len(p) for p in prompts)
        n_out = sum(len(g.token_ids) for g in gens)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": self.name, "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                      "total_tokens": n_prompt + n_out},
        }

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
            tok = getattr(self.policy, "tokenizer", None)
            if tok is None:
                raise BadRequest("text prompts need a tokenizer; send token ids")
            texts = [prompt] if isinstance(prompt, str) else prompt
            return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            return [list(prompt)]
        if isinstance(prompt, list) and prompt and all(
            isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt
        ):
            return [list(p) for p in prompt]
        raise BadRequest("prompt must be token ids, a list of token-id lists, or text")

    def _choice(self, index: int, g: Generation, n_lp: int | None, as_ids: bool,
                skip: bool) -> dict[str, Any]:
        tok = getattr(self.policy, "tokenizer", None)
        text = tok.decode(g.token_ids, skip_special_tokens=skip) if tok is not None else ""
        stop = g.token_ids[-1] if g.finish_reason == "stop" and g.token_ids else None
        choice: dict[str, Any] = {
            "index": index, "text": text, "token_ids": g.token_ids,
            "finish_reason": g.finish_reason, "stop_reason": stop, "logprobs": None,
        }
        if n_lp is not None:
            names = [f"token_id:{t}" if as_ids or tok is None else tok.decode([t])
                     for t in g.token_ids]
            choice["logprobs"] = {
                "tokens": names,
                "token_logprobs": g.logprobs,
                "top_logprobs": [{n: lp} for n, lp in zip(names, g.logprobs, strict=True)]
                if n_lp > 0 else None,
                "text_offset": None,
            }
        return choice


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _params(body: dict[str, Any], cap: int) -> SamplingParams:
    """SamplingParams from a request body; BadRequest for anything we would not honour."""
    for key, ok in NEUTRAL.items():
        if key in body and body[key] not in ok:
            raise BadRequest(f"{key}={body[key]!r} is not supported (only {ok[0]!r}); "
                             "it would change the sampling distribution")
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1 (send one request per sample, each with its own seed)")
    if body.get("stream") or body.get("echo"):
        raise BadRequest("stream and echo are not supported")
    try:
        max_tokens = int(body.get("max_tokens") or 16)
        if max_tokens > cap:
            raise BadRequest(f"max_tokens={max_tokens} exceeds this server's cap {cap}")
        seed = body.get("seed")
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=_num(body, "temperature", 1.0),
            top_p=_num(body, "top_p", 1.0),
            stop_token_ids=tuple(int(t) for t in body.get("stop_token_ids") or ()),
            seed=None if seed is None else int(seed),
        )
    except BadRequest:
        raise
    except Exception as e:  # InputError from SamplingParams, TypeError/ValueError from casts
        raise BadRequest(f"bad sampling parameters: {e}") from None


def _num(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    return default if value is None else float(value)


def _seeded(params: SamplingParams, i: int) -> SamplingParams:
    """Prompt i of one request gets seed + i, as the client does for a batch."""
    from dataclasses import replace

    return params if params.seed is None or i == 0 else replace(params, seed=params.seed + i)


def _handler(server: PolicyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "rlcycle-serve"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: results only
            pass

        def _send(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if not isinstance(obj, bytes) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def _authorised(self) -> bool:
            key = server.config.api_key
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self._error(401, "missing or wrong API key", "authentication_error")
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/health":
                return self._send(200, b"ok")
            if not self._authorised():
                return None
            if self.path == "/v1/models":
                model = {"id": server.name, "object": "model", "owned_by": "rlcycle",
                         "max_model_len": getattr(server.policy, "max_length", None)}
                return self._send(200, {"object": "list", "data": [model]})
            return self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return None
            if self.path != "/v1/completions":
                return self._error(404, f"no route {self.path} (use /v1/completions)")
            size = int(self.headers.get("Content-Length") or 0)
            if size <= 0 or size > server.config.max_body_bytes:
                return self._error(413 if size > 0 else 400, f"body of {size} bytes refused")
            try:
                body = json.loads(self.rfile.read(size))
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                return self._send(200, server.complete(body))
            except (BadRequest, InputError, json.JSONDecodeError, UnicodeDecodeError) as e:
                return self._error(400, str(e))
            except Exception as e:  # the model failed: the client may retry
                return self._error(500, f"{type(e).__name__}: {e}", "server_error")

    return Handler
