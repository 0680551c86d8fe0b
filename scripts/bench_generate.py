"""Benchmark: rlcycle's batched sampler (policy backend a) vs `model.generate` one prompt at a time.

Same model (the tiny default from `init-model`, seed 0, random weights; or `--model DIR`, any
checkpoint directory, e.g. SmolLM2-135M from `init-model --preset smollm2-135m`), same prompts (the
first prompt of N agent episodes rendered by the harness: system prompt + tools + a task), same
number of new tokens per prompt (no stop token, so both do the same work), same process. A fourth line turns
rlcycle's prefix KV cache on: every episode starts with the same system prompt and tool list,
so it is prefilled once instead of N times. Each
side runs `--runs` times, interleaved; the table (scripts/benchkit.py) prints the median
tokens/s and each side's ratio to `model.generate` one prompt at a time (the baseline). A
batched `model.generate` (left padding) is printed too, as a second reference.

A second table (`--turns`, default 3) runs whole multi-turn episodes the way the episode runner
does: turn k+1's prompt is turn k's prompt + completion + a tool result. rlcycle runs them
batched with its prefix KV cache on (`prefix_cache_tokens`), `model.generate` one prompt at a
time re-reads the whole conversation every turn.

    .venv/bin/python scripts/bench_generate.py                  # 16 episodes, 64 tokens each
    .venv/bin/python scripts/bench_generate.py --episodes 8 --max-new-tokens 32 --threads 2
    .venv/bin/python scripts/bench_generate.py --model runs/smol/policy --episodes 8 --threads 2
    .venv/bin/python scripts/bench_generate.py --episodes 2 --max-new-tokens 4 --runs 1 --json   # a quick look

Generated tokens only are counted (prefill is in the time, not in the count).
"""

from __future__ import annotations

import time

import benchkit

TASKS = [
    "Fix the off-by-one error in utils/pagination.py",
    "Add a --verbose flag to the CLI in cli.py",
    "The test test_parse_dates fails on leap years; make it pass",
    "Rename the function getUser to get_user everywhere",
    "Add type hints to models/order.py",
    "Cache the results of fetch_prices for 60 seconds",
    "Make the retry loop in client.py use exponential backoff",
    "Write a unit test for merge_configs",
]


