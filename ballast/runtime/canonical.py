"""The canonical layout of a strategy's state of record (`vocabulary/sharding.py`'s `CANONICAL`,
priced by `pricing/parameter_movement.py`): the model's trained tensors, unit by unit (each block,
then the tensors in no block: `ParallelModel.blocks`), each unit flattened and cut into N equal
flat shards, shard r on rank r of the job, in fp32; AdamW steps the shards.

A tensor that tensor parallelism splits (along `split_dims[name]`) is flattened TP-major: its G
equal pieces along that dimension one after another (G the largest power of two up to a node that
divides the dimension), so that the TP shard i of any degree t dividing G, pieces i G / t to
(i + 1) G / t - 1, is one contiguous range of the unit: what a rank holds of every unit is a few
ranges, one per tensor it holds.

Two movements (`Movement`), unit by unit over the world:

    full     gather_into   all_gather_single of the unit's shards -> the unit whole on every rank,
                           which copies in the ranges it holds
             reduce_from   each rank lays the gradients it counts into the unit's whole flat buffer
                           (zeros elsewhere), reduce_scatter_single -> every rank its shard's sum
    sliced   gather_into   all_to_all_single: each shard's owner sends every rank the part of its
                           shard that rank holds (`WorldHoldings`: every rank's ranges, told once per
                           strategy); a rank receives its ranges in order
             reduce_from   the same pieces back, each rank sending the gradients it counts, the
                           owners adding what arrives: every piece copied into its pipeline's row
                           of a [pipelines, shard] buffer (one pipeline lays a value once, so a
                           row's pieces never overlap), the rows summed, in a few kernels whatever
                           the number of pieces

A gradient is counted once per pipeline: the pool's ranks all hold the pool's summed gradients
after their sync (the first pool rank lays them), a TP group's ranks the same gradient of a
tensor they hold whole (its first rank lays it), and a tensor lives on one stage. So the
reduced shards are the batch's summed gradient whatever the strategy or the movement.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

Ranges = list[tuple[int, int]]
"""Flat [start, stop) ranges of a unit, ascending and disjoint."""


@dataclass(frozen=True)
class Holding:
    """What a rank of a compute model holds of the canonical layout: for every unit, the ranges it
    receives before the passes (`gathered`) and those whose gradients it counts (`laid`)."""

    gathered: list[Ranges]
    laid: list[Ranges]
    pipeline: int = 0
    """The pipeline the rank runs: ranges laid by the ranks of one pipeline never overlap."""


@dataclass(frozen=True)
class MovementRoute:
    """One unit's movement of one kind (`gathered` or `laid`) on this rank, cut once per strategy."""

    cuts: list[Ranges]
    """Per peer, in rank order, the ranges of this rank's shard that peer holds (shard offsets)."""
    pieces: Ranges
    """Those ranges, peer after peer: what this rank sends (a gather) or receives (a reduction)."""
    theirs: list[int]
    """How many values each peer holds of this rank's shard."""
    mine: list[int]
    """How many values this rank holds of each peer's shard."""


@dataclass(frozen=True)
class WorldHoldings:
    """Every rank's `Holding` (the world's, in rank order), which a sliced movement cuts by shard."""

    holdings: list[Holding]
    routes: dict = field(default_factory=dict, compare=False)
    """Per (unit, movement) the ranges each peer sends and receives, cut once per strategy: a step
    then runs no per-peer arithmetic in Python (`CanonicalState._routes`)."""

    @classmethod
    def gather(cls, mine: Holding) -> WorldHoldings:
        """Every rank's holding from each rank's own (a collective of the world, once per strategy)."""
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        return cls(everyone)


