"""The in-process transformers backend: seeds, batching, stops, and exact logprobs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlcycle.errors import InputError
from rlcycle.policy.base import SamplingParams
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig, sample_step, top_p_filter

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
TEXTS = [
    "def add(a, b):",
    "Fix the failing test in app.py please",
    "import os\nprint(os.getcwd())\n# now list the files in the repository root",
    "x",
    "class Cache:\n    def get(self, key):\n        return self.data[key]\n",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices gain nothing from more threads, and a busy machine makes them slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def policy():
    from transformers import AutoTokenizer

    from rlcycle.model_init import InitModelConfig, build_model

    tok = AutoTokenizer.from_pretrained(str(SAMPLE / "tokenizer"))
    model = build_model(InitModelConfig(seed=0), tok)
    return HFPolicy(model, tok, HFPolicyConfig(num_threads=1), name="tiny-test")


@pytest.fixture(scope="module")
def prompts(policy):
    return [policy.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def forward_logits(policy, ids):
    """Logits of every position from one plain forward pass (no cache, no padding)."""
    with torch.inference_mode():
        return policy.model(input_ids=torch.tensor([ids])).logits[0].float()


def test_same_seed_same_result_different_seed_different(policy, prompts):
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7, stop_token_ids=(99999,))
    a = policy.generate(prompts, sp)
    b = policy.generate(prompts, sp)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    c = policy.generate(prompts, SamplingParams(max_new_tokens=12, seed=8, stop_token_ids=(99999,)))
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    for g in a:
        assert len(g.token_ids) == len(g.logprobs) == 12 and g.finish_reason == "length"
        assert g.latency_ms > 0


@pytest.mark.parametrize("batched_prefill", [False, True])
def test_batched_equals_unbatched(policy, prompts, batched_prefill):
    """Prompt i of a batch with seed s is the prompt alone with seed s + i."""
    sp = SamplingParams(max_new_tokens=16, temperature=0.9, seed=100)
    config = HFPolicyConfig(num_threads=1, batched_prefill=batched_prefill)
    batched = HFPolicy(policy.model, policy.tokenizer, config).generate(prompts, sp)
    for i, p in enumerate(prompts):
        [alone] = policy.generate([p], SamplingParams(max_new_tokens=16, temperature=0.9, seed=100 + i))
        assert alone.token_ids == batched[i].token_ids
        assert alone.finish_reason == batched[i].finish_reason
        assert max(abs(x - y) for x, y in zip(alone.logprobs, batched[i].logprobs, strict=True)) < 1e-4


def test_per_prompt_params_in_one_batch(policy, prompts):
    plist = [
        SamplingParams(
            max_new_tokens=3 + i,
            temperature=[0.5, 1.0, 0.0, 1.3, 0.8][i],
            top_p=[1.0, 0.9, 1.0, 0.5, 0.95][i],
            seed=1000 + i,
        )
        for i in range(5)
    ]
    batched = policy.generate(prompts, plist)
    small = HFPolicy(policy.model, policy.tokenizer, HFPolicyConfig(max_batch_size=2, num_threads=1))
    chunked = small.generate(prompts, plist)
    for i, (p, sp) in enumerate(zip(prompts, plist, strict=True)):
        [alone] = policy.generate([p], sp)
        assert alone.token_ids == batched[i].token_ids == chunked[i].token_ids
        assert len(batched[i].token_ids) <= sp.max_new_tokens


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_separate_forward_pass(policy, prompts, temperature):
    """The train/inference mismatch check: log_softmax(logits / T) of the sampled tokens."""
    gens = policy.generate(prompts, SamplingParams(max_new_tokens=16, temperature=temperature, seed=3))
    worst = 0.0
    for p, g in zip(prompts, gens, strict=True):
        logits = forward_logits(policy, p + g.token_ids)
        logp = torch.log_softmax(logits[len(p) - 1 : -1] / temperature, dim=-1)
        recomputed = logp.gather(-1, torch.tensor(g.token_ids).unsqueeze(-1)).squeeze(-1)
        worst = max(worst, (recomputed - torch.tensor(g.logprobs)).abs().max().item())
        assert policy.score(p, g.token_ids, temperature) == pytest.approx(recomputed.tolist(), abs=1e-4)
    assert worst < 1e-4


def test_top_p_logprob_is_of_the_truncated_renormalised_distribution(policy, prompts):
    T, P = 1.2, 0.6
    gens = policy.generate(prompts, SamplingParams(max_new_tokens=8, temperature=T, top_p=P, seed=5))
    for p, g in zip(prompts, gens, strict=True):
        logits = forward_logits(policy, p + g.token_ids)
        for k, (tok, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=True)):
            logq = torch.log_softmax(logits[len(p) - 1 + k].double() / T, dim=-1)
            order = torch.argsort(logq, descending=True, stable=True)
            probs = logq[order].exp()
            n_keep = int(((torch.cumsum(probs, 0) - probs) < P).sum())
            nucleus = order[:n_keep]
            assert tok in set(nucleus.tolist())
            expected = logq[tok] - torch.logsumexp(logq[nucleus], 0)
            assert lp == pytest.approx(expected.item(), abs=1e-4)


def test_greedy_takes_the_argmax_and_reports_the_t1_logprob(policy, prompts):
    [g] = policy.generate([prompts[1]], SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(99999,)))
    ids = prompts[1]
    for tok, lp in zip(g.token_ids, g.logprobs, strict=True):
        logp = torch.log_softmax(forward_logits(policy, ids)[-1], -1)
        assert tok == int(logp.argmax()) and lp == pytest.approx(logp[tok].item(), abs=1e-4)
        ids = ids + [tok]


def test_stops_at_a_stop_token_and_includes_it(policy, prompts):
    sp = SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=(99999,))
    [g] = policy.generate([prompts[0]], sp)
    stop = g.token_ids[3]
    first = g.token_ids.index(stop)
    [s] = policy.generate([prompts[0]], SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=(stop,)))
    assert s.token_ids == g.token_ids[: first + 1] and s.finish_reason == "stop"
    assert policy.default_stops >= {0, 2}  # <|endoftext|> and <|im_end|>


def test_context_limit_ends_with_length(policy):
    from rlcycle.model_init import InitModelConfig, build_model

    model = build_model(InitModelConfig(seed=1, max_position_embeddings=32), policy.tokenizer)
    short = HFPolicy(model, policy.tokenizer, policy.config)
    gens = short.generate([[10] * 28, [11] * 32], SamplingParams(max_new_tokens=50, seed=0, stop_token_ids=(99999,)))
    assert len(gens[0].token_ids) == 4 and gens[0].finish_reason == "length"
    assert gens[1].token_ids == [] and gens[1].finish_reason == "length"


def test_bad_inputs_are_input_errors(policy):
    with pytest.raises(InputError):
        policy.generate([[]], SamplingParams())
    with pytest.raises(InputError):
        policy.generate([[5, 10**6]], SamplingParams())
    with pytest.raises(InputError):
        policy.generate([[5], [6]], [SamplingParams()])
    for bad in ({"temperature": -1}, {"top_p": 0}, {"max_new_tokens": 0}, {"temperature": math.nan}):
        with pytest.raises(InputError):
            SamplingParams(**bad)


def test_sample_step_draws_from_the_stated_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0])
    n = 40_000
    logits = probs.clamp_min(1e-30).log().expand(n, -1).clone()
    u = torch.rand(n, dtype=torch.float64)
    tokens, lps = sample_step(logits, torch.ones(n), torch.ones(n), u)
    freq = torch.bincount(tokens, minlength=5).double() / n
    assert torch.allclose(freq, probs.double(), atol=0.01) and freq[4] == 0
    assert torch.allclose(lps, probs.log()[tokens], atol=1e-5)
    # top_p = 0.6 keeps {0, 1} (mass before token 1 is 0.5 < 0.6) renormalised to 2/3, 1/3
    tokens, lps = sample_step(logits, torch.ones(n), torch.full((n,), 0.6), u)
    freq = torch.bincount(tokens, minlength=5).double() / n
    assert torch.allclose(freq, torch.tensor([2 / 3, 1 / 3, 0, 0, 0], dtype=torch.float64), atol=0.01)
    assert torch.allclose(lps[tokens == 0], torch.tensor(2 / 3).log(), atol=1e-5)


def test_top_p_filter_keeps_at_least_the_top_token():
    logp = torch.log_softmax(torch.tensor([[5.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), -1)
    out = top_p_filter(logp, torch.tensor([0.01, 1.0]))
    assert out[0, 0] == 0.0 and torch.isinf(out[0, 1:]).all()
    assert torch.equal(out[1], logp[1])


def test_open_policy_picks_the_backend(tmp_path, policy):
    from rlcycle.policy.open import kind_of, open_policy
    from rlcycle.policy.registry import checkpoint_id

    policy.model.save_pretrained(tmp_path / "m")
    policy.tokenizer.save_pretrained(tmp_path / "m")
    opened = open_policy(tmp_path / "m", options={"device": "cpu"})
    assert isinstance(opened.policy, HFPolicy) and opened.name == checkpoint_id(tmp_path / "m")
    opened.close()
    assert kind_of("http://127.0.0.1:9/v1") == "http" and kind_of("scripted:nothing") == "scripted"
    with pytest.raises(InputError, match="not a directory, and no registry"):
        open_policy(tmp_path / "missing")
    with pytest.raises(InputError, match="unknown option"):
        open_policy(tmp_path / "m", options={"temprature": 1})


def test_prefix_cache_reuses_turns_and_matches_a_cold_run(policy, prompts):
    """Turn 2 extends turn 1 (prompt + completion + tool text): only the new part is prefilled."""
    warm = HFPolicy(policy.model, policy.tokenizer, HFPolicyConfig(num_threads=1, prefix_cache_tokens=10_000))
    sp = SamplingParams(max_new_tokens=10, temperature=1.0, seed=21, stop_token_ids=(99999,))
    first = warm.generate(prompts[:3], sp)
    assert warm.prefix.hits == 0
    turn2 = [p + g.token_ids + [5, 200, 300, 6, 1] for p, g in zip(prompts, first, strict=False)]
    again = warm.generate(turn2, sp)
    # everything but the last sampled token (never fed back) comes from the cache
    assert warm.prefix.hits == sum(len(p) + len(g.token_ids) - 1 for p, g in zip(prompts, first, strict=False))
    cold = policy.generate(turn2, sp)
    for a, c in zip(again, cold, strict=True):
        assert a.token_ids == c.token_ids
        assert a.logprobs == pytest.approx(c.logprobs, abs=1e-4)
    # a group of identical prompts in one call: all but the first reuse the prompt's cache
    hits = warm.prefix.hits
    group = warm.generate([prompts[4]] * 4, sp)
    assert warm.prefix.hits - hits >= 3 * (len(prompts[4]) - 1)
    assert len({tuple(g.token_ids) for g in group}) > 1  # seeds s..s+3 still differ
    assert warm.prefix.tokens <= 10_000


def test_prefix_cache_respects_its_budget(policy, prompts):
    warm = HFPolicy(policy.model, policy.tokenizer, HFPolicyConfig(num_threads=1, prefix_cache_tokens=40))
    warm.generate(prompts, SamplingParams(max_new_tokens=8, seed=0))
    assert 0 < warm.prefix.tokens <= 40
