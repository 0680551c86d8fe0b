"""`rlcycle report` on run directories built by hand from tiny files with the real schemas.

No Docker and no model: the trajectories are written with the `trajectories` contract, distill
and the eval verdict are the real functions on them, and the train metrics use the real
TRAIN_METRICS_SCHEMA. The HTML is parsed back with html.parser.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from distill_data import T0, call, episode
from distill_data import write as write_trajectories

from rlcycle import io as rio
from rlcycle.schema import EVAL_RESULTS, conform
from rlcycle.stats import ratio_estimate

EVIL = "<script>alert('x')</script> still fails & it's worse"
SECTIONS = ("run", "reward", "online", "eval", "training")
VOID = {"meta", "br", "img", "input", "link", "hr", "rect", "line", "path", "circle", "polyline"}


# --- building a run directory ----------------------------------------------------------------


def _trajectories(path: Path) -> None:
    rows = []
    for i in range(8):  # two policy versions, the second after the first
        version = "pa" if i < 4 else "pb"
        followup = EVIL if i == 1 else ("thanks, works" if i % 2 else "that's wrong, revert")
        turns = [
            {"tool_calls": [call("write_file")], "edit_lines_proposed": 10, "edit_lines_surviving": 4 + i % 5},
            {"tool_calls": [call("run", "invalid")] if i % 3 == 0 else [], "latency_ms": 800.0 + 100 * i},
        ]
        rows += episode(
            f"e{i}",
            turns,
            start=T0 + i * 60_000,
            followup=followup,
            feedback=1.0 if i % 2 else None,
            policy_version=version,
            prompt=[1, 2, i % 2],
        )
    rows += episode(
        "e-ask",
        [{"tool_calls": [call("ask_user")]}],
        start=T0 + 9 * 60_000,
        followup="the csv one",
        policy_version="pb",
    )
    write_trajectories(path, rows)


def _manifest(run: Path, stage: str, result: dict, seconds: float = 1.5) -> None:
    doc = {
        "stage": stage,
        "key": "k",
        "result": result,
        "seconds": seconds,
        "finished": "2026-12-02T10:00:00+00:00",
        "config": {"objective": "ppo", "lr": 1e-5, "batch_size": 8, "kl_coef": 0.0} if stage == "train" else {},
    }
    (run / stage / "manifest.json").write_text(json.dumps(doc))


def _distill(run: Path) -> None:
    from rlcycle.distill.stage import DistillConfig
    from rlcycle.distill.stage import run as distill

    config = DistillConfig(monitor_min_episodes=1)  # compare even tiny versions: warnings appear
    r = distill(config, str(run / "collect/trajectories.arrow"), str(run / "distill/examples.arrow"), quiet=True)
    _manifest(run, "distill", {"rows": r.rows, "included": r.included})


def _train(run: Path, steps: int = 6) -> None:
    from rlcycle.train.stage import metrics_table

    rows = [
        {
            "step": k,
            "epoch": 0,
            "lr": 1e-5,
            "loss": 0.5 / k,
            "pg_loss": 0.5 / k,
            "kl_loss": 0.0,
            "rows": 8,
            "loss_tokens": 100,
            "tokens": 400,
            "ratio_mean": 1.0,
            "ratio_min": 0.9,
            "ratio_max": 1.1,
            "mismatch_kl": 0.01 * k,
            "clip_frac": 0.1 * k / steps,
            "clip_frac_low": 0.0,
            "clip_frac_high": 0.05,
            "kl_ref": None,
            "grad_norm": float("nan") if k == 3 else 1.0 / k,
            "skipped": k == 3,
            "tokens_per_s": 1000.0,
            "step_seconds": 0.4,
        }
        for k in range(1, steps + 1)
    ]
    (run / "train/checkpoint").mkdir(parents=True)
    rio.write_table(metrics_table(rows), run / "train/checkpoint/train_metrics.arrow")
    _manifest(run, "train", {"checkpoint_id": "sha256:cand", "steps": steps}, seconds=12.0)


def _eval(run: Path) -> None:
    from rlcycle.evaluation.verdict import GateConfig, decide

    rows = []
    for t in range(6):
        for policy, passed in (("candidate:sha256:cand", t % 2 == 0), ("baseline:sha256:base", t % 3 == 0)):
            rows.append(
                {
                    "task_id": f"task-{t}",
                    "cluster": f"<c{t % 3}>",
                    "policy": policy,
                    "attempt": 0,
                    "status": "pass" if passed else "fail",
                    "reward": float(passed),
                    "turns": 2,
                    "n_tool_calls": 3,
                    "n_invalid_tool_calls": 0,
                    "edited": True,
                    "asked_clarification": False,
                    "tokens": 50,
                    "latency_ms": 900.0 if policy.startswith("c") else 1000.0,
                }
            )
    table = conform(pa.Table.from_pylist(rows, schema=EVAL_RESULTS.schema), EVAL_RESULTS)
    rio.write_table(table, run / "eval/eval_results.arrow")
    verdict = decide(
        pl.from_arrow(table), "candidate:sha256:cand", "baseline:sha256:base", GateConfig(min_paired_tasks=3)
    )
    verdict.update(candidate_id="sha256:cand", baseline_id="sha256:base", config={"max_pass_rate_drop": 0.0})
    (run / "eval/verdict.json").write_text(json.dumps(verdict))
    _manifest(run, "eval", {"decision": verdict["decision"], "failed_gates": [], "status": "ran"}, seconds=30.0)


def make_run(root: Path, stages: tuple[str, ...] = ("collect", "distill", "train", "eval")) -> Path:
    run = root / "run"
    for s in stages:
        (run / s).mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"base": "production", "base_path": "/x", "base_id": "sha256:base"}))
    if "collect" in stages:
        _trajectories(run / "collect/trajectories.arrow")
        _manifest(run, "collect", {"samples_out": 17, "episodes_out": 9})
    builders = {"distill": _distill, "train": _train, "eval": _eval}
    for s in stages:
        if s in builders:
            builders[s](run)
    return run


# --- reading the HTML back -------------------------------------------------------------------


class Page(HTMLParser):
    """Tags, section ids, the text of each section, and nesting errors."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.errors: list[str] = []
        self.sections: dict[str, dict] = {}
        self._section: str | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "section":
            self._section = a["id"]
            self.sections[a["id"]] = {"class": a.get("class") or "", "text": "", "svgs": 0}
        if tag == "svg" and self._section:
            self.sections[self._section]["svgs"] += 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._section:
            self.sections[self._section]["text"] += data


