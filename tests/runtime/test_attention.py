"""Sequence-parallel attention, process groups and the local launcher (gloo, 4 ranks, one spawn)."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from ballast.models import PackedStream, build_gpt, varlen_attention
from ballast.runtime import ProcessGroups, StreamShard, run_local, sequence_parallel_attention, shard_sizes
from ballast.vocabulary.model_shape import MODEL_PRESETS

WORLD = 4
# Streams of several sequences whose total the degrees 2 and 4 do not divide (17 and 3 tokens:
# 3 < 4 leaves one rank of a degree-4 group with an empty shard), and one that they do.
STREAMS = [[5, 3, 7, 2], [1, 2], [8, 4, 12]]
HEADS, HEAD_DIM = 8, 16
# Grouped-query attention: 4 kv heads every degree divides; 2 and 1, which degree 4 (and 2) do
# not, so the runtime replicates them (`exchanged_kv_heads`).
KV_HEADS = (4, 2, 1)
# fp32: each output is a softmax-weighted mean of at most 12 unit-variance values, and a
# head-sharded rank runs the same per-sequence, per-head arithmetic as one process; only the
# kernel's blocking over heads may differ, i.e. a few ulps (1.2e-7 each) of O(1) numbers.
RTOL, ATOL = 1e-5, 1e-6
COLLECTIVE_TIMEOUT = timedelta(seconds=97)
"""Not torch's default for any backend, so the groups can only have it from the launcher."""


pytestmark = pytest.mark.usefixtures("single_thread")


