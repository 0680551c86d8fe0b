"""`rlcycle serve`: a small OpenAI-compatible completions server over the in-process backend.

What goes in: an `HFPolicy` (a model directory) and a `ServeConfig`. What comes out: an HTTP
server, on 127.0.0.1 unless told otherwise, that speaks the subset of the OpenAI/vLLM
completions API that `http.HTTPPolicy` sends, so (a) and (b) return the same ids and logprobs.

Endpoints:
    GET  /health                  200 "ok"
    GET  /v1/models               {"object": "list", "data": [{"id": NAME, ...}, adapters...]}
    POST /v1/completions          OpenAI completions with vLLM's token-id extensions
    POST /v1/load_lora_adapter    {"lora_name", "lora_path"}   (with `enable_lora` only)
    POST /v1/unload_lora_adapter  {"lora_name"}                (with `enable_lora` only)

Request fields read: `prompt` (token ids, a list of them, a string or list of strings),
`max_tokens` (16), `temperature` (1.0), `top_p` (1.0), `seed`, `stop_token_ids`, `logprobs`,
`return_tokens_as_token_ids`, `skip_special_tokens` (true), `n` (must be 1), `stream` (must be
false), `echo` (false), `model` (the served name, an adapter's `lora_name`, or absent for the
base; any other name is 404 as in vLLM). Fields that would change the sampling distribution are refused
with 400 unless neutral (`top_k` -1/0, `min_p` 0, `repetition_penalty` 1, `presence_penalty`
and `frequency_penalty` 0, `stop` empty, `best_of` 1): silently ignoring them would make the
returned logprobs lie. Unknown fields are ignored, as vLLM does.

Each choice carries `token_ids` (always; vLLM only with `return_token_ids`), `text`,
`finish_reason`, `stop_reason` (the stop token id) and, when `logprobs` is set,
`logprobs.tokens` ("token_id:N" with `return_tokens_as_token_ids`, else the token text),
`logprobs.token_logprobs` and `logprobs.top_logprobs` (the sampled token; with `logprobs: k`,
1 < k <= 20, also the k most likely tokens at each generated position under
log_softmax(logits / T), as vLLM's processed logprobs; top_p is not applied to them). With `echo`
the prompt comes first, as in OpenAI/vLLM: `text` = prompt text + completion text, and with
`logprobs` the lists start with the prompt tokens, whose logprobs are log_softmax(logits)[token]
of the served model at T = 1 (None for the first token); `max_tokens` 0 then scores the prompt
only. `prompt_token_ids` is added with `echo`.

LoRA (vLLM's runtime adapter API; `enable_lora`, like vLLM's `--enable-lora` with
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): `load_lora_adapter` loads a peft adapter directory
(`adapter_config.json` + `adapter_model.safetensors`, e.g. `rlcycle train --set lora.r=16`'s
OUT/adapter) onto the served model; `model=<lora_name>` is then served by base + that adapter,
`/v1/models` lists it with `parent` = the base, `unload_lora_adapter` drops it. Errors as vLLM:
a missing name or path, or a name already loaded: 400 `InvalidUserInput`; no adapter at the path:
404 `NotFoundError`; an adapter that does not fit the model: 400 `BadRequestError`; unloading a
name that is not loaded: 404 `NotFoundError`. Success is 200 with a plain-text line. See
`_Adapters` for how adapters share the weights and why each has its own prefix cache.

Requests from many connections are batched by the shared `batching.Batcher` (the gateway's
too): a worker takes what is queued (up to `max_batch_size`, waiting at most `batch_wait_ms`
for more) and runs one `generate` over all of them with one SamplingParams per prompt, so
results do not depend on what else was queued (see hf.py for what that guarantees). A batch is
split by model (base, or one adapter; the batcher's `key`): each group runs as one `generate`
with its adapter active, and an error fails only its own group.

Threat model: no TLS and, by default, no authentication; it binds to loopback. Anyone who can
reach the port can use the model. `api_key` requires `Authorization: Bearer KEY` (compared in
constant time). Request bodies are capped at `max_body_bytes` and `max_tokens` at
`max_new_tokens_cap`. With `enable_lora`, a client can make the server read any adapter
directory the server process can read (only safetensors weights are accepted, never pickles);
leave it off unless the clients are trusted (deploy hooks).
"""

