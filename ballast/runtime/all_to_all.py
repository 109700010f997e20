"""The one all-to-all of the runtime, as an autograd function: the backward is the reverse exchange.

The re-layouts of the runtime are exchanges that have an exact reverse:

    HeadExchange (attention.py)    Ulysses: a stream sharded by tokens <-> the same stream sharded by heads
    Route (remap.py)               one contiguous partition of a domain's rows <-> another
    Relayout (video_sp.py)         one layout of a video stream's tokens <-> another, over a Route
    RoutedExchange (routing.py)    the all-to-all of any of them over whole nodes in a routed
                                   wave, its inter-node rows over every NIC (three each way)

An exchange only moves values between ranks, so it is a permutation of the values of the
whole group, and the adjoint of a permutation is its inverse: the gradient of the forward
exchange is the reverse exchange of the gradient.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class Exchange(Protocol):
    """A layout change over a process group that `reversed()` undoes exactly."""

    def run(self, x: Tensor) -> Tensor:
        """This rank's rows after the exchange (all-to-alls, collectives of the group)."""
        ...

    def reversed(self) -> Exchange:
        ...


class AllToAll(torch.autograd.Function):
    """Forward: `exchange.run(x)`. Backward: `exchange.reversed().run(grad)` (one all-to-all each,
    three for a `routing.RoutedExchange`)."""

    @staticmethod
    def forward(ctx, x: Tensor, exchange: Exchange) -> Tensor:
        ctx.exchange = exchange
        return exchange.run(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.exchange.reversed().run(grad.contiguous()), None


def all_to_all(x: Tensor, exchange: Exchange) -> Tensor:
    """`exchange` applied to `x`, differentiably (see `AllToAll`)."""
    return AllToAll.apply(x, exchange)
