"""The deploy hook's two rules on a real vLLM, on real trained updates: does each pass the honest
deploy and fail the server that still answers with older weights? docs/vllm.md, "The update rule".

    .venv/bin/python scripts/measure_deploy_rule.py URL START C1 C2 [C3 ...]

URL serves START (e.g. `rlcycle serve --policy START`, bf16); C1 is a LoRA
checkpoint trained from START, C2 from C1 (continue_adapter), and so on: a chain of cycles, as
the SmolLM2 experiment writes them. For each Ck (previous version P = C(k-1), or none for C1),
three servers are imitated by what is loaded under a fresh name:
  honest  Ck's own adapter;
  stale   P's adapter (C1: skipped, its previous version is START itself);
  base    Ck's adapter with every lora_B zeroed: exactly START's weights, through the LoRA path.
and both rules are applied as the hook applies them (rlcycle.deploy.vllm: the absolute
tolerance on the largest per-token |diff|, and --relative's update rule with START and P, P loaded
under its own name, as references). One JSON line per case on stdout, a table on stderr.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from rlcycle.deploy.vllm import PREFIX, Forced, Local, Report, Server, check, update_rule
from rlcycle.policy.registry import checkpoint_id

TOLERANCE = 0.6  # the bf16 hook tolerance of rlcycle/configs/vllm.toml


def zero_adapter(adapter: Path, out: Path) -> Path:
    """A copy of `adapter` whose lora_B weights are all zero: the base's weights exactly."""
    shutil.copytree(adapter, out)
    weights = out / "adapter_model.safetensors"
    tensors = load_file(weights)
    save_file({k: (v.zero_() if "lora_B" in k else v) for k, v in tensors.items()}, weights)
    return out


def main() -> None:
    url, start, chain = sys.argv[1], Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
    server = Server(url, None, 300.0)
    root_model = next(str(m["id"]) for m in server.models() if not m.get("parent"))
    tmp = Path(tempfile.mkdtemp(prefix="deploy-rule-"))
    rows = []
    for k, ckpt in enumerate(chain):
        prev = chain[k - 1] if k else None
        refs = {"base": (root_model, start)}
        if prev is not None:
            prev_name = PREFIX + "prev-" + str(k)
            server.load(prev_name, str((prev / "adapter").resolve()))
            refs["previous"] = (prev_name, prev)
        local = Local(ckpt, "cpu")
        cases = {"honest": ckpt / "adapter", "base": zero_adapter(ckpt / "adapter", tmp / f"zero-{k}")}
        if prev is not None:
            cases["stale"] = prev / "adapter"
        for case, adapter in cases.items():
            name = f"{PREFIX}probe-{k}-{case}"
            server.load(name, str(adapter.resolve()))
            report = Report(name, checkpoint_id(ckpt), True, TOLERANCE)
            forced = Forced(server, local)
            check(forced, name, report)
            absolute = report.passed
            report.passed = True
            update_rule(forced, name, report, refs, "cpu")
            server.unload(name)
            row = {
                "version": f"c{k + 1}",
                "case": case,
                "prompt_max_diff": report.prompt_max_diff,
                "decode_max_diff": report.decode_max_diff,
                "prompt_mean_diff": report.prompt_mean_diff,
                "absolute_passes": absolute,
                "relative_passes": report.passed,
                "relative": report.relative,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        if prev is not None:
            server.unload(refs["previous"][0])
    shutil.rmtree(tmp)
    sys.stderr.write(
        f"\n{'version':8} {'case':7} {'max |diff|':>10} {'mean':>7} {'tol ' + str(TOLERANCE):>8}  seen(base) moved(base)  seen(prev) moved(prev) relative\n"
    )
    for r in rows:
        b, p = r["relative"].get("base", {}), r["relative"].get("previous", {})

        def f(x, spec):
            return format(x, spec) if isinstance(x, float) else "-"

        sys.stderr.write(
            f"{r['version']:8} {r['case']:7} {max(r['prompt_max_diff'], r['decode_max_diff']):10.3f} "
            f"{r['prompt_mean_diff']:7.4f} {'pass' if r['absolute_passes'] else 'FAIL':>8}  "
            f"{f(b.get('seen'), '10.2f')} {f(b.get('moved'), '10.4f')}  {f(p.get('seen'), '10.2f')} "
            f"{f(p.get('moved'), '11.4f')} {'pass' if r['relative_passes'] else 'FAIL'}\n"
        )


if __name__ == "__main__":
    main()
