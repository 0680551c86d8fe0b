"""deploy: promote a candidate checkpoint in the model registry if its eval verdict allows it.

    from rlcycle.deploy import DeployConfig, run, rollback
    result = run(DeployConfig(), "runs/c1/checkpoint", "runs/c1/eval/verdict.json")

stage.py holds the verdict rules, promote/canary/rollback and `register`; hooks.py calls the
serving side after an alias moves. The registry itself (content ids, aliases, history) lives in
rlcycle.policy.registry, beside the policy references that resolve against it. docs/deploy.md.
"""

from rlcycle.deploy.stage import (
    DeployConfig,
    DeployResult,
    format_summary,
    load_verdict,
    register,
    rollback,
    run,
)

__all__ = ["DeployConfig", "DeployResult", "format_summary", "load_verdict", "register", "rollback", "run"]
