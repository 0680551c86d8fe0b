"""Real agent frameworks, unmodified, against `rlcycle gateway` on loopback (issue 24, item 7).

Each framework is installed, pinned, in a venv of its own under ~/.cache/rlcycle-clients (made
once, then reused; $RLCYCLE_CLIENTS moves it): mini-swe-agent 2.4.6, openai-agents 0.24.0,
smolagents 1.26.0. Each runs a small task in a scratch git repository, configured only by its
base URL and API key, as a user would; then the test checks that every request it made was
answered and logged exactly once, in one session and one episode (turns 0, 1, ...), and runs
`rlcycle collect` -> `distill` -> one `train` step on the events it produced.

The model: the tiny random checkpoint cannot write tool calls, so the gateway runs `--upstream`
against a second gateway serving a *scripted* policy over /v1/completions (`Scripted` below:
a fixed completion per task and step, a stand-in for the model only). The gateway, the
harness renderer and parser, the stop-string cuts, the forced-call prefill, the Responses API,
the episode matcher, the log, collect, distill and train are all real.

Under CI=1 these tests run (an install failure fails them); elsewhere an install that cannot
reach the package index skips them with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from rlcycle.policy.base import Generation
from tests.test_gateway import _start, read_full_events, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("RLCYCLE_CLIENTS", Path.home() / ".cache" / "rlcycle-clients"))
PINS = {"mini-swe-agent": "2.4.6", "openai-agents": "0.24.0", "smolagents": "1.26.0"}
# what pip installs: the pins, with litellm pinned too (some litellm releases were compromised)
INSTALL = {
    "mini-swe-agent": ["mini-swe-agent==2.4.6", "litellm==1.110.2"],
    "openai-agents": ["openai-agents==0.24.0"],
    "smolagents": ["smolagents[openai]==1.26.0"],
}
CALL = '<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'

# marker in the first user message -> completion per step (the number of assistant turns so far)
SCRIPTS = {
    "MSWEA-TASK": [
        "I will write the file.\n" + CALL.format(name="bash", args=json.dumps({"command": "echo hello > note.txt"})),
        "Check it.\n" + CALL.format(name="bash", args=json.dumps({"command": "cat note.txt"})),
        "Done.\n"
        + CALL.format(name="bash", args=json.dumps({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})),
    ],
    "AGENTS-CHAT-TASK": [
        "Noting.\n" + CALL.format(name="write_note", args=json.dumps({"text": "hello"})),
        "Wrote the note.",
    ],
    "AGENTS-RESP-TASK": [
        "Noting.\n" + CALL.format(name="write_note", args=json.dumps({"text": "hi"})),
        "Wrote the note.",
    ],
    # smolagents' ToolCallingAgent forces a call (tool_choice "required"): the gateway prefills
    # `<tool_call>`, so the script is what follows it
    "SMOL-TOOL-TASK": [
        json.dumps({"name": "write_note", "arguments": {"text": "hey"}}) + "</tool_call>",
        json.dumps({"name": "final_answer", "arguments": {"answer": "noted"}}) + "</tool_call>",
    ],
    # CodeAgent: code blocks; it stops at </code> (a stop string), so the made-up observation
    # after it is never returned
    "SMOL-CODE-TASK": [
        "Thought: write it.\n<code>\nopen('note.txt', 'w').write('x')\n</code>\nObservation: invented",
        "Thought: done.\n<code>\nfinal_answer('written')\n</code>",
    ],
}


class Scripted:
    """A stand-in model: the completion scripted for the task named in the prompt, by step."""

    def __init__(self, tokenizer_dir: str, scripts: dict[str, list[str]] | None = None):
        from transformers import AutoTokenizer

        self.scripts = SCRIPTS if scripts is None else scripts
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p, skip_special_tokens=False)
            step = text.count("<|im_start|>assistant") - 1
            script = next((s for k, s in self.scripts.items() if k in text), ["I do not know this task."])
            body = script[min(step, len(script) - 1)]
            ids = list(self.tokenizer(body, add_special_tokens=False)["input_ids"]) + [self.end]
            out.append(Generation(ids, [-0.5] * len(ids), "stop", 1.0))
        return out

    def close(self) -> None:
        pass


def _venv(name: str) -> Path:
    """The pinned framework's venv, made once (a marker file says the install finished)."""
    root = CACHE / f"{name}-{PINS[name]}"
    py = root / "bin" / "python"
    marker = root / ".installed"  # says the install of exactly these specs finished
    if marker.exists() and marker.read_text() == " ".join(INSTALL[name]) and py.exists():
        return py
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", *INSTALL[name]],
            check=True,
            timeout=1200,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        why = f"cannot install {name}=={PINS[name]} into {root}: {getattr(e, 'stderr', b'') or e}"
        if os.environ.get("CI"):
            raise AssertionError(why) from None
        pytest.skip(why[-2000:])
    marker.write_text(" ".join(INSTALL[name]))
    return py


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):  # noqa: F811
    from tests.test_gateway import _scripted_upstream

    server = _scripted_upstream(world, Scripted(str(world["model"])))
    yield server
    server.close()


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("scratch\n")
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def _drive(py: Path, code: str, repo: Path, env: dict[str, str]) -> str:
    script = repo.parent / "drive.py"  # a file: smolagents' @tool reads its function's source
    script.write_text(textwrap.dedent(code))
    r = subprocess.run(
        [str(py), str(script)],
        cwd=repo,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"client failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r.stdout


def _check_and_train(cli, running, tmp_path: Path, expect_turns: int, world) -> list[dict]:  # noqa: F811
    """Every request answered once, one session and episode, then collect -> distill -> train."""
    running.gateway.log.flush()
    logs = Path(running.gateway.config.log_dir)
    comps = [e for e in read_full_events(logs) if e["type"] == "completion"]
    assert running.gateway.requests == len(comps) and not running.gateway.refused, running.gateway.refused_fields
    assert max(Counter(e["sample_id"] for e in comps).values()) == 1
    assert len({e["session_id"] for e in comps}) == 1 and len({e["episode_id"] for e in comps}) == 1, [
        (e["session_id"], e["episode_id"], e["id_rules"]) for e in comps
    ]
    assert sorted(e["turn"] for e in comps) == list(range(expect_turns))
    traj, ex = tmp_path / "t.arrow", tmp_path / "ex.arrow"
    r = cli(["collect", logs, "-o", traj, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["samples_out"] == len(comps)
    r = cli(["distill", traj, "-o", ex, "--set", "exclude_flat_groups=false"])
    assert r.exit_code == 0, r.output
    r = cli(
        [
            "train",
            ex,
            "--base",
            world["model"],
            "-o",
            tmp_path / "ckpt",
            "--max-steps",
            1,
            "--set",
            f"batch_size={len(comps)}",
        ]
        + ["--set", "max_policy_lag=-1"]
    )
    assert r.exit_code == 0, r.output
    return comps


def test_smolagents_tool_calling_and_code_agents(cli, world, served, tmp_path):  # noqa: F811
    py = _venv("smolagents")
    for kind, task in (("ToolCallingAgent", "SMOL-TOOL-TASK"), ("CodeAgent", "SMOL-CODE-TASK")):
        running = _start(world, tmp_path / kind / "logs", upstream=served.url)
        try:
            out = _drive(
                py,
                f"""
                import os
                from smolagents import {kind}, OpenAIServerModel, tool

                @tool
                def write_note(text: str) -> str:
                    \"\"\"Write a note.

                    Args:
                        text: the note's text
                    \"\"\"
                    open("note.txt", "w").write(text)
                    return "written"

                model = OpenAIServerModel(model_id="production", api_base=os.environ["BASE"], api_key="unused")
                agent = {kind}(tools=[write_note], model=model, max_steps=4)
                print("ANSWER", agent.run("{task}: write a note"))
                """,
                _repo(tmp_path / kind),
                {"BASE": running.url + "/v1"},
            )
            assert "ANSWER" in out
            comps = _check_and_train(cli, running, tmp_path / kind, 2, world)
        finally:
            running.close()
        if kind == "ToolCallingAgent":  # the forced call was prefilled into the prompt
            assert all(e["sampling"]["prefill"] == "<tool_call>" for e in comps)
        else:  # the stop string cut the invented observation off, on a token boundary
            assert comps[0]["cut"]["rule"] == "stop" and "invented" not in comps[0]["completion_text"]


def test_openai_agents_chat_completions_and_responses(cli, world, served, tmp_path):  # noqa: F811
    py = _venv("openai-agents")
    for api, task in (("chat", "AGENTS-CHAT-TASK"), ("responses", "AGENTS-RESP-TASK")):
        running = _start(world, tmp_path / api / "logs", upstream=served.url)
        try:
            out = _drive(
                py,
                f"""
                import asyncio, os
                from openai import AsyncOpenAI
                from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
                from agents import set_default_openai_client, set_tracing_disabled

                set_tracing_disabled(True)
                client = AsyncOpenAI(base_url=os.environ["BASE"], api_key="unused")

                @function_tool
                def write_note(text: str) -> str:
                    \"\"\"Write a note.\"\"\"
                    open("note.txt", "w").write(text)
                    return "written"

                if "{api}" == "chat":
                    model = OpenAIChatCompletionsModel(model="production", openai_client=client)
                    agent = Agent(name="a", instructions="Be brief.", tools=[write_note], model=model)
                    print("ANSWER", Runner.run_sync(agent, "{task}").final_output)
                else:  # the SDK's default model: the Responses API, streamed
                    set_default_openai_client(client)
                    agent = Agent(name="a", instructions="Be brief.", tools=[write_note], model="production")

                    async def main():
                        run = Runner.run_streamed(agent, "{task}")
                        async for _ in run.stream_events():
                            pass
                        print("ANSWER", run.final_output)

                    asyncio.run(main())
                """,
                _repo(tmp_path / api),
                {"BASE": running.url + "/v1"},
            )
            assert "ANSWER Wrote the note." in out, out
            assert (tmp_path / api / "repo" / "note.txt").exists()
            comps = _check_and_train(cli, running, tmp_path / api, 2, world)
        finally:
            running.close()
        assert {e["api"] for e in comps} == {"chat.completions" if api == "chat" else "responses"}


def test_mini_swe_agent(cli, world, served, tmp_path):  # noqa: F811
    py = _venv("mini-swe-agent")
    running = _start(world, tmp_path / "logs", upstream=served.url)
    repo = _repo(tmp_path)
    try:
        out = _drive(
            py,
            """
            import os, yaml
            from minisweagent.agents.default import DefaultAgent
            from minisweagent.config import builtin_config_dir
            from minisweagent.environments.local import LocalEnvironment
            from minisweagent.models.litellm_model import LitellmModel

            cfg = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
            model_cfg = {**cfg["model"], "model_name": "openai/production"}
            model_cfg["model_kwargs"] = {
                **(model_cfg.get("model_kwargs") or {}),
                "api_base": os.environ["BASE"],
                "api_key": "unused",
                "max_tokens": 256,
            }
            agent = DefaultAgent(
                LitellmModel(**model_cfg), LocalEnvironment(cwd=os.getcwd()), **{**cfg["agent"], "step_limit": 6}
            )
            result = agent.run("MSWEA-TASK: write hello into note.txt")
            print("EXIT", result.get("exit_status"))
            """,
            repo,
            {
                "BASE": running.url + "/v1",
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MSWEA_CONFIGURED": "true",
            },
        )
        assert "EXIT Submitted" in out, out
        assert (repo / "note.txt").read_text() == "hello\n"
        comps = _check_and_train(cli, running, tmp_path, 3, world)
    finally:
        running.close()
    # its assistant turns come back with tool_calls and no content; still one token-exact episode
    assert comps[1]["prompt_ids"][: len(comps[0]["prompt_ids"]) + len(comps[0]["completion_ids"])] == (
        comps[0]["prompt_ids"] + comps[0]["completion_ids"]
    )
