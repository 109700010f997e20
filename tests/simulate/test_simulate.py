"""`ballast simulate` end to end (ballast/simulate/: command.py, side_by_side.py, table.py): its
JSON, its table, its Gantt chart, its flags and its errors."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ballast

from ballast.simulate import command as simulate_cmd
from ballast.cli import main
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost, get_cost_model
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import get_length_source
from ballast.planners import PlannerOptions, get_planner
from ballast.vocabulary.model_shape import get_model_shape
from ballast.plans.timeline import simulate
from ballast.pricing.pipeline_bound import pipeline_lower_bound, report_lower_bound
from ballast.vocabulary.job_mesh import JobMesh

UNSIZED = ["--lengths", "lognormal:7,1.2", "--cluster", "a100-8", "--model", "gpt-7b",
           "--max-len", "32768", "--steps", "2"]
SETTING = [*UNSIZED, "--batch", "32"]
PLANNERS = ("static", "ballast", "hydraulis")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def wide(monkeypatch):
    """Rich sizes its table to COLUMNS off a terminal: wide enough that no row wraps."""
    monkeypatch.setenv("COLUMNS", "200")


def simulate_cli(*argv: str) -> int:
    """`ballast simulate ARGV`'s exit status, argparse's own errors included."""
    return main(["simulate", *argv])


def fails(capsys, *argv: str) -> str:
    """The message of a user error: exit status 2 and a message, never a traceback."""
    code = simulate_cli(*argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "error:" in err
    return err


def expected_steps(name: str) -> list:
    """What the command must have averaged: the same batches planned and simulated here."""
    cluster = get_cluster("a100-8")
    cost = get_cost_model("auto", get_model_shape("gpt-7b"), cluster)
    sampler = LengthStream(get_length_source("lognormal:7,1.2"), BatchSpec(batch=32, max_len=32768), seed=0)
    planner = get_planner(name, cluster, cost, PlannerOptions(max_len=32768))
    return [simulate(planner.plan(sampler.next_batch()), cost, cluster.world_size) for _ in range(2)]


def test_json_table_and_gantt(tmp_path, capsys, wide):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    assert simulate_cli(*SETTING, "--planners", ",".join(PLANNERS), "--json", str(out), "--gantt", str(png)) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert set(data) == {"setting", "steps", "lower_bound_s", "longest_alone_s", "planners", "provenance"}
    assert data["steps"] == 2
    # the record names the code it ran (this checkout's commit) and the torch it ran on
    assert data["provenance"]["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(ballast.__file__).parents[1],
                                                          capture_output=True, text=True).stdout.strip()
    assert data["provenance"]["torch"] == torch.__version__
    # no planner's step beats the floor of plans without remapping by more than remapping can
    assert 0 < data["longest_alone_s"] <= max(p["step_time_s"] for p in data["planners"].values())
    setting = data["setting"]
    assert (setting["cluster"], setting["world_size"], setting["model"]) == ("a100-8", 8, "gpt-7b")
    assert (setting["batch"], setting["max_len"], setting["zeppelin_remap"]) == (32, 32768, "on")
    assert set(data["planners"]) == set(PLANNERS)
    steps = {name: expected_steps(name) for name in PLANNERS}
    # Every figure is a mean over the K steps, tokens/s included (not total tokens / total time).
    assert data["lower_bound_s"] == pytest.approx(np.mean([m.lower_bound for m in steps["static"]]), rel=1e-12)
    for name, s in data["planners"].items():
        metrics = steps[name]
        assert s["step_time_s"] == pytest.approx(np.mean([m.step_time for m in metrics]), rel=1e-12)
        assert s["tokens_per_s"] == pytest.approx(np.mean([m.tokens_per_s for m in metrics]), rel=1e-12)
        assert s["idle_fraction"] == pytest.approx(np.mean([m.idle_fraction for m in metrics]), rel=1e-12)
        assert s["vs_lower_bound"] == pytest.approx(np.mean([m.vs_lower_bound for m in metrics]), rel=1e-12)
        assert s["vs_lower_bound"] >= 1 - 1e-9 and s["vs_lower_bound_max"] >= s["vs_lower_bound"]
        assert s["waves"] >= 1 and 0 <= s["plan_ms"] <= s["plan_ms_max"]
    # The table lists the planners fastest (most tokens/s) first.
    ranked = sorted(PLANNERS, key=lambda n: -data["planners"][n]["tokens_per_s"])
    first_cells = [line.split("│")[1].strip() for line in printed.splitlines() if line.count("│") > 1]
    assert [cell for cell in first_cells if cell in PLANNERS] == ranked
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_batch_defaults_to_512_sequences(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert simulate_cli("--cluster", "a100-8", "--max-len", "32768", "--steps", "1", "--planners", "static",
                        "--json", str(out)) == 0
    setting = json.loads(out.read_text())["setting"]
    assert (setting["batch"], setting["tokens_per_step"]) == (512, None)


@pytest.mark.parametrize("value", ["on", "off"])
def test_zeppelin_remap_flag_reaches_the_planner(tmp_path, capsys, monkeypatch, value):
    seen = []

    def compare(batches, names, cluster, cost, options, on_step=None, as_lengths=False):
        seen.append(options)
        return real(batches, names, cluster, cost, options, on_step)

    real = simulate_cmd.simulate_planners
    monkeypatch.setattr(simulate_cmd, "simulate_planners", compare)
    out = tmp_path / "out.json"
    assert simulate_cli(*SETTING, "--planners", "zeppelin", "--zeppelin-remap", value, "--json", str(out)) == 0
    assert [o.remap for o in seen] == [value == "on"]
    assert json.loads(out.read_text())["setting"]["zeppelin_remap"] == value


@pytest.mark.parametrize("argv, message", [
    (["--planners", "static,nope"], "unknown planner.*nope"),
    (["--planners", ","], "unknown planner"),
    (["--cluster", "tpu-64"], "unknown cluster 'tpu-64'"),
    (["--model", "gpt-1t"], "gpt-1t"),
    (["--zeppelin-remap", "maybe"], "argument --zeppelin-remap: expected no value \\(or on / off\\), got 'maybe'"),
    (["--tokens-per-step", "65536"], "argument --tokens-per-step: not allowed with argument --batch"),
])
def test_user_errors_are_messages(capsys, argv, message):
    assert re.search(message, fails(capsys, *SETTING, *argv))


@pytest.mark.parametrize("flag, value", [
    ("--steps", "0"), ("--steps", "-1"), ("--batch", "0"), ("--tokens-per-step", "0"),
    ("--max-len", "0"), ("--max-len", "-32768"), ("--time-limit", "0"), ("--buckets", "0"),
    ("--degree", "0"), ("--world", "0"), ("--device-memory-gb", "0"), ("--steps", "two"),
])
def test_numeric_flags_must_be_positive(capsys, flag, value):
    # --steps 0 used to end in a ZeroDivisionError; --world 0 and --degree 0 were taken for
    # "not given". Each is now refused by name, with the limit.
    err = fails(capsys, *(UNSIZED if flag == "--tokens-per-step" else SETTING), flag, value)
    assert f"argument {flag}: " in err and ("> 0" in err or flag == "--max-len" and ">= 2" in err)


def test_bad_files_are_messages(tmp_path, capsys):
    cluster = tmp_path / "c.toml"
    cluster.write_text('nodes = "1"\ndevices_per_node = 8\ndevice_memory = 28e9\npeak_flops = 3e14\n')
    assert "nodes must be an integer" in fails(capsys, "--cluster", str(cluster), "--steps", "1")
    profile = tmp_path / "tiny.json"
    analytic_cost(get_model_shape("tiny"), get_cluster("a100-8")).save(profile)
    err = fails(capsys, *SETTING, "--cost", str(profile))
    assert "describes model 'tiny', not 'gpt-7b'" in err


def test_output_paths_are_checked_before_planning(tmp_path, capsys, monkeypatch):
    """An unwritable --json ends simulate before any plan, not after the whole run."""
    def no_planning(*args, **kwargs):
        raise AssertionError("planned before checking --json")

    monkeypatch.setattr(simulate_cmd, "simulate_planners", no_planning)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert simulate_cli(*SETTING, "--json", str(blocker / "out.json")) == 2
    assert f"--json {blocker}/out.json: {blocker} is not a folder" in capsys.readouterr().err


@pytest.mark.slow
def test_piped_output_has_whole_columns_and_no_solver_banner():
    """Through a pipe (no terminal, 80 columns by default) the table keeps every column and
    planner name whole, and HiGHS prints nothing: a fresh process, since HiGHS's banner comes
    once per process."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    run = subprocess.run([sys.executable, "-m", "ballast.cli", "simulate", "--cluster", "cpu", "--world", "2",
                          "--model", "tiny", "--max-len", "4096", "--batch", "64", "--steps", "1",
                          "--planners", "flexsp,megatron-dynamic-cp,batch-adaptive"],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    assert "HiGHS" not in run.stdout + run.stderr
    header = next(line for line in run.stdout.splitlines() if "planner" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")] == [
        "planner", "step s", "sync s", "optim s", "tokens/s", "vs static", "idle", "x LB", "plan ms", "waves"]
    assert {"flexsp", "megatron-dynamic-cp", "batch-adaptive"} <= set(re.findall(r"[a-z-]+", run.stdout))


