"""The agent: episodes of a policy working on tasks in sandboxes, graded, logged as events.

    from rlcycle.agent import RunnerConfig, run_episodes
    results = run_episodes(policy, "ckpt-1a2b", tasks, pool, RunnerConfig(), attempts=2)

Modules: runner (the episode loop, `RunnerConfig`, `EpisodeResult`, `run_episodes`), tools_exec
(each harness tool in a sandbox), events (the one writer of completion and tool_result events,
and a session as production events), user (the simulated user); the scripted policies for
tests and benches are `rlcycle.policy.scripted`.
`rlcycle.simulate` writes the events of many sessions as a production log.
"""

from rlcycle.agent.runner import EpisodeResult, RunnerConfig, run_episodes, summarize

__all__ = ["EpisodeResult", "RunnerConfig", "run_episodes", "summarize"]
