"""The warm start's pieces: the shared-prefix loss equals the plain loss, the schedule, and the
batched, scheduled warm start through the CLI (`--set warm_start_batch=... warm_start_schedule=...`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlcycle.model_init import (
    InitModelConfig,
    _lr_factor,
    _prefix_cached_loss,
    _shared_prefix,
    build_model,
)

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "sample_data" / "edit_tasks" / "train"


@pytest.fixture(scope="module")
def demos_and_model():
    from rlcycle.harness import ChatRenderer
    from rlcycle.harness.demos import reference_transcript
    from rlcycle.policy.scripted import load_tokenizer
    from rlcycle.tasks import load_suite

    tok = load_tokenizer(None)
    renderer = ChatRenderer(tok)
    demos = [(tr.ids, tr.mask) for tr in (reference_transcript(t, renderer) for t in load_suite(SUITE)[:3])]
    return demos, build_model(InitModelConfig(max_position_embeddings=2048), tok)


def test_the_shared_prefix_loss_is_the_plain_loss(demos_and_model):
    demos, model = demos_and_model
    prefix = _shared_prefix(demos)
    assert 500 < prefix < min(d[1].index(1) for d in demos)  # the system prompt and tool list, no trained token
    cached = float(_prefix_cached_loss(model, prefix, demos, 0).detach())
    plain = float(_prefix_cached_loss(model, 0, demos, 0).detach())  # no prefix: every transcript whole
    assert math.isclose(cached, plain, rel_tol=1e-4) and 7 < plain < 10  # ~ln(4096) untrained


def test_the_cosine_schedule_warms_up_then_decays_to_a_tenth():
    f = [_lr_factor(s, 100, "cosine") for s in range(100)]
    assert f[0] == 0.1 and f[9] == 1.0 and all(a >= b for a, b in zip(f[9:], f[10:], strict=False))
    assert math.isclose(f[-1], 0.1, abs_tol=0.01) and _lr_factor(50, 100, "constant") == 1.0


def test_cli_batched_cosine_warm_start(cli, tmp_path):
    r = cli(
        [
            "init-model",
            "-o",
            tmp_path / "m",
            "--warm-start",
            SUITE,
            "--warm-start-steps",
            2,
            "--set",
            "warm_start_batch=3",
            "--set",
            "warm_start_schedule=cosine",
            "--set",
            "max_position_embeddings=2048",
            "--json",
        ]
    )
    assert r.exit_code == 0, r.output
    warm = json.loads(r.stdout.strip().splitlines()[-1])["warm_start"]
    assert (warm["tasks"], warm["steps"], warm["batch"], warm["schedule"]) == (48, 2, 3, "cosine")
    bad = cli(["init-model", "-o", tmp_path / "x", "--set", "warm_start_schedule=linear"])
    assert bad.exit_code == 2 and "warm_start_schedule='linear'" in bad.error
