"""`ballast simulate --strategy`: every planner placed on heterogeneous strategies, each step under
the one its plan is fastest under, each step priced as the canonical layout's gather, the slowest pipeline, the reduction and
the optimizer; the JSON records it all. Simulated, on a GPU preset, in a second."""
from __future__ import annotations

import json

import pytest

from ballast.cli import main

STRATEGIES = "4x2,1x4,1x4;4x2,4x2"
# 16,384 tokens: what a (4,2) pipeline holds without recomputation, which hydraulis runs none of
ARGS = ["simulate", "--cluster", "h100-16", "--model", "gpt-7b", "--steps", "2", "--batch", "48", "--max-len", "16384",
        "--planners", "ballast,static,hydraulis"]


def run(tmp_path, *extra: str, strategies: str = STRATEGIES) -> dict:
    out = tmp_path / f"sim{len(extra)}{strategies}.json"
    assert main([*ARGS, "--strategy", strategies, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_each_step_is_the_movement_around_the_slowest_pipeline(tmp_path, capsys):
    full = run(tmp_path, "--movement", "full")
    assert full["setting"]["strategies"] == [[[4, 2], [1, 4], [1, 4]], [[4, 2], [4, 2]]]
    assert full["setting"]["movement"] == "full"
    assert "simulated; step = gather + slowest pipeline" in capsys.readouterr().out
    for name, s in full["planners"].items():
        assert s["step_time_s"] == pytest.approx(s["gather_s"] + s["pipelines_time_s"] + s["reduction_s"]
                                                 + s["optimizer_s"]), name
        # Each step's times are its own strategy's pipelines'.
        pipelines = [strategy.count("),(") + 1 for strategy in s["strategy_per_step"]]
        assert [len(times) for times in s["pipeline_times_s"]] == pipelines, name
        assert s["pipelines_time_s"] == pytest.approx(sum(map(max, s["pipeline_times_s"])) / 2), name
        assert s["vs_assigned_bound"] >= 1.0 - 1e-9, name
    # The full movement moves the whole 7B model's fp32 tensors each way (0.5 s at 50 GB/s);
    # the sliced one a rank's own slice, at most a (1,4) stage's quarter of them.
    sliced = run(tmp_path)  # the default, what train runs
    assert sliced["setting"]["movement"] == "sliced"
    for name in full["planners"]:
        assert sliced["planners"][name]["gather_s"] < full["planners"][name]["gather_s"] / 3
        if sliced["planners"][name]["strategy_per_step"] == full["planners"][name]["strategy_per_step"]:
            # the same strategies, the same plans: only the movement differs (a planner choosing by the
            # whole step may take another strategy once the movement is cheaper)
            assert sliced["planners"][name]["pipelines_time_s"] == pytest.approx(full["planners"][name]["pipelines_time_s"])


def test_each_step_takes_the_strategy_its_plan_is_fastest_under(tmp_path):
    chosen = run(tmp_path)["planners"]
    alone = [run(tmp_path, strategies=strategy)["planners"] for strategy in STRATEGIES.split(";")]
    for name, s in chosen.items():
        # ballast may run a strategy's pooled form: [(4,2),(4,2)]'s two replicas as one pipeline of a pool of 2
        assert set(s["strategy_per_step"]) <= {"[(4,2),(1,4),(1,4)]", "[(4,2),(4,2)]", "[(4,2)x2]",
                                               "[(4,2),(1,4)x2]"}, name
        if name != "hydraulis":  # which chooses by its own stage-2 makespan (test_hydraulis_strategies.py)
            assert s["step_time_s"] <= min(a[name]["step_time_s"] for a in alone) * (1 + 1e-12), name


def test_the_gantt_chart_draws_each_planners_first_step(tmp_path, capsys):
    chart = tmp_path / "strategy.png"
    run(tmp_path, "--gantt", str(chart))
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {chart} (the first step of each planner)" in capsys.readouterr().out
