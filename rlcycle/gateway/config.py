"""The gateway's options: one dataclass, resolved like every stage config.

In: defaults < `[gateway]` table of a TOML file < `--set key=value` < explicit flags of
`rlcycle gateway`. Out: a validated `GatewayConfig`; `validate()` lists every problem at once
(a non-loopback bind without an API key is one: see docs/gateway.md, "Threat model").
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcycle.config import cfg, check_range

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class GatewayConfig:
    """Options of `rlcycle gateway`."""

    alias: str = cfg("production", help="Registry alias served (an alias, checkpoint id or directory).")
    upstream: str | None = cfg(
        None,
        help="OpenAI-compatible completions server that returns token ids "
        "and logprobs (vLLM: `rlcycle serve`, SGLang, another gateway); none = in-process.",
    )
    upstream_api_key: str | None = cfg(None, help="Bearer token sent to the upstream.")
    upstream_probe_s: float = cfg(
        2.0,
        help="With an upstream: GET its /v1/models this often while it is up (a dead upstream or an unloaded "
        "adapter is noticed without traffic); while it is down, probes back off from 0.25 s to this.",
    )
    upstream_probe_timeout_s: float = cfg(
        10.0, help="Seconds a probe of the upstream may take before it counts as down."
    )
    registry: str | None = cfg(None, help="Registry directory (`rlcycle gateway`'s default: $RLCYCLE_HOME/registry).")
    host: str = cfg("127.0.0.1", help="Interface to bind (loopback by default).")
    port: int = cfg(8100, help="TCP port (0 picks a free one).")
    log_dir: str = cfg("", help="Directory the completion events are appended to (required).")
    api_key: str | None = cfg(None, help="Require `Authorization: Bearer KEY` (required off loopback).")
    session_keys: dict[str, str] = cfg(
        {},
        help="Per-session or per-user bearer keys: key = session name. Each is accepted like "
        "api_key and names the session of its requests (docs/gateway.md, Sessions).",
    )
    session_from_key: bool = cfg(
        False, help="Any bearer key other than api_key names the session (key-<sha256 prefix>)."
    )
    logging: bool = cfg(True, help="Write events (false only for benchmarks: nothing is logged).")
    flush_interval_s: float = cfg(
        0.5, help="Events are written and fsync'd at least this often: a kill -9 loses at most this much."
    )
    rotate_bytes: int = cfg(64 << 20, help="Start a new log file after this many bytes.")
    rotate_s: float = cfg(3600.0, help="Start a new log file after this many seconds.")
    log_buckets: int = cfg(
        0,
        help="0: one flat log; N (a power of two): LOG_DIR/<day>/bucket=<k>-of-<N>/, split by session as collect "
        "partitions, so collect skips its repartition pass (docs/gateway.md).",
    )
    redact: bool = cfg(True, help="Redact secrets in logged text with collect's patterns before disk.")
    redact_inputs: bool = cfg(
        False,
        help="Also redact secrets in request messages before the model sees "
        "them, so prompt token ids hold none (the model reads the marks).",
    )
    secret_patterns: dict[str, str] = cfg({}, help="Extra secret patterns to redact: name = regex.")
    canary_fraction: float | None = cfg(
        None,
        help="Share of sessions sent to `candidate` (default: the registry's canary fraction for this alias, else 0).",
    )
    watch_interval_s: float = cfg(
        2.0, help="Poll the registry this often for alias moves (0 = only POST /v1/rlcycle/reload)."
    )
    allow_truncated_sampling: bool = cfg(
        False, help="Accept top_p < 1 (refused by default: train scores the full vocabulary, see docs/gateway.md)."
    )
    max_body_bytes: int = cfg(4 << 20, help="Largest request body accepted.")
    max_tokens_cap: int = cfg(4096, help="Largest max_tokens accepted.")
    default_max_tokens: int = cfg(512, help="max_tokens when the request gives none.")
    max_prompt_tokens: int = cfg(32768, help="Largest rendered prompt accepted (tokens).")
    max_batch_size: int = cfg(16, help="In-process: prompts generated together.")
    batch_wait_ms: float = cfg(5.0, help="In-process: how long the batcher waits for more requests.")
    device: str = cfg("auto", help="In-process: cpu, cuda, cuda:N or auto.")
    dtype: str = cfg("auto", help="In-process: float32, bfloat16, float16 or auto.")
    num_threads: int | None = cfg(None, help="In-process: CPU threads torch uses while generating.")
    prompt_cache_tokens: int = cfg(
        64 << 20,
        help="Token ids of recent contexts kept to log each prompt as what it adds to the session's previous "
        "call (docs/design.md, 'Prompts stored once'); 0: every prompt logged whole.",
    )
    idempotency_entries: int = cfg(10_000, help="Request ids remembered for idempotent retries.")
    idempotency_ttl_s: float = cfg(900.0, help="How long a request id is remembered.")

    def validate(self) -> list[str]:
        problems: list[str] = []
        if not self.log_dir and self.logging:
            problems.append("log_dir is required (--log-dir DIR)")
        if self.host not in LOOPBACK and not self.api_key and not self.session_keys:
            problems.append(
                f"host={self.host!r} is not loopback: an api_key is required (--api-key or $RLCYCLE_GATEWAY_API_KEY)"
            )
        if self.upstream is not None and not self.upstream.startswith(("http://", "https://")):
            problems.append(f"upstream={self.upstream!r}: expected an http(s):// URL")
        check_range(problems, self, "port", ge=0, le=65535)
        check_range(problems, self, "flush_interval_s", gt=0, le=60)
        check_range(problems, self, "rotate_bytes", ge=1 << 10)
        check_range(problems, self, "rotate_s", gt=0)
        if self.log_buckets < 0 or self.log_buckets & (self.log_buckets - 1):
            problems.append(f"log_buckets={self.log_buckets}: 0 (one flat log) or a power of two")
        check_range(problems, self, "canary_fraction", ge=0, le=1, optional=True)
        check_range(problems, self, "watch_interval_s", ge=0)
        check_range(problems, self, ("upstream_probe_s", "upstream_probe_timeout_s"), gt=0)
        check_range(
            problems,
            self,
            (
                "max_body_bytes",
                "max_tokens_cap",
                "default_max_tokens",
                "max_prompt_tokens",
                "max_batch_size",
                "idempotency_entries",
            ),
            ge=1,
        )
        check_range(problems, self, ("batch_wait_ms", "prompt_cache_tokens"), ge=0)
        check_range(problems, self, "idempotency_ttl_s", gt=0)
        if self.default_max_tokens > self.max_tokens_cap:
            problems.append(
                f"default_max_tokens={self.default_max_tokens} exceeds max_tokens_cap={self.max_tokens_cap}"
            )
        return problems
