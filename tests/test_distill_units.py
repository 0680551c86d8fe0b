"""distill's pieces on their own: the follow-up classifier, caps, segments, spec validation."""

# ruff: noqa: F811  (dcli is a pytest fixture imported from distill_data)
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
import tomllib
from conftest import SAMPLE
from distill_data import T0, by_sample, dcli, distill, episode  # noqa: F401

from rlcycle.distill import DistillConfig, default_spec, load_spec, parse_spec
from rlcycle.distill.features import Segments, dense_codes
from rlcycle.distill.followup import score_texts
from rlcycle.distill.monitors import compare
from rlcycle.distill.rewards import cap_scales
from rlcycle.errors import InputError


@pytest.mark.parametrize(
    "text, score",
    [
        ("thanks, works", 1),
        ("Great, that fixed it. Next: Getting IndexError", 1),
        ("works now, ty", 1),
        ("no, revert that", -1),
        ("This is not what I asked for.", -1),
        ("still broken on staging", -1),
        ("Still getting IndexError from collect_discount.", -1),
        ("that's wrong, test_x still fails", -1),
        ("thanks, but it still fails", -1),  # a complaint wins over thanks
        ("It isn’t fixed", -1),
        ("not fixed", -1),
        ("it doesn't work", -1),  # negated thanks
        ("no need to revert", 0),
        ("no longer fails, thanks", 1),  # negated complaints
        ("Getting `AssertionError` from load_rows", 0),
        ("Fails with ValueError when blank", 0),  # new requests
        (None, None),
    ],
)
def test_builtin_followup_classifier(text, score):
    assert score_texts(pl.Series([text], dtype=pl.String), None).to_list() == [score]


def test_classifier_hook_by_dotted_path(dcli, tmp_path):
    rows = episode("A", 1, followup="NO. REVERT.") + episode("B", 1, followup="meh", start=T0 + 9000)
    spec = '[signals.dissatisfied_followup]\nweight = -1.0\nclassifier = "distill_data:shouty_classifier"\n'
    df, _ = distill(dcli, tmp_path, rows, spec)
    assert by_sample(df, "part_dissatisfied_followup") == {"A-t0": -1.0, "B-t0": 0.0}


def test_custom_phrases_replace_the_defaults(dcli, tmp_path):
    rows = episode("A", 1, followup="meh") + episode("B", 1, followup="no, revert that", start=T0 + 9000)
    spec = '[signals.dissatisfied_followup]\nweight = -1.0\nphrases = ["meh"]\n'
    df, _ = distill(dcli, tmp_path, rows, spec)
    assert by_sample(df, "part_dissatisfied_followup") == {"A-t0": -1.0, "B-t0": 0.0}


