"""`ballast train` under torchrun with flags no run can use: one line per node, before any rank
joins the job (so without waiting for the ranks' rendezvous), and exit code 2 in torchrun's own
report of the failed workers."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flags, message", [
    (["--world", "3"], "--world 3 does not match torchrun's WORLD_SIZE 2"),
    # argparse's own error: one line on local rank 0 too
    (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan (`ballast train --help` lists the options)"),
], ids=["world", "lr"])
def test_torchrun_user_error_is_one_line(flags, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "ballast.cli", "train", *flags, "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=150)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert [line for line in output.splitlines() if "error:" in line] == [f"ballast train: error: {message}"], output
    assert "exitcode  : 2" in output, output
