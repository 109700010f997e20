"""A rank's error reaches the caller of `run_local` once, as that rank's error: the launcher
prefers the original over its echoes on the other ranks, and rank 0 broadcasts a failure to
plan as an error every rank raises (`broadcast_plan`)."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ballast.runtime import PeerFailed, RankFailed, RankInputError, broadcast_plan, run_local
from ballast.runtime.world import is_echo

def _rank0_cannot_plan() -> None:
    failure = ValueError("sequence 3 has 9999 tokens, more than any plan can hold")
    broadcast_plan(failure if dist.get_rank() == 0 else None)


def _rank1_raises_while_rank0_waits() -> None:
    if dist.get_rank() == 1:
        raise RuntimeError("a defect on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for a peer that is gone


def _peer_sees(rank_of_error: int) -> str:
    try:
        broadcast_plan(ValueError("bad batch") if dist.get_rank() == rank_of_error else None, src=rank_of_error)
    except PeerFailed as e:
        return f"peer: {e}"
    except ValueError as e:
        return f"own: {e}"
    return "no error"


@pytest.mark.slow
def test_rank0_failure_to_plan_is_raised_once_as_rank0s():
    with pytest.raises(RankInputError, match=r"^rank 0: sequence 3 has 9999 tokens, more than any plan can hold$"):
        run_local(2, _rank0_cannot_plan, timeout=120)


@pytest.mark.slow
def test_a_defect_on_one_rank_is_reported_not_the_broken_connection_it_leaves():
    with pytest.raises(RankFailed) as failed:
        run_local(2, _rank1_raises_while_rank0_waits, timeout=120, collective_timeout=timedelta(seconds=30))
    assert str(failed.value).startswith("rank 1 failed:")
    assert "RuntimeError: a defect on rank 1" in str(failed.value)
    assert "Connection closed" not in str(failed.value)


@pytest.mark.slow
def test_peers_of_a_failed_rank_stop_with_peer_failed():
    # Each rank catches what broadcast_plan raised: the sender its own error, the others PeerFailed.
    assert run_local(2, _peer_sees, 1, timeout=120) == ["peer: stopped: rank 1 failed: bad batch", "own: bad batch"]


def test_echoes_are_told_from_causes():
    assert is_echo(PeerFailed(0, "x", True))
    assert is_echo(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1"))
    assert is_echo(dist.DistBackendError("NCCL communicator was aborted"))
    assert not is_echo(RuntimeError("CUDA out of memory"))
    assert not is_echo(ValueError("SP degree 3 is not usable"))


def _rank0_fails_slowly() -> None:
    import time

    if dist.get_rank() == 0:
        try:
            broadcast_plan(ValueError("rank 0 cannot plan this batch"))
        finally:
            time.sleep(1.5)  # rank 1's echo reaches the launcher first
    else:
        broadcast_plan(None)


@pytest.mark.slow
def test_an_echo_that_arrives_first_still_reports_the_cause_it_carries():
    with pytest.raises(RankInputError, match=r"^rank 0: rank 0 cannot plan this batch$"):
        run_local(2, _rank0_fails_slowly, timeout=120)


def _sum_of(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.sum() for t in tensors))


@pytest.mark.slow
def test_arguments_of_many_tensors_reach_the_ranks():
    # A video bench hands its ranks every clip of every batch (hundreds of tensors): passed as
    # they are, torch shares each through a file descriptor, and the fork server takes at most
    # 252 ("too many fds").
    tensors = [torch.full((2,), float(i)) for i in range(300)]
    assert run_local(2, _sum_of, tensors, timeout=120) == [2.0 * sum(range(300))] * 2
