"""The precondition of hinted self-distillation (issue 37 item 4; docs/hints.md): does the start
model pass more often on a second attempt *with* the user's hint in its context than without it?

    python experiments/hints/precondition.py --policy http://127.0.0.1:8311 --tokenizer runs/smol2/start \\
        --tasks runs/smol2/traffic --sessions 64 --seed 0 --out runs/hints_pre_s0 \\
        --config experiments/closed_loop/smollm2.toml
    bash experiments/hints/run_precondition.sh     # the same on SmolLM2's start, from nothing
    python experiments/hints/precondition.py --policy runs/demo/policy --tasks sample_data/tasks \\
        --sessions 4 --out runs/hints_pre_dry                  # a tiny dry run (the tiny model)

Read top to bottom, the program does this:
  1. first attempts: `--sessions` traffic sessions of `--policy` on `--tasks`, with the simulated
     user who says what is wrong (`user.followup_style = informative`, a follow-up after every
     session) and `--underspecified` of the first messages cut to the task's brief; the
     simulator's settings from `--config` (its `[cycle.simulate]` or `[simulate]` table, e.g.
     experiments/closed_loop/smollm2.toml: runner sizes, sandboxes);
  2. the hints: every failed session whose follow-up passes distill's rule (it says something
     beyond the complaint: rlcycle.distill.hints.informative) gives a pair;
  3. second attempts, `--attempts` per pair and arm, on a fresh workspace: *without* — the
     session's first message alone; *with* — the first message, then the follow-up as the user
     wrote it, in one user message (the hint in context, as the teacher of train/hints.py sees
     it). Both arms run the same task ids, attempts and seed, so a pair differs only in the hint
     (with a sampler seeded per session, the same random stream);
  4. the result: pass rates without and with, the paired difference (with − without, per pair
     the mean over its attempts) with a 95 % delta-method interval (rlcycle.stats), McNemar's
     exact test on single attempts, and the verdict: `hinted better` only when the interval
     excludes 0 on the positive side. Otherwise the teacher has nothing to teach: report it and
     change the model or the hints, not the training knobs.

Output: the report on stdout (`--json`: one JSON object), progress on stderr, and
OUT/precondition.json with every pair (task, first message, hint, passes per arm) and every first
attempt (`first_attempt_rows`: status, end reason, follow-up, whether it is a hint).
The SmolLM2 runs are the lead's to make on a quiet machine (docs/hints.md, "The experiment").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the checkout root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlcycle import stats
from rlcycle.agent.feedback import informative_followup
from rlcycle.agent.runner import derive_seed, run_id_for
from rlcycle.agent.user import SimulatedUser
from rlcycle.config import load_toml, resolve
from rlcycle.distill import followup
from rlcycle.distill.hints import informative
from rlcycle.policy.open import open_policy
from rlcycle.rollout import open_executor
from rlcycle.simulate.stage import SimulateConfig
from rlcycle.tasks import load_suite


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True, help="The start model: a checkpoint dir, alias or an OpenAI URL.")
    ap.add_argument("--tokenizer", help="Tokenizer directory prompts are rendered with (needed for an http policy).")
    ap.add_argument("--tasks", required=True, help="The traffic task suite.")
    ap.add_argument("--sessions", type=int, default=64, help="First-attempt sessions.")
    ap.add_argument("--attempts", type=int, default=1, help="Second attempts per pair and arm.")
    ap.add_argument("--underspecified", type=float, default=0.5, help="Share of first messages cut to the brief.")
    ap.add_argument("--min-words", type=int, default=3, help="distill's hints.min_words.")
    ap.add_argument(
        "--symptom-when-unchanged",
        action="store_true",
        help="Exploratory, not the issue's user: a failed first attempt that changed nothing gets the symptom "
        "its untouched code shows (the hidden tests' first failure on the task's repo, as the informative "
        "user words it) instead of the canned 'you didn't change anything?'.",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", help="A TOML with a [cycle.simulate] or [simulate] table (runner, sandboxes).")
    ap.add_argument("--out", required=True, help="Where precondition.json goes.")
    ap.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = ap.parse_args(argv)
    config = simulate_config(args.config, args.underspecified)
    if args.tokenizer:
        config = dataclasses.replace(config, policy=dataclasses.replace(config.policy, tokenizer=args.tokenizer))
    tasks = {t.id: t for t in load_suite(args.tasks)}
    first = run_sessions(config, args.policy, list(tasks.values()), args.sessions, args.seed, simulate_user=True)
    symptoms = untouched_symptoms(list(tasks.values()), config.sandboxes) if args.symptom_when_unchanged else {}
    pairs = hint_pairs(first, tasks, config, args.seed, args.min_words, symptoms)
    firsts = first_attempts(first, args.min_words, symptoms)
    say(f"precondition: {len(pairs)} pair(s) from {len(first)} first attempts ({first_counts(firsts)})")
    if pairs:
        without = [dataclasses.replace(p["task"], id=p["id"], instruction=p["first"]) for p in pairs]
        with_hint = [
            dataclasses.replace(p["task"], id=p["id"], instruction=f"{p['first']}\n\n{p['hint']}") for p in pairs
        ]
        n = len(pairs) * args.attempts
        second = args.seed + 1  # the same seed in both arms: paired sessions
        r0 = run_sessions(config, args.policy, without, n, second, simulate_user=False)
        r1 = run_sessions(config, args.policy, with_hint, n, second, simulate_user=False)
        attach(pairs, r0, "without")
        attach(pairs, r1, "with")
    report = {**summarize(pairs, len(first)), "first_attempt_counts": first_counts(firsts)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in p.items() if k != "task"} for p in pairs]
    doc = {**report, "pairs": rows, "first_attempt_rows": firsts}
    (out / "precondition.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def simulate_config(path: str | None, underspecified: float) -> SimulateConfig:
    """The simulator's settings (the file's table), with the informative user switched on."""
    data = load_toml(path) if path else {}
    table = (data.get("cycle") or {}).get("simulate") or data.get("simulate") or {}
    config = resolve(SimulateConfig, data=table, data_origin=str(path))
    user = dataclasses.replace(
        config.user, followup_style="informative", underspecified_rate=underspecified, followup_rate=1.0
    )
    return dataclasses.replace(config, user=user)


def run_sessions(config: SimulateConfig, policy: str, tasks: list, n: int, seed: int, simulate_user: bool) -> list:
    """`n` sessions cycling over `tasks` (EpisodeResults, in job order), as rlcycle simulate runs them."""
    opened = open_policy(policy, config.policy, None, where=config.rollout.executor)
    runner = dataclasses.replace(config.runner)
    if opened.run_key is not None and not runner.run_id:
        runner.run_id = run_id_for(opened.run_key, seed, runner, tasks, simulate_user, config.user)
    try:
        with open_executor(config.rollout, min(config.sandboxes, n)) as ex:
            return ex.run(
                opened.spec,
                opened.name,
                tasks,
                runner,
                seed=seed,
                simulate_user=simulate_user,
                n_episodes=n,
                user_config=config.user,
            )
    finally:
        opened.close()


def untouched_symptoms(tasks: list, sandboxes: int) -> dict[str, str]:
    """Per task, what its untouched repo shows a user (rlcycle.agent.feedback.failure_detail of the
    hidden tests' do-nothing run), for --symptom-when-unchanged; tasks with no symptom are left out."""
    from rlcycle.agent.feedback import failure_detail
    from rlcycle.sandbox import SandboxPool
    from rlcycle.tasks import check_suite

    size = max(1, min(sandboxes, len(tasks)))
    with SandboxPool(size=size) as pool:
        checks = check_suite(tasks, pool, workers=size)
    details = {c.task_id: failure_detail(c.noop.output) for c in checks}
    say(f"precondition: a symptom on untouched code for {sum(bool(d) for d in details.values())}/{len(tasks)} task(s)")
    return {k: v for k, v in details.items() if v}


def followup_of(r: Any, symptoms: dict[str, str]) -> str | None:
    """The session's follow-up (its last user message); with `symptoms`, a failure that changed
    nothing gets its task's symptom in the informative user's words (template by attempt)."""
    if symptoms and r.status == "fail" and not r.edited and r.task_id in symptoms:
        return informative_followup(symptoms[r.task_id], r.attempt)
    texts = [e["text"] for e in r.events if e.get("type") == "user_message" and e.get("text")]
    return texts[-1] if texts else None


def hint_pairs(
    results: list, tasks: dict, config: SimulateConfig, seed: int, min_words: int, symptoms: dict[str, str]
) -> list[dict[str, Any]]:
    """One pair per failed first attempt whose follow-up says something (distill's rule)."""
    user = SimulatedUser(config.user)
    pairs = []
    for r in results:
        if r.status != "fail":
            continue
        hint = followup_of(r, symptoms)
        if hint is None or not informative_text(hint, min_words):
            continue
        task = tasks[r.task_id]
        # The first message the session started with (the runner's own draw, agent/runner.py).
        rng = random.Random(derive_seed(seed, task.id, r.attempt, "first_message"))
        pairs.append(
            {
                "id": f"{task.id}.p{len(pairs)}",
                "task": task,
                "task_id": task.id,
                "attempt": r.attempt,
                "first": user.first_message(task, rng),
                "hint": hint,
            }
        )
    return pairs


def first_attempts(results: list, min_words: int, symptoms: dict[str, str]) -> list[dict[str, Any]]:
    """Every first attempt: its outcome, its follow-up and whether that follow-up is a hint."""
    rows = []
    for r in results:
        hint = followup_of(r, symptoms)
        rows.append(
            {
                "task_id": r.task_id,
                "attempt": r.attempt,
                "status": r.status,
                "end_reason": r.end_reason,
                "grade_reason": r.grade_reason,
                "edited": r.edited,
                "followup": hint,
                "informative": hint is not None and informative_text(hint, min_words),
            }
        )
    return rows


def first_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """pass / fail / error counts, and the failures whose follow-up says something (the pairs)."""
    fails = [r for r in rows if r["status"] == "fail"]
    return {
        "pass": sum(r["status"] == "pass" for r in rows),
        "fail": len(fails),
        "error": sum(r["status"] == "error" for r in rows),
        "fail_with_followup": sum(r["followup"] is not None for r in fails),
        "fail_informative": sum(r["informative"] for r in fails),
    }


def informative_text(text: str, min_words: int) -> bool:
    import polars as pl

    return bool(informative(pl.Series([text]), followup.DISSATISFIED, min_words)[0])


def attach(pairs: list[dict], results: list, arm: str) -> None:
    """Each pair's passes in `arm` (its second attempts cycle over the pairs in order)."""
    by_id = {p["id"]: p for p in pairs}
    for p in pairs:
        p[arm] = []
    for r in results:
        by_id[r.task_id][arm].append(r.status == "pass" if r.status != "error" else None)


def summarize(pairs: list[dict], first_attempts: int) -> dict[str, Any]:
    """Pass rates without and with the hint, the paired difference and McNemar (module docstring)."""
    usable = [p for p in pairs if _rate(p.get("without")) is not None and _rate(p.get("with")) is not None]
    y0 = [_rate(p["without"]) for p in usable]
    y1 = [_rate(p["with"]) for p in usable]
    ones = [1.0] * len(usable)
    est = stats.paired_difference(y0, ones, y1, ones)
    singles = [
        (bool(p["with"][0]), bool(p["without"][0])) for p in usable if None not in (p["with"][0], p["without"][0])
    ]
    mc = stats.mcnemar_exact(singles)
    better = est.low is not None and est.low > 0
    return {
        "first_attempts": first_attempts,
        "pairs": len(pairs),
        "usable_pairs": len(usable),
        "pass_without": sum(y0) / len(y0) if y0 else None,
        "pass_with": sum(y1) / len(y1) if y1 else None,
        "difference": est.value,
        "ci95": [est.low, est.high],
        "mcnemar": {"with_only": mc.candidate_only, "without_only": mc.baseline_only, "p": mc.p_value},
        "verdict": "hinted better" if better else "not shown: the teacher has nothing to teach yet",
    }


def _rate(passes: list | None) -> float | None:
    got = [x for x in passes or [] if x is not None]
    return sum(got) / len(got) if got else None


def format_report(r: dict[str, Any]) -> str:
    def p(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lo, hi = r["ci95"]
    ci = "n/a" if lo is None else f"[{100 * lo:+.1f}, {100 * hi:+.1f}] points"
    return "\n".join(
        [
            f"precondition: {r['usable_pairs']} paired sessions (of {r['pairs']} hints from {r['first_attempts']} first attempts)",
            f"  second attempt without the hint  {p(r['pass_without'])}",
            f"  second attempt with the hint     {p(r['pass_with'])}",
            f"  with - without                   {p(r['difference'])}  95% CI {ci}",
            f"  McNemar (single attempts)        with only {r['mcnemar']['with_only']}, without only "
            f"{r['mcnemar']['without_only']}, p = {r['mcnemar']['p']:.3g}",
            f"  verdict                          {r['verdict']}",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
