"""deploy: promote a checkpoint in the registry if its verdict passed; roll back; notify serving.

In:  a checkpoint directory and its `verdict.json` (from eval). Out: registry aliases moved
     atomically, a row in `deployments.arrow`, and the serving hook called.

    rlcycle deploy runs/2026-12-02T10/checkpoint --verdict runs/2026-12-02T10/eval/verdict.json

Rules:
- no verdict, or a verdict whose decision is not `accept`: refused (exit 3) unless `--force`,
  which is recorded in the history with who forced it;
- a verdict that names a different candidate id than the checkpoint's: refused (exit 2);
- promote: `production` = the checkpoint, `previous` = the old production;
- `--canary F`: production stays; `candidate` = the checkpoint and the canary fraction F is
  recorded for serving (the hook receives it); a later full deploy clears it;
- the hook (a shell command, or an http(s) URL that receives a JSON POST, with
  `Authorization: Bearer $<hook_api_key_env>` when that names a variable) runs after the
  aliases moved; if it fails, the aliases are moved back and that is recorded too. For vLLM:
  `--hook 'rlcycle deploy-vllm --url http://host:8000'` (deploy/vllm.py);
- the checkpoint about to be served is re-hashed in full first (deploy: the registry's copy,
  rollback: `previous`; rlcycle/policy/manifest.py): a file that changed since it was made
  refuses the deploy or rollback (exit 2) before any alias moves;
- rollback: `production` = `previous` and back; with a hook (`rlcycle rollback --hook ...`) the
  hook is called as above for the checkpoint rolled back to, and a failing hook undoes it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcycle.config import cfg, check_range
from rlcycle.deploy.hooks import call_hook
from rlcycle.errors import EXIT_GATE_REFUSED, InputError, RlcycleError
from rlcycle.policy.registry import Entry, Registry, actor, verify_checkpoint
from rlcycle.stage import Outcome, RunLayout, StageContext, checkpoint_key


@dataclass
class DeployConfig:
    alias: str = cfg("production", help="The alias to promote into.")
    force: bool = cfg(False, help="Promote without a passing verdict (recorded in the history).")
    canary_fraction: float | None = cfg(None, help="Serve the checkpoint to this fraction of traffic first.")
    hook: str | None = cfg(None, help="Serving hook: a shell command, or an http(s) URL to POST to.")
    hook_timeout_s: float = cfg(120.0, help="Seconds the hook may take before it counts as failed.")
    hook_api_key_env: str | None = cfg(
        None,
        help="Name of the environment variable holding the API key "
        "an http(s) hook is sent as `Authorization: Bearer KEY` "
        "(the NAME, never the key).",
    )

    def validate(self) -> list[str]:
        problems = []
        check_range(problems, self, "canary_fraction", gt=0, lt=1, optional=True)
        check_range(problems, self, "hook_timeout_s", gt=0)
        name = self.hook_api_key_env
        if name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(
                f"hook_api_key_env={name!r}: the name of an environment variable, "
                "e.g. RLCYCLE_GATEWAY_API_KEY (not the key itself)"
            )
        return problems

    def hook_api_key(self) -> str | None:
        """The key in $hook_api_key_env (None when no variable is named); raises when it is unset."""
        if not self.hook_api_key_env:
            return None
        key = os.environ.get(self.hook_api_key_env)
        if not key:
            raise InputError(
                f"hook_api_key_env={self.hook_api_key_env}: ${self.hook_api_key_env} is not set",
                hint=f"export {self.hook_api_key_env}=<the serving side's API key>, or drop hook_api_key_env",
            )
        return key


@dataclass
class DeployResult:
    action: str
    alias: str
    checkpoint_id: str | None
    previous_id: str | None
    forced: bool = False
    canary_fraction: float | None = None
    hook: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def format_summary(r: DeployResult) -> str:
    """The line `rlcycle deploy`, `rollback` and `registry add` print on stdout."""
    return f"{r.action}: {r.alias} -> {r.checkpoint_id} (was {r.previous_id})"


def load_verdict(path: str | Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"verdict {path}: no such file", hint="run `rlcycle eval` first") from None
    except json.JSONDecodeError as e:
        raise InputError(f"verdict {path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None


def _check_verdict(verdict: dict[str, Any] | None, path, cid: str, force: bool) -> str | None:
    """The verdict's decision; raises when it does not allow this checkpoint to ship."""
    if verdict is None:
        if force:
            return None
        raise RlcycleError(
            "refusing to deploy without a verdict",
            hint="pass --verdict eval/verdict.json, or --force (recorded in the history)",
            exit_code=EXIT_GATE_REFUSED,
        )
    named = verdict.get("candidate_id")
    if named and named != cid:
        raise InputError(
            f"verdict {path} is for checkpoint {named}, not {cid}",
            hint="deploy the checkpoint that was evaluated",
        )
    decision = verdict.get("decision")
    if decision != "accept" and not force:
        failed = [g["name"] for g in verdict.get("gates", []) if not g.get("passed")]
        raise RlcycleError(
            f"verdict {path} says {decision!r}" + (f" (failed gates: {', '.join(failed)})" if failed else ""),
            hint="fix the candidate, or --force to override (recorded in the history)",
            exit_code=EXIT_GATE_REFUSED,
        )
    return decision


