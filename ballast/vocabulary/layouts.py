"""Sharding layouts: how a group of SP degree d lays a micro-batch's tokens over its ranks for
attention, with the one degree rule of each.

    ULYSSES   the packed stream split contiguously over the group (shards differ by at most one
              token); attention all-to-alls q, k, v to head shards and the output back, so the
              degree must divide the query heads; kv heads a degree does not divide are
              replicated to lcm(kv heads, d) before the exchange.
    VIDEO_2D  2D sequence parallelism for spatial-temporal DiTs: whole frames or whole patch
              columns per rank where they balance, one hidden-state exchange per switch; a block
              whose frames or columns cannot balance falls back to ULYSSES (or, in a group with a
              CP part, to Ulysses x CP over whole-clip chunks), so its degree rule is Ulysses'.
    CONTEXT   context parallelism (`runtime/context_parallel.py`): every sequence cut into 2c
              head-tail chunks (c for bidirectional attention) over the c ranks, K and V
              all-gathered for attention; no head constraint, any power-of-two degree.

A group of degree d may run its attention as Ulysses (the model's head layout) over u ranks times
CONTEXT over c ranks, d = u c (`plans.Group.cp` is c): the Ulysses sub-groups are contiguous, the
CP dimension spans them (USP's 2D mesh). `Splits` says which (u, c) a planner may use: Ulysses
alone (the published DCP, FlexSP, Hydraulis), context parallelism alone (Megatron's dynamic CP),
Ulysses inside a node times CP across (Zeppelin, USP), a fixed c (static), or any (ballast).

A rank of ULYSSES or VIDEO_2D holds ceil(tokens / d) of a micro-batch's tokens, the share the cost model's
memory prices. Remap domains (`remapping.py`, `runtime/remap.py`) keep each group's layout for attention and add a
token-balanced one for the rest. The cost model (`CostModel.degrees`, `exchange_bytes`),
`Plan.validate`, the planners' forced degree and the runtime ask `Layout.check` or
`Layout.allows`; nothing else re-derives the rule. `patterns.AttentionPattern.layout` names the
layout of a model's groups; the runtime keeps the table from layout to shard class.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout(ABC):
    """A group's attention layout over its ranks; its degree rule is `why_not`."""

    name: str
    description: str

    @abstractmethod
    def why_not(self, degree: int, heads: int) -> str | None:
        """Why a group of `degree` ranks cannot run a model of `heads` query heads in this
        layout, or None."""

    def allows(self, degree: int, heads: int) -> bool:
        return self.why_not(degree, heads) is None

    def check(self, degree: int, heads: int, what: str = "") -> None:
        """Raise ValueError (prefixed by `what`) unless `allows`."""
        if (why := self.why_not(degree, heads)) is not None:
            raise ValueError(f"{what}: {why}" if what else why)

    def __repr__(self) -> str:
        return self.name


class HeadLayout(Layout):
    """A layout whose attention shards the heads over the group (Ulysses; 2D SP falls back to
    it): the degree must divide the heads, and kv heads it does not divide are replicated."""

    def why_not(self, degree: int, heads: int) -> str | None:
        if heads % degree == 0:
            return None
        return (f"SP degree {degree} does not divide the attention heads ({heads}): the {self.name} layout "
                f"shards the heads over the group's {degree} ranks")

    @staticmethod
    def exchanged_kv_heads(kv_heads: int, degree: int) -> int:
        """The kv heads the head exchange moves at SP degree `degree`: lcm(kv_heads, degree).

        Each rank receives heads / degree query heads and the kv heads they read. When the degree
        divides the kv heads that is kv_heads / degree of them; when it does not (kv_heads <
        degree, common with GQA), every kv head is replicated degree / gcd(kv_heads, degree)
        times so each rank receives the copies its query heads need. The replicas' gradients
        sum in backward."""
        return math.lcm(kv_heads, degree)

    def with_context(self, cp: int) -> Layout:
        """The layout a group of this one split u x `cp` runs: CONTEXT (with this layout's
        Ulysses over u ranks inside it) where cp > 1."""
        return CONTEXT if cp > 1 else self

    def exchange_bytes(self, bytes_per_token: float, heads: int, kv_heads: int, degree: int) -> float:
        """Bytes one token moves in a micro-batch's exchanges at `degree`, given
        `bytes_per_token` with the model's own kv heads (q, k, v, out; forward and backward):
        the replicated kv heads add their share."""
        kv = self.exchanged_kv_heads(kv_heads, degree)
        if kv == kv_heads:
            return bytes_per_token
        return bytes_per_token * (heads + kv) / (heads + kv_heads)


