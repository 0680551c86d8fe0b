#!/usr/bin/env bash
# The precondition of hinted self-distillation (issue 37 item 4; docs/hints.md, "The precondition
# and the experiment") on SmolLM2-135M served by vLLM, from nothing:
#
#   bash experiments/hints/run_precondition.sh                        # -> runs/hints_pre_s0/precondition.json
#   SESSIONS=16 bash experiments/hints/run_precondition.sh 0 runs/hints_pre_pilot
#
# Steps 1-3 are scripts/smollm2_experiment.sh's (both source scripts/smollm2_start.sh) (the fixed split under
# runs/smol2/, the warm-started start model, one vLLM serving it in float32), so the precondition
# measures exactly the start every arm of the experiment begins from; both reuse runs/smol2/ when
# it is there. Then experiments/hints/precondition.py on the traffic tasks with the informative
# user, and the vLLM is stopped (on success and on failure).
#
# Arguments: SEED (0: precondition.py's --seed) and OUT (runs/hints_pre_s$SEED). Environment:
# SESSIONS (64 first attempts), UNDERSPECIFIED (0.5), ATTEMPTS (1 second attempt per pair and arm),
# EXTRA (more precondition.py flags, e.g. EXTRA=--symptom-when-unchanged, the exploratory hints),
# and the experiment's PORT (8311), DTYPE (float32), WARM_STEPS (12), SMOL_DIR (runs/smol2).
# Needs what scripts/smollm2_experiment.sh step 0 installs: .venv, .venv-vllm, Docker and the
# sandbox image (this script installs nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED="${1:-0}"
OUT="${2:-runs/hints_pre_s$SEED}"
SESSIONS="${SESSIONS:-64}"
UNDERSPECIFIED="${UNDERSPECIFIED:-0.5}"
ATTEMPTS="${ATTEMPTS:-1}"
PORT="${PORT:-8311}"
DTYPE="${DTYPE:-float32}"
WARM_STEPS="${WARM_STEPS:-12}"
PY=.venv/bin/python
RL=(.venv/bin/python -m rlcycle)
W="${SMOL_DIR:-runs/smol2}"
log() { printf '[precondition] %s\n' "$*" >&2; }

# --- 1-3. the split, the start, vLLM (scripts/smollm2_start.sh, as the experiment runs them) --
source scripts/smollm2_start.sh
smol_split
START="$W/start"
smol_start "$WARM_STEPS"
mkdir -p "$OUT"
smol_serve "$PORT" "$DTYPE"

# --- the precondition ----------------------------------------------------------------------
# The experiment's sampling and sizes (experiments/closed_loop/smollm2.toml [cycle.simulate]:
# 16 sandboxes and sessions at once, temperature 0.7, 160 new tokens, 3 turns).
start_s=$SECONDS
"$PY" experiments/hints/precondition.py --policy "$URL" --tokenizer "$START" --tasks "$W/traffic" \
  --sessions "$SESSIONS" --underspecified "$UNDERSPECIFIED" --attempts "$ATTEMPTS" --seed "$SEED" \
  --out "$OUT" --config experiments/closed_loop/smollm2.toml ${EXTRA:-} | tee "$OUT/report.txt"
log "precondition took $((SECONDS - start_s)) s; $OUT/precondition.json"
