"""In-process sampling in bfloat16 and float32 against the float32 trainer's scoring of the
same ids: per-token |logprob difference| and the per-sequence ratio e^(sum of differences), and
tokens/s of each side in the same run. docs/performance.md, "The CPU default dtype".

    .venv/bin/python scripts/measure_dtype_agreement.py MODEL_DIR    # e.g. rlcycle init-model --preset smollm2-135m
"""

import math
import statistics
import sys
import time

from transformers import AutoTokenizer

from rlcycle.harness import ChatRenderer
from rlcycle.harness.demos import reference_transcript
from rlcycle.policy.base import SamplingParams
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
from rlcycle.tasks import load_suite

model = sys.argv[1]
tok = AutoTokenizer.from_pretrained(model)
r = ChatRenderer(tok)
tasks = load_suite("sample_data/edit_tasks/train")[:8]

prompts = [reference_transcript(t, r).ids[:600] for t in tasks]
ref = HFPolicy.from_pretrained(model, HFPolicyConfig(device="cpu", dtype="float32", num_threads=2))
for dtype in ("bfloat16", "float32"):
    p = HFPolicy.from_pretrained(model, HFPolicyConfig(device="cpu", dtype=dtype, num_threads=2))
    t = time.perf_counter()
    gens = p.generate(
        prompts, [SamplingParams(max_new_tokens=48, temperature=1.0, seed=i) for i in range(len(prompts))]
    )
    dt = time.perf_counter() - t
    d, seq = [], []
    for pr, g in zip(prompts, gens, strict=True):
        s = ref.score(pr, g.token_ids, temperature=1.0)
        dd = [a - b for a, b in zip(g.logprobs, s, strict=True)]
        d += [abs(x) for x in dd]
        seq.append(math.exp(sum(s) - sum(g.logprobs)))
    d.sort()
    ntok = sum(len(g.token_ids) for g in gens)
    print(
        f"{dtype}: {ntok} tokens in {dt:.1f}s ({ntok / dt:.1f} tok/s incl. prefill); |dlogprob| mean {statistics.mean(d):.2e} p99 {d[int(0.99 * len(d)) - 1]:.2e} max {d[-1]:.2e}; seq ratio min {min(seq):.3f} max {max(seq):.3f}"
    )
    p.close()