from __future__ import annotations

import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rlcycle.config import cfg
from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy.base import FINISH_LENGTH, Generation, SamplingParams
from rlcycle.policy.batching import Batcher

MAX_LOGPROBS = 20  # top logprobs per token at most (vLLM's default --max-logprobs)
NEUTRAL = {
    "top_k": (-1, 0, None),
    "min_p": (0, 0.0, None),
    "repetition_penalty": (1, 1.0, None),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "best_of": (1, None),
    "stop": (None, [], ""),
}


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
    enable_lora: bool = cfg(
        False,
        help="Serve vLLM's runtime LoRA API (/v1/load_lora_adapter, /v1/unload_lora_adapter; needs peft).",
    )
    root: str | None = cfg(
        None,
        help="Model directory listed as the base's `root` in /v1/models, as vLLM lists its --model "
        "(clients name the served checkpoint by it; rlcycle/policy/served.py).",
    )


class BadRequest(Exception):
    """A request the server refuses with 400 and this message."""


class ApiError(Exception):
    """A request refused with this status and vLLM's error type (e.g. 404 NotFoundError)."""

    def __init__(self, status: int, message: str, kind: str):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass
class _Job:
    prompt: list[int]
    params: SamplingParams | None  # None: score the prompt only (echo with max_tokens 0)
    model: str | None = None  # an adapter's name, None for the base
    echo: bool = False  # also score the prompt (prompt logprobs)
    top: int = 0  # `logprobs: k` > 1: the k most likely tokens at each generated position


@dataclass
class _Result:
    generation: Generation
    prompt_logprobs: list[float] | None  # logprobs of prompt[1:], with echo
    top: list[list[tuple[int, float]]] | None = None  # (id, logprob) most likely first, per generated token