def run(
    config: DeployConfig,
    checkpoint: str | Path,
    verdict_path: str | Path | None,
    registry: Registry,
) -> DeployResult:
    """Promote `checkpoint` into `registry` (its verdict permitting), then the serving hook."""
    reg = registry
    verdict = load_verdict(verdict_path)
    api_key = config.hook_api_key() if config.hook else None  # before anything moves
    with reg.locked():
        # Full re-hash of what will be served (the registry's copy): a changed file stops the
        # deploy here, before any alias moves (CheckpointChanged, exit 2).
        cid = reg.add(checkpoint, full=True)
        decision = _check_verdict(verdict, verdict_path, cid, config.force)
        forced = config.force and decision != "accept"
        before = reg.state()
        old = dict(before["aliases"])
        new = dict(old)
        note = "forced without a passing verdict" if forced else None
        if config.canary_fraction is not None:
            new["candidate"] = cid
            canary = {"id": cid, "fraction": config.canary_fraction, "alias": config.alias}
            action = "canary"
        else:
            if old.get(config.alias) != cid and config.alias in old:
                new["previous"] = old[config.alias]
            new[config.alias] = cid
            canary, action = {}, "promote"
        entry = Entry(
            action,
            config.alias,
            cid,
            old.get(config.alias),
            str(verdict_path) if verdict_path else None,
            decision,
            actor(),
            note,
        )
        reg.commit(new, entry, canary)
        result = DeployResult(
            action,
            config.alias,
            cid,
            old.get(config.alias),
            forced,
            config.canary_fraction,
            config.hook,
        )
        if config.hook:
            problem = call_hook(
                config.hook or "",
                reg.ckpts / cid,
                cid,
                config.alias,
                config.canary_fraction,
                config.hook_timeout_s,
                api_key,
                action,
            )
            if problem:
                reg.commit(
                    old,
                    Entry(
                        "revert",
                        config.alias,
                        old.get(config.alias),
                        cid,
                        None,
                        None,
                        actor(),
                        f"serving hook failed: {problem}",
                    ),
                    before.get("canary") or {},
                )
                raise RlcycleError(
                    f"serving hook failed ({problem}); the registry was moved back "
                    f"({config.alias} -> {old.get(config.alias) or 'nothing, as before'})",
                    hint="check the hook command/URL, then deploy again",
                )
    return result


def rollback(
    registry: Registry,
    alias: str = "production",
    note: str | None = None,
    config: DeployConfig | None = None,
) -> DeployResult:
    """Point `alias` back at `previous` (and `previous` at what was rolled back from); then the
    serving hook, as deploy calls it, with the checkpoint rolled back to. If the hook fails, the
    serving side still has the newer one: the rollback is reverted (recorded) and it raises."""
    reg = registry
    hook = config.hook if config else None
    api_key = config.hook_api_key() if hook else None  # before anything moves
    with reg.locked():
        old = reg.aliases()
        if "previous" not in old or alias not in old:
            raise RlcycleError(
                f"nothing to roll back to: the registry has no 'previous' for {alias!r}",
                hint="`rlcycle registry ls` shows the aliases",
            )
        before = reg.state()
        back, current = old["previous"], old[alias]
        verify_checkpoint(reg.ckpts / back, full=True, expected_id=back)  # before anything moves
        new = dict(old, **{alias: back, "previous": current})
        reg.commit(new, Entry("rollback", alias, back, current, None, None, actor(), note), {})
        if hook:
            problem = call_hook(hook, reg.ckpts / back, back, alias, None, config.hook_timeout_s, api_key, "rollback")
            if problem:
                reg.commit(
                    old,
                    Entry(
                        "revert",
                        alias,
                        current,
                        back,
                        None,
                        None,
                        actor(),
                        f"serving hook failed on rollback: {problem}",
                    ),
                    before.get("canary") or {},
                )
                raise RlcycleError(
                    f"serving hook failed ({problem}); the rollback was undone ({alias} -> {current}, "
                    "still what the serving side has)",
                    hint="check the hook command/URL, then roll back again",
                )
    return DeployResult("rollback", alias, back, current, hook=hook)


