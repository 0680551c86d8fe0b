#!/usr/bin/env bash
# The edit-suite experiment of docs/closed_loop.md ("configuration B"), one seed, from nothing:
#
#   bash scripts/edit_experiment.sh 3                 # -> runs/exp_b_s3 (report.txt, report.json, report/)
#   bash scripts/edit_experiment.sh 4 runs/my_exp     # another seed, another output directory
#   MEASURE=128 bash scripts/edit_experiment.sh 6     # configuration C: 128 paired measure sessions
#   PLAN=1 bash scripts/edit_experiment.sh 3          # print the runs and their configs; no start, no runs
#   HELDOUT=0 bash scripts/edit_experiment.sh 3       # without the held-out measure runs
#
# 1. the stand-in traffic: the 16 `edit-range-*` and `edit-return-*` tasks of
#    sample_data/edit_tasks/train (the two families the warm start solves sometimes, neither
#    never nor always) copied into runs/edit_rr;
# 2. the start: `rlcycle init-model --warm-start sample_data/edit_tasks/train` (250 steps, batch 4,
#    cosine, lr 4e-3; ~5 min on 2 cores) into runs/edit_start, made once and reused;
# 3. experiments/closed_loop/run.py with arms treatment and control, 2 cycles of 64 sessions,
#    every version measured on the same 64 fresh sessions (v0 too), paired comparisons;
# 4. held-out (unless HELDOUT=0): the 8 `edit-range-*`/`edit-return-*` variants of
#    sample_data/edit_tasks/heldout (the same two families; neither the warm start nor any arm
#    saw them) copied into runs/edit_rr_heldout, v0 and each arm's last version measured there
#    on the same MEASURE fresh sessions.
# Needs the Docker engine (scripts/ensure_docker.sh) and the venv (scripts/dev.sh setup).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED="${1:?usage: scripts/edit_experiment.sh SEED [OUT]}"
MEASURE="${MEASURE:-64}"
OUT="${2:-runs/exp_b_s$SEED}"
PY=.venv/bin/python
TASKS=runs/edit_rr
HELD=runs/edit_rr_heldout
START=runs/edit_start

if [ ! -d "$TASKS" ]; then
  mkdir -p "$TASKS.tmp"
  cp -r sample_data/edit_tasks/train/edit-range-* sample_data/edit_tasks/train/edit-return-* "$TASKS.tmp"/
  mv "$TASKS.tmp" "$TASKS"
fi
if [ ! -d "$HELD" ]; then
  mkdir -p "$HELD.tmp"
  cp -r sample_data/edit_tasks/heldout/edit-range-* sample_data/edit_tasks/heldout/edit-return-* "$HELD.tmp"/
  mv "$HELD.tmp" "$HELD"
fi
HELD_FLAG=(--heldout "$HELD")
if [ "${HELDOUT:-1}" = 0 ]; then HELD_FLAG=(); fi
PLAN_FLAG=()
if [ -n "${PLAN:-}" ]; then
  PLAN_FLAG=(--plan)
elif [ ! -f "$START/config.json" ]; then
  .venv/bin/rlcycle init-model -o "$START" --warm-start sample_data/edit_tasks/train --warm-start-steps 250 \
    --set warm_start_batch=4 --set warm_start_schedule=cosine --set warm_start_lr=4e-3 --force
fi
exec "$PY" experiments/closed_loop/run.py "${PLAN_FLAG[@]}" --arms treatment,control --cycles 2 --episodes 64 \
  --measure-episodes "$MEASURE" --start "$START" --tasks "$TASKS" "${HELD_FLAG[@]}" --seed "$SEED" --out "$OUT" \
  --set reward_spec="$PWD/sample_data/rewards.toml" \
  --set simulate.runner.temperature=0.5 --set simulate.runner.max_turns=3 --set simulate.runner.max_new_tokens=96 \
  --set train.use_sample_temperature=true --set train.lr=1e-4 --set train.epochs=1 \
  --set eval.runner.temperature=0.5 --set eval.runner.max_turns=3 --set eval.runner.max_new_tokens=96 --set eval.max_tasks=16 \
  --set eval.gates.max_latency_ratio=5.0 --set eval.gates.max_invalid_rate_increase=0.05
