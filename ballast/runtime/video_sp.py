"""2D sequence parallelism for spatial-temporal video DiTs (STDiT): whole frames for spatial
blocks, whole patch columns for temporal ones (VideoSys' dynamic sequence parallelism).

A micro-batch's stream (clips packed frame-major, `protocol.py`) is laid out over the d ranks of
its group in one of three layouts, each a contiguous split of one order of the stream's tokens
(`TokenSplit`):

    tokens   the frame-major order split evenly (`StreamShard`'s shards)
    frames   the frame-major order split at frame boundaries, balanced by tokens: whole frames
    columns  every clip column by column (a column's F tokens in frame order), clip after clip,
             split at column boundaries, balanced by tokens: whole patch columns

In every layout a rank's tokens are grouped by sample in stream order. A spatial block on the
`frames` layout, or a temporal one on `columns`, attends over the frames (columns) each rank
holds whole: no communication at all. Switching layouts costs one all-to-all of the hidden
states (`Relayout`). A layout whose largest shard exceeds the even share by too much
(`BALANCE`: one huge frame, a long clip of tiny frames, d > a clip's frames or columns) is not
used: that block runs on the `tokens` layout with Ulysses' head exchange (`attention.py`),
which takes any pattern. A group split u x c (`plans.Group.cp` > 1: its degree past what the
heads allow Ulysses) falls back instead to

    context  every clip cut in c contiguous chunks (`context_shard.py`), CP rank j holding the
             j-th of each, split over its Ulysses sub-group of u ranks (`hybrid.attention_rows`)

where attention is hybrid Ulysses x CP (`hybrid.HybridShard`): each query attends its frame's or
column's keys, gathered over the CP group (`context_parallel.py`). Whole-clip chunks balance
both patterns: every query of a clip attends its S frame tokens or its F column tokens.
The model is handed the `frames` layout's slice when it balances
(else `tokens`'s), both contiguous in stream order, and gets it back with `arrange(x, INPUT)`.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import operator
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from ..models.protocol import INPUT, check_span, pattern_spans, video_grids, video_positions
from ..vocabulary.patterns import SPATIAL, TEMPORAL, Span
from ..vocabulary.samples import Sample
from .all_to_all import Exchange, all_to_all
from ..models.kernels import varlen_attention
from .attention import StreamShard
from .groups import ContextGroups
from .hybrid import HybridShard, attention_rows
from .remap import Route, overlaps
from .routing import RoutingGroups, SpanGroups
from .shard_sizes import shard_sizes

BALANCE = 1.25
"""A frames or columns layout is used when its largest shard holds at most BALANCE x ceil(n/d)
tokens. The planner priced the group's work as shared evenly over its d ranks, and every
per-token op between two `arrange`s (projections, MLP, the attention itself) runs on the
layout's shards, so the largest one sets the block's time: up to 25% over the even share is
accepted to save Ulysses' two exchanges per attention (q, k, v in and the output back, about
2-4x the hidden states' bytes and two latencies) for one exchange of the hidden states per
layout switch. Beyond that the fallback's communication is the cheaper price."""

_HOLDS_WHOLE = {"frames": SPATIAL, "columns": TEMPORAL}
"""The pattern whose spans a layout holds whole."""


@dataclass(frozen=True, eq=False)
class TokenSplit:
    """One of a stream's layouts over a group (`tokens`, `frames`, `columns`, `context`): a
    contiguous split of `order` (every token index of the stream once). Not a
    `vocabulary.layouts.Layout`, the attention layout of a group: a VIDEO_2D group's stream
    moves between these splits."""

    name: str
    order: Tensor
    sizes: tuple[int, ...]

    @functools.cached_property
    def starts(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.sizes, initial=0))

    def held(self, index: int) -> Tensor:
        """Stream indices of the tokens rank `index` holds, in its order."""
        return self.order[self.starts[index]:self.starts[index + 1]]

    def ranks(self) -> list[list[int]]:
        return [self.held(i).tolist() for i in range(len(self.sizes))]

    @functools.cached_property
    def owner(self) -> Tensor:
        """[n] the rank holding each stream token."""
        ranks = torch.repeat_interleave(torch.arange(len(self.sizes)), torch.tensor(self.sizes, dtype=torch.long))
        return torch.empty_like(ranks).index_copy_(0, self.order, ranks)

    @functools.cached_property
    def where(self) -> Tensor:
        """[n] each stream token's place in `order`."""
        return torch.empty_like(self.order).index_copy_(0, self.order, torch.arange(len(self.order)))

    def balances(self, factor: float = BALANCE) -> bool:
        return max(self.sizes) <= factor * math.ceil(sum(self.sizes) / len(self.sizes))