def build(size: str, seed: int, device: str, model_dir: str | None = None):
    """(model float32, tokenizer): a checkpoint directory, or the random model of `size`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcycle.model_init import DEFAULT_TOKENIZER, InitModelConfig, build_model

    if model_dir:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        return model.to(device), tok
    tok = AutoTokenizer.from_pretrained(str(DEFAULT_TOKENIZER))
    model = build_model(InitModelConfig(seed=seed, size=size), tok).to(device)
    return model, tok


PAD = 7  # the pad id model.generate is given (set from the tokenizer in main)


def episode_prompts(tok, n: int) -> list[list[int]]:
    from rlcycle.harness import ChatRenderer, initial_messages

    renderer = ChatRenderer(tok)
    return [renderer.render(initial_messages(f"{TASKS[i % len(TASKS)]} (episode {i})"), True) for i in range(n)]


def run_rlcycle(policy, prompts, new_tokens: int) -> float:
    from rlcycle.policy import SamplingParams

    never = (policy.vocab_size + 1,)  # no stop token: every prompt gets exactly new_tokens
    t = time.perf_counter()
    gens = policy.generate(prompts, SamplingParams(max_new_tokens=new_tokens, seed=0, stop_token_ids=never))
    dt = time.perf_counter() - t
    return sum(len(g.token_ids) for g in gens) / dt


def run_generate_single(model, prompts, new_tokens: int) -> float:
    import torch

    n = 0
    t = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=model.device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=PAD,
            )
            n += out.shape[1] - ids.shape[1]
    return n / (time.perf_counter() - t)


def run_generate_batched(model, prompts, new_tokens: int) -> float:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids.to(model.device),
            attention_mask=mask.to(model.device),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=PAD,
        )
    return (out.shape[1] - width) * len(prompts) / (time.perf_counter() - t)


TOOL_RESULT = "\n<tool_response>\ndef add(a, b):\n    return a - b\n</tool_response>"


def run_episodes(gen_fn, prompts, tok, turns: int, new_tokens: int) -> float:
    """Tokens/s over `turns` turns; gen_fn(prompts) -> list of completion id lists."""
    suffix = tok(
        f"<|im_end|>\n<|im_start|>tool{TOOL_RESULT}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )["input_ids"]
    convs = [list(p) for p in prompts]
    n = 0
    t = time.perf_counter()
    for _ in range(turns):
        outs = gen_fn(convs, new_tokens)
        n += sum(len(o) for o in outs)
        convs = [c + o + suffix for c, o in zip(convs, outs, strict=True)]
    return n / (time.perf_counter() - t)


def rlcycle_turn(policy):
    from rlcycle.policy import SamplingParams

    def gen(convs, new_tokens):
        sp = SamplingParams(max_new_tokens=new_tokens, seed=0, stop_token_ids=(policy.vocab_size + 1,))
        return [g.token_ids for g in policy.generate(convs, sp)]

    return gen


def generate_turn(model):
    import torch

    def gen(convs, new_tokens):
        outs = []
        with torch.inference_mode():
            for c in convs:
                ids = torch.tensor([c], device=model.device)
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    pad_token_id=PAD,
                )
                outs.append(out[0, ids.shape[1] :].tolist())
        return outs

    return gen


BASELINE = "model.generate, one prompt at a time"


def parse_args():
    ap = benchkit.parser(__doc__, runs=3, runs_help="interleaved runs of every side")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3, help="turns per episode in the second table (0: skip)")
    ap.add_argument("--size", default="tiny", help="shape of the random model (without --model)")
    ap.add_argument("--model", default=None, help="a checkpoint directory instead of the random model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads for both sides (1 is fastest for the tiny model on a shared 2-core machine)",
    )
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    import torch  # after parsing, so `--help` does not pay for it

    torch.set_num_threads(args.threads)
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

    global PAD
    model, tok = build(args.size, 0, args.device, args.model)
    PAD = tok.pad_token_id if tok.pad_token_id is not None else 0
    name = args.model or args.size
    prompts = episode_prompts(tok, args.episodes)
    policy = HFPolicy(model, tok, HFPolicyConfig(device=args.device, max_batch_size=args.episodes))
    lens = [len(p) for p in prompts]
    title = (
        f"model {name} ({sum(p.numel() for p in model.parameters()):,} params), "
        f"{args.episodes} prompts of {min(lens)}-{max(lens)} tokens, {args.max_new_tokens} new "
        f"tokens each, device {args.device}, {args.threads} thread(s)"
    )
    run_rlcycle(policy, prompts[:2], 4)  # warm-up (allocator, kernels)
    budget = args.episodes * (max(lens) + args.max_new_tokens + 16)

    def with_prefix_cache(p, prompts, n):  # a fresh (empty) cache every run
        cached = HFPolicy(
            model, tok, HFPolicyConfig(device=args.device, max_batch_size=args.episodes, prefix_cache_tokens=budget)
        )
        return run_rlcycle(cached, prompts, n)

    sides = (
        ("rlcycle HFPolicy.generate, batched", run_rlcycle, policy),
        (BASELINE, run_generate_single, model),
        ("model.generate, batched (reference)", run_generate_batched, model),
        ("rlcycle batched + prefix cache", with_prefix_cache, None),
    )
    # Interleaved runs (A, B, C, A, B, C, ...): a load change on a shared machine hits
    # every side alike instead of biasing whichever ran during it.
    runs: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    for k in range(args.runs):
        for name, fn, target in sides:
            runs[name].append(fn(target, prompts, args.max_new_tokens))
        benchkit.progress(f"bench_generate: run {k + 1} of {args.runs} done")
    tables = [benchkit.Table(title, "tokens/s", baseline=BASELINE, samples=runs)]
    m = {k: benchkit.summary(v)["median"] for k, v in runs.items()}
    names = list(m)
    notes = [
        f"ratio rlcycle batched / model.generate one at a time: {m[names[0]] / m[names[1]]:.2f}x",
        f"ratio rlcycle batched / model.generate batched:       {m[names[0]] / m[names[2]]:.2f}x",
        f"ratio rlcycle + prefix cache (shared system prompt) / one at a time: {m[names[3]] / m[names[1]]:.2f}x",
    ]
    if args.turns > 0:
        tables.append(episodes(args, model, tok, prompts))
        ep = {k: benchkit.summary(v)["median"] for k, v in tables[-1].samples.items()}
        a, b = ep.values()
        notes.append(f"ratio rlcycle / model.generate one at a time (episodes): {a / b:.2f}x")
    benchkit.emit(args, "bench_generate", tables, notes)


def episodes(args, model, tok, prompts) -> benchkit.Table:
    """The multi-turn table: whole episodes, prefix cache on for rlcycle."""
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

    budget = args.episodes * (max(len(p) for p in prompts) + 4 * args.turns * args.max_new_tokens + 200)
    sides = (
        (
            "rlcycle batched + prefix cache",
            lambda: rlcycle_turn(
                HFPolicy(
                    model,
                    tok,
                    HFPolicyConfig(device=args.device, max_batch_size=args.episodes, prefix_cache_tokens=budget),
                )
            ),
        ),
        (BASELINE, lambda: generate_turn(model)),
    )
    runs: dict[str, list[float]] = {name: [] for name, _ in sides}
    for _ in range(args.runs):  # interleaved; a fresh policy (empty prefix cache) each time
        for name, make in sides:
            runs[name].append(run_episodes(make(), prompts, tok, args.turns, args.max_new_tokens))
    title = f"{args.turns}-turn episodes ({args.episodes} at once, {args.max_new_tokens} tokens per turn)"
    return benchkit.Table(title, "tokens/s", baseline=BASELINE, samples=runs)


if __name__ == "__main__":
    main()