class PolicyServer:
    """The HTTP server and its batching worker. Use `start()` (background) or `serve_forever()`."""

    def __init__(self, policy: Any, config: ServeConfig | None = None):
        self.policy = policy
        self.config = config or ServeConfig()
        self.name = self.config.name or getattr(policy, "name", "rlcycle-policy")
        self.adapters = _Adapters(policy)
        try:
            self._httpd = ThreadingHTTPServer((self.config.host, self.config.port), _handler(self))
        except OSError as e:
            raise RlcycleError(
                f"cannot listen on {self.config.host}:{self.config.port}: {e}",
                hint="choose another --port (0 picks a free one)",
            ) from None
        self._httpd.daemon_threads = True
        # One generate per model: an adapter is active for the whole call, so requests for
        # different adapters (or the base) never share a forward pass.
        self._batcher: Batcher[_Job, _Result] = Batcher(
            self._run_group,
            self.config.max_batch_size,
            self.config.batch_wait_ms,
            name="rlcycle-batcher",
            key=lambda job: job.model,
        )
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
        self._batcher.close()  # runs what is still queued, then stops the worker (idempotent)

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- batching ---------------------------------------------------------------------
    def submit(
        self,
        prompt: list[int],
        params: SamplingParams | None,
        model: str | None = None,
        echo: bool = False,
        top: int = 0,
    ) -> Future:
        """Queue one prompt; the Future resolves to its _Result (generation, prompt logprobs)."""
        return self._batcher.submit(_Job(prompt, params, model, echo, top))

    def _run_group(self, jobs: list[_Job]) -> list[_Result]:
        """Generate (and score prompts, for echo) for jobs of one model, its adapter active."""
        with self.adapters.use(jobs[0].model) as policy:
            todo = [j for j in jobs if j.params is not None]
            gens = policy.generate([j.prompt for j in todo], [j.params for j in todo]) if todo else []
            done = iter(gens)
            out = []
            for j in jobs:
                gen = next(done) if j.params is not None else Generation([], [], FINISH_LENGTH, 0.0)
                lps = top = None
                if j.echo:  # logprobs of prompt[1:] given what precedes each (T = 1)
                    lps = policy.score(j.prompt[:1], j.prompt[1:]) if len(j.prompt) > 1 else []
                if j.top > 1 and j.params is not None and hasattr(policy, "top_logprobs"):
                    top = policy.top_logprobs(j.prompt, gen.token_ids, j.params.temperature, j.top)
                out.append(_Result(gen, lps, top))
            return out

    # --- the completions endpoint -------------------------------------------------------
    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one /v1/completions request body (raises BadRequest, ApiError)."""
        model = self._model(body.get("model"))
        prompts = self._prompts(body.get("prompt"))
        echo = bool(body.get("echo"))
        params = _params(body, self.config.max_new_tokens_cap)
        n_lp = body.get("logprobs")
        if n_lp is not None and (not isinstance(n_lp, int) or isinstance(n_lp, bool) or n_lp < 0):
            raise BadRequest("logprobs must be a non-negative integer")
        if n_lp is not None and n_lp > MAX_LOGPROBS:
            raise BadRequest(
                f"logprobs {n_lp} > {MAX_LOGPROBS}: at most {MAX_LOGPROBS} top logprobs per token (vLLM's default)"
            )
        futures = [
            self.submit(p, _seeded(params, i) if params else None, model, echo, n_lp or 0)
            for i, p in enumerate(prompts)
        ]
        results = [f.result() for f in futures]
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        skip = body.get("skip_special_tokens", True) is not False
        choices = [
            self._choice(i, r, p if echo else None, n_lp, as_ids, skip)
            for i, (r, p) in enumerate(zip(results, prompts, strict=True))
        ]
        n_prompt = sum(len(p) for p in prompts)
        n_out = sum(len(r.generation.token_ids) for r in results)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model or self.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_out,
                "total_tokens": n_prompt + n_out,
            },
        }

    def _model(self, name: Any) -> str | None:
        """The adapter a request names (None: the base); 404 for a name nobody serves."""
        if name is None or name == "" or name == self.name:
            return None
        if isinstance(name, str) and self.adapters.has(name):
            return name
        raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError")

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
            tok = getattr(self.policy, "tokenizer", None)
            if tok is None:
                raise BadRequest("text prompts need a tokenizer; send token ids")
            texts = [prompt] if isinstance(prompt, str) else prompt
            return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            return [list(prompt)]
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt)
        ):
            return [list(p) for p in prompt]
        raise BadRequest("prompt must be token ids, a list of token-id lists, or text")

    def _choice(
        self,
        index: int,
        r: _Result,
        prompt: list[int] | None,
        n_lp: int | None,
        as_ids: bool,
        skip: bool,
    ) -> dict[str, Any]:
        """One choice; with `prompt` (echo) the prompt's tokens and logprobs come first."""
        g = r.generation
        tok = getattr(self.policy, "tokenizer", None)
        text = tok.decode(g.token_ids, skip_special_tokens=skip) if tok is not None else ""
        if prompt is not None and tok is not None:
            text = tok.decode(prompt, skip_special_tokens=skip) + text
        stop = g.token_ids[-1] if g.finish_reason == "stop" and g.token_ids else None
        choice: dict[str, Any] = {
            "index": index,
            "text": text,
            "token_ids": g.token_ids,
            "finish_reason": g.finish_reason,
            "stop_reason": stop,
            "logprobs": None,
        }
        if prompt is not None:
            choice["prompt_token_ids"] = prompt
        if n_lp is not None:
            ids = (prompt or []) + g.token_ids
            lps: list[float | None] = ([None] + list(r.prompt_logprobs or []) if prompt else []) + g.logprobs
            names = [f"token_id:{t}" if as_ids or tok is None else tok.decode([t]) for t in ids]
            tops: list[dict[str, float] | None] = [
                None if lp is None else {n: lp} for n, lp in zip(names, lps, strict=True)
            ]
            if r.top is not None:  # logprobs: k > 1, as vLLM: the sampled token and the k most likely
                name = (lambda t: f"token_id:{t}") if as_ids or tok is None else (lambda t: tok.decode([t]))
                first = len(ids) - len(g.token_ids)
                for i, pairs in enumerate(r.top):
                    tops[first + i] = (tops[first + i] or {}) | {name(t): lp for t, lp in pairs}
            choice["logprobs"] = {
                "tokens": names,
                "token_logprobs": lps,
                "top_logprobs": tops if n_lp > 0 else None,
                "text_offset": None,
            }
        return choice