def _split(units: Sequence[int], degree: int) -> tuple[int, ...]:
    """Sizes of a split of consecutive units (their token counts) over `degree` ranks at unit
    boundaries with the smallest largest shard: each cut at the boundary nearest the even
    split's (`shard_sizes`) when that is as good (a shard then exceeds the even share by less
    than the largest unit), else the ranks filled in turn up to the smallest feasible size."""
    ends = list(itertools.accumulate(units, initial=0))
    n = ends[-1]

    def nearest(target: int) -> int:
        above = bisect.bisect_left(ends, target)
        return ends[above] if above and ends[above] - target < target - ends[above - 1] else ends[max(above - 1, 0)]

    def filled(cap: int) -> list[int] | None:
        cuts = [0]
        for _ in range(degree - 1):
            cuts.append(ends[bisect.bisect_right(ends, cuts[-1] + cap) - 1])
        return cuts[1:] if n - cuts[-1] <= cap else None

    def sizes(cuts: list[int]) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))

    even = sizes([nearest(t) for t in list(itertools.accumulate(shard_sizes(n, degree)))[:-1]])
    low, high = max(units, default=0), max(even)
    while low < high:  # the smallest largest shard: greedy filling decides feasibility
        middle = (low + high) // 2
        low, high = (low, middle) if filled(middle) is not None else (middle + 1, high)
    return even if max(even) <= low else sizes(filled(low))


def video_layouts(grids: Sequence[tuple[int, int, int]], degree: int) -> dict[str, TokenSplit]:
    """The `tokens`, `frames` and `columns` layouts of the stream of clips `grids` over `degree` ranks."""
    bounds = tuple(itertools.accumulate((math.prod(g) for g in grids), initial=0))
    frame_major = torch.arange(bounds[-1])
    # The frames and the columns are the spans of spatial and temporal attention.
    _, frame_bounds = pattern_spans(grids, bounds, SPATIAL)
    column_major, column_bounds = pattern_spans(grids, bounds, TEMPORAL)
    frames, columns = (list(map(operator.sub, b[1:], b[:-1])) for b in (frame_bounds, column_bounds))
    return {"tokens": TokenSplit("tokens", frame_major, shard_sizes(bounds[-1], degree)),
            "frames": TokenSplit("frames", frame_major, _split(frames, degree)),
            "columns": TokenSplit("columns", column_major, _split(columns, degree))}


@dataclass(frozen=True, eq=False)
class Relayout:
    """One rank's side of a switch between two layouts: an `all_to_all.Exchange`.

    Forward (`run`): gather the rows to send, grouped by destination rank in the target's
    order; one `all_to_all_single` with uneven splits (`Route`); place the rows received (from
    each source in the target's order) where the target layout has them.
    Backward (`reversed`, what `all_to_all` runs on the gradient): the same all-to-all with
    the splits swapped, gathering by `place` and placing by `gather`.
    Between two splits of the same order (`frames` <-> `tokens`) both index maps are the
    identity (None) and the splits are `remap.overlaps`. One rank (d = 1): no collective.
    Over a group of two or more nodes in a routed wave (`routing`) the all-to-all is a
    `routing.RoutedExchange` of the same rows (three all-to-alls each way, over every NIC).
    """

    route: Exchange | None
    gather: Tensor | None
    place: Tensor | None

    @classmethod
    def between(cls, source: TokenSplit, target: TokenSplit, group: ProcessGroup | None, index: int,
                device: torch.device | str | None = None, routing: SpanGroups | None = None) -> Relayout:
        d, same = len(source.sizes), source.order is target.order
        mine, theirs = source.held(index), target.held(index)
        if d == 1:
            route = None
        elif routing is not None:
            # Every rank's rows for every rank: the tokens each pair of owners shares.
            route = routing.exchange(torch.bincount(source.owner * d + target.owner, minlength=d * d)
                                     .view(d, d).tolist())
        elif same:
            route = Route(group, *overlaps(source.sizes, target.sizes, index))
        else:
            route = Route(group, tuple(torch.bincount(target.owner[mine], minlength=d).tolist()),
                          tuple(torch.bincount(source.owner[theirs], minlength=d).tolist()))
        if same:
            return cls(route, None, None)
        return cls(route, torch.argsort(target.where[mine], stable=True).to(device),
                   torch.argsort(source.owner[theirs], stable=True).to(device))

    def run(self, x: Tensor) -> Tensor:
        if self.gather is not None:
            x = x.index_select(0, self.gather)
        if self.route is not None:
            x = self.route.run(x)
        return x if self.place is None else torch.empty_like(x).index_copy_(0, self.place, x)

    def reversed(self) -> Relayout:
        return Relayout(self.route.reversed() if self.route is not None else None, self.place, self.gather)


