"""Shared fixtures: a temp RLCYCLE_HOME per test, the CLI runner, and the Docker engine.

Docker tests must *run* in CI: when CI is set and no engine answers, they fail; elsewhere they
skip with the reason printed (DEVELOPERS.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data"


@pytest.fixture(autouse=True)
def rlcycle_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("rlcycle_home")
    monkeypatch.setenv("RLCYCLE_HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    return home


@pytest.fixture
def cli():
    """Run the real CLI in-process: cli(["collect", ...], input=b"...") -> Result."""
    from typer.testing import CliRunner

    from rlcycle.cli import app

    runner = CliRunner()

    def invoke(args, input=None):
        from rlcycle.errors import RlcycleError

        result = runner.invoke(app, [str(a) for a in args], input=input, catch_exceptions=True)
        # Map RlcycleError the way rlcycle.cli.main does, so tests see the real exit codes.
        result.error = ""
        if isinstance(result.exception, RlcycleError):
            e = result.exception
            result.exit_code = e.exit_code
            result.error = f"Error: {e.message}" + (f"\nHint: {e.hint}" if e.hint else "")
        return result

    return invoke


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
