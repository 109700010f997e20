"""2D (spatial <-> temporal) sequence parallelism of video DiTs (`video_sp.py`): the layouts'
invariants (pure Python), and on 4 gloo ranks (one spawn) a spatial-temporal block program (in
groups of Ulysses alone and split u x c, whose fallback is the `context` layout) and plain
Ulysses for the full, spatial and temporal patterns against one process."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.models import PackedStream
from ballast.models.kernels import local_attention
from ballast.models.protocol import INPUT, attention_spans, video_positions
from ballast.runtime import (BALANCE, ProcessGroups, Relayout, StreamShard, VideoShard, run_local,
                             sequence_parallel_attention, shard_sizes, video_layouts)
from ballast.runtime.routing import NodeNics, SpanGroups

pytestmark = pytest.mark.usefixtures("single_thread")


WORLD = 4
HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 4, 2, 8, 16  # 2 kv heads: degree 4 replicates them (GQA)
CLIPS = {
    # both 2D layouts balance at degrees 2 and 4; F = 1 and F < d among them
    "mixed": [(2, 2, 3), (1, 3, 4), (3, 1, 2), (4, 2, 2)],
    # frames do not balance at degree 4 (a 16-token frame in 56 tokens): the model starts on `tokens`
    "odd": [(3, 2, 3), (1, 4, 4), (2, 1, 1), (5, 2, 2)],
    # one huge frame: spatial blocks fall back to Ulysses, temporal ones hold whole columns
    "huge frame": [(1, 8, 8), (2, 1, 2)],
    # d > frames x columns: ranks that hold nothing in some layouts
    "one row": [(1, 1, 3)],
    "two frames": [(2, 1, 1)],
    # neither layout balances at degree 4
    "cube": [(3, 3, 3)],
    # 1x1 frames (text-like) beside a single image
    "1x1 frames": [(4, 1, 1), (1, 1, 1), (3, 1, 1), (1, 2, 2)],
}
DEGREES = (1, 2, 4)
SPLITS = ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (4, 4))
"""(degree, cp): Ulysses alone, CP alone at degrees 2 and 4, and Ulysses 2 x CP 2."""
# fp32. Every rank runs the same per-span, per-head softmax arithmetic as one process on the same
# rows; what may differ is the SDPA kernel's batching (runs of equal spans are grouped per rank,
# and Ulysses splits heads) and the order in which x's gradient sums its two blocks' terms: a
# few ulps (1.2e-7 each) of O(1) values through two blocks.
RTOL, ATOL = 1e-5, 1e-5


# -- (a) layouts, pure Python ---------------------------------------------------------------------

grids_strategy = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=4)


def _min_max(units: list[int], degree: int) -> int:
    """The smallest largest shard of a contiguous split of `units` over `degree` ranks (brute DP)."""
    ends = list(itertools.accumulate(units, initial=0))
    best = [0] + [math.inf] * len(units)  # best[i]: first i units over the ranks so far
    for _ in range(degree):
        best = [min(max(best[j], ends[i] - ends[j]) for j in range(i + 1)) for i in range(len(units) + 1)]
    return best[-1]


@settings(max_examples=150)
@given(grids_strategy, st.integers(1, 8))
def test_layouts_hold_every_token_once_whole_and_grouped(grids, degree):
    n = sum(math.prod(g) for g in grids)
    whole = video_positions(grids, torch.arange(n), list(itertools.accumulate((math.prod(g) for g in grids), initial=0)))
    found = video_layouts(grids, degree)
    assert found["tokens"].sizes == shard_sizes(n, degree)
    units = {"frames": [h * w for f, h, w in grids for _ in range(f)],
             "columns": [f for f, h, w in grids for _ in range(h * w)]}
    for name, layout in found.items():
        ranks = layout.ranks()
        assert len(ranks) == degree and sorted(sum(ranks, [])) == list(range(n))
        samples = [int(whole[t, 0]) for held in ranks for t in held]
        assert samples == sorted(samples), (name, "grouped by sample in stream order")
        assert layout.balances() == (max(layout.sizes) <= BALANCE * math.ceil(n / degree))
        if name == "tokens":
            continue
        # whole frames (columns) per rank, each in order: rank after rank, the layout's order is
        # frame-major (clip by clip, column-major), i.e. sorted by these keys
        keys = (lambda p: (p[0], p[1], p[2], p[3])) if name == "frames" else (lambda p: (p[0], p[2], p[3], p[1]))
        flat = [tuple(whole[t].tolist()) for held in ranks for t in held]
        assert flat == sorted(flat, key=keys)
        span = (lambda p: p[:2]) if name == "frames" else (lambda p: (p[0], p[2], p[3]))
        owners: dict = {}
        for r, held in enumerate(ranks):
            for t in held:
                owners.setdefault(span(tuple(whole[t].tolist())), set()).add(r)
        assert all(len(o) == 1 for o in owners.values()), (name, "whole spans")
        # balance: the smallest largest shard, within one unit of the even share
        assert max(layout.sizes) == _min_max(units[name], degree)
        assert max(layout.sizes) < math.ceil(n / degree) + max(units[name])


@settings(max_examples=60)
@given(grids_strategy, st.sampled_from([2, 4, 8]))
def test_a_routed_layout_switch_moves_the_unrouted_ones_rows(grids, degree):
    """Every rank's routed matrix (one bincount over both layouts' owners) has its row and column
    where the unrouted switch has its splits (`overlaps` or per-rank bincounts), with the same
    gathering and placing around it."""
    layouts = video_layouts(grids, degree)
    for source, target in itertools.permutations(layouts.values(), 2):
        for index in range(degree):
            spans = SpanGroups(NodeNics(1, ((0,),)), degree, index, None, None)
            plain, routed = (Relayout.between(source, target, None, index, routing=r) for r in (None, spans))
            assert routed.route.matrix[index] == plain.route.send
            assert tuple(row[index] for row in routed.route.matrix) == plain.route.recv
            for got, want in ((routed.gather, plain.gather), (routed.place, plain.place)):
                assert (got is None and want is None) or torch.equal(got, want)


@settings(max_examples=60)
@given(grids_strategy, st.sampled_from([1, 2, 3, 4, 8]))
def test_video_shard_hands_the_model_a_contiguous_slice_with_its_positions(grids, degree):
    n = sum(math.prod(g) for g in grids)
    locals_ = []
    for index in range(degree):
        shard = VideoShard.create(list(grids), None, degree, index)  # no collective until arrange
        assert shard.initial == ("frames" if shard.layouts["frames"].balances() else "tokens")
        assert shard.held.tolist() == list(range(n))[shard.local]
        assert torch.equal(shard.positions, PackedStream.of(list(grids)).positions[shard.local])
        locals_.append(shard.local)
        for layout, pattern in (("frames", "spatial"), ("columns", "temporal")):
            view = dataclasses.replace(shard, layout=layout, pattern=pattern,
                                       positions=shard.layouts.positions(layout))
            spans = view.held_spans
            assert spans[-1] == len(view.held) and all(b > a for a, b in zip(spans, spans[1:]))
    assert [s.start for s in locals_] == [0, *(s.stop for s in locals_[:-1])] and locals_[-1].stop == n


def _dense(q, k, v, positions, pattern):
    """Attention with an explicit mask built from (sample, frame, row, column): the oracle."""
    same = positions[:, None, 0] == positions[None, :, 0]
    if pattern == "spatial":
        same &= positions[:, None, 1] == positions[None, :, 1]
    elif pattern == "temporal":
        same &= (positions[:, None, 2:] == positions[None, :, 2:]).all(-1)
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.shape[2])
    return torch.einsum("hij,jhd->ihd", scores.masked_fill(~same, -math.inf).softmax(-1), v)


@pytest.mark.parametrize("pattern", ["full", "spatial", "temporal"])
def test_local_attention_matches_a_dense_masked_oracle(pattern):
    # What (b) and (c) compare against is itself right.
    clips = CLIPS["mixed"] + CLIPS["1x1 frames"]
    stream = dataclasses.replace(PackedStream.of(clips), pattern=pattern)
    q, k, v = _qkv(stream.bounds[-1])
    torch.testing.assert_close(local_attention(q, k, v, stream), _dense(q, k, v, stream.positions, pattern),
                               rtol=RTOL, atol=ATOL)


# -- shared by the ranks and the reference ---------------------------------------------------------

def _qkv(n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed + n)
    return tuple(torch.randn(n, h, HEAD_DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))


def _weights() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    shapes = [(HIDDEN, HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM),
              (HEADS * HEAD_DIM, HIDDEN)]
    return tuple(torch.randn(s, generator=g) / math.sqrt(s[0]) for s in shapes)


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, HIDDEN, generator=g), torch.randn(n, HIDDEN, generator=g)


def block_program(x, stream, attend):
    """A toy STDiT: spatial block, temporal block, back to the input layout. Each block scales its
    attention output by a function of every token's (sample, frame, row, column), read from the
    stream `arrange` returned. Returns the output and, per block, (stream, q, k, v)."""
    wq, wk, wv, wo = _weights()
    calls = []
    for pattern in ("spatial", "temporal"):
        x, stream = stream.arrange(x, pattern)
        q, k, v = ((x @ w).view(len(x), w.shape[1] // HEAD_DIM, HEAD_DIM) for w in (wq, wk, wv))
        for t in (q, k, v):
            t.retain_grad()
        p = stream.positions.to(x.dtype)
        scale = 1 + 0.3 * p[:, :1] + 0.1 * p[:, 1:2] + 0.05 * p[:, 2:3] + 0.02 * p[:, 3:4]
        x = x + (attend(q, k, v, stream).reshape(len(x), HEADS * HEAD_DIM) @ wo) * scale
        calls.append((stream, q, k, v))
    x, stream = stream.arrange(x, INPUT)
    return x, calls


# -- (b), (c) on 4 ranks ---------------------------------------------------------------------------

def _worker() -> dict:
    groups = ProcessGroups()
    rank = dist.get_rank()
    out: dict = {"program": [], "ulysses": []}
    for (name, clips), (degree, cp) in itertools.product(CLIPS.items(), SPLITS):
        start = rank // degree * degree
        group, index = groups.get(start, degree, cp), rank - start
        n = sum(math.prod(c) for c in clips)
        # (b) the block program on a 2D sequence-parallel stream
        stream = VideoShard.create(clips, group, degree, index)
        x_all, grad_all = _data(n)
        x = x_all[stream.local].clone().requires_grad_()
        y, calls = block_program(x, stream, sequence_parallel_attention)
        (y * grad_all[stream.local]).sum().backward()
        out["program"].append((name, degree, cp, stream.local, stream.initial, y.detach(), x.grad,
                               [(s.layout, s.held, q.grad, k.grad, v.grad) for s, q, k, v in calls]))
        if cp > 1:
            continue
        # (c) plain Ulysses (a contiguous StreamShard) for every bidirectional pattern
        for pattern in ("full", "spatial", "temporal"):
            shard = dataclasses.replace(StreamShard.create(clips, group, degree, index), pattern=pattern)
            q, k, v = (t[shard.local].clone().requires_grad_() for t in _qkv(n))
            o = sequence_parallel_attention(q, k, v, shard)
            (o * _qkv(n, seed=1)[0][shard.local]).sum().backward()
            out["ulysses"].append((name, degree, pattern, shard.local, o.detach(), [t.grad for t in (q, k, v)]))
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_local(WORLD, _worker, timeout=300)


@pytest.mark.slow
def test_block_program_on_2d_layouts_matches_one_process(ranks):
    checked, layouts_seen = set(), {}
    for rank in ranks:
        for name, degree, cp, local, initial, y, x_grad, calls in rank["program"]:
            clips = CLIPS[name]
            x_all, grad_all = _data(sum(math.prod(c) for c in clips))
            x = x_all.clone().requires_grad_()
            expected, reference = block_program(x, PackedStream.of(clips), local_attention)
            (expected * grad_all).sum().backward()
            torch.testing.assert_close(y, expected[local], rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(x_grad, x.grad[local], rtol=RTOL, atol=ATOL)
            for (layout, held, *grads), (_, *tensors) in zip(calls, reference):
                for got, want in zip(grads, tensors):
                    torch.testing.assert_close(got, want.grad[held], rtol=RTOL, atol=ATOL)
            layouts_seen[(name, degree, cp)] = (initial, *(c[0] for c in calls))
            checked.add((name, degree, cp))
    assert len(checked) == len(CLIPS) * len(SPLITS)
    # One process holds everything: whole frames, then whole columns.
    assert all(layouts_seen[(name, 1, 1)] == ("frames", "frames", "columns") for name in CLIPS)
    assert layouts_seen[("mixed", 4, 1)] == ("frames", "frames", "columns")
    assert layouts_seen[("odd", 4, 1)] == ("tokens", "tokens", "columns")
    # Ulysses fallback: the huge frame's spatial block, the cube's both blocks.
    assert layouts_seen[("huge frame", 2, 1)] == ("tokens", "tokens", "columns")
    assert layouts_seen[("huge frame", 4, 1)] == ("tokens", "tokens", "columns")
    assert layouts_seen[("cube", 4, 1)] == ("tokens", "tokens", "tokens")
    # Empty shards: 3 columns of one token over 4 ranks, two 1-token frames over 4.
    assert layouts_seen[("one row", 4, 1)] == ("tokens", "tokens", "columns")
    assert layouts_seen[("two frames", 4, 1)] == ("frames", "frames", "tokens")
    # With a CP part the fallback is Ulysses x CP over whole-clip chunks; balanced layouts stay.
    for cp in (2, 4):
        assert layouts_seen[("cube", 4, cp)] == ("tokens", "context", "context")
        assert layouts_seen[("huge frame", 4, cp)] == ("tokens", "context", "columns")
        assert layouts_seen[("mixed", 4, cp)] == ("frames", "frames", "columns")
    assert layouts_seen[("two frames", 4, 2)] == ("frames", "frames", "context")


@pytest.mark.slow
def test_ulysses_takes_full_spatial_and_temporal_patterns(ranks):
    checked = set()
    for rank in ranks:
        for name, degree, pattern, local, o, grads in rank["ulysses"]:
            clips = CLIPS[name]
            n = sum(math.prod(c) for c in clips)
            stream = dataclasses.replace(PackedStream.of(clips), pattern=pattern)
            q, k, v = (t.clone().requires_grad_() for t in _qkv(n))
            expected = local_attention(q, k, v, stream)
            (expected * _qkv(n, seed=1)[0]).sum().backward()
            torch.testing.assert_close(o, expected[local], rtol=RTOL, atol=ATOL)
            for got, want in zip(grads, (q.grad, k.grad, v.grad)):
                torch.testing.assert_close(got, want[local], rtol=RTOL, atol=ATOL)
            checked.add((name, degree, pattern))
    assert len(checked) == len(CLIPS) * len(DEGREES) * 3
