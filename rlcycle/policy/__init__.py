"""Generation backends behind one protocol: token ids in, token ids and logprobs out.

    from rlcycle.policy import open_policy, SamplingParams
    policy = open_policy("runs/demo/policy").policy     # or "production", "http://…", "scripted:reference"
    [gen] = policy.generate([prompt_ids], SamplingParams(max_new_tokens=256, seed=0))
    gen.token_ids, gen.logprobs, gen.finish_reason, gen.latency_ms

`open.open_policy` is the one way from a reference (registry alias or id, checkpoint directory,
`scripted:…`, `http(s)://…`) to an opened policy, here or on Ray workers. Backends: `hf.HFPolicy`
(in-process transformers), `http.HTTPPolicy` (vLLM, SGLang, the gateway), `scripted` (tests,
benches, demos). Heavy imports (torch, transformers) happen only when a backend is loaded.
"""

from rlcycle.policy.base import Generation, Policy, SamplingParams
from rlcycle.policy.open import PolicyConfig, open_policy

__all__ = ["Generation", "Policy", "PolicyConfig", "SamplingParams", "open_policy"]
