"""`ballast verify` launched by torchrun on 2 CPU processes, as a user runs it on a GPU node
(`torchrun --nproc-per-node 8 -m ballast.cli verify ...`): each process joins torchrun's job
(gloo here; NCCL on GPUs, which these CPU runs do not reach), rank 0 runs the command, and a
failed check is a non-zero exit of every rank. bench/gpu.sh's dry run
(tests/bench/test_gpu_script.py) launches verify, profile, profile --check and bench this way
and checks what each writes."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def torchrun(*command: str) -> subprocess.CompletedProcess:
    # The agent looks at its workers every 5 s: both ranks have exited by the time it sees the
    # first one has (rank 1 ends as soon as rank 0's verdict reaches it), so it reports each
    # rank's own exit code; at 1 s a loaded machine let it stop rank 1 before rank 1 exited.
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--monitor-interval", "5", "-m", "ballast.cli", *command],
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
