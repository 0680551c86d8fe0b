#!/usr/bin/env bash
# The precondition of hinted self-distillation (issue 37 item 4; docs/hints.md, "The precondition
# and the experiment") on SmolLM2-135M served by vLLM, from nothing:
#
#   bash experiments/hints/run_precondition.sh                        # -> runs/hints_pre_s0/precondition.json
#   SESSIONS=16 bash experiments/hints/run_precondition.sh 0 runs/hints_pre_pilot
#
# Steps 1-3 are scripts/smollm2_experiment.sh's, command for command (the fixed split under
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
FAMILIES=(compare default range rename return string)
log() { printf '[precondition] %s\n' "$*" >&2; }

# --- 1. the split (scripts/smollm2_experiment.sh step 1) -----------------------------------
copy_suite() {  # DST SRC PATTERN...: a task suite made once (tmp dir, then rename)
  local dst="$1" src="$2"; shift 2
  [ -d "$dst" ] && return 0
  mkdir -p "$dst.tmp"
  for p in "$@"; do cp -r "$src"/$p "$dst.tmp"/; done
  mv "$dst.tmp" "$dst"
}
WARM=() TRAFFIC=()
for f in "${FAMILIES[@]}"; do
  for v in 00 01 02 03; do WARM+=("edit-$f-$v"); done
  for v in 04 05 06 07; do TRAFFIC+=("edit-$f-$v"); done
done
copy_suite "$W/warm_tasks" sample_data/edit_tasks/train "${WARM[@]}"
copy_suite "$W/traffic" sample_data/edit_tasks/train "${TRAFFIC[@]}"

# --- 2. the start (step 2) -----------------------------------------------------------------
START="$W/start"
if [ ! -f "$START/config.json" ]; then
  log "warm start (minutes on 2 cores)"
  "${RL[@]}" init-model -o "$START" --preset smollm2-135m --warm-start "$W/warm_tasks" --warm-start-steps "$WARM_STEPS" \
    --set warm_start_batch=4 --set warm_start_schedule=cosine --force
fi

# --- 3. vLLM (step 3) ----------------------------------------------------------------------
mkdir -p "$W" "$OUT"
"${RL[@]}" serve --policy "$START" --port "$PORT" --dtype "$DTYPE" --set log="$W/vllm.log" > "$W/serve.out" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 300); do grep -q '^http' "$W/serve.out" 2>/dev/null && break; kill -0 $SERVE || exit 1; sleep 1; done
URL="$(grep -m1 '^http' "$W/serve.out")"
log "vLLM at $URL"

# --- the precondition ----------------------------------------------------------------------
# The experiment's sampling and sizes (experiments/closed_loop/smollm2.toml [cycle.simulate]:
# 16 sandboxes and sessions at once, temperature 0.7, 160 new tokens, 3 turns).
start_s=$SECONDS
"$PY" experiments/hints/precondition.py --policy "$URL" --tokenizer "$START" --tasks "$W/traffic" \
  --sessions "$SESSIONS" --underspecified "$UNDERSPECIFIED" --attempts "$ATTEMPTS" --seed "$SEED" \
  --out "$OUT" --config experiments/closed_loop/smollm2.toml ${EXTRA:-} | tee "$OUT/report.txt"
log "precondition took $((SECONDS - start_s)) s; $OUT/precondition.json"