def test_cap_water_filling():
    # a: mass 6, b: 3, c: 1; caps .5, .25, 1. First pass: total 10, a (.6) and b (.3) over.
    # Both capped: U = 1 (c), K = .75, T' = 1 / .25 = 4: a -> 2 (x 1/3), b -> 1 (x 1/3).
    scale, notes = cap_scales({"a": 6.0, "b": 3.0, "c": 1.0}, {"a": 0.5, "b": 0.25, "c": 1.0})
    assert scale == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1.0}) and notes == []
    # Nothing over its cap: nothing scaled.
    assert cap_scales({"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 0.5}) == ({"a": 1.0, "b": 1.0}, [])
    # One signal carries everything: it cannot be capped; it stays as it is, with a note.
    scale, notes = cap_scales({"a": 5.0, "b": 0.0}, {"a": 0.5, "b": 1.0})
    assert scale["a"] == 1.0 and "cannot all hold" in notes[0]
    # Two capped signals carry everything, caps .3 + .5: shares .375 / .625 (in proportion).
    scale, _ = cap_scales({"a": 3.0, "b": 1.0}, {"a": 0.3, "b": 0.5})
    assert 3 * scale["a"] / (3 * scale["a"] + scale["b"]) == pytest.approx(0.375)


def test_segments_and_codes_without_collects_layout():
    ids = pl.Series(["b", "a", "b", "c", "a"])
    codes = dense_codes(ids)  # "b" comes back after "a": not run-length ids, a dense rank
    assert codes.to_list() == [1, 0, 1, 2, 0]
    assert dense_codes(pl.Series(["x", "x", "y"])).to_list() == [0, 0, 1]
    seg = Segments(codes.to_numpy(), np.array([1, 5, 0, 0, 2]))
    assert seg.first_rows().tolist() == [4, 2, 3]  # a: turn 2 (row 4) before turn 5 (row 1)
    assert seg.last_rows().tolist() == [1, 0, 3]
    assert seg.sum(np.array([1, 2, 3, 4, 5])).tolist() == [7, 4, 4]
    valid = np.array([True, False, False, True, True])
    assert seg.first_valid(valid).tolist() == [4, 0, 3] and seg.last_valid(~valid).tolist() == [1, 2, -1]


def test_shipped_spec_is_the_defaults():
    spec = load_spec(SAMPLE / "rewards.toml")
    assert spec.signals == default_spec().signals
    table = tomllib.loads((SAMPLE / "rewards.toml").read_text())["distill"]
    defaults = DistillConfig()
    assert {k: getattr(defaults, k) for k in table} == table  # documented values are the real ones
    assert not defaults.validate()


def test_spec_problems_all_at_once():
    data = {
        "signals": {
            "latency": {"clip": [3.0, 1.0], "credit": "final", "budget_ms": "fast"},
            "clarification": {"credit": "first", "transform": "identity"},
            "mine": {"fn": "rlcycle.distill.spec:no_such_function", "scope": "turn"},
        }
    }
    with pytest.raises(InputError) as e:
        parse_spec(data, "x.toml")
    msg = e.value.message
    assert msg.startswith("6 problem(s) in reward spec x.toml")
    for needle in (
        "clip=[3.0, 1.0]: low must be <= high",
        "credit: only episode signals",
        "budget_ms='fast'",
        "credit='first'",
        "no attribute",
        "scope='turn'",
    ):
        assert needle in msg, needle
    with pytest.raises(InputError, match="no \\[signals.NAME\\] tables"):
        parse_spec({}, "empty.toml")


def test_config_validation():
    bad = dataclasses.replace(DistillConfig(), normalization="z", group_keys=["batch", "prompt"], min_group_size=0)
    problems = bad.validate()
    assert len(problems) == 3 and any("must be the last" in p for p in problems)


def test_monitor_thresholds_need_both_absolute_and_relative_moves():
    metrics = {
        "a": {
            "episodes": 100,
            "invalid_tool_call_rate": 0.001,
            "clarification_rate": 0.30,
            "edit_rate": 0.5,
            "mean_latency_ms": 1000.0,
        },
        "b": {
            "episodes": 100,
            "invalid_tool_call_rate": 0.004,
            "clarification_rate": 0.32,
            "edit_rate": 0.5,
            "mean_latency_ms": 1400.0,
        },
        "c": {"episodes": 5, "invalid_tool_call_rate": 0.5, "clarification_rate": 0.9, "edit_rate": 0.1},
    }
    warnings, hacks = compare(metrics, abs_thr=0.01, rel_thr=0.25, min_episodes=20)
    # invalid: x4 but only +0.3 points; clarification: +2 points but only +7%; latency +40%;
    # version c has too few episodes to compare.
    assert [w["metric"] for w in warnings] == ["mean_latency_ms"] and hacks == []


def test_take_and_episode_codes_across_record_batches():
    import pyarrow as pa

    from rlcycle.distill.features import episode_codes, take

    col = pa.chunked_array([pa.array(["a", "b", "c"]), pa.array(["d", "e"])])
    assert take(col, np.array([0, -1, 2, 3, -1])).to_pylist() == ["a", None, "c", "d", None]  # ascending
    assert take(col, np.array([4, -1, 0, 3])).to_pylist() == ["e", None, "a", "d"]  # any order
    runs = pa.chunked_array([pa.array(["x", "x", "y"]), pa.array(["y", "z"])])  # a run spans batches
    assert episode_codes(runs).to_list() == [0, 0, 1, 1, 2]
    back = pa.chunked_array([pa.array(["b", "a"]), pa.array(["b"])])  # "b" comes back: a rank
    assert episode_codes(back).to_list() == [1, 0, 1]
