"""Context-parallel attention: the head-tail sharding, and attention on 2 and 4 gloo ranks,
pure CP and hybrid Ulysses x CP (`HybridShard`), against one process running each sequence alone:
causal and full attention over text, and a spatial-temporal DiT's frame and column attention
over clips cut in whole-clip chunks."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from ballast.vocabulary.layouts import CONTEXT, ULYSSES
from ballast.models import PackedStream, varlen_attention
from ballast.models import kernels
from ballast.models.kernels import flash_attn_varlen, local_attention, span_attention
from ballast.vocabulary.patterns import CAUSAL, FULL, SPATIAL, TEMPORAL, span
from ballast.runtime import ProcessGroups, run_local, sequence_parallel_attention
from ballast.runtime import context_parallel
from ballast.runtime.context_parallel import ContextShard, _chunk_attention
from ballast.runtime.context_shard import held_chunks
from ballast.runtime.hybrid import HybridShard, attention_rows

# Sequences shorter than 2c (1, 3 tokens), lengths 2c does not divide (5, 7, 9), a single
# token, and one that is long enough for every chunk.
STREAMS = [[5, 1, 9, 3], [1], [7, 16]]
HEADS, HEAD_DIM = 4, 8
KV_HEADS = (4, 2, 1)  # MHA, GQA, and GQA whose kv heads u = 2 does not divide (replicated)
# fp32: each output is a softmax-weighted mean of at most 16 unit-variance values; a CP rank runs
# the same per-query dot products as one process over the same keys, with masked keys instead
# of absent ones (exact zeros after softmax), so only summation order differs: a few ulps. The
# hybrid's Ulysses exchanges and the kv replication copy values exactly; the replicas' gradients
# and the reduce-scatter add a few terms in another order.
RTOL, ATOL = 1e-5, 1e-6
# A gradient element sums many such terms, up to ~6 in magnitude once the replicas of a shared
# kv head add up: another order moves it by a few ulps of the largest terms, not of itself (ulp
# of 4-8 is 4.8e-7; on an AMD EPYC host dV of the hybrid 2 x 2 split on (7, 16) with one kv head
# differed by 1.85e-6). 1e-5 is ~20 such ulps; a wrong chunk, mask or reduction errs by O(0.1).
GRAD_ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("single_thread")


@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.sampled_from([1, 2, 4, 8]), st.booleans())
def test_every_token_held_once_in_balanced_chunks(lengths, degree, causal):
    bounds = PackedStream.from_lengths(lengths).bounds
    pattern = CAUSAL if causal else FULL
    shards = [ContextShard.create(lengths, None, degree, j, pattern=pattern) for j in range(degree)]
    held = torch.cat([s.held for s in shards])
    assert sorted(held.tolist()) == list(range(bounds[-1]))
    whole = PackedStream.from_lengths(lengths).positions
    for shard in shards:
        assert torch.equal(shard.positions, whole[shard.held])
        assert shard.sizes == tuple(len(s.held) for s in shards)
    pieces = 2 * degree if causal else degree
    for start, end in zip(bounds, bounds[1:]):
        # Chunks of one sequence differ by at most a token; rank j holds chunks j and 2c-1-j.
        sizes = [sum(b - a for s, a, b in held_chunks(bounds, degree, j, causal) if s == start)
                 for j in range(degree)]
        base, extra = divmod(end - start, pieces)
        for j, size in enumerate(sizes):
            mine = (j, pieces - 1 - j) if causal else (j,)
            assert size == sum(base + (p < extra) for p in mine)


@given(st.lists(st.integers(1, 40), min_size=0, max_size=5),
       st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2), (1, 4), (4, 2)]), st.booleans())
def test_a_groups_attention_rows_are_its_cp_shards_split_over_each_ulysses_sub_group(lengths, split, clips):
    u, c = split
    samples = [(1, 1, n) for n in lengths] if clips else lengths
    rows = attention_rows(samples, u * c, c)
    assert sorted(torch.cat([*rows, torch.zeros(0, dtype=torch.long)]).tolist()) == list(range(sum(lengths)))
    for j in range(c):  # sub-group j: the contiguous u ranks of CP index j
        mine = torch.cat([*rows[j * u:(j + 1) * u], torch.zeros(0, dtype=torch.long)])
        if c == 1:
            assert mine.tolist() == list(range(sum(lengths)))
        else:
            pattern = FULL if clips else CAUSAL
            assert torch.equal(mine, ContextShard.create(samples, None, c, j, pattern=pattern).held)
        assert max(map(len, rows[j * u:(j + 1) * u])) - min(map(len, rows[j * u:(j + 1) * u])) <= 1


def test_head_tail_pairs():
    # 16 tokens over c = 2: chunks of 4, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    assert held_chunks((0, 16), 2, 0, True) == ((0, 0, 4), (0, 12, 16))
    assert held_chunks((0, 16), 2, 1, True) == ((0, 4, 8), (0, 8, 12))
    assert held_chunks((0, 16), 2, 1, False) == ((0, 8, 16),)


def test_context_layout_rule():
    # (the bytes CP moves are priced by hand in tests/pricing/test_cost.py)
    assert CONTEXT.allows(8, 28) and not ULYSSES.allows(8, 28)
    with pytest.raises(ValueError, match="CP degree 6 is not a power of two"):
        CONTEXT.check(6, 8)


def test_clips_are_cut_as_whole_sequences_with_their_video_positions():
    # A clip is one sequence of its frame-major tokens; its rows keep (sample, frame, row, column).
    clips = [(2, 2, 3), (1, 1, 5)]
    whole = PackedStream.of(clips)
    for j in range(2):
        shard = ContextShard.create(clips, None, 2, j, pattern=FULL)
        assert shard.grids == whole.grids
        assert torch.equal(shard.positions, whole.positions[shard.held])
    assert ContextShard.create(clips, None, 2, 1, pattern=FULL).held.tolist() == [*range(6, 12), 15, 16]


CLIPS = [[(2, 2, 3), (1, 1, 5), (3, 1, 2)], [(1, 1, 1)], [(4, 2, 2)]]
"""Clips whose frames and columns CP chunks cut (a chunk ends mid-frame), a one-patch clip, and
one whose columns span every chunk."""


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=4),
       st.sampled_from([1, 2, 4]), st.sampled_from([SPATIAL, TEMPORAL]), st.sampled_from([4, 2, 1]))
def test_frame_and_column_queries_attend_their_spans_gathered_keys(clips, degree, pattern, kv_heads):
    # Each CP rank's queries against the whole stream's keys equal one process's attention
    # inside every frame (column) at those rows: the reference is `local_attention`.
    q, k, v, _ = _inputs([int(torch.tensor(c).prod()) for c in clips], kv_heads)
    whole = dataclasses.replace(PackedStream.of(clips), pattern=pattern)
    expected = local_attention(q, k, v, whole)
    for j in range(degree):
        shard = dataclasses.replace(ContextShard.create(clips, None, degree, j, pattern=FULL), pattern=pattern)
        torch.testing.assert_close(_chunk_attention(q[shard.held], k, v, shard), expected[shard.held],
                                   rtol=RTOL, atol=ATOL)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=8), st.sampled_from([4, 1]))
def test_span_attention_equals_each_spans_sdpa(spans, kv_heads):
    # Queries that are part of their span (0 to 5 of them) against the span's keys (1 to 6: both
    # the tiny elementwise path and SDPA), one call per span as the reference.
    queries, keys = [m for m, _ in spans], [s for _, s in spans]
    q = torch.randn(sum(queries), HEADS, HEAD_DIM)
    k, v = (torch.randn(sum(keys), kv_heads, HEAD_DIM) for _ in range(2))
    q_bounds, k_bounds = (tuple(itertools.accumulate(x, initial=0)) for x in (queries, keys))
    got = span_attention(q, k, v, q_bounds, k_bounds)
    for i in range(len(spans)):
        rows, cols = slice(q_bounds[i], q_bounds[i + 1]), slice(k_bounds[i], k_bounds[i + 1])
        want = torch.nn.functional.scaled_dot_product_attention(
            q[rows].transpose(0, 1), k[cols].transpose(0, 1), v[cols].transpose(0, 1), enable_gqa=True).transpose(0, 1)
        torch.testing.assert_close(got[rows], want, rtol=RTOL, atol=ATOL)


@pytest.mark.cuda
@pytest.mark.skipif(flash_attn_varlen() is None or not torch.cuda.is_available(),
                    reason="the flash-attn varlen path needs a CUDA GPU with flash-attn installed")
def test_flash_attn_chunks_match_one_process():  # pragma: no cover - no GPU on the CI machine
    # Each held chunk is its own query sequence against its key prefix (bottom-right causal).
    lengths = [5, 1, 9, 3, 16]
    q, k, v, _ = _inputs(lengths, 2)
    expected = varlen_attention(q, k, v, PackedStream.from_lengths(lengths).bounds)
    for j in range(2):
        shard = ContextShard.create(lengths, None, 2, j, device="cuda")
        q_, k_, v_ = (t.to("cuda", torch.bfloat16) for t in (q[shard.held], k, v))
        got = _chunk_attention(q_, k_, v_, shard).float().cpu()
        torch.testing.assert_close(got, expected[shard.held], rtol=2e-2, atol=2e-2)  # bf16: 8 bits


def _inputs(lengths, kv_heads):
    generator = torch.Generator().manual_seed(sum(lengths) * 10 + kv_heads)
    n = sum(lengths)
    shapes = [(n, HEADS, HEAD_DIM), (n, kv_heads, HEAD_DIM), (n, kv_heads, HEAD_DIM), (n, HEADS, HEAD_DIM)]
    return tuple(torch.randn(s, generator=generator) for s in shapes)


def _tensors_on_context(output):
    """Names of tensors the CP autograd nodes behind `output` keep as plain ctx attributes: held
    out of saved-tensor hooks' sight, so a recomputed layer could not drop them."""
    seen, todo, names = set(), [output.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith("GatherKV"):
            names += [k for k, x in vars(node).items() if any(isinstance(t, torch.Tensor)
                                                               for t in (x if isinstance(x, tuple) else (x,)))]
            names.append("found")
        todo += [n for n, _ in node.next_functions]
    return names


def _worker(splits):
    torch.set_num_threads(1)
    groups, rank, results = ProcessGroups(), dist.get_rank(), []
    for u, c in splits:
        degree = u * c
        start = rank // degree * degree
        for lengths in STREAMS:
            for kv_heads in KV_HEADS:
                for pattern in (CAUSAL, FULL):
                    q, k, v, grad_out = _inputs(lengths, kv_heads)
                    shard = HybridShard.create(lengths, groups.get(start, degree, c), degree, rank - start,
                                               pattern=pattern)
                    held = shard.local
                    local = [t[held].clone().requires_grad_() for t in (q, k, v)]
                    output = sequence_parallel_attention(*local, shard)
                    kept = _tensors_on_context(output)
                    (output * grad_out[held]).sum().backward()
                    results.append(((u, c), tuple(lengths), kv_heads, pattern.name, held,
                                    output.detach(), [t.grad for t in local], kept))
        for clips in CLIPS:  # a spatial-temporal DiT's frame and column attention on whole-clip chunks
            for kv_heads in (4, 1):
                for pattern in (SPATIAL, TEMPORAL):
                    q, k, v, grad_out = _inputs(_tokens(clips), kv_heads)
                    shard = dataclasses.replace(
                        HybridShard.create(clips, groups.get(start, degree, c), degree, rank - start), pattern=pattern)
                    held = shard.local
                    local = [t[held].clone().requires_grad_() for t in (q, k, v)]
                    output = sequence_parallel_attention(*local, shard)
                    (output * grad_out[held]).sum().backward()
                    results.append(((u, c), tuple(clips), kv_heads, pattern.name, held,
                                    output.detach(), [t.grad for t in local], ["found"]))
    return results


def _tokens(clips):
    return [f * h * w for f, h, w in clips]


def _reference(samples, kv_heads, name):
    """One process's output and q, k, v gradients for a stream of these samples."""
    clips = isinstance(samples[0], tuple)
    q, k, v, grad_out = (t.clone().requires_grad_() for t in _inputs(_tokens(samples) if clips else samples, kv_heads))
    if clips:
        expected = local_attention(q, k, v, dataclasses.replace(PackedStream.of(samples), pattern=span(name)))
    else:
        expected = varlen_attention(q, k, v, PackedStream.from_lengths(samples).bounds, causal=name == "causal")
    (expected * grad_out).sum().backward()
    return expected, (q.grad, k.grad, v.grad)


def _check(ranks, splits):
    checked, empty = set(), 0
    for results in ranks:
        for split, lengths, kv_heads, name, held, output, grads, kept in results:
            assert kept == ["found"]  # q and the gathered K/V are saved, not kept on ctx
            expected, wanted = _reference(list(lengths), kv_heads, name)
            torch.testing.assert_close(output, expected[held], rtol=RTOL, atol=ATOL)
            for got, want in zip(grads, wanted):
                # An empty shard (the 1-token stream on c >= 2) gets empty, i.e. zero, gradients.
                torch.testing.assert_close(got, want[held], rtol=RTOL, atol=GRAD_ATOL)
            checked.add((split, lengths, kv_heads, name))
            empty += len(held) == 0
    # The 1-token stream leaves c - 1 ranks empty: they ran the collectives (or their peers
    # would have hung) and returned their (empty) gradients.
    assert empty > 0
    assert len(checked) == len(splits) * (len(STREAMS) * len(KV_HEADS) * 2 + len(CLIPS) * 2 * 2)


@pytest.mark.slow
def test_context_parallel_attention_on_2_ranks_matches_one_process():
    _check(run_local(2, _worker, [(1, 2)], timeout=240), [(1, 2)])


@pytest.mark.slow
def test_context_parallel_and_hybrid_attention_on_4_ranks_match_one_process():
    splits = [(1, 2), (1, 4), (2, 2)]
    _check(run_local(4, _worker, splits, timeout=240), splits)


class HostWork(TorchFunctionMode):
    """Counts the ops that build index tensors on the host or wait for the device (a sync on
    CUDA): what a layer's attention should not run once its micro-batch's metadata exists."""

    NAMES = {"arange", "tensor", "cumsum", "max", "__int__", "item", "tolist", "to"}

    def __init__(self):
        super().__init__()
        self.calls, self.counting = [], True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if self.counting and name in self.NAMES:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_chunks_are_built_once_per_micro_batch_and_attend_as_sdpa(monkeypatch, causal):
    # The varlen branch runs on CUDA only; here a stand-in kernel with flash-attn's semantics
    # (queries of entry i against its keys, causal diagonal bottom-right), itself one
    # `_chunk_sdpa` per entry, runs the call's metadata against the SDPA path on CPU.
    lengths = [5, 1, 9, 3, 16]
    q, k, v, _ = _inputs(lengths, 2)
    mode = HostWork()

    def stand_in(q, k, v, cu_q, cu_k, longest_q, longest_k, causal):
        mode.counting = False
        cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
        assert longest_q == max(b - a for a, b in zip(cu_q, cu_q[1:]))
        assert longest_k == max(b - a for a, b in zip(cu_k, cu_k[1:]))
        out = torch.cat([context_parallel._chunk_sdpa(q[a:b], k[c:d], v[c:d], causal)
                         for a, b, c, d in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])])
        mode.counting = True
        return out

    pattern = CAUSAL if causal else FULL
    for j in range(2):
        shard = ContextShard.create(lengths, None, 2, j, pattern=pattern)
        expected = _chunk_attention(q[shard.held], k, v, shard)
        with monkeypatch.context() as patch:
            patch.setattr(context_parallel, "attention_kernel", lambda *_: "flash-attn")
            patch.setattr(kernels, "flash_attn_varlen", lambda: stand_in)
            with mode:
                first = _chunk_attention(q[shard.held], k, v, shard)
                built = len(mode.calls)
                for _ in range(3):  # the next layers of the micro-batch
                    torch.testing.assert_close(_chunk_attention(q[shard.held], k, v, shard), first, rtol=0, atol=0)
        torch.testing.assert_close(first, expected, rtol=RTOL, atol=ATOL)
        assert built > 0 and mode.calls[built:] == [], mode.calls[built:]
        mode.calls.clear()


def test_gqa_chunks_off_cpu_do_not_materialise_the_causal_mask(monkeypatch):
    # Off the CPU (`meta` stands in for the GPU: the same branch), a causal chunk with grouped-
    # query heads goes to SDPA with a lower-right bias. CUDA's memory-efficient kernel refuses
    # GQA (stood in here, as its rule), and a refused bias is materialised into a heads x chunk x
    # prefix mask for the math kernel: the kv heads are repeated so that it is not.
    import torch.nn.attention.bias as bias

    def materialise(self, device=None):
        raise AssertionError("the lower-right causal mask was materialised")

    monkeypatch.setattr(bias, "can_use_efficient_attention", lambda params, debug=False: not params.enable_gqa)
    monkeypatch.setattr(bias.CausalBias, "_materialize", materialise)
    q = torch.empty(5, HEADS, HEAD_DIM, device="meta", requires_grad=True)
    k, v = (torch.empty(12, 2, HEAD_DIM, device="meta", requires_grad=True) for _ in range(2))
    out = context_parallel._chunk_sdpa(q, k, v, causal=True)
    assert out.shape == q.shape
    out.sum().backward()
    assert k.grad.shape == k.shape