class VideoLayouts:
    """The layouts of one micro-batch's stream over its group from one rank's side, with what
    each `arrange` needs (positions, spans, exchanges) made once and shared by every stream.
    `context`: this rank's `HybridShard` of a group split u x c, whose rows the `context`
    layout holds (None: the group runs Ulysses, and `tokens` is the fallback). `routing`: the
    group's routing groups when its switches are routed (`Relayout`)."""

    def __init__(self, grids: Sequence[tuple[int, int, int]], group: ProcessGroup | None, degree: int,
                 index: int, device: torch.device | str | None = None, context: HybridShard | None = None,
                 routing: SpanGroups | None = None):
        self.grids, self.group, self.index, self.device = tuple(grids), group, index, device
        self.routing = routing
        self.bounds = tuple(itertools.accumulate((math.prod(g) for g in self.grids), initial=0))
        self.layouts = video_layouts(self.grids, degree)
        self.context = context
        if context is not None:
            rows = attention_rows(list(self.grids), degree, context.context.degree)
            self.layouts["context"] = TokenSplit("context", torch.cat(rows), tuple(map(len, rows)))
        self.fallback = "tokens" if context is None else "context"
        self.balanced = {name: layout.balances() for name, layout in self.layouts.items()}
        self._positions: dict[str, Tensor] = {}
        self._spans: dict[str, tuple[int, ...]] = {}
        self._exchanges: dict[tuple[str, str], Relayout] = {}
        self._attending: dict[Span, HybridShard] = {}

    def __getitem__(self, name: str) -> TokenSplit:
        return self.layouts[name]

    def target(self, pattern: Span) -> str:
        """The layout attention of `pattern` runs on: the one holding its spans whole if it
        balances, else the fallback (`tokens`, or `context` in a group with a CP part)."""
        whole = next((name for name, p in _HOLDS_WHOLE.items() if p == pattern), None)
        return whole if whole is not None and self.balanced[whole] else self.fallback

    def attending(self, pattern: Span) -> HybridShard:
        """The `context` layout's shard attending `pattern` (made once per pattern: its CP shard
        keeps which keys each of its queries reads)."""
        assert self.context is not None
        if pattern not in self._attending:
            self._attending[pattern] = dataclasses.replace(self.context, pattern=pattern)
        return self._attending[pattern]

    def positions(self, name: str) -> Tensor:
        if name not in self._positions:
            held = self.layouts[name].held(self.index)
            self._positions[name] = video_positions(self.grids, held, self.bounds).to(self.device)
        return self._positions[name]

    def spans(self, name: str) -> tuple[int, ...]:
        """cu_seqlens of the whole frames (columns) this rank holds in layout `name`."""
        if name not in self._spans:
            positions = self.positions(name).cpu()
            key = positions[:, :2] if name == "frames" else positions[:, [0, 2, 3]]
            starts = ((key[1:] != key[:-1]).any(dim=1).nonzero().view(-1) + 1).tolist()
            self._spans[name] = (0, *starts, len(key)) if len(key) else (0,)
        return self._spans[name]

    def exchange(self, source: str, target: str) -> Relayout:
        if (source, target) not in self._exchanges:
            self._exchanges[(source, target)] = Relayout.between(
                self.layouts[source], self.layouts[target], self.group, self.index, self.device, self.routing)
        return self._exchanges[(source, target)]