def register(checkpoint: str | Path, alias: str | None, registry: Registry) -> str:
    """Add a checkpoint (e.g. the first production model), optionally setting an alias."""
    reg = registry
    with reg.locked():
        cid = reg.add(checkpoint)
        if alias:
            old = reg.aliases()
            reg.commit(
                dict(old, **{alias: cid}),
                Entry("register", alias, cid, old.get(alias), None, None, actor(), None),
            )
    return cid


# --- the stage object (rlcycle/stage.py): what `rlcycle deploy` and the cycle both run ---------


@dataclass(frozen=True)
class DeployArgs:
    """What one deploy promotes, on what verdict, into which registry: `run`'s arguments past
    the config. `skip_promoted` (the cycle's rule): `up_to_date` when the alias already points
    at the checkpoint, `superseded` when it was promoted before, and nothing moves."""

    checkpoint: str | Path
    verdict: str | Path | None  # verdict.json from eval (None: refused unless force)
    registry: Registry
    skip_promoted: bool = False


def promoted(history: list[dict[str, Any]]) -> set[str]:
    """The checkpoints a promote moved an alias to and that stayed promoted: a promote that its
    serving hook failed (the `revert` right after, naming it as `previous_id`) never served, so a
    rerun of its run directory may try again; a revert of a rollback cancels nothing."""
    done: set[str] = set()
    last: dict[str, str] = {}  # checkpoint -> the last action that moved an alias to it
    for h in history:
        cid = h["checkpoint_id"]
        if h["action"] == "revert" and last.get(h["previous_id"]) == "promote":
            done.discard(h["previous_id"])
            last[h["previous_id"]] = "revert"
        elif cid is not None:
            if h["action"] == "promote":
                done.add(cid)
            last[cid] = h["action"]
    return done


class DeployStage:
    """deploy as a stage: a checkpoint into the registry with its verdict (in a cycle: train's,
    with eval's). Never cached (its effect is the registry, not the run directory), and so in a
    cycle it checks the registry itself (`skip_promoted`): rerunning an old run directory must
    not roll production back to its checkpoint (that takes an explicit `rlcycle deploy` or
    `rlcycle rollback`)."""

    name = "deploy"
    config_class = DeployConfig
    cacheable, gate, publishes = False, False, True

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        return {"checkpoint": checkpoint_key(ctx.layout.file("checkpoint"))}

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {}

    def args(self, ctx: StageContext) -> DeployArgs:
        ckpt, verdict = ctx.layout.file("checkpoint"), ctx.layout.file("verdict")
        return DeployArgs(ckpt, verdict, Registry(ctx.registry), skip_promoted=True)

    def run(self, config: DeployConfig, args: DeployArgs) -> DeployResult:
        if args.skip_promoted:
            cid, current = checkpoint_key(Path(args.checkpoint)), args.registry.aliases().get(config.alias)
            if current == cid:
                return DeployResult("up_to_date", config.alias, cid, current)
            if cid in promoted(args.registry.history().to_pylist()):
                return DeployResult("superseded", config.alias, cid, current)
        return run(config, args.checkpoint, args.verdict, args.registry)

    def record(self, result: DeployResult) -> Outcome:
        r = result
        if r.action == "up_to_date":
            return Outcome(
                {"status": r.action, "checkpoint_id": r.checkpoint_id},
                f"deploy: {r.alias} is {r.checkpoint_id} already",
            )
        if r.action == "superseded":
            return Outcome(
                {"status": r.action, "checkpoint_id": r.checkpoint_id}, f"deploy: {r.checkpoint_id} was promoted before"
            )
        return Outcome(
            {"checkpoint_id": r.checkpoint_id, "previous_id": r.previous_id, "action": r.action}, format_summary(r)
        )


STAGE = DeployStage()