def _inputs(lengths: list[int], kv_heads: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(sum(lengths) + kv_heads)
    n = sum(lengths)
    shapes = [(n, HEADS, HEAD_DIM), (n, kv_heads, HEAD_DIM), (n, kv_heads, HEAD_DIM), (n, HEADS, HEAD_DIM)]
    return tuple(torch.randn(s, generator=generator) for s in shapes)


def _group_timeout(group: dist.ProcessGroup) -> timedelta:
    # torch has no public getter for a group's timeout; gloo's backend options hold it.
    return group._get_backend(torch.device("cpu")).options._timeout


def _attention_worker() -> dict:
    groups = ProcessGroups()
    rank = dist.get_rank()
    blocks = ((rank // 2 * 2, 2), (0, 4))  # a rank holds only its own groups
    split = groups.get(0, 4, 2)  # 2 x 2: Ulysses in ranks (0,1) or (2,3), CP over (0,2) or (1,3)
    out: dict = {"groups": len(groups), "results": [],
                 "timeouts": [_group_timeout(groups.get(start, degree)) for start, degree in blocks]
                 + [_group_timeout(split.context)],
                 "split": (dist.get_process_group_ranks(split.ulysses), dist.get_process_group_ranks(split.context))}
    for lengths, kv_heads in ((lengths, kv) for lengths in STREAMS for kv in KV_HEADS):
        q, k, v, grad_out = _inputs(lengths, kv_heads)
        for degree in (1, 2, 4):
            start = rank // degree * degree
            shard = StreamShard.create(lengths, groups.get(start, degree), degree, rank - start)
            local = [t[shard.local].clone().requires_grad_() for t in (q, k, v)]
            output = sequence_parallel_attention(*local, shard)
            (output * grad_out[shard.local]).sum().backward()
            out["results"].append((tuple(lengths), kv_heads, degree, shard.local, output.detach(),
                                   [t.grad for t in local], shard.positions))
    # Heads a degree does not divide: ValueError on every rank, before any communication...
    shard = StreamShard.create([6], groups.get(0, 4), 4, rank)
    q = torch.randn(shard.sizes[rank], 6, HEAD_DIM)
    kv = torch.randn(shard.sizes[rank], 2, HEAD_DIM)
    try:
        sequence_parallel_attention(q, kv, kv, shard)
    except ValueError as e:
        out["heads_error"] = str(e)
    # ...so the group is still in step afterwards.
    total = torch.ones(1)
    dist.all_reduce(total, group=groups.get(0, 4))
    out["after_error"] = float(total)
    try:
        groups.get(1, 2)
    except ValueError as e:
        out["unaligned_error"] = str(e)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_local(WORLD, _attention_worker, timeout=240, collective_timeout=COLLECTIVE_TIMEOUT)


@pytest.mark.slow
def test_every_aligned_block_has_a_cached_group(ranks):
    # A rank keeps the groups it is a member of (`ProcessGroups`: made on every rank in one
    # order, kept by their members): in a world of 4 its block of two ((0,1) or (2,3)), the
    # world itself, and of the 2 x 2 split's strided CP groups (0,2) and (1,3) its own.
    assert all(r["groups"] == 3 for r in ranks)
    assert [r["split"] for r in ranks] == [([0, 1], [0, 2]), ([0, 1], [1, 3]), ([2, 3], [0, 2]), ([2, 3], [1, 3])]
    assert "ranks 1..2" in ranks[0]["unaligned_error"]


@pytest.mark.slow
def test_every_group_has_the_collective_timeout(ranks):
    assert all(r["timeouts"] == [COLLECTIVE_TIMEOUT] * 3 for r in ranks)


@pytest.mark.slow
def test_sequence_parallel_attention_matches_one_process(ranks):
    checked = set()
    for rank in ranks:
        for lengths, kv_heads, degree, local, output, grads, positions in rank["results"]:
            q, k, v, grad_out = (t.clone().requires_grad_() for t in _inputs(list(lengths), kv_heads))
            expected = varlen_attention(q, k, v, PackedStream.from_lengths(lengths).bounds)
            (expected * grad_out).sum().backward()
            torch.testing.assert_close(output, expected[local], rtol=RTOL, atol=ATOL)
            for got, want in zip(grads, (q.grad, k.grad, v.grad)):
                torch.testing.assert_close(got, want[local], rtol=RTOL, atol=ATOL)
            # Each rank knows the global per-sequence positions of its shard.
            assert torch.equal(positions, PackedStream.from_lengths(lengths).positions[local])
            checked.add((lengths, kv_heads, degree))
    assert len(checked) == len(STREAMS) * len(KV_HEADS) * 3


@pytest.mark.slow
def test_heads_not_divisible_is_a_value_error_naming_both_numbers(ranks):
    for rank in ranks:
        message = rank["heads_error"]
        assert "degree 4" in message and "heads (6)" in message
        assert rank["after_error"] == WORLD


@given(st.integers(0, 10_000), st.sampled_from([1, 2, 4, 8, 64]))
def test_shards_are_contiguous_and_even(tokens, degree):
    sizes = shard_sizes(tokens, degree)
    assert sum(sizes) == tokens and max(sizes) - min(sizes) <= 1 and list(sizes) == sorted(sizes, reverse=True)


def test_packed_stream_equals_sequences_run_alone():
    # Causal per sequence and positions restarting at every sequence: packing changes nothing.
    model = build_gpt(MODEL_PRESETS["tiny"], seed=1)
    lengths = [7, 1, 12]
    tokens = torch.randint(0, model.shape.vocab, (sum(lengths),), generator=torch.Generator().manual_seed(0))
    packed = model(tokens, PackedStream.from_lengths(lengths))
    pieces = torch.split(tokens, lengths)
    alone = torch.cat([model(piece, PackedStream.from_lengths([len(piece)])) for piece in pieces])
    torch.testing.assert_close(packed, alone, rtol=RTOL, atol=ATOL)
    assert PackedStream.from_lengths(lengths).positions.tolist() == [*range(7), 0, *range(12)]


def _failing_worker() -> None:
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()  # rank 0 would wait here forever without the launcher's clean-up


@pytest.mark.slow
def test_a_failing_rank_raises_in_the_parent_instead_of_hanging():
    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        run_local(2, _failing_worker, timeout=120)
