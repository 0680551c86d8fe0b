# Steps 1-3 of the SmolLM2 experiment, shared by scripts/smollm2_experiment.sh and
# experiments/hints/run_precondition.sh (sourced, from the repository root, after they define
# `log`, `RL` and `W`), so the precondition measures exactly the start every arm begins from:
#   smol_split             the fixed split under $W (warm_tasks: variants 00-03 of the six edit
#                          families, traffic: 04-07), each suite made once;
#   smol_start STEPS       the warm-started start model $W/start (once);
#   smol_serve PORT DTYPE  one vLLM on it in the background: sets SERVE and URL, stops it on EXIT.

smol_copy_suite() {  # DST SRC PATTERN...: a task suite made once (tmp dir, then rename)
  local dst="$1" src="$2"; shift 2
  [ -d "$dst" ] && return 0
  mkdir -p "$dst.tmp"
  for p in "$@"; do cp -r "$src"/$p "$dst.tmp"/; done
  mv "$dst.tmp" "$dst"
}

smol_split() {
  local warm=() traffic=() f v
  for f in compare default range rename return string; do
    for v in 00 01 02 03; do warm+=("edit-$f-$v"); done
    for v in 04 05 06 07; do traffic+=("edit-$f-$v"); done
  done
  smol_copy_suite "$W/warm_tasks" sample_data/edit_tasks/train "${warm[@]}"
  smol_copy_suite "$W/traffic" sample_data/edit_tasks/train "${traffic[@]}"
}

smol_start() {
  [ -f "$W/start/config.json" ] && return 0
  log "warm start (minutes on 2 cores)"
  "${RL[@]}" init-model -o "$W/start" --preset smollm2-135m --warm-start "$W/warm_tasks" --warm-start-steps "$1" \
    --set warm_start_batch=4 --set warm_start_schedule=cosine --force
}

smol_serve() {
  mkdir -p "$W"
  "${RL[@]}" serve --policy "$W/start" --port "$1" --dtype "$2" --set log="$W/vllm.log" > "$W/serve.out" &
  SERVE=$!
  trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
  for _ in $(seq 300); do grep -q '^http' "$W/serve.out" 2>/dev/null && break; kill -0 $SERVE || exit 1; sleep 1; done
  URL="$(grep -m1 '^http' "$W/serve.out")"
  log "vLLM at $URL"
}
