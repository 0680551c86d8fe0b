"""Sandboxes against the real Docker engine: abuse attempts contained, nothing leaked.

One module-scoped pool serves most tests (starting containers is the slow part). Each abuse
test asserts the status the result must carry *and* that the host and the pool are fine
afterwards. At the end of the session no container or volume made by this process remains.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from rlcycle.errors import InputError
from rlcycle.sandbox import (
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPool,
    Status,
    cleanup,
    ensure_image,
)
from rlcycle.sandbox.images import image_tag

pytestmark = pytest.mark.docker

# Small limits keep the abuse cases fast; the behaviour is the same at the defaults.
CFG = SandboxConfig(memory_mb=256, workspace_mb=32, tmp_mb=16, pids_limit=128, timeout_s=20)
MY_PID = f":{os.getpid()}"


def mine(client) -> list:
    """rlcycle containers and volumes created by this test process."""
    return [x for x in cleanup.list_leftovers(client) if x.owner.endswith(MY_PID)]


@pytest.fixture(scope="session", autouse=True)
def no_leaks_at_the_end():
    """After the whole session, nothing this process created may remain on the engine."""
    yield
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception:  # no engine: the Docker tests were skipped, nothing to check
        return
    deadline = time.monotonic() + 60  # auto-removed containers vanish asynchronously
    while mine(client) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = mine(client)
    client.close()
    assert not left, f"leaked sandbox resources: {[x.name for x in left]}"


@pytest.fixture(scope="module")
def image(docker_client):
    return ensure_image(docker_client, CFG)  # offline (debootstrap) when no registry answers


@pytest.fixture(scope="module")
def pool(docker_client, image):
    with SandboxPool(size=2, images=[image], config=CFG, clients=[docker_client]) as p:
        yield p


def host_is_fine(pool: SandboxPool) -> None:
    """The host can still fork, and the pool still hands out a working, clean sandbox."""
    assert subprocess.run(["true"]).returncode == 0
    with pool.acquire(timeout=30) as sb:
        assert sb.exec(["ls", "-A", "/workspace"]).stdout == ""
        # Only init and the executor besides ps itself: nothing was left running.
        procs = sb.exec(["ps", "-eo", "comm", "--no-headers"]).stdout.split()
        assert procs == ["docker-init", "python3", "ps"], procs


# --- image ------------------------------------------------------------------------------


def test_image_is_content_tagged_and_not_rebuilt(docker_client, image, cli):
    assert image == image_tag(CFG) and image.startswith("rlcycle-sandbox:")
    before = docker_client.images.get(image).id
    r = cli(["sandbox", "build", "--json"])
    assert r.exit_code == 0, r.output
    built = json.loads(r.stdout)["images"][0]
    assert built == {**built, "image": image, "built": False}
    assert docker_client.images.get(image).id == before


def test_image_holds_the_agent_tools(pool):
    with pool.acquire() as sb:
        r = sb.exec(
            "python3 --version && git --version && rg --version && pytest --version && grep --version", timeout=30
        )
    assert r.ok, r


# --- the API ----------------------------------------------------------------------------


def test_files_exec_and_reset_between_users(pool):
    with pool.acquire() as sb:
        sb.write_files({"pkg/test_a.py": "def test_a():\n    assert 2 + 2 == 4\n", "data.bin": b"\x00\xff"})
        r = sb.exec("pytest -q pkg", timeout=60)
        assert r.ok and "1 passed" in r.stdout, r
        r = sb.exec(["sh", "-c", "pwd; echo $FOO"], cwd="pkg", env={"FOO": "bar"})
        assert r.stdout == "/workspace/pkg\nbar\n"
        assert sb.read_files(["data.bin", "nope"]) == {"data.bin": b"\x00\xff", "nope": None}
        assert sb.exec("exit 3").status is Status.NONZERO
        sb.exec("echo x > /tmp/scratch")
    for _ in range(2):  # both pool members: every one handed out is empty
        with pool.acquire() as sb:
            assert sb.exec("ls -A /workspace /tmp").stdout.split() == ["/tmp:", "/workspace:"]


def test_runs_as_non_root_without_capabilities(pool):
    with pool.acquire() as sb:
        r = sb.exec("id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status")
    lines = r.stdout.split("\n")
    assert lines[0] == "1000"
    assert "CapEff:\t0000000000000000" in lines and "CapBnd:\t0000000000000000" in lines
    assert "NoNewPrivs:\t1" in lines


def test_concurrent_tool_calls_share_the_pool(pool):
    from concurrent.futures import ThreadPoolExecutor

    def call(i):
        with pool.acquire(timeout=60) as sb:
            return sb.exec(f"echo {i}").stdout

    with ThreadPoolExecutor(16) as ex:
        assert list(ex.map(call, range(32))) == [f"{i}\n" for i in range(32)]


# --- abuse: each contained with the right status, the host unaffected ---------------------


def test_fork_bomb_is_contained(pool):
    with pool.acquire() as sb:
        r = sb.exec(":(){ :|:& };: ; sleep 3", timeout=6)
        assert r.status in (Status.OK, Status.NONZERO, Status.TIMEOUT), r
        assert (
            sb.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max").stdout.strip()
            == "128"
        )
    host_is_fine(pool)


def test_infinite_loop_is_killed_at_its_timeout(pool):
    with pool.acquire() as sb:
        r = sb.exec("trap '' TERM; while :; do :; done", timeout=1)
    assert r.status is Status.TIMEOUT and r.signal == 9
    # The loop never ends by itself: the status says the 1 s timeout killed it (the host deadline
    # would say INFRA); the bound only says it did not run on, loose enough for a busy machine.
    assert 1 <= r.duration_s < 30
    host_is_fine(pool)


def test_memory_beyond_the_limit_is_oom(pool):
    with pool.acquire() as sb:
        r = sb.exec("python3 -c 'x = bytearray(600 << 20); print(len(x))'", timeout=30)
        assert r.status is Status.OOM, r
        assert sb.exec("echo alive").stdout == "alive\n"  # the executor survived
    host_is_fine(pool)


def test_a_gigabyte_of_output_is_capped_and_flagged(pool):
    with pool.acquire() as sb:
        r = sb.exec("head -c 1000000000 /dev/zero | tr '\\0' x", timeout=60)
    assert r.ok and r.truncated, r.status
    assert r.stdout_bytes == 1_000_000_000
    assert len(r.stdout) < CFG.max_output_bytes + 200
    assert r.stdout.startswith("xxx") and r.stdout.endswith("xxx") and "bytes truncated" in r.stdout
    host_is_fine(pool)


def test_network_is_unreachable(pool):
    probe = textwrap.dedent("""
        import os, socket
        print(sorted(os.listdir('/sys/class/net')))
        try:
            socket.create_connection(('1.1.1.1', 53), timeout=3)
        except OSError as e:
            raise SystemExit(f'blocked: {e}')
    """)
    with pool.acquire() as sb:
        sb.write_files({"probe.py": probe})
        r = sb.exec("python3 probe.py", timeout=10)
    assert r.status is Status.NONZERO and "blocked" in r.stderr, r
    assert r.stdout.strip() == "['lo']"
    host_is_fine(pool)


def test_writing_outside_the_workspace_fails(pool):
    with pool.acquire() as sb:
        for target in ("/etc/evil", "/usr/bin/evil", "/opt/rlcycle/executor.py", "/root/evil"):
            r = sb.exec(f"echo x > {target}")
            assert r.status is Status.NONZERO and ("Read-only" in r.stderr or "denied" in r.stderr), (target, r)
        with pytest.raises(InputError):
            sb.write_files({"../escape": "x"})
        sb.exec("ln -s /etc link")
        with pytest.raises(SandboxError, match="escapes"):
            sb.write_files({"link/evil": "x"})
    host_is_fine(pool)


def test_filling_the_workspace_stops_at_its_size(pool):
    with pool.acquire() as sb:
        r = sb.exec(f"dd if=/dev/zero of=big bs=1M count={CFG.workspace_mb * 2}", timeout=30)
        assert r.status is Status.NONZERO and "No space left" in r.stderr, r
        with pytest.raises(SandboxError, match="No space"):
            sb.write_files({"more.bin": b"\0" * (1 << 20)})
        assert sb.exec("echo alive").ok  # the executor needs no workspace space to answer
    host_is_fine(pool)  # and the reset freed it


def test_killing_the_executor_is_an_infrastructure_error_and_the_pool_heals(pool):
    with pool.acquire() as sb:
        r = sb.exec("kill -9 $PPID; sleep 5", timeout=10)
        assert r.status is Status.INFRA and r.infra_error and sb.broken
    deadline = time.monotonic() + 60
    while pool.stats()["idle"][pool.images[0]] < pool.size and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool.stats()["total"] == pool.size
    host_is_fine(pool)


def test_a_stopped_executor_hits_the_host_deadline(docker_client, image):
    cfg = SandboxConfig(**{**CFG.__dict__, "host_grace_s": 1.0})
    with Sandbox.start(docker_client, image, cfg) as sb:
        start = time.monotonic()
        r = sb.exec("kill -STOP $PPID", timeout=1)
        assert r.status is Status.INFRA and "did not answer" in r.error
        assert time.monotonic() - start < 60  # a stopped executor never answers: the deadline fired


def test_background_processes_do_not_outlive_their_command(pool):
    with pool.acquire() as sb:
        r = sb.exec("setsid sleep 300 & nohup sleep 301 >/dev/null 2>&1 & (sleep 302 &) ; echo started")
        assert r.ok and r.stdout == "started\n" and r.duration_s < 60  # not the sleeps' 300 s
        left = sb.exec("ps -eo comm --no-headers").stdout.split()
    assert "sleep" not in left, left
    host_is_fine(pool)


# --- config: runtime, several engines ----------------------------------------------------


def test_another_runtime_by_config_fails_clearly_when_absent(docker_client, image):
    cfg = SandboxConfig(**{**CFG.__dict__, "runtime": "no-such-runtime"})
    with pytest.raises(SandboxError, match="no-such-runtime"):
        Sandbox.start(docker_client, image, cfg)


def test_pool_spreads_over_several_engines(image):
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    cfg = SandboxConfig(**{**CFG.__dict__, "hosts": [host, host]})  # the local engine, twice
    with SandboxPool(size=2, images=[image], config=cfg) as p:
        assert len(p.clients) == 2
        used = {id(sb.client) for sb in list(p._all)}
        assert used == {id(c) for c in p.clients}
        with p.acquire() as sb:
            assert sb.exec("echo ok").stdout == "ok\n"


# --- cleanup on every way out -------------------------------------------------------------

CHILD = """
import sys, time
from rlcycle.sandbox import SandboxConfig, SandboxPool
cfg = SandboxConfig(ttl_s=0.001, workspace_mb=8)  # expired at once: gc may take it
pool = SandboxPool(size=1, config=cfg, run=sys.argv[1])
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_cleanup_on_signals_and_gc_after_a_crash(docker_client, image, cli, sig):
    run = f"t{uuid.uuid4().hex[:10]}"
    child = subprocess.Popen([sys.executable, "-c", CHILD, run], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    assert len(cleanup.list_leftovers(docker_client, run)) == 2  # container + volume
    child.send_signal(sig)
    child.wait(timeout=60)
    if sig == signal.SIGKILL:
        # The container goes by itself (stdin EOF, auto-remove); the volume waits for gc.
        _wait_until(lambda: [x.kind for x in cleanup.list_leftovers(docker_client, run)] == ["volume"])
        r = cli(["sandbox", "gc", "--json"])
        assert r.exit_code == 0, r.output
        assert run in {x["run"] for x in json.loads(r.stdout)["removed"]}
    _wait_until(lambda: cleanup.list_leftovers(docker_client, run) == [])


def test_gc_removes_only_expired_leftovers_and_ls_lists_them(docker_client, image, cli):
    ghost = {cleanup.LABEL_OWNER: "ghost@elsewhere:1", cleanup.LABEL_RUN: "crashed-run"}
    old = {**ghost, cleanup.LABEL_EXPIRES: str(int(time.time()) - 10)}
    fresh = {**ghost, cleanup.LABEL_EXPIRES: str(int(time.time()) + 3600)}
    names = [f"rlcycle-gctest-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    docker_client.api.create_volume(name=names[0], labels=old)
    docker_client.api.create_container(image, name=names[1], labels=old, command="true")
    docker_client.api.create_volume(name=names[2], labels=fresh)
    try:
        listed = {x["name"] for x in json.loads(cli(["sandbox", "ls", "--json"]).stdout)["items"]}
        assert set(names) <= listed
        r = cli(["sandbox", "gc", "--json"])
        removed = {x["name"] for x in json.loads(r.stdout)["removed"]}
        assert set(names[:2]) <= removed and names[2] not in removed
        dry = cli(["sandbox", "gc", "--all", "--dry-run", "--json"])
        assert names[2] in {x["name"] for x in json.loads(dry.stdout)["removed"]}
    finally:
        for kind, name in zip(("volume", "container", "volume"), names, strict=True):
            cleanup.remove(docker_client, kind, name)


# --- the CLI ------------------------------------------------------------------------------


def test_cli_exec_prints_output_and_exits_with_the_status(docker_client, image, cli):
    r = cli(["sandbox", "exec", "--", "python3", "-c", "print(6 * 7)"])
    assert (r.exit_code, r.stdout) == (0, "42\n")
    assert cli(["sandbox", "exec", "--", "exit 3"]).exit_code == 3
    r = cli(["sandbox", "exec", "--timeout", "1", "--", "sleep 30"])
    assert r.exit_code == 124 and "timed out" in r.stderr
    r = cli(["sandbox", "exec", "--set", "memory_mb=64", "--", "python3 -c 'x = bytearray(256 << 20)'"])
    assert r.exit_code == 137
    r = cli(["sandbox", "exec", "--", "kill -9 $PPID"])
    assert r.exit_code == 125 and "infrastructure error" in r.error
    r = cli(["sandbox", "exec", "--json", "--", "seq 3"])
    assert json.loads(r.stdout)["stdout"] == "1\n2\n3\n"


def test_cli_exec_leaves_nothing_behind(docker_client, image, cli, tmp_path):
    (tmp_path / "test_t.py").write_text("def test_t():\n    pass\n")
    before = {x.name for x in mine(docker_client)}
    r = cli(["sandbox", "exec", "--copy", tmp_path, "--", "pytest -q"])
    assert r.exit_code == 0 and "1 passed" in r.stdout
    _wait_until(lambda: {x.name for x in mine(docker_client)} == before)


def _wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
