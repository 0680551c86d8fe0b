"""The gateway under load, with real clients (the `openai` SDK, a few sessions in threads):

- zero lost and zero duplicated events across concurrent sessions;
- `kill -9` of a real `rlcycle gateway` process mid-load: `collect` reads every flushed event,
  and then `distill` → `train` on those very logs starts on-policy (step-1 mismatch_kl ≈ 0);
- `deploy` moving the alias during load: every event names the checkpoint that served it (the
  response header says the same), requests after the reload get the new one;
- a canary share goes to `candidate` by session, sticky.
The model is the tiny random one from `rlcycle init-model`, in-process (real transformers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import polars as pl
import pytest

from rlcycle.cli.options import registry_dir
from rlcycle.gateway import GatewayConfig, start
from tests.test_gateway import read_events

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from rlcycle import model_init

    root = tmp_path_factory.mktemp("gwload")
    return [Path(model_init.run(model_init.InitModelConfig(seed=s), root / f"m{s}").path) for s in (0, 1)]


class Load:
    """N sessions, each a thread with its own SDK client, sending multi-turn chats until stopped."""

    def __init__(self, url: str, sessions: int = 4, max_tokens: int = 4):
        self.url, self.max_tokens = url, max_tokens
        self.done: list[dict] = []  # one per response received: sample id, checkpoint, session, when
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(f"load-{i}",), daemon=True) for i in range(sessions)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _run(self, session: str) -> None:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        msgs: list[dict] = []
        k = 0
        while not self._stop.is_set():
            if len(msgs) >= 5:
                msgs = []
            msgs.append({"role": "user", "content": f"task {k} of {session}"})
            k += 1
            with self._lock:
                self.sent += 1
            t0 = time.monotonic()
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="production",
                    messages=msgs,
                    max_tokens=self.max_tokens,
                    temperature=1.0,
                    seed=k,
                    extra_headers={"X-Session-Id": session},
                )
            except (openai.APIConnectionError, openai.APIStatusError) as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                return
            resp = raw.parse()
            msgs.append({"role": "assistant", "content": resp.choices[0].message.content or ""})
            with self._lock:
                self.done.append(
                    {
                        "sample_id": raw.headers["x-sample-id"],
                        "session": session,
                        "checkpoint": raw.headers["x-checkpoint-id"],
                        "start": t0,
                        "end": time.monotonic(),
                    }
                )

    def wait_for(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.done) < n and time.monotonic() < deadline and not self.errors:
            time.sleep(0.05)
        assert not self.errors, self.errors
        assert len(self.done) >= n, f"only {len(self.done)} responses in {timeout}s"


def _register(cli, model: Path, alias: str = "production") -> str:
    r = cli(["registry", "add", model, "--alias", alias])
    assert r.exit_code == 0, r.output
    return r.stdout.strip().splitlines()[-1]


def test_concurrent_sessions_lose_and_duplicate_nothing(cli, models, tmp_path):
    _register(cli, models[0])
    running = start(
        GatewayConfig(
            registry=str(registry_dir()),
            log_dir=str(tmp_path / "logs"),
            port=0,
            flush_interval_s=0.1,
            rotate_bytes=4096,
        )
    )  # tiny files: rotation happens under load
    try:
        with Load(running.url, sessions=4) as load:
            load.wait_for(40)
    finally:
        running.close()
    events = read_events(tmp_path / "logs")
    ids = Counter(e["event_id"] for e in events)
    assert max(ids.values()) == 1  # no duplicates
    logged = sorted(e["sample_id"] for e in events if e["type"] == "completion")
    assert logged == sorted(d["sample_id"] for d in load.done)  # none lost, none made up
    assert len(list((tmp_path / "logs").glob("*.jsonl"))) > 1
    per_session = Counter(e["session_id"] for e in events)
    assert set(per_session) == {f"load-{i}" for i in range(4)}
    # each client resends its conversation plus the answer and a new user message, three times,
    # then starts over: by message-prefix continuation that is one episode of turns 0, 1, 2
    comps = [e for e in events if e["type"] == "completion"]
    assert all(e["episode_id"].startswith(e["session_id"] + "-e") and e["turn"] in (0, 1, 2) for e in comps)
    by_episode: dict[str, list[int]] = {}
    for e in sorted(comps, key=lambda e: e["ts"]):
        by_episode.setdefault(e["episode_id"], []).append(e["turn"])
    assert all(turns == [0, 1, 2][: len(turns)] for turns in by_episode.values()), by_episode
    assert all(e["id_rules"]["episode"] == ("new" if e["turn"] == 0 else "continuation") for e in comps)


def test_alias_move_during_load_names_the_serving_checkpoint(cli, models, tmp_path):
    old = _register(cli, models[0])
    running = start(
        GatewayConfig(
            registry=str(registry_dir()),
            log_dir=str(tmp_path / "logs"),
            port=0,
            flush_interval_s=0.1,
            watch_interval_s=0,
        )
    )  # the deploy hook, not the watcher, reloads
    try:
        with Load(running.url, sessions=3) as load:
            load.wait_for(6)
            hook = running.url + "/v1/rlcycle/reload"
            r = cli(["deploy", models[1], "--force", "--hook", hook])
            assert r.exit_code == 0, r.output
            moved_at = time.monotonic()
            new = running.gateway.models.describe()["checkpoint_id"]
            assert new != old
            n = len(load.done)
            load.wait_for(n + 9)
    finally:
        running.close()
    served = {d["sample_id"]: d for d in load.done}
    events = {e["sample_id"]: e for e in read_events(tmp_path / "logs") if e["type"] == "completion"}
    assert set(events) == set(served)
    assert all(events[s]["policy_version"] == d["checkpoint"] for s, d in served.items())
    assert {d["checkpoint"] for d in load.done} == {old, new}
    assert all(d["checkpoint"] == new for d in load.done if d["start"] > moved_at)


def test_canary_share_is_sticky_per_session(cli, models, tmp_path):
    prod = _register(cli, models[0])
    r = cli(["deploy", models[1], "--force", "--canary", "0.5"])
    assert r.exit_code == 0, r.output
    running = start(GatewayConfig(registry=str(registry_dir()), log_dir=str(tmp_path / "logs"), port=0))
    try:
        cand = running.gateway.models.describe()["candidate_id"]
        assert cand not in (None, prod)
        seen: dict[str, set[str]] = {}
        for i in range(16):
            for _ in range(2):
                h = httpx.post(
                    running.url + "/v1/chat/completions",
                    headers={"X-Session-Id": f"s{i}"},
                    timeout=60,
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                ).headers
                seen.setdefault(f"s{i}", set()).add(h["x-checkpoint-id"])
    finally:
        running.close()
    assert all(len(v) == 1 for v in seen.values())  # sticky
    assert {next(iter(v)) for v in seen.values()} == {prod, cand}  # both get traffic
    # Completions say which side served them; a tool_result is logged too when the random
    # model's one token happens to be a stray </tool_call> (an invalid call, no `served_as`).
    roles = Counter(e["served_as"] for e in read_events(tmp_path / "logs") if e["type"] == "completion")
    assert set(roles) == {"production", "candidate"}


def _spawn_gateway(log_dir: Path, home: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, RLCYCLE_HOME=str(home))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlcycle",
            "gateway",
            "--port",
            "0",
            "--json",
            "--log-dir",
            str(log_dir),
            "--set",
            "flush_interval_s=0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the gateway did not start: {proc.stderr.read().decode()[-2000:]}")
    return proc, json.loads(line)["url"]


def test_kill_9_mid_load_then_collect_distill_train(cli, models, tmp_path, rlcycle_home):
    _register(cli, models[0])
    logs = tmp_path / "logs"
    proc, url = _spawn_gateway(logs, rlcycle_home)
    try:
        with Load(url, sessions=4, max_tokens=6) as load:
            load.wait_for(48)
            # late signals (thumbs up/down by sample) so that distill has rewards that differ
            fb = [
                {
                    "type": "feedback",
                    "session_id": d["session"],
                    "sample_id": d["sample_id"],
                    "value": 1.0 if i % 2 else -1.0,
                    "kind": "thumbs",
                }
                for i, d in enumerate(list(load.done))
            ]
            before = httpx.get(url + "/v1/rlcycle/stats").json()["log"]["written"]
            assert httpx.post(url + "/v1/rlcycle/events", json={"events": fb}).status_code == 200
            # the feedback must be on disk before the kill (it is what gives distill rewards that
            # differ): three flush intervals, then until the count has passed it
            time.sleep(1.5)
            for _ in range(200):
                flushed = httpx.get(url + "/v1/rlcycle/stats").json()["log"]["written"]
                if flushed >= before + len(fb):
                    break
                time.sleep(0.05)
            received = {d["sample_id"] for d in load.done}
            os.kill(proc.pid, signal.SIGKILL)  # mid-load: requests are in flight
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = tmp_path / "traj.arrow"
    r = cli(["collect", logs, "-o", out, "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["events_in"] >= flushed and summary["duplicates"] == 0
    assert set(summary["quarantine_reasons"]) <= {"truncated last line"}
    logged = {e["sample_id"] for e in read_events_tolerant(logs) if e["type"] == "completion"}
    # nothing is made up: a logged sample was answered, or was in flight (one per session) at the kill
    assert len(logged - received) <= 4
    print(
        f"kill -9: {flushed} events flushed before, {summary['events_in']} read after, "
        f"{len(received - logged)} answered but unflushed (lost)"
    )
    assert summary["samples_out"] == len(logged)
    # the gateway's own logs train on-policy: step-1 mismatch KL is float noise
    ex = tmp_path / "examples.arrow"
    # the mismatch KL needs rows, not a learning signal: keep flat groups (advantage 0) too
    r = cli(["distill", out, "-o", ex, "--set", "exclude_flat_groups=false"])
    assert r.exit_code == 0, r.output
    r = cli(["train", ex, "--base", models[0], "-o", tmp_path / "ckpt", "--max-steps", 1, "--set", "batch_size=16"])
    assert r.exit_code == 0, r.output
    steps = pl.read_ipc(tmp_path / "ckpt" / "train_metrics.arrow")
    kl = steps.get_column("mismatch_kl")[0]
    print(f"step-1 mismatch_kl on gateway logs: {kl:.3g}")
    assert kl < 1e-4, kl


def read_events_tolerant(log_dir: Path) -> list[dict]:
    """Events of every file, skipping a last line a kill -9 may have cut."""
    out = []
    for f in sorted(Path(log_dir).glob("*.jsonl")):
        for line in f.read_bytes().split(b"\n"):
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.append(ev)
    return out
