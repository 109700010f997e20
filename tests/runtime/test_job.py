"""A command's ranks under torchrun (`runtime.job`): the world it runs on, and rank 0 driving the
others, who run its calls and end with its exit status or its error.

`driven` is what `drive` runs once it has joined torchrun's job; here it runs on `run_local`'s
gloo ranks, which stand in for torchrun's processes (tests/cli/test_torchrun_commands.py
launches the commands under torchrun itself)."""
from __future__ import annotations

import pytest
import torch.distributed as dist

from ballast.cli import main
from ballast.runtime import PeerFailed, job, job_world, on_ranks, run_local


def test_the_world_is_torchruns_and_a_world_given_must_match_it(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert (job_world(None, 2), job_world(4, 2), job_world(None, None)) == (2, 4, None)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert job_world(None, 2) == job_world(8, 2) == job_world(None, None) == 8
    with pytest.raises(ValueError, match="^--world 4 does not match torchrun's WORLD_SIZE 8$"):
        job_world(4, 2)


@pytest.mark.parametrize("command", [["verify"], ["profile"], ["profile", "--check", "profile.json"], ["bench"]])
def test_every_command_refuses_a_world_torchrun_contradicts_before_joining(monkeypatch, capsys, command):
    """One line, from local rank 0, before any process joins the job (no rendezvous here: this
    process is rank 0 of a job nobody else joins)."""
    for name, value in dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0").items():
        monkeypatch.setenv(name, value)
    assert main([*command, "--world", "4"]) == 2
    assert capsys.readouterr().err == f"ballast {command[0]}: error: --world 4 does not match torchrun's WORLD_SIZE 2\n"


def _rank() -> int:
    return dist.get_rank()


def _command_with_a_call() -> int:
    """A command whose distributed call comes back as every rank's result, in rank order."""
    return 3 if on_ranks(2, _rank) == [0, 1] else 4


def _failing_command() -> int:
    raise ValueError("bad flag")


def _drive_twice() -> tuple[int, tuple[str, str]]:
    status = job.driven(_command_with_a_call)
    try:
        job.driven(_failing_command)
    except (ValueError, PeerFailed) as e:
        return status, (type(e).__name__, str(e))
    raise AssertionError("the failing command did not fail on this rank")


@pytest.mark.slow
def test_rank0_runs_the_command_and_every_rank_ends_with_its_status_or_its_error():
    rank0, rank1 = run_local(2, _drive_twice, timeout=120)
    assert rank0 == (3, ("ValueError", "bad flag"))
    assert rank1 == (3, ("PeerFailed", "stopped: rank 0 failed: bad flag"))
