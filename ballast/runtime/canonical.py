"""The canonical layout of a strategy's state of record (`vocabulary/sharding.py`'s `CANONICAL`,
priced by `pricing/parameter_movement.py`): the model's trained tensors, unit by unit (each block,
then the tensors in no block: `ParallelModel.blocks`), each unit flattened and cut into N equal
flat shards, shard r on rank r of the job, in fp32; AdamW steps the shards.

Every step moves them the simple way (`Movement.FULL`), unit by unit over the world:

    gather_into   all_gather_single of the unit's shards -> the unit whole on every rank, which
                  copies into its compute model the tensors it holds, its TP shard of a split one
    reduce_from   each rank lays its gradients into the unit's whole flat buffer (zeros where it
                  holds nothing or another rank already counts the same values), then
                  reduce_scatter_single -> every rank its shard's summed gradient

A gradient is counted once per pipeline: the pool's ranks all hold the pool's summed gradients
after their sync (the first pool rank lays them), a TP group's ranks the same gradient of a
tensor they hold whole (its first rank lays it), and a tensor lives on one stage. So the
reduced shards are the batch's summed gradient whatever the strategy.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor, nn


class CanonicalState:
    """This rank's shards of every unit of the model (module docstring)."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module]):
        """From `model`, whole and alike on every rank (rank 0's weights), its `blocks` in order."""
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        trained = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
        in_blocks = [[trained[id(p)] for p in block.parameters() if id(p) in trained] for block in blocks]
        placed = {n for unit in in_blocks for n in unit}
        units = in_blocks + [[n for n in trained.values() if n not in placed]]
        self.units = [unit for unit in units if unit]  # a frozen block has nothing to hold
        """The trained tensors' names, unit by unit (every block's, then the rest)."""
        params = dict(model.named_parameters())
        self.shapes = {n: params[n].shape for unit in self.units for n in unit}
        self.order = list(trained.values())
        """The model's own order of its trained tensors (`named_parameters`)."""
        self.shards = []
        for unit in self.units:
            flat = self._padded(torch.cat([params[n].detach().reshape(-1).float() for n in unit]), unit)
            chunk = flat.numel() // self.world
            self.shards.append(nn.Parameter(flat[self.rank * chunk:(self.rank + 1) * chunk].clone()))

    def _padded(self, flat: Tensor, unit: list[str]) -> Tensor:
        size = sum(self.shapes[n].numel() for n in unit)
        whole = math.ceil(size / self.world) * self.world
        return torch.cat([flat, flat.new_zeros(whole - size)])

    def _whole(self, u: int, shard: Tensor) -> dict[str, Tensor]:
        """Unit `u` whole on every rank from every rank's `shard` of it (a collective), by name."""
        flat = shard.new_empty(shard.numel() * self.world)
        dist.all_gather_single(flat, shard.detach().contiguous())
        sizes = [self.shapes[n].numel() for n in self.units[u]]
        pieces = torch.split(flat[:sum(sizes)], sizes)
        return {n: piece.view(self.shapes[n]) for n, piece in zip(self.units[u], pieces)}

    def gather_into(self, model: nn.Module, split_dims: dict[str, int], tp: int, tp_index: int) -> None:
        """Every tensor `model` holds set from the canonical shards: its TP shard `tp_index` of `tp`
        along `split_dims[name]` where split, else whole (a collective of the world)."""
        held = dict(model.named_parameters())
        with torch.no_grad():
            for u, shard in enumerate(self.shards):
                for name, whole in self._whole(u, shard).items():
                    if name in held:
                        piece = whole.chunk(tp, split_dims[name])[tp_index] if name in split_dims else whole
                        held[name].copy_(piece)

    def reduce_from(self, model: nn.Module, split_dims: dict[str, int], tp: int, tp_index: int,
                    lays: bool) -> None:
        """Every shard's `.grad` set to the summed gradients of its part of the model, from every
        rank's `model` (a collective of the world); `lays`: whether this rank's gradients count
        (the first rank of its pool), and of a TP-whole tensor only on TP index 0."""
        held = dict(model.named_parameters())
        for u, (unit, shard) in enumerate(zip(self.units, self.shards)):
            flat = shard.new_zeros(shard.numel() * self.world)
            at = 0
            for name in unit:
                size, param = self.shapes[name].numel(), held.get(name)
                split = name in split_dims
                if lays and param is not None and param.grad is not None and (split or tp_index == 0):
                    whole = flat[at:at + size].view(self.shapes[name])
                    (whole.chunk(tp, split_dims[name])[tp_index] if split else whole).copy_(param.grad)
                at += size
            reduced = shard.new_empty(shard.numel())
            dist.reduce_scatter_single(reduced, flat)
            shard.grad = reduced

    def squares(self) -> Tensor:
        """This rank's shards' summed squared gradients (each value counted on one rank)."""
        return sum((s.grad.pow(2).sum() for s in self.shards if s.grad is not None),
                   torch.zeros((), device=self.shards[0].device))

    def whole_parameters(self) -> list[Tensor]:
        """Every trained tensor whole, in the model's order (a collective, for checks)."""
        return self._in_model_order([self._whole(u, s) for u, s in enumerate(self.shards)])

    def whole_gradients(self) -> list[Tensor]:
        """Every trained tensor's reduced gradient whole, in the model's order (a collective)."""
        return self._in_model_order([self._whole(u, s.grad if s.grad is not None else torch.zeros_like(s))
                                     for u, s in enumerate(self.shards)])

    def _in_model_order(self, units: list[dict[str, Tensor]]) -> list[Tensor]:
        byname = {n: t for unit in units for n, t in unit.items()}
        return [byname[n] for n in self.order]