class CanonicalState:
    """This rank's shards of every unit of the model (module docstring)."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], split_dims: dict[str, int], node: int,
                 device: torch.device, read: Callable[[str], Tensor] | None = None):
        """From `model`, whole and alike on every rank (built alike from one seed or folder; on the host, a unit at a
        time flattened there), its `blocks` in order; `split_dims`: the dimension tensor
        parallelism splits each split tensor along; `node`: the largest TP degree (a node's
        devices); the shards live on `device`. `read`: where `model` is a skeleton (its
        parameters on the meta device, `models.PartLoad`), each tensor whole by name from its
        weights, read as its unit is flattened (the host then holds one unit at a time)."""
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        trained = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
        in_blocks = [[trained[id(p)] for p in block.parameters() if id(p) in trained] for block in blocks]
        placed = {n for unit in in_blocks for n in unit}
        units = in_blocks + [[n for n in trained.values() if n not in placed]]
        self.units = [unit for unit in units if unit]  # a frozen block has nothing to hold
        """The trained tensors' names, unit by unit (every block's, then the rest)."""
        params = dict(model.named_parameters())
        self.shapes = {n: params[n].shape for unit in self.units for n in unit}
        self.split = {n: d for n, d in split_dims.items() if n in self.shapes}
        self.pieces = {n: _pieces(self.shapes[n][d], node) for n, d in self.split.items()}
        self.offsets = [dict(zip(unit, itertools.accumulate((self.shapes[n].numel() for n in unit), initial=0)))
                        for unit in self.units]
        """Each tensor's start in its unit's flat layout."""
        self.order = list(trained.values())
        """The model's own order of its trained tensors (`named_parameters`)."""
        self.shards = []
        whole = read or (lambda n: params[n].detach())
        for unit in self.units:
            flat = self._padded(torch.cat([self._flat(n, whole(n).float(), 1) for n in unit]), unit)
            chunk = flat.numel() // self.world
            self.shards.append(nn.Parameter(flat[self.rank * chunk:(self.rank + 1) * chunk].to(device, copy=True)))

    # --- the TP-major layout of a tensor -----------------------------------------------------
    def _flat(self, name: str, tensor: Tensor, tp: int) -> Tensor:
        """`tensor` (a TP shard of degree `tp`, or whole at 1) flattened TP-major."""
        if name not in self.split:
            return tensor.reshape(-1)
        return torch.cat([p.reshape(-1) for p in tensor.chunk(self.pieces[name] // tp, self.split[name])])

    def _assemble(self, name: str, flat: Tensor, tp: int) -> Tensor:
        """The inverse of `_flat`: a TP shard of degree `tp` (whole at 1) from its flat range."""
        if name not in self.split:
            return flat.view(self.shapes[name])
        count, dim = self.pieces[name] // tp, self.split[name]
        piece = list(self.shapes[name])
        piece[dim] //= self.pieces[name]
        return torch.cat([x.view(piece) for x in flat.chunk(count)], dim)

    def _range(self, u: int, name: str, tp: int, tp_index: int) -> tuple[int, int]:
        """The unit's flat range of TP shard `tp_index` of `tp` of tensor `name` (whole if unsplit)."""
        start, size = self.offsets[u][name], self.shapes[name].numel()
        if name not in self.split:
            return start, start + size
        if self.pieces[name] % tp:
            raise ValueError(f"tensor {name} {tuple(self.shapes[name])} splits into {self.pieces[name]} equal pieces "
                             f"along dimension {self.split[name]}, which TP degree {tp} does not divide")
        return start + tp_index * size // tp, start + (tp_index + 1) * size // tp

    def _padded(self, flat: Tensor, unit: list[str]) -> Tensor:
        size = sum(self.shapes[n].numel() for n in unit)
        whole = math.ceil(size / self.world) * self.world
        return torch.cat([flat, flat.new_zeros(whole - size)])

    def holding(self, model: nn.Module, tp: int, tp_index: int, lays: bool, pipeline: int = 0) -> Holding:
        """What this rank's compute `model` (TP shard `tp_index` of `tp`, in `pipeline`) holds;
        `lays`: whether its gradients count (the first rank of its pool), a TP-whole tensor's on TP
        index 0 only."""
        held = {n for n, _ in model.named_parameters()}
        gathered, laid = [], []
        for u, unit in enumerate(self.units):
            mine = [(n, self._range(u, n, tp, tp_index)) for n in unit if n in held]
            gathered.append([r for _, r in mine])
            laid.append([r for n, r in mine if lays and (n in self.split or tp_index == 0)])
        return Holding(gathered, laid, pipeline)

    def _held(self, u: int, params: dict[str, nn.Parameter]) -> list[tuple[str, nn.Parameter]]:
        """The unit's tensors among a compute model's `params`, in the unit's order (ascending ranges)."""
        return [(n, params[n]) for n in self.units[u] if n in params]

    # --- full movement ----------------------------------------------------------------------
    def gather_into(self, model: nn.Module, tp: int, tp_index: int, exchange: WorldHoldings | None = None) -> None:
        """Every tensor `model` holds set from the canonical shards: its TP shard `tp_index` of `tp`
        where split, else whole (a collective of the world); sliced when given the `exchange`."""
        params = dict(model.named_parameters())
        with torch.no_grad():
            for u, shard in enumerate(self.shards):
                held = self._held(u, params)
                if exchange is None:
                    flat = self._whole_flat(shard)
                    pieces = [flat[slice(*self._range(u, n, tp, tp_index))] for n, _ in held]
                else:
                    pieces = self._received(u, shard, exchange)
                for (name, param), piece in zip(held, pieces, strict=True):
                    param.copy_(self._assemble(name, piece, tp))

    def reduce_from(self, model: nn.Module, tp: int, tp_index: int, lays: bool, exchange: WorldHoldings | None = None
                    ) -> None:
        """Every shard's `.grad` set to the summed gradients of its part of the model, from every
        rank's `model` (a collective of the world); `lays`: whether this rank's gradients count
        (`holding`); sliced when given the `exchange`."""
        params = dict(model.named_parameters())
        for u, shard in enumerate(self.shards):
            mine = [(n, self._range(u, n, tp, tp_index), self._flat(n, p.grad, tp))
                    for n, p in self._held(u, params)
                    if lays and p.grad is not None and (n in self.split or tp_index == 0)]
            if exchange is None:
                flat = shard.new_zeros(shard.numel() * self.world)
                for _, (start, stop), grad in mine:
                    flat[start:stop] = grad
                reduced = shard.new_empty(shard.numel())
                dist.reduce_scatter_single(reduced, flat)
            else:
                reduced = self._returned(u, shard, exchange, [g for *_, g in mine])
            shard.grad = reduced

    def _whole_flat(self, shard: Tensor) -> Tensor:
        flat = shard.new_empty(shard.numel() * self.world)
        dist.all_gather_single(flat, shard.detach().contiguous())
        return flat

    # --- sliced movement --------------------------------------------------------------------
    def _cut(self, ranges: Ranges, owner: int, chunk: int) -> Ranges:
        """`ranges` within shard `owner` (of `chunk` values), in the shard's own offsets."""
        lo, hi = owner * chunk, (owner + 1) * chunk
        return [(max(a, lo) - lo, min(b, hi) - lo) for a, b in ranges if a < hi and b > lo]

    def _routes(self, u: int, exchange: WorldHoldings, kind: str) -> MovementRoute:
        """Unit `u`'s route for the `gathered` or `laid` ranges (`MovementRoute`), cut once per strategy."""
        if (u, kind) not in exchange.routes:
            chunk = self.shards[u].numel()
            cuts = [self._cut(getattr(h, kind)[u], self.rank, chunk) for h in exchange.holdings]
            held = getattr(exchange.holdings[self.rank], kind)[u]
            mine = [sum(b - a for a, b in self._cut(held, r, chunk)) for r in range(self.world)]
            exchange.routes[u, kind] = MovementRoute(cuts, [piece for cut in cuts for piece in cut],
                                                     [sum(b - a for a, b in cut) for cut in cuts], mine)
        return exchange.routes[u, kind]

    def _received(self, u: int, shard: Tensor, exchange: WorldHoldings) -> list[Tensor]:
        """Sliced gather of unit `u`: this rank's gathered ranges, one tensor each, in order."""
        route = self._routes(u, exchange, "gathered")
        data = shard.detach()
        send = torch.cat([data[a:b] for a, b in route.pieces] or [data[:0]])
        recv = shard.new_empty(sum(route.mine))
        dist.all_to_all_single(recv, send, route.mine, route.theirs)
        return list(torch.split(recv, [b - a for a, b in exchange.holdings[self.rank].gathered[u]]))

    def _returned(self, u: int, shard: Tensor, exchange: WorldHoldings, grads: list[Tensor]) -> Tensor:
        """Sliced reduction of unit `u`: this rank's `grads` (of its laid ranges, in order) sent to
        the shards' owners; its own shard's sum of what every rank laid in it."""
        route = self._routes(u, exchange, "laid")
        send = torch.cat(grads) if grads else shard.new_empty(0)
        recv = shard.new_empty(sum(route.theirs))
        dist.all_to_all_single(recv, send.contiguous(), route.theirs, route.mine)
        rows, shifts, lengths = self._rows(u, exchange, shard.device)
        if not rows:
            return shard.new_zeros(shard.numel())
        # recv value k goes to k + its piece's shift: its pipeline's row, at its place in the shard.
        # output_size: no host sync to size the index.
        where = torch.arange(recv.numel(), device=shard.device) + torch.repeat_interleave(
            shifts, lengths, output_size=recv.numel())
        stacked = shard.new_zeros(rows * shard.numel())
        stacked.index_copy_(0, where, recv)
        return stacked.view(rows, shard.numel()).sum(0)

    def _rows(self, u: int, exchange: WorldHoldings, device: torch.device) -> tuple[int, Tensor, Tensor]:
        """Unit `u`'s reduction layout, made once per strategy: how many pipelines lay into this
        rank's shard, and per arriving piece (in arrival order) its shift from its place in the
        received buffer to its place in its pipeline's row, and its length (on `device`)."""
        if (u, "rows") not in exchange.routes:
            chunk = self.shards[u].numel()
            cuts = [(h.pipeline, cut) for h, cut in zip(exchange.holdings, self._routes(u, exchange, "laid").cuts)]
            row_of = {p: i for i, p in enumerate(sorted({p for p, cut in cuts if cut}))}
            shifts, lengths, at = [], [], 0
            by_row: dict[int, Ranges] = {}
            for pipeline, cut in cuts:
                for a, b in cut:
                    row = row_of[pipeline]
                    shifts.append(row * chunk + a - at)
                    lengths.append(b - a)
                    by_row.setdefault(row, []).append((a, b))
                    at += b - a
            for ranges in by_row.values():  # counted once per pipeline: a row's pieces are disjoint
                ranges.sort()
                assert all(prev[1] <= nxt[0] for prev, nxt in zip(ranges, ranges[1:])), "a value laid twice"
            exchange.routes[u, "rows"] = (len(row_of), torch.tensor(shifts, dtype=torch.long, device=device),
                                          torch.tensor(lengths, dtype=torch.long, device=device))
        return exchange.routes[u, "rows"]

    # --- checks ------------------------------------------------------------------------------
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

    def parameters_on_host(self, rank: int = 0) -> dict[str, Tensor]:
        """Every trained tensor whole on global rank `rank`'s host, by name in the model's order, {}
        on the others (a collective): a unit at a time, so a device holds one unit whole at most
        (writing a trained model out, where the whole would not fit a device)."""
        units = []
        for u, shard in enumerate(self.shards):
            unit = self._whole(u, shard.detach())
            units.append({n: t.cpu() for n, t in unit.items()} if self.rank == rank else {})
        return dict(zip(self.order, self._in_model_order(units))) if self.rank == rank else {}

    def _whole(self, u: int, shard: Tensor) -> dict[str, Tensor]:
        """Unit `u` whole on every rank from every rank's `shard` of it (a collective), by name."""
        flat = self._whole_flat(shard)
        return {n: self._assemble(n, flat[slice(*self._range(u, n, 1, 0))], 1) for n in self.units[u]}

    def _in_model_order(self, units: list[dict[str, Tensor]]) -> list[Tensor]:
        byname = {n: t for unit in units for n, t in unit.items()}
        return [byname[n] for n in self.order]


def _pieces(size: int, node: int) -> int:
    """The largest power of two up to `node` that divides `size`: a split tensor's piece count."""
    pieces = 1
    while pieces * 2 <= node and size % (pieces * 2) == 0:
        pieces *= 2
    return pieces