def test_a_pipeline_setting_reports_its_bubble_and_draws_its_stages(tmp_path, capsys, wide):
    # --pp prices every planner's plan as the 1F1B step through the stages, divides it by the
    # pipeline's bound and records its bubble; the Gantt draws each stage.
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    argv = ["--lengths", "lognormal:7,1.2", "--cluster", "h100-32", "--model", "llama3-8b", "--max-len", "32768",
            "--steps", "1", "--batch", "32", "--tp", "2", "--pp", "2", "--planners", "ballast,wlb-llm"]
    assert simulate_cli(*argv, "--json", str(out), "--gantt", str(png)) == 0
    assert "TP 2 x PP 2: plans over a pool of 8" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (data["setting"]["tp"], data["setting"]["pp"], data["setting"]["pool"]) == (2, 2, 8)
    cluster = get_cluster("h100-32")
    mesh = JobMesh.of(cluster, tp=2, pp=2)
    cost = get_cost_model("auto", get_model_shape("llama3-8b"), cluster, mesh=mesh)
    batch = LengthStream(get_length_source("lognormal:7,1.2"), BatchSpec(batch=32, max_len=32768), seed=0).next_batch()
    assert data["lower_bound_s"] == pytest.approx(report_lower_bound(cost, batch), rel=1e-12)
    assert report_lower_bound(cost, batch) > pipeline_lower_bound(cost, batch)  # the gradient sync and optimizer
    for s in data["planners"].values():
        assert 0 < s["bubble_fraction"] < 1 and s["vs_lower_bound"] >= 1 - 1e-9
    assert png.read_bytes().startswith(PNG_MAGIC)
