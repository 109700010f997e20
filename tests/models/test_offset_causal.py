"""`offset_causal_attention` (a CP chunk's queries against its key prefix, CPU, no mask) against
SDPA with the explicit bottom-right causal mask, outputs and every gradient; and what it keeps
for backward (nothing quadratic)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from ballast.models.offset_causal import offset_causal_attention

HEADS, HEAD_DIM = 4, 8

pytestmark = pytest.mark.usefixtures("single_thread")


def _inputs(queries, keys, kv_heads, dtype=torch.float64):
    generator = torch.Generator().manual_seed(queries * 100 + keys * 10 + kv_heads)
    shapes = [(queries, HEADS, HEAD_DIM), (keys, kv_heads, HEAD_DIM), (keys, kv_heads, HEAD_DIM)]
    return [torch.randn(s, generator=generator, dtype=dtype).requires_grad_() for s in shapes]


def _masked(q, k, v):
    """The reference: query i of m sees keys 0 .. n - m + i, as an explicit mask."""
    m, n = q.shape[0], k.shape[0]
    mask = torch.arange(n) <= torch.arange(n - m, n)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)


@given(st.integers(1, 40), st.integers(0, 60), st.sampled_from([4, 2, 1]))
def test_offset_causal_equals_the_masked_attention(queries, prefix, kv_heads):
    # fp64: the two parts' softmaxes merged by their log-sum-exp equal the one softmax up to
    # summation order, ~1e-16 relative; 1e-12 leaves room and still catches any wrong key or
    # weight (those are O(1) errors).
    q, k, v = _inputs(queries, prefix + queries, kv_heads)
    grad = torch.randn(queries, HEADS, HEAD_DIM, dtype=torch.float64)
    got = offset_causal_attention(q, k, v)
    want = _masked(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_backward_keeps_nothing_quadratic():
    # A 64-query chunk behind 960 prefix keys: the mask SDPA would keep is 64 x 1024 floats, 8x
    # the queries' size; what is kept here is the inputs, the output and one value per query-head.
    queries, keys = 64, 1024
    q, k, v = _inputs(queries, keys, 2, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        offset_causal_attention(q, k, v)
    assert sum(saved) <= 2 * q.numel() + k.numel() + v.numel() + queries * HEADS, saved
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        _masked(q, k, v)
    assert max(saved) >= queries * keys  # the reference does keep its mask: the test can fail
