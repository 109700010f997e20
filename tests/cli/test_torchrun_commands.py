"""`ballast verify`, `profile --check` and `bench` launched by torchrun on 2 CPU processes, as a
user runs them on a GPU node (`torchrun --nproc-per-node 8 -m ballast.cli verify ...`): each
process joins torchrun's job (gloo here; NCCL on GPUs, which these CPU runs do not reach), rank 0
runs the command and writes its outputs, and a failed check is a non-zero exit of every rank.
bench/gpu.sh's dry run (tests/bench/test_gpu_script.py) launches every step of the script this
way too."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape

pytestmark = pytest.mark.slow


def torchrun(*command: str) -> subprocess.CompletedProcess:
    # The agent looks at its workers once a second: both ranks have exited by the time it sees
    # the first one has, so it reports each rank's own exit code (none is stopped by the agent).
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--monitor-interval", "1", "-m", "ballast.cli", *command],
                          capture_output=True, text=True, timeout=170)


@pytest.mark.timeout(180)
def test_verify_under_torchrun_fails_on_every_rank_when_a_tolerance_is_exceeded():
    # Two ranks sum the gradient in another order than one process: one step leaves a drift of
    # ~1e-5 of the distance moved, above 1e-9 (tests/verify/test_verify.py runs it on local ranks).
    done = torchrun("verify", "--planners", "ballast", "--steps", "1", "--batch", "4", "--max-len", "64",
                    "--param-tolerance", "1e-9")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert done.stdout.count("verify: 2 torchrun ranks (gloo, cpu), model tiny") == 1, output  # rank 0 reports
    assert "1 planner(s) exceed the tolerance: ballast" in done.stdout, output
    assert output.count("exitcode  : 1 ") == 2, output  # rank 0's verdict, sent to rank 1


@pytest.mark.timeout(180)
def test_profile_check_under_torchrun_writes_its_comparison(tmp_path):
    shape = get_model_shape("tiny")
    cost = analytic_cost(shape, get_cluster("cpu", world_size=2, device_memory_gb=0.05))
    profile = tmp_path / "profile.json"  # as a CPU profile records what it needs for the check
    dataclasses.replace(cost, fit=dict(shape=shape.to_dict(), machine=dict(device="cpu", backend="gloo"),
                                       settings=dict(lengths=[64], statistic="min"),
                                       load_average=dict(median=0.0), core_share=1.0)).save(profile)
    out = tmp_path / "check.json"
    done = torchrun("profile", "--check", str(profile), "--planners", "ballast", "--plans", "1", "--repeats", "1",
                    "--tokens-per-step", "128", "--json", str(out), "--png", str(tmp_path / "check.png"))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert (report["machine"]["backend"], report["machine"]["world_size"]) == ("gloo", 2)
    assert [row["planner"] for row in report["plans"]] == ["ballast"] and report["plans"][0]["measured_s"] > 0
    assert (tmp_path / "check.png").stat().st_size > 0


@pytest.mark.timeout(180)
def test_bench_under_torchrun_writes_its_results(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "text.txt").write_text("every planner trains the same model on the same batches\n" * 40)
    out = tmp_path / "bench.json"
    done = torchrun("bench", "--data", f"folder:{corpus}", "--cache-dir", str(tmp_path / "cache"),
                    "--planners", "ballast", "--steps", "1", "--warmup", "0", "--repeats", "1", "--max-len", "64",
                    "--tokens-per-step", "256", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert (result["machine"]["backend"], result["setting"]["world"]) == ("gloo", 2)
    assert result["same_batches"] and result["planners"]["ballast"]["tokens_per_s"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
