"""bench/gpu.sh: its CPU dry run launches every command of the GPU run under torchrun, as on a
GPU node but on gloo (2 processes, 4 for the CP step; fp32, tiny sizes), and writes their
records. What it cannot reach on a CPU: the CUDA tests, NCCL (with CUDA placement and
flash-attn) and --precision bf16 (the script's GPU-only lines)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["verify-gpt", "verify-gpt-fsdp2", "verify-hf-gqa", "verify-hf-gqa-fsdp2", "verify-six-heads-cp",
         "verify-stdit", "verify-dit", "profile", "profile-check", "bench"]


def run_script(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, BALLAST_GPU_OUT=str(out),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=1200)


@pytest.mark.slow
def test_dry_run_passes_every_cpu_stand_in_and_records_each_step(tmp_path):
    run = run_script("--dry-run", out=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads((tmp_path / "gpu-cpu-dry-run.json").read_text())
    assert summary["passed"] == STEPS and summary["dry_run"] and summary["ranks"] == 2
    records = {name: json.loads((tmp_path / f"gpu-cpu-dry-run-{name}.json").read_text()) for name in STEPS}
    assert all(r["exit_status"] == 0 and r["gpu"] == "cpu-dry-run" for r in records.values())
    # Every command joined torchrun's job, whose rank 0 reported.
    for name in STEPS:
        if name.startswith("verify"):
            ranks = 4 if name == "verify-six-heads-cp" else 2
            assert f"verify: {ranks} torchrun ranks (gloo, cpu)" in " ".join(records[name]["log_tail"]), name
    # Past the 6 heads on 4 ranks: the plans ran degree 4 as u x c with context parallelism.
    assert any("2x2" in line or "1x4" in line for line in records["verify-six-heads-cp"]["log_tail"])
    machine = records["profile"]["result"]["fit"]["machine"]
    assert (machine["device"], machine["backend"], machine["world_size"]) == ("cpu", "gloo", 2)
    assert records["profile-check"]["result"]["plans"] and records["profile-check"]["result"]["machine"]["backend"] == "gloo"
    bench = records["bench"]["result"]
    assert bench["planners"] and bench["cost_model"]["source"] == "profiled" and bench["drift"] is not None


def test_without_a_gpu_the_script_fails_at_once_and_names_the_dry_run(tmp_path):
    run = run_script(out=tmp_path)
    assert run.returncode == 1 and "--dry-run" in run.stderr
    assert run_script("--bogus", out=tmp_path).returncode == 2
