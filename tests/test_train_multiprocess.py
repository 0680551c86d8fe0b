"""2 real processes == 1 process on the same global batch (issue #6, point 5).

`rlcycle train ... --processes 2` re-runs itself under torchrun; each process must see world
size 2 under Accelerate (MULTI_CPU here), take half of each global batch, and the update must
equal the one-process update with gradient accumulation (2 micro-batches), within float
tolerance (SGD, so the weight change is the gradient itself, not Adam's normalised step).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from train_data import make_base, make_rows, write_examples

from rlcycle import io as rio
from rlcycle.train import checkpoint as C
from rlcycle.train import stage
from rlcycle.train.config import TrainConfig

COMMON = dict(optimizer="sgd", lr=0.5, batch_size=3, epochs=1, max_seq_len=24, save_every=0)


@pytest.mark.slow
def test_two_processes_equal_one_process_with_accumulation(cli, tmp_path):
    base = make_base(tmp_path / "base")
    ex = write_examples(tmp_path / "ex.arrow", base, make_rows(7, seed=5), versions=[C.checkpoint_id(base)] * 7)

    # 7 rows, 3 per step: steps of 3, 3 and 1 rows; in the last, process 1 has no row and runs
    # a zero-coefficient pass so the all-reduce still meets. One process, a 24-token budget:
    # each 3-row global batch takes >= 2 forward passes.
    one = stage.run(TrainConfig(**COMMON, micro_batch_tokens=24), ex, base, tmp_path / "one", quiet=True)
    m1 = rio.read_table(tmp_path / "one" / stage.METRICS_FILE).to_pylist()
    assert one.world_size == 1 and [m["micro_batches"] >= 2 for m in m1] == [True, True, False]

    # Two processes through the real CLI (torchrun children run `-m rlcycle train ...`), a
    # budget so large each process makes one pass.
    sets = [f"{k}={v}" for k, v in {**COMMON, "micro_batch_tokens": 512}.items()]
    args = ["train", str(ex), "--base", str(base), "-o", str(tmp_path / "two"), "--processes", "2", "--quiet"]
    for s in sets:
        args += ["--set", s]
    result = cli(args)
    assert result.exit_code == 0, result.output
    m2 = rio.read_table(tmp_path / "two" / stage.METRICS_FILE).to_pylist()
    assert [m["world_size"] for m in m2] == [2, 2, 2]  # recorded by the processes themselves
    assert [m["micro_batches"] for m in m2] == [2, 2, 1]  # one pass per process with rows
    for a, b in zip(m1, m2, strict=True):
        # The loss sums O(1) terms of both signs: compare absolutely.
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["loss_tokens"] == b["loss_tokens"] and a["tokens"] == b["tokens"]

    w1 = load_file(str(tmp_path / "one" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "model.safetensors"))
    w0 = load_file(str(base / "model.safetensors"))
    moved = max((w1[k] - w0[k]).abs().max().item() for k in w0)
    assert moved > 1e-3  # the update is real, so agreeing is not trivial
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=1e-5, rtol=1e-4, msg=k)
    meta = json.loads((tmp_path / "two" / "rlcycle.json").read_text())
    assert meta["id"] == C.content_id(tmp_path / "two")