class VideoLayout(HeadLayout):
    """2D sequence parallelism: a CP part changes only its fallback, so it stays the layout."""

    def with_context(self, cp: int) -> Layout:
        return self


ULYSSES = HeadLayout("ulysses", "contiguous shards; all-to-all q, k, v to head shards and the output back")
VIDEO_2D = VideoLayout("video-2d", "whole frames or patch columns per rank where they balance, else Ulysses "
                                   "(x CP in a group with a CP part)")


class ContextLayout(Layout):
    """Context parallelism's layout: the degree rule is any power of two, whatever the heads."""

    def why_not(self, degree: int, heads: int) -> str | None:
        if degree >= 1 and degree & (degree - 1) == 0:
            return None
        return f"CP degree {degree} is not a power of two: the {self.name} layout cuts sequences in 2 x degree chunks"


CONTEXT = ContextLayout("context", "each sequence in 2c head-tail chunks; K and V all-gathered, dK and dV reduce-scattered")


@dataclass(frozen=True)
class Splits:
    """Which splits d = u x c of a group's degree a planner may run: u ranks of the model's head
    layout times c of CONTEXT. Each rule is a value (`ULYSSES_ONLY`, `CONTEXT_ONLY`, `ANY_SPLIT`,
    `ulysses_in_node`, `fixed_context`); a `split_catalogue.SplitCatalogue` holds the planner's."""

    name: str
    ulysses: bool = True
    """u > 1 allowed."""
    context: bool = True
    """c > 1 allowed."""
    node: int | None = None
    """u is the largest allowed one up to this many ranks (one node), c the rest."""
    fixed: int | None = None
    """c is this at every degree it divides (and 1 at smaller degrees)."""

    def context_parts(self, degree: int, heads: int, layout: Layout) -> list[int]:
        """The c of every split of `degree` this rule allows for a model of `heads` heads whose
        head layout is `layout`, ascending."""
        allowed = [c for c in powers_of_two(degree)
                   if layout.allows(degree // c, heads) and (c == 1 or self.context)
                   and (degree // c == 1 or self.ulysses)]
        if self.fixed is not None:
            want = min(self.fixed, degree)
            allowed = [c for c in allowed if c == want]
        if self.node is not None and allowed:
            inside = [c for c in allowed if degree // c <= self.node]
            allowed = inside[:1] if inside else []
        return allowed

    def __repr__(self) -> str:
        return self.name


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    return [1 << i for i in range(n.bit_length()) if 1 << i <= n]


ULYSSES_ONLY = Splits("ulysses-only", context=False)
"""u = d: the model's head layout alone (no CP), so degrees stop where the heads do."""
CONTEXT_ONLY = Splits("context-only", ulysses=False)
"""c = d: context parallelism alone (Megatron-Core's dynamic CP)."""
ANY_SPLIT = Splits("any")
"""Every split the heads allow (ballast; the bound of every plan)."""


def ulysses_in_node(devices_per_node: int) -> Splits:
    """u the largest the heads allow inside one node, c across nodes (USP, Zeppelin)."""
    return Splits(f"ulysses-in-node-{devices_per_node}", node=devices_per_node)


def fixed_context(cp: int) -> Splits:
    """c fixed (static USP: `--degree` with `--cp`); degrees below c run CP over all their ranks."""
    CONTEXT.check(cp, 1, "--cp")
    return Splits(f"cp-{cp}", fixed=cp)
