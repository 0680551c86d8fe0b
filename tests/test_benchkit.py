"""scripts/benchkit.py, the benches' shared harness, and the options every bench shares.

In: the harness's functions on made-up samples; every scripts/bench_*.py run with `--help` only
(nothing is measured). Out: medians, ratios and the JSON shape are right; every bench lists
`--runs` and `--json`, the two options `scripts/dev.sh bench` passes to all of them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import benchkit  # noqa: E402

BENCHES = sorted(SCRIPTS.glob("bench_*.py"))


def test_summary_is_median_min_max():
    assert benchkit.summary([3.0, 1.0, 10.0]) == {"median": 3.0, "min": 1.0, "max": 10.0}
    assert benchkit.summary([1.0, 2.0, 4.0, 100.0])["median"] == 3.0
    with pytest.raises(ValueError):
        benchkit.summary([])


def test_ratio_is_the_sides_median_over_the_baselines():
    t = benchkit.Table("t", "tokens/s", baseline="base", samples={"base": [10, 20, 30], "fast": [50, 40, 60]})
    rows = {r["side"]: r for r in t.rows()}
    assert rows["base"]["ratio"] == 1.0
    assert rows["fast"]["ratio"] == 2.5  # 50 / 20
    assert rows["fast"]["samples"] == [50, 40, 60]


def test_a_baseline_that_is_not_a_side_is_refused():
    with pytest.raises(KeyError, match="nope"):
        benchkit.Table("t", "s", baseline="nope", samples={"a": [1.0]}).rows()


def test_json_is_one_object_on_stdout_and_progress_goes_to_stderr(capsys):
    args = benchkit.parser("doc", runs=2).parse_args(["--json"])
    assert args.runs == 2
    t = benchkit.Table(
        "lat", "ms", baseline="off", samples={"off": [2.0, 4.0], "on": [3.0, 5.0]}, higher_is_better=False
    )
    benchkit.progress("working")
    benchkit.emit(args, "bench_x", [t], notes=["a note"], extra={"k": 1})
    out, err = capsys.readouterr()
    assert "working" in err and "working" not in out
    res = json.loads(out)  # exactly one object: a second line would fail to parse
    assert res["bench"] == "bench_x" and res["runs"] == 2 and res["notes"] == ["a note"] and res["extra"] == {"k": 1}
    (table,) = res["tables"]
    assert table["baseline"] == "off" and table["higher_is_better"] is False and table["metric"] == "ms"
    on = next(r for r in table["rows"] if r["side"] == "on")
    assert on == {"side": "on", "median": 4.0, "min": 3.0, "max": 5.0, "samples": [3.0, 5.0], "ratio": 4.0 / 3.0}


def test_the_printed_table_shows_each_side_and_its_ratio(capsys):
    args = benchkit.parser("doc", runs=1).parse_args([])
    t = benchkit.Table("gen", "tokens/s", baseline="hf", samples={"hf": [100.0], "rlcycle": [250.0]})
    benchkit.emit(args, "bench_x", [t], notes=["target: 2x"])
    out = capsys.readouterr().out
    assert re.search(r"rlcycle\s+250\s+250\s+250\s+2\.50x", out), out
    assert "ratio = side / hf" in out and "target: 2x" in out and "median of 1 run(s)" in out


def test_runs_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        benchkit.parser("doc", runs=1).parse_args(["--runs", "0"])
    assert "at least 1" in capsys.readouterr().err


def test_skip_says_why_and_still_prints_one_object(capsys):
    args = benchkit.parser("doc", runs=1).parse_args(["--json"])
    assert benchkit.skip(args, "bench_x", "no vLLM") == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"bench": "bench_x", "skipped": "no vLLM"} and "no vLLM" in err


def test_run_process_times_a_subprocess_and_keeps_its_output():
    p = benchkit.run_process([sys.executable, "-c", "import sys; print(42); sys.exit(3)"])
    assert p.returncode == 3 and p.stdout.strip() == "42" and p.seconds > 0 and p.rss_mb > 0


def test_every_bench_lists_the_shared_options():
    """`scripts/dev.sh bench --runs N --json` hands both to every bench: each must take them."""
    assert len(BENCHES) >= 11
    procs = {
        b.name: subprocess.Popen([sys.executable, str(b), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for b in BENCHES
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (name, err.decode()[-2000:])
        text = out.decode()
        # the options list, not the docstring above it
        assert re.search(r"^\s+--runs RUNS\b", text, re.M), (name, text[-1500:])
        assert re.search(r"^\s+--json\b", text, re.M), (name, text[-1500:])


def test_no_bench_keeps_a_private_timer_or_another_spelling_of_runs():
    for b in BENCHES:
        src = b.read_text()
        assert "def timed(" not in src, b.name
        for spelling in ('"--repeats"', '"--rounds"'):
            assert spelling not in src, (b.name, spelling)
        assert "import benchkit" in src, b.name