# --- LoRA adapters ----------------------------------------------------------------------


class _Adapters:
    """LoRA adapters hot-loaded onto the served model, through peft (vLLM's runtime LoRA API).

    The first load wraps the served transformers model in a `PeftModel` *in place* (peft injects
    LoRA layers into its linear modules; the base weights are shared, not copied); later loads
    add named adapters to it. A request for an adapter runs with `set_adapter(name)`, a request
    for the base inside `disable_adapter()`, which bypasses every LoRA layer, so the base's
    outputs are bitwise what they were before any load. Each adapter gets its own `HFPolicy`
    over the same model object, hence its own prefix cache: keys/values computed under one
    adapter are never reused under another (or under the base). Selecting an adapter and the
    generate that follows run under one lock, which load and unload take too.
    """

    def __init__(self, policy: Any):
        self.base = policy
        self.lock = threading.RLock()
        self._peft: Any = None  # the PeftModel, after the first load
        self._views: dict[str, tuple[Any, str]] = {}  # name -> (HFPolicy over base+adapter, path)

    # Lookups read a snapshot without the lock, which a running generate holds: listing the
    # models or naming one must not wait for a batch. `use` checks again under the lock.
    def has(self, name: str) -> bool:
        return name in dict(self._views)

    def cards(self, parent: str) -> list[dict[str, Any]]:
        """/v1/models entries of the loaded adapters, as vLLM lists them."""
        return [
            {"id": n, "object": "model", "owned_by": "rlcycle", "root": path, "parent": parent}
            for n, (_, path) in dict(self._views).items()
        ]

    @contextmanager
    def use(self, name: str | None) -> Iterator[Any]:
        """The policy to generate with, with `name`'s adapter active (None: the base)."""
        with self.lock:
            if name is None:
                if self._peft is None:
                    yield self.base
                else:
                    with self._peft.disable_adapter():
                        yield self.base
                return
            if name not in self._views:  # unloaded while the request was queued
                raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError")
            self._peft.set_adapter(name)
            yield self._views[name][0]

    def load(self, name: Any, path: Any) -> str:
        """Load the adapter at `path` as `name`; raises ApiError with vLLM's status and type."""
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        model = getattr(self.base, "model", None)
        if model is None or not hasattr(self.base, "config"):
            raise ApiError(
                400,
                f"this server's policy ({type(self.base).__name__}) cannot take LoRA adapters; serve a model directory",
                "BadRequestError",
            )
        adapter = Path(path)
        if not (adapter / "adapter_config.json").is_file():
            raise ApiError(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        if not (adapter / "adapter_model.safetensors").is_file():
            raise ApiError(
                400,
                f"Loading lora {name} failed: {path} has no adapter_model.safetensors (pickled weights are refused)",
                "BadRequestError",
            )
        with self.lock:
            if name in self._views:
                raise ApiError(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
            try:
                self._attach(model, name, str(adapter))
            except ImportError:
                raise ApiError(400, "LoRA adapters need peft: pip install 'rlcycle[lora]'", "BadRequestError") from None
            except Exception as e:  # wrong shapes, target modules the model lacks, bad JSON
                self._forget(name)
                raise ApiError(400, f"Loading lora {name} failed: {type(e).__name__}: {e}", "BadRequestError") from None
            view = type(self.base)(model, self.base.tokenizer, self.base.config, name=name)
            self._views[name] = (view, str(adapter))
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: Any) -> str:
        if not name or not isinstance(name, str):
            raise ApiError(
                400,
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                "InvalidUserInput",
            )
        with self.lock:
            if name not in self._views:
                raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            del self._views[name]
            self._forget(name)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def _attach(self, model: Any, name: str, path: str) -> None:
        from peft import PeftModel

        if self._peft is None:
            self._peft = PeftModel.from_pretrained(model, path, adapter_name=name, is_trainable=False)
        else:
            self._peft.load_adapter(path, adapter_name=name, is_trainable=False)
        self._peft.eval()

    def _forget(self, name: str) -> None:
        """Remove `name`'s LoRA weights from the model, if any were attached."""
        if self._peft is not None and name in self._peft.peft_config:
            self._peft.delete_adapter(name)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _params(body: dict[str, Any], cap: int) -> SamplingParams | None:
    """SamplingParams from a request body (None: echo with max_tokens 0, score only);
    BadRequest for anything we would not honour."""
    for key, ok in NEUTRAL.items():
        if key in body and body[key] not in ok:
            raise BadRequest(
                f"{key}={body[key]!r} is not supported (only {ok[0]!r}); it would change the sampling distribution"
            )
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1 (send one request per sample, each with its own seed)")
    if body.get("stream"):
        raise BadRequest("stream is not supported")
    if body.get("echo") and body.get("max_tokens") == 0:
        return None
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
            self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

        def _authorised(self) -> bool:
            key = server.config.api_key
            given = self.headers.get("Authorization") or ""
            if key and not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                self._error(401, "missing or wrong API key", "authentication_error")
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/health":
                return self._send(200, b"ok")
            if not self._authorised():
                return None
            if self.path == "/v1/models":
                model = {
                    "id": server.name,
                    "object": "model",
                    "owned_by": "rlcycle",
                    "max_model_len": getattr(server.policy, "max_length", None),
                }
                if server.config.root:
                    model["root"] = server.config.root
                return self._send(200, {"object": "list", "data": [model, *server.adapters.cards(server.name)]})
            return self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return None
            routes = {"/v1/completions": server.complete}
            if server.config.enable_lora:
                routes["/v1/load_lora_adapter"] = lambda b: server.adapters.load(b.get("lora_name"), b.get("lora_path"))
                routes["/v1/unload_lora_adapter"] = lambda b: server.adapters.unload(b.get("lora_name"))
            route = routes.get(self.path)
            if route is None:
                off = " (runtime LoRA updates are off: start with --enable-lora)" if "lora_adapter" in self.path else ""
                return self._error(404, f"no route {self.path} (use /v1/completions){off}")
            size = int(self.headers.get("Content-Length") or 0)
            if size <= 0 or size > server.config.max_body_bytes:
                return self._error(413 if size > 0 else 400, f"body of {size} bytes refused")
            try:
                body = json.loads(self.rfile.read(size))
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                answer = route(body)
                return self._send(200, answer.encode() if isinstance(answer, str) else answer)
            except ApiError as e:
                return self._error(e.status, str(e), e.kind)
            except (BadRequest, InputError, json.JSONDecodeError, UnicodeDecodeError) as e:
                return self._error(400, str(e))
            except Exception as e:  # the model failed: the client may retry
                return self._error(500, f"{type(e).__name__}: {e}", "server_error")

    return Handler
