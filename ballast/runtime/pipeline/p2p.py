"""Point-to-point transfers between a pipeline's neighbouring stages: activations forward,
their gradients backward, with `batch_isend_irecv` (gloo and NCCL alike).

No shape travels: a micro-batch's rows on a rank are its shard of the micro-batch, which every
stage derives from the plan it holds (the same pool rank, group and layout at every stage), so
the receiver allocates [rows, hidden] itself, and a rank holding no row of a micro-batch sends
and receives nothing (its neighbour knows that too). The tensors are the residual stream in the
parameters' dtype (fp32 under autocast too: autocast keeps the residual additions in fp32).

Pairing (Megatron-LM's p2p_communication): a send right after a pass and the receive right
before the stage's next pass go in one batch when they are with the same neighbour (a forward's
activations out and the next backward's gradient in, or a backward's gradient out and the next
forward's activations in), as the neighbour's mirror-image pair does: under NCCL the two
directions between a pair of ranks share one stream, and two unbatched calls each waiting for the
other's would deadlock. A receive is waited for at once (the pass needs it); a send alone is not:
its work is kept and waited for at the end of the step (`finish`), so a stage never waits for its
neighbour to take what it sent, and the step runs as the dataflow of its passes
(`pricing/pipeline.py` prices exactly that).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Send:
    peer: int
    """Global rank of the neighbour."""
    tensor: Tensor


@dataclass(frozen=True)
class Receive:
    peer: int
    rows: int
    """Rows [rows, width] to receive, known from the plan."""


class StageLinks:
    """This rank's transfers with its pipeline neighbours, for one step at a time."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device):
        self.width, self.dtype, self.device = width, dtype, device
        self._sends: list[tuple[list[dist.Work], Tensor]] = []
        """Sends in flight, with their tensors (kept alive until waited for)."""

    def exchange(self, send: Send | None, receive: Receive | None) -> Tensor | None:
        """Post `send` and `receive` (either may be None), batched when with the same peer; wait for
        the receive and return its tensor (None without one)."""
        buffer = None if receive is None else torch.empty(receive.rows, self.width, dtype=self.dtype,
                                                          device=self.device)
        sent = None if send is None else dist.P2POp(dist.isend, self._checked(send.tensor), send.peer)
        got = None if receive is None else dist.P2POp(dist.irecv, buffer, receive.peer)
        if sent is not None and got is not None and send.peer == receive.peer:
            for work in dist.batch_isend_irecv([sent, got]):
                work.wait()
            return buffer
        if sent is not None:
            self._sends.append((dist.batch_isend_irecv([sent]), sent.tensor))
        if got is not None:
            for work in dist.batch_isend_irecv([got]):
                work.wait()
        return buffer

    def _checked(self, tensor: Tensor) -> Tensor:
        assert tensor.dim() == 2 and tensor.shape[1] == self.width and tensor.dtype == self.dtype, \
            (tuple(tensor.shape), tensor.dtype, self.width, self.dtype)
        return tensor.contiguous()

    def finish(self) -> None:
        """Wait for every send still in flight (at the end of a step)."""
        for works, _ in self._sends:
            for work in works:
                work.wait()
        self._sends = []