# --- tests -----------------------------------------------------------------------------------


def test_full_run_dir_renders_every_section_with_charts(cli, tmp_path):
    run = make_run(tmp_path)
    r = cli(["report", run, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["report"] == str(run / "report.html")
    assert [s["id"] for s in out["sections"]] == list(SECTIONS)
    assert all(s["available"] for s in out["sections"]), out["sections"]
    html = (run / "report.html").read_text()
    page = Page(html)
    assert not page.errors and not page.stack, (page.errors, page.stack)
    assert set(page.sections) == set(SECTIONS)
    svgs = {k: v["svgs"] for k, v in page.sections.items()}
    # reward: mean + share; online: 8 metrics (no tests_passed column); eval: interval + clusters; training: 6 curves
    assert svgs == {"run": 0, "reward": 2, "online": 8, "eval": 2, "training": 6}
    assert "not available" not in html
    text = page.sections
    assert "sha256:cand" in text["run"]["text"] and "sha256:base" in text["run"]["text"]
    assert "pass_rate" in text["eval"]["text"] and "latency" in text["eval"]["text"]
    assert "edit_persistence" in text["reward"]["text"] and "pb" in text["online"]["text"]


def test_escapes_a_script_followup_text(cli, tmp_path):
    """A follow-up `<script>` is shown as text (in the complaints table), never as markup."""
    run = make_run(tmp_path)
    assert cli(["report", run]).exit_code == 0
    html = (run / "report.html").read_text()
    page = Page(html)
    assert "script" not in page.tags  # no data became markup
    assert "<script" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; still fails &amp; it&#x27;s worse" in html
    assert EVIL in page.sections["online"]["text"]  # shown, as text
    assert "&lt;c0&gt;" in html and "<c0>" not in html  # a cluster name, in a table and a chart


def test_escaping_helpers():
    from rlcycle.report.page import esc, table

    cell = table(["follow-up"], [[EVIL]])
    assert "<script>" not in cell and "&lt;script&gt;" in cell
    assert esc(EVIL) == esc(esc(EVIL))  # escaped markup is not escaped twice


def test_only_collect_done(cli, tmp_path):
    run = make_run(tmp_path, ("collect",))
    r = cli(["report", run, "--json"])
    assert r.exit_code == 0, r.output
    available = {s["id"]: s for s in json.loads(r.stdout)["sections"]}
    assert available["run"]["available"] and available["online"]["available"]
    for sid, stage in (("reward", "distill"), ("eval", "eval"), ("training", "train")):
        assert not available[sid]["available"]
        assert f"the {stage} stage did not run" in available[sid]["why"]
    page = Page((run / "report.html").read_text())
    assert not page.errors
    assert page.sections["online"]["svgs"] == 8
    assert "unavailable" in page.sections["training"]["class"]
    assert "not available: the train stage did not run" in page.sections["training"]["text"]
    assert "none (eval: not run)" in page.sections["run"]["text"]


def test_unfinished_and_corrupt_stages_are_explained(cli, tmp_path):
    run = make_run(tmp_path, ("collect", "distill"))
    (run / "train").mkdir()  # crashed before its manifest
    (run / "eval").mkdir()
    (run / "eval/verdict.json").write_text("{not json")
    (run / "eval/eval_results.arrow").write_text("garbage")
    _manifest(run, "eval", {"decision": "refuse"})
    out = tmp_path / "elsewhere" / "r.html"
    r = cli(["report", run, "-o", out, "--json"])
    assert r.exit_code == 0, r.output
    s = {x["id"]: x for x in json.loads(r.stdout)["sections"]}
    assert "the train stage did not finish" in s["training"]["why"]
    assert "unreadable" in s["eval"]["why"]
    assert out.exists() and not (run / "report.html").exists()


def test_plain_output_is_the_path(cli, tmp_path):
    run = make_run(tmp_path, ("collect",))
    r = cli(["report", run])
    assert r.exit_code == 0
    assert r.stdout.strip() == str(run / "report.html")


@pytest.mark.parametrize("what", ["missing", "file", "empty"])
def test_bad_run_dir_exits_2(cli, tmp_path, what):
    path = tmp_path / "nope"
    if what == "file":
        path.write_text("x")
    elif what == "empty":
        path.mkdir()
    r = cli(["report", path])
    assert r.exit_code == 2
    assert not (tmp_path / "nope" / "report.html").exists()


def test_online_metrics_numbers(tmp_path):
    """Golden numbers of the online table on the hand-made trajectories."""
    from rlcycle.report.metrics import Scoring, online_of

    _trajectories(tmp_path / "t.arrow")
    m = online_of(pl.read_ipc(tmp_path / "t.arrow"), Scoring())
    assert m.versions == ["pa", "pb"] and [m.counts[v]["episodes"] for v in m.versions] == [4, 5]
    pa_, pb = ({v: m.metrics[v][k] for v in m.versions} for k in ("edit_persistence", "dissatisfied_rate"))
    assert pa_["pa"].value == pytest.approx((4 + 5 + 6 + 7) / 40)
    assert pb["pa"].value == pytest.approx(0.75)  # e0, e1 (the <script> complaint), e2 of e0..e3
    assert pb["pb"].value == pytest.approx(0.5) and pb["pb"].den == 4  # the ask_user answer is not counted
    inv = {v: m.metrics[v]["invalid_per_sample"] for v in m.versions}
    assert inv["pa"].value == pytest.approx(2 / 8) and inv["pb"].value == pytest.approx(1 / 9)
    assert "tests_pass_rate" in m.absent and m.notes  # no tests_passed column: said, not guessed


def test_ratio_estimate_interval():
    e = ratio_estimate([1, 0, 1, 1], [1, 1, 1, 1])
    # p = 0.75, se = sqrt(Σ(y − p)² / (n(n − 1))) = sqrt(0.75 / 12) = 0.25
    assert e.value == 0.75
    assert e.low == pytest.approx(0.75 - 1.959964 * 0.25, abs=1e-6)
    assert e.high == pytest.approx(0.75 + 1.959964 * 0.25, abs=1e-6)
    assert ratio_estimate([0, 0], [0, 0]).value is None
    one = ratio_estimate([3], [4])  # one cluster: an estimate, no interval
    assert one.value == 0.75 and one.low is None and one.high is None
    assert ratio_estimate([5, 5], [2, 2]).low == 2.5  # no variation: a zero-width interval


def test_svg_charts_handle_edge_cases():
    from rlcycle.report import svg

    assert "no data" in svg.bar_chart("t", ["a"], [svg.Series("s", [None])])
    assert "no data" in svg.line_chart("t", [1, 2], [svg.Series("s", [None, float("nan")])])
    neg = svg.bar_chart("t", ["a", "b"], [svg.Series("s", [-1.0, 2.0], [-1.5, 1.0], [-0.5, 3.0])])
    assert neg.count("<rect") == 2 and "&lt;" not in neg
    flat = svg.line_chart("t", [1], [svg.Series("<s>", [0.0])])
    assert "&lt;s&gt;" in flat and "<s>" not in flat
    assert svg.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_html_on_stdout(cli, tmp_path):
    run = make_run(tmp_path, ("collect",))
    r = cli(["report", run, "-o", "-"])
    assert r.exit_code == 0
    assert r.stdout.startswith("<!DOCTYPE html>") and not (run / "report.html").exists()
    assert cli(["report", run, "-o", "-", "--json"]).exit_code == 2


def test_dissatisfied_rate_matches_the_distill_monitors(tmp_path):
    """The report's classifier is distill's: its rates per version are the monitors' rates."""
    from rlcycle.report.load import RunDir
    from rlcycle.report.metrics import run_online_metrics

    run = RunDir(make_run(tmp_path, ("collect", "distill")))
    m, _ = run_online_metrics(run)
    monitors = run.json("reward_report")["per_policy_version"]
    for v in m.versions:
        for mine, theirs in (
            ("dissatisfied_rate", "dissatisfied_rate"),
            ("clarification_rate", "clarification_rate"),
            ("edit_rate", "edit_rate"),
            ("latency_ms", "mean_latency_ms"),
        ):
            assert m.metrics[v][mine].value == pytest.approx(monitors[v][theirs], abs=1e-6)


def test_report_and_closed_loop_print_the_same_numbers(tmp_path):
    """The closed-loop experiment's table (experiments/closed_loop/report.py) and `rlcycle report`
    on one run: the same estimates, printed alike."""
    from experiments.closed_loop.report import SHOWN, build_report, render
    from rlcycle.online import METRICS
    from rlcycle.report import ab
    from rlcycle.report import online as online_section
    from rlcycle.report.load import RunDir
    from rlcycle.report.metrics import run_online_metrics

    run = RunDir(make_run(tmp_path, ("collect", "distill")))
    mine, _ = run_online_metrics(run)
    html = str(online_section._body(run))
    runs = {"home": str(tmp_path / "home"), "cycles": [{"name": "run", "exit_code": 0, "wall_s": 1.0}]}
    loop = build_report(tmp_path, runs)
    text = render(loop)
    assert [v["id"] for v in loop["versions"]] == mine.versions
    compared = 0
    for v in mine.versions:
        for name in set(SHOWN) & set(mine.metrics[v]):
            e = mine.metrics[v][name]
            assert loop["metrics"][v][name] == e, (v, name)
            printed = ab.fmt(e, METRICS[name].unit)
            assert printed in text and printed in html, (v, name, printed)
            compared += 1
    assert compared >= 10


# --- several run directories: the online section compares their versions ---------------------


def _measure_run(root: Path, name: str, version: str, keys: list[str | None], kept: list[int], start: int) -> Path:
    """A run dir whose collect served `version` one session per key, an edit of 10 lines each."""
    run = root / name
    (run / "collect").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"base": "production", "base_path": "/x", "base_id": version}))
    rows = []
    for i, (key, k) in enumerate(zip(keys, kept, strict=True)):
        turn = {"tool_calls": [call("write_file")], "edit_lines_proposed": 10, "edit_lines_surviving": k}
        rows += episode(
            f"{name}-e{i}",
            [turn],
            start=start + i * 60_000,
            policy_version=version,
            session_id=f"{name}-s{i}",
            pair_key=key,
        )
    write_trajectories(run / "collect/trajectories.arrow", rows)
    return run