@dataclass(frozen=True, kw_only=True)
class VideoShard(StreamShard):
    """This rank's tokens of a micro-batch under 2D sequence parallelism: `layout` says which
    (`held`), `positions` are theirs; `initial` is the layout the model was handed (`local`)."""

    layouts: VideoLayouts
    layout: str
    initial: str

    @classmethod
    def create(cls, samples: list[Sample], group: ProcessGroup | ContextGroups | None, degree: int, index: int,
               device: torch.device | str | None = None, *, routing: RoutingGroups | None = None) -> VideoShard:
        """Group rank `index`'s shard; a group split u x c (`ContextGroups`) falls back to the
        `context` layout, over its block's group. `routing`: the routed wave's routing groups,
        which route the layout switches and the `tokens` layout's Ulysses exchange where the
        group spans nodes (and the `context` layout's as `HybridShard.create` does)."""
        assert 0 <= index < degree, (index, degree)
        context = None
        if isinstance(group, ContextGroups):
            context = HybridShard.create(samples, group, degree, index, device, routing=routing)
            group = group.block
        spans = routing.spanning(degree) if routing is not None else None
        plan = VideoLayouts(video_grids(samples), group, degree, index, device, context, spans)
        initial = "frames" if plan.balanced["frames"] else "tokens"
        return cls(plan.bounds, plan.positions(initial), plan.grids, group=group, degree=degree, index=index,
                   routing=spans, layouts=plan, layout=initial, initial=initial)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every rank's token count in the current layout (`tokens`: `StreamShard`'s)."""
        return self.layouts[self.layout].sizes

    @property
    def local(self) -> slice:
        """Where the initial layout's tokens of this rank sit in the stream (frames and tokens
        are both contiguous splits of the stream order)."""
        starts = self.layouts[self.initial].starts
        return slice(starts[self.index], starts[self.index + 1])

    @property
    def held(self) -> Tensor:
        """Stream indices of the tokens this rank holds, in their order."""
        return self.layouts[self.layout].held(self.index)

    @property
    def held_spans(self) -> tuple[int, ...] | None:
        if self.layout not in _HOLDS_WHOLE:
            return None
        if _HOLDS_WHOLE[self.layout] != self.pattern:
            raise ValueError(f"a {self.layout} layout holds {_HOLDS_WHOLE[self.layout]} spans, not "
                             f"{self.pattern!r} ones: arrange(x, {self.pattern!r}) before attending")
        return self.layouts.spans(self.layout)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Bidirectional attention over the whole frames or patch columns this rank holds, with no
        communication; Ulysses on the `tokens` layout, Ulysses x CP on `context`."""
        if self.layout == "context":
            return self.layouts.attending(self.pattern).attend(q, k, v)
        if (spans := self.held_spans) is None:
            return super().attend(q, k, v)
        if not q.shape[0]:  # nothing held: an empty output, still on q, k, v's graph
            return q.new_zeros(0, q.shape[1], v.shape[2]) + 0 * (q.sum() + k.sum() + v.sum())
        return varlen_attention(q, k, v, spans, causal=False)

    def arrange(self, x: Tensor, pattern: Span | str) -> tuple[Tensor, VideoShard]:
        """`x` (rows of the tokens held) on the layout for `pattern` (`VideoLayouts.target`; the
        initial one for INPUT), moved by one all-to-all (`Relayout`) if the layout changes;
        every rank of the group takes part, an empty one too."""
        if pattern == INPUT:
            target, pattern = self.initial, self.pattern
        else:
            pattern = check_span(pattern)
            target = self.layouts.target(pattern)
        assert x.shape[0] == self.sizes[self.index], (x.shape, self.layout, self.sizes, self.index)
        if target != self.layout:
            x = all_to_all(x, self.layouts.exchange(self.layout, target))
        return x, dataclasses.replace(self, positions=self.layouts.positions(target), layout=target, pattern=pattern)
