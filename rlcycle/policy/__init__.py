"""Generation backends behind one protocol: token ids in, token ids and logprobs out.

    from rlcycle.policy import load_policy, SamplingParams
    policy = load_policy("runs/demo/policy")          # or "http://127.0.0.1:8000"
    [gen] = policy.generate([prompt_ids], SamplingParams(max_new_tokens=256, seed=0))
    gen.token_ids, gen.logprobs, gen.finish_reason, gen.latency_ms

Backends: `hf.HFPolicy` (in-process transformers, the default), `http.HTTPPolicy` (vLLM, which
`rlcycle serve` starts, SGLang, or `rlcycle gateway`, whose /v1/completions serves the first as
the second expects).
Heavy imports (torch, transformers) happen only when a backend is loaded.
"""

from rlcycle.policy.base import Generation, Policy, SamplingParams
from rlcycle.policy.load import load_policy

__all__ = ["Generation", "Policy", "SamplingParams", "load_policy"]