def test_more_run_dirs_compare_their_versions_paired_by_pair_key(cli, tmp_path):
    """`rlcycle report A B C`: the online section holds every run's versions in run order; B
    served A's sessions (the same pair keys, other session ids): its difference is paired; C's
    samples carry no pair key: independent. The other sections are A's."""
    keys = [f"s900-task{i}-a0" for i in range(6)]
    a = _measure_run(tmp_path, "a", "pa", keys, [2, 9, 4, 8, 1, 6], start=T0 + 3_600_000)  # later clock than B's
    b = _measure_run(tmp_path, "b", "pb", keys, [3, 10, 6, 9, 3, 7], start=T0)
    c = _measure_run(tmp_path, "c", "pc", [None] * 6, [3, 10, 6, 9, 3, 7], start=T0)
    out = tmp_path / "cmp.html"
    r = cli(["report", a, b, c, "-o", out, "--json"])
    assert r.exit_code == 0, r.error
    page = Page(out.read_text())
    online = page.sections["online"]["text"]
    assert (
        "pb − pa" in online and "pc − pa" in online and "pa − pb" not in online
    )  # the first run's version is the base
    assert "Paired by session" in online and "matched sessions (pb − pa: 6)" in online
    assert "pc − pa:" not in online  # no pair keys: the independent difference
    assert online.index("pa: estimate") < online.index("pb: estimate") < online.index("pc: estimate")
    assert str(a.resolve()) in page.sections["run"]["text"] and str(b.resolve()) not in page.sections["run"]["text"]
    # one run directory: unchanged (its versions against its first, no pairing without keys)
    assert cli(["report", b, "-o", tmp_path / "b.html"]).exit_code == 0
    # every path is checked: a missing later run dir is a usage error naming it
    r = cli(["report", a, tmp_path / "nope"])
    assert r.exit_code == 2 and "nope" in r.error
