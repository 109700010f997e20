"""bench/gpu.sh: its CPU dry run launches each command of the GPU run and each launch path under
torchrun, as on a GPU node but on gloo (2 processes, 4 for the CP step; fp32, tiny sizes), and
writes their records; the three verify steps it leaves to the GPU run (`GPU_ONLY`) repeat a
launch path of its own with another model or sharding. What it cannot reach on a CPU: the CUDA tests, NCCL (with CUDA placement and
flash-attn) and --precision bf16 (the script's GPU-only lines)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["verify-gpt-fsdp2", "verify-hf-gqa", "verify-six-heads-cp", "verify-stdit", "profile", "profile-check",
         "bench"]
GPU_ONLY = ["verify-gpt", "verify-hf-gqa-fsdp2", "verify-dit"]


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
    assert all(f"== {name}: GPU run only" in run.stdout for name in GPU_ONLY)
    assert not any((tmp_path / f"gpu-cpu-dry-run-{name}.json").exists() for name in GPU_ONLY)
    assert all(r["exit_status"] == 0 and r["gpu"] == "cpu-dry-run" for r in records.values())
    # Every command joined torchrun's job, whose rank 0 reported.
    for name in STEPS:
        if name.startswith("verify"):
            ranks = 4 if name == "verify-six-heads-cp" else 2
            assert f"verify: {ranks} torchrun ranks (gloo, cpu)" in " ".join(records[name]["log_tail"]), name
    # Past the 6 heads on 4 ranks: the plans ran degree 4 as u x c with context parallelism.
    assert any("2x2" in line or "1x4" in line for line in records["verify-six-heads-cp"]["log_tail"])
    # What rank 0 of each torchrun job wrote: measured on both gloo ranks.
    machine = records["profile"]["result"]["fit"]["machine"]
    assert (machine["device"], machine["backend"], machine["world_size"]) == ("cpu", "gloo", 2)
    check = records["profile-check"]["result"]
    assert (check["machine"]["backend"], check["machine"]["world_size"]) == ("gloo", 2)
    assert check["plans"] and all(row["measured_s"] > 0 for row in check["plans"])
    bench = records["bench"]["result"]
    assert (bench["machine"]["backend"], bench["setting"]["world"]) == ("gloo", 2) and bench["same_batches"]
    assert bench["planners"] and all(p["tokens_per_s"] > 0 for p in bench["planners"].values())
    assert bench["cost_model"]["source"] == "profiled" and bench["drift"] is not None


def test_without_a_gpu_the_script_fails_at_once_and_names_the_dry_run(tmp_path):
    run = run_script(out=tmp_path)
    assert run.returncode == 1 and "--dry-run" in run.stderr
    assert run_script("--bogus", out=tmp_path).returncode == 2
