"""The video DiTs (`stdit.py`, `dit.py`) and their rectified-flow objective (`flow.py`) as plain
single-device models behind the model protocol: packing never mixes clips, the attention
patterns are the protocol's, the flow draws depend on the key alone, recomputation changes
nothing, an empty shard still runs every attention and every gradient, bad clips are refused."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from ballast.vocabulary.model_shape import MODEL_PRESETS, ModelShape
from ballast.models import DiT, PackedStream, ParallelModel, STDiT, build_dit, build_model, build_stdit
from ballast.vocabulary.clip import Clip
from ballast.models.flow import clip_noise, clip_timestep, flow_pair, flow_targets, patchify, unpatchify
from ballast.models.kernels import local_attention
from ballast.models.span_sdpa import TINY_SPAN, batched_sdpa, tiny_attention
from ballast.models.protocol import INPUT, video_positions
from ballast.models.video_conditioning import CONDITION_TOKENS, LABELS
from ballast.models.video_layers import apply_rope, rope_angles, rope_pairs

pytestmark = pytest.mark.usefixtures("single_thread")

MODELS = {"stdit-tiny": build_stdit, "dit-tiny": build_dit}
CAPTION_DIM = 32
# Patches (frames, height, width): several frames, a single image (F = 1), frames of one patch,
# a clip of one token.
GRIDS = [(2, 2, 3), (1, 3, 2), (3, 1, 1), (1, 1, 1)]


def dense_attention(q, k, v, stream):
    """Reference attention of `stream.pattern` from a dense mask of position equalities: inside
    a sample, the same frame (spatial), the same row and column (temporal), or all (full).
    Depends on the rows' positions only, not on their order."""
    p = stream.positions
    mask = p[:, None, 0] == p[None, :, 0]
    if stream.pattern == "spatial":
        mask &= p[:, None, 1] == p[None, :, 1]
    elif stream.pattern == "temporal":
        mask &= (p[:, None, 2] == p[None, :, 2]) & (p[:, None, 3] == p[None, :, 3])
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hij,jhd->ihd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v)


def shape_of(name: str, caption_dim: int = 0) -> ModelShape:
    return dataclasses.replace(MODEL_PRESETS[name], caption_dim=caption_dim)


def model_of(name: str, caption_dim: int = 0, seed: int = 0):
    """The model with every parameter moved off its initialisation: adaLN-zero starts with zero
    gates and a zero final layer, under which most gradients are zero and prove nothing."""
    model = MODELS[name](shape_of(name, caption_dim), seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model


def clips_of(grids, caption_dim: int = 0, seed: int = 0, patch=(1, 2, 2), channels: int = 4) -> list[Clip]:
    generator = torch.Generator().manual_seed(seed)
    clips = []
    for i, grid in enumerate(grids):
        latent = torch.randn(channels, *(g * p for g, p in zip(grid, patch)), generator=generator)
        condition = torch.randn(i + 1, caption_dim, generator=generator) if caption_dim else i % LABELS
        clips.append(Clip(latent, condition, 1000 + 7 * i + seed))
    return clips


def stream_of(model, clips) -> PackedStream:
    return PackedStream.of([model.sample_shape(c) for c in clips])


def loss_and_grads(model, clips, recompute_layers: int = 0):
    model.zero_grad(set_to_none=True)
    stream = stream_of(model, clips)
    loss = model.loss(clips, stream, slice(0, stream.bounds[-1]), recompute_layers)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name, caption_dim", [("stdit-tiny", 0), ("dit-tiny", 0), ("stdit-tiny", CAPTION_DIM),
                                               ("dit-tiny", CAPTION_DIM)])
def test_a_packed_stream_is_the_sum_of_its_clips(name, caption_dim):
    model = model_of(name, caption_dim)
    clips = clips_of(GRIDS, caption_dim)
    loss, grads = loss_and_grads(model, clips)
    alone = [loss_and_grads(model, [clip]) for clip in clips]
    # fp32: packing changes only how SDPA batches equal spans and the order in which a sum (the
    # loss, a gradient over tokens) adds its terms, a few ulps (1.2e-7 relative) each. A gradient
    # entry is a sum with cancellation, so its error scales with its tensor's largest entries,
    # not its own. Measured: the loss (~50) within 4e-6, every gradient within 1.3e-6 of its
    # tensor's largest entry. A value crossing a sample moves them by orders of magnitude more
    # (a clip's timestep, condition or RoPE position reaching another clip fails every case).
    torch.testing.assert_close(loss, sum(l for l, _ in alone), rtol=1e-6, atol=2e-5)
    for n, g in grads.items():
        expected = sum(a[n] for _, a in alone)
        error = (g - expected).abs().max().item()
        assert error <= 1e-5 * expected.abs().max().item() + 1e-8, f"{n}: off by {error}"
        assert g.abs().sum() > 0, f"{n}: no gradient, the test proves nothing of it"


@pytest.mark.parametrize("name, caption_dim", [("stdit-tiny", 0), ("dit-tiny", 0), ("stdit-tiny", CAPTION_DIM),
                                               ("dit-tiny", CAPTION_DIM)])
def test_a_many_tiny_clips_are_the_sum_of_their_clips(name, caption_dim):
    # Clip sizes, frame sizes and column lengths repeat far apart in the stream, and captions
    # of several lengths go with one clip size: the attention kernel and cross-attention batch
    # them by size (index gathers; captions padded to the longest with a key mask).
    grids = [(1, 1, 2), (2, 1, 1), (1, 1, 1), (1, 2, 3), (1, 1, 2), (1, 1, 1), (2, 1, 1), (1, 1, 1), (2, 3, 1),
             (1, 1, 2)]
    model = model_of(name, caption_dim)
    clips = clips_of(grids, caption_dim)
    if caption_dim:  # caption lengths 1..3, unlike their clips' sizes
        clips = [Clip(c.latent, c.condition[:1 + i % 3], c.key) for i, c in enumerate(clips)]
    loss, grads = loss_and_grads(model, clips)
    alone = [loss_and_grads(model, [clip]) for clip in clips]
    torch.testing.assert_close(loss, sum(l for l, _ in alone), rtol=1e-6, atol=2e-5)
    for n, g in grads.items():
        expected = sum(a[n] for _, a in alone)
        error = (g - expected).abs().max().item()
        assert error <= 1e-5 * expected.abs().max().item() + 1e-8, f"{n}: off by {error}"


@pytest.mark.parametrize("causal", [True, False])
def test_b_sdpa_kernel_groups_equal_spans_wherever_they_are(causal):
    # Spans of equal length far apart and empty ones: one batched call per length (spans of
    # up to TINY_SPAN tokens: `tiny_attention`), equal to per-span SDPA up to float rounding.
    lengths = [2, 3, 0, 1, 2, 5, 1, 0, 3, 2, 1]
    bounds = (0, *itertools.accumulate(lengths))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(bounds[-1], heads, 8, generator=generator, requires_grad=True) for heads in (4, 2, 2))
    out = batched_sdpa(q, k, v, bounds, causal)
    expected = torch.cat([
        F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), is_causal=causal,
                                       enable_gqa=True)[0].transpose(0, 1)
        for a, b in zip(bounds, bounds[1:]) if b > a])
    torch.testing.assert_close(out, expected)
    grad = torch.randn(out.shape, generator=generator)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("length", range(1, TINY_SPAN + 1))
def test_b_tiny_spans_skip_sdpa_and_match_it(length, heads, kv_heads, causal):
    # Values and all three gradients of the elementwise path, grouped-query heads included,
    # against SDPA on the same [spans, heads, length, head_dim] batch.
    assert TINY_SPAN >= 1
    generator = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(7, length, h, 8, generator=generator, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    out = tiny_attention(q, k, v, causal)
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal,
                                              enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    if length == 1:  # a one-token span's output is its value, exactly
        assert torch.equal(out, v.repeat_interleave(heads // kv_heads, dim=2))
    grad = torch.randn(out.shape, generator=generator)
    got, want = torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):  # one token: q and k still get their (zero) gradient
        torch.testing.assert_close(g, w)


def test_b_tiny_spans_in_a_stream_of_clips_only_of_tiny_spans():
    # A stream whose every span is one token (frames of one patch, spatial): q and k still get
    # a gradient, as every rank's weights need one.
    lengths = [1] * 6
    bounds = (0, *itertools.accumulate(lengths))
    q, k, v = (torch.randn(6, 2, 8, requires_grad=True) for _ in range(3))
    out = batched_sdpa(q, k, v, bounds, False)
    assert torch.equal(out, v)
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and torch.equal(k.grad, torch.zeros_like(k))
    assert torch.equal(v.grad, torch.ones_like(v))


@pytest.mark.parametrize("name, block, pattern, attend", [
    pytest.param("stdit-tiny", 0, "spatial", local_attention, id="spatial-local"),
    pytest.param("stdit-tiny", 1, "temporal", local_attention, id="temporal-local"),
    pytest.param("dit-tiny", 0, "full", local_attention, id="full-local"),
    pytest.param("stdit-tiny", 0, "spatial", None, id="spatial-installed"),
    pytest.param("stdit-tiny", 1, "temporal", None, id="temporal-installed"),
    pytest.param("dit-tiny", 0, "full", None, id="full-installed")])
def test_b_self_attention_is_the_masked_reference(name, block, pattern, attend):
    torch.manual_seed(0)
    model = model_of(name)
    if attend is not None:
        model.install_attention(attend)
    else:  # whatever is installed is what the model calls
        seen = []
        model.install_attention(lambda q, k, v, s: seen.append(s.pattern) or dense_attention(q, k, v, s))
    attention = model.blocks()[block].attention
    stream = dataclasses.replace(PackedStream.of(GRIDS), pattern=pattern)
    x = torch.randn(stream.bounds[-1], model.shape.hidden)
    # The reference: the module's own projections and rotations, then the dense masked softmax.
    n, heads, head_dim = x.shape[0], model.shape.heads, model.shape.head_dim
    cos, sin = rope_angles(stream.positions[:, attention.axes], attention.pairs)
    q = apply_rope(attention.q_norm(attention.q(x).view(n, heads, head_dim)), cos, sin)
    k = apply_rope(attention.k_norm(attention.k(x).view(n, heads, head_dim)), cos, sin)
    v = attention.v(x).view(n, heads, head_dim)
    expected = attention.o(dense_attention(q, k, v, stream).reshape(n, -1))
    # fp32 softmax over at most 16 keys: the kernels' and the einsum's summation orders differ.
    torch.testing.assert_close(attention(x, stream), expected, rtol=1e-5, atol=1e-5)
    if attend is None:
        assert seen == [pattern]


def test_b_rope_is_relative_along_its_axes():
    # Wan's split of head_dim 128 (64 pairs): frame 22, row 21, column 21; and the tiny heads'.
    assert rope_pairs(128, 3) == (22, 21, 21) and rope_pairs(16, 3) == (4, 2, 2)
    assert rope_pairs(16, 2) == (4, 4) and rope_pairs(16, 1) == (8,)
    with pytest.raises(ValueError, match="head_dim 4: RoPE over 3 axes"):
        rope_pairs(4, 3)
    torch.manual_seed(0)
    q, k = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    a, b = torch.randint(0, 9, (5, 3)), torch.randint(0, 9, (5, 3))
    pairs = rope_pairs(16, 3)

    def scores(pa, pb):
        rotated_q, rotated_k = apply_rope(q, *rope_angles(pa, pairs)), apply_rope(k, *rope_angles(pb, pairs))
        return torch.einsum("ihd,ihd->ih", rotated_q, rotated_k)

    shift = torch.tensor([3, 1, 4])
    torch.testing.assert_close(scores(a + shift, b + shift), scores(a, b), rtol=1e-4, atol=1e-4)
    for axis in range(3):  # every axis turns some pairs
        moved = b.clone()
        moved[:, axis] += 1
        assert not torch.allclose(scores(a, moved), scores(a, b), atol=1e-3)


def test_c_flow_draws_depend_on_the_key_alone():
    latent = torch.randn(4, 2, 4, 6)
    same = [clip_noise(Clip(latent, 0, 5)), clip_noise(Clip(latent.clone(), 3, 5))]
    assert same[0][0] == same[1][0] and torch.equal(same[0][1], same[1][1])
    assert clip_timestep(Clip(latent, 0, 5)) == same[0][0]
    draws = [clip_noise(Clip(latent, 0, key)) for key in range(20)]
    assert len({t for t, _ in draws}) == 20 and not torch.equal(draws[0][1], draws[1][1])
    assert all(0.0 < t < 1.0 for t, _ in draws)
    ts = torch.tensor([clip_timestep(Clip(latent, 0, key)) for key in range(2000)])
    # logit-normal(0, 1): symmetric about 1/2, logit(t) with unit variance
    assert abs(ts.mean() - 0.5) < 0.02 and abs(torch.logit(ts).std() - 1.0) < 0.05
    # x_t = (1 - t) x0 + t noise, target = noise - x0
    clip = Clip(latent, 0, 5)
    noisy, target, t = flow_pair(clip, (1, 2, 2))
    t_, noise = clip_noise(clip)
    assert t == t_
    torch.testing.assert_close(unpatchify(target, (2, 2, 3), (1, 2, 2)), noise - latent)
    torch.testing.assert_close(unpatchify(noisy, (2, 2, 3), (1, 2, 2)), (1 - t) * latent + t * noise)
    torch.testing.assert_close(noisy - t * target, patchify(latent, (1, 2, 2)), rtol=1e-5, atol=1e-5)


def test_c_patch_tokens_are_in_stream_order():
    patch = (2, 2, 3)
    grid = (2, 3, 2)
    latent = torch.zeros(2, 4, 6, 6)
    for f, r, c in torch.cartesian_prod(*(torch.arange(g * p) for g, p in zip(grid, patch))).tolist():
        latent[:, f, r, c] = 100 * (f // 2) + 10 * (r // 2) + c // 3  # the patch each value is in
    tokens = patchify(latent, patch)
    positions = video_positions([grid], torch.arange(12), (0, 12))
    assert tokens.shape == (12, 2 * 12)
    patch_of_token = (100 * positions[:, 1] + 10 * positions[:, 2] + positions[:, 3]).float()
    assert torch.equal(tokens, patch_of_token[:, None].expand(12, 24))
    assert torch.equal(unpatchify(tokens, grid, patch), latent)
    clips = [Clip(torch.randn(4, 1, 2, 2), 0, 1), Clip(torch.randn(4, 2, 2, 4), 1, 2)]
    noisy, target, t = flow_targets(clips, (1, 2, 2))
    assert noisy.shape == target.shape == (5, 16) and t.shape == (2,)
    assert torch.equal(noisy[1:], flow_pair(clips[1], (1, 2, 2))[0])
    # The stream's one gather is every clip's own patchify, whatever the clips' shapes.
    clips = [Clip(torch.randn(3, f * 2, h * 2, w * 3), 0, key)
             for key, (f, h, w) in enumerate([(1, 1, 1), (2, 3, 1), (3, 1, 2), (1, 1, 1), (2, 2, 2)])]
    noisy, target, t = flow_targets(clips, patch)
    draws = [clip_noise(clip) for clip in clips]
    assert t.tolist() == [torch.tensor(d[0], dtype=torch.float32).item() for d in draws]
    assert torch.equal(target, torch.cat([patchify(n - c.latent, patch) for c, (_, n) in zip(clips, draws)]))
    torch.testing.assert_close(noisy, torch.cat([patchify((1 - t_) * c.latent + t_ * n, patch)
                                                 for c, (t_, n) in zip(clips, draws)]))


@pytest.mark.parametrize("name", MODELS)
def test_d_recomputation_changes_nothing(name):
    model = model_of(name)
    clips = clips_of(GRIDS)
    loss, grads = loss_and_grads(model, clips)
    for layers in (1, model.shape.layers):
        again, again_grads = loss_and_grads(model, clips, recompute_layers=layers)
        assert torch.equal(again, loss)
        assert all(torch.equal(again_grads[n], g) for n, g in grads.items())
    with pytest.raises(ValueError, match="recompute_layers 5 is outside 0..4"):
        loss_and_grads(model, clips, recompute_layers=5)


@pytest.mark.parametrize("name, caption_dim", [("stdit-tiny", 0), ("dit-tiny", CAPTION_DIM)])
def test_e_an_empty_shard_runs_every_attention_and_gradient(name, caption_dim):
    model = model_of(name, caption_dim)
    calls = []

    def attend(q, k, v, stream):  # what a rank holding nothing gets from Ulysses: its (empty) rows
        calls.append((q.shape[0], stream.pattern))
        return q + k + v

    model.install_attention(attend)
    clips = clips_of(GRIDS, caption_dim)
    stream = stream_of(model, clips)
    empty = dataclasses.replace(stream, positions=stream.positions[:0])
    loss = model.loss(clips, empty, slice(7, 7))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    patterns = ["spatial", "temporal"] * 2 if name == "stdit-tiny" else ["full"] * 4
    assert calls == [(0, p) for p in patterns]
    for n, p in model.named_parameters():  # FSDP2 reduce-scatters only parameters with a gradient
        assert p.grad is not None and not p.grad.any(), n


def test_e_dummy_sample_is_one_token():
    for name, caption_dim in (("stdit-tiny", 0), ("dit-tiny", CAPTION_DIM)):
        model = model_of(name, caption_dim)
        dummy = model.dummy_sample()
        assert model.sample_shape(dummy) == (1, 1, 1)
        stream = stream_of(model, [dummy])
        model.loss([dummy], stream, slice(0, 1)).backward()


def test_f_bad_clips_and_conditions_are_refused():
    model = model_of("stdit-tiny")
    good = torch.randn(4, 2, 4, 4)
    for latent, message in [
        (torch.randn(4, 4, 4), "4-D float tensor .* got 3-D"),
        (torch.zeros(4, 2, 4, 4, dtype=torch.long), "4-D float tensor .* got 4-D torch.int64"),
        (torch.randn(3, 2, 4, 4), "3 channels; model 'stdit-tiny' takes 4"),
        (torch.randn(4, 2, 3, 4), "height 3 is not a positive multiple of the patch's 2"),
        (torch.randn(4, 2, 4, 0), "width 0 is not a positive multiple"),
    ]:
        with pytest.raises(ValueError, match=message):
            model.sample_shape(Clip(latent, 0, 0))
    with pytest.raises(ValueError, match="a video sample is a Clip"):
        model.sample_shape(torch.zeros(3, dtype=torch.long))
    assert model.sample_shape(Clip(good, torch.tensor(3), 0)) == (2, 2, 2)
    clips = clips_of([(1, 1, 1), (1, 2, 1)])
    for condition, message in [(LABELS, f"sample 1 of the micro-batch: label {LABELS} is outside"),
                               (-1, "sample 1 of the micro-batch: label -1 is outside"),
                               (torch.randn(2, CAPTION_DIM),
                                r"sample 1 .*class labels \(caption_dim 0\), got a tensor of shape \(2, 32\)")]:
        bad = [clips[0], dataclasses.replace(clips[1], condition=condition)]
        with pytest.raises(ValueError, match=message):
            model.loss(bad, stream_of(model, clips), slice(0, 3))
    captioned = model_of("dit-tiny", CAPTION_DIM)
    clips = clips_of([(1, 1, 1), (1, 2, 1)], CAPTION_DIM)
    for condition, message in [(3, r"sample 1 .*caption embeddings \[tokens, 32\] \(float\), got 3"),
                               (torch.randn(2, 8), r"sample 1 .*caption embedding of shape \(2, 8\); the model takes"),
                               (torch.randn(0, CAPTION_DIM), r"sample 1 .*shape \(0, 32\)")]:
        bad = [clips[0], dataclasses.replace(clips[1], condition=condition)]
        with pytest.raises(ValueError, match=message):
            captioned.loss(bad, stream_of(captioned, clips), slice(0, 3))
    with pytest.raises(ValueError, match="layers must be even, got 3"):
        build_stdit(dataclasses.replace(MODEL_PRESETS["stdit-tiny"], layers=3))
    with pytest.raises(ValueError, match="caption_dim -1 must be >= 0"):
        dataclasses.replace(MODEL_PRESETS["dit-tiny"], caption_dim=-1)


def test_models_are_built_by_shape_and_seed():
    stdit, dit = build_model(MODEL_PRESETS["stdit-tiny"], 3), build_model(MODEL_PRESETS["dit-tiny"], 3)
    assert isinstance(stdit, STDiT) and isinstance(dit, DiT)
    assert isinstance(stdit, ParallelModel) and isinstance(dit, ParallelModel)
    assert [b.pattern for b in stdit.blocks()] == ["spatial", "temporal"] * 2
    assert [b.pattern for b in dit.blocks()] == ["full"] * 4
    again, other = build_stdit(MODEL_PRESETS["stdit-tiny"], 3), build_stdit(MODEL_PRESETS["stdit-tiny"], 4)
    assert all(torch.equal(a, b) for a, b in zip(stdit.parameters(), again.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(stdit.parameters(), other.parameters()))
    assert stdit.condition.labels.num_embeddings == LABELS * CONDITION_TOKENS
    for name in ("stdit3-1b", "stdit3-5b", "wan-1.3b", "wan-14b"):
        assert MODEL_PRESETS[name].caption_dim == 4096
        assert ModelShape.from_dict(MODEL_PRESETS[name].to_dict()) == MODEL_PRESETS[name]


def test_a_fresh_model_starts_from_identity_blocks():
    # adaLN-zero: all gates and the final layer start at zero, so the prediction is 0 and the
    # loss is the targets' mean square.
    model = build_dit(MODEL_PRESETS["dit-tiny"], 0)
    clips = clips_of(GRIDS)
    stream = stream_of(model, clips)
    loss = model.loss(clips, stream, slice(0, stream.bounds[-1]))
    expected = sum(flow_pair(c, (1, 2, 2))[1].pow(2).mean(1).sum() for c in clips)
    torch.testing.assert_close(loss, expected)


@dataclasses.dataclass(frozen=True)
class ColumnStream(PackedStream):
    """A one-process stream whose temporal layout holds its rows column by column (each clip's
    patch columns in turn, as the runtime's `columns` layout): rows move on arrange, so a model
    that carried a per-token value across an arrange would pair it with the wrong token."""

    held: torch.Tensor | None = None  # stream indices of the rows, in their current order

    def arrange(self, x, pattern):
        n = self.bounds[-1]
        order = torch.arange(n) if self.held is None else self.held
        if pattern == INPUT:
            target, pattern = torch.arange(n), self.pattern
        elif pattern == "temporal":
            every = video_positions(self.grids, torch.arange(n), self.bounds)
            key = ((every[:, 0] * 64 + every[:, 2]) * 64 + every[:, 3]) * 64 + every[:, 1]
            target = torch.argsort(key)
        else:
            target = torch.arange(n)
        where = torch.empty_like(order)
        where[order] = torch.arange(n)
        positions = video_positions(self.grids, target, self.bounds)
        return x[where[target]], dataclasses.replace(self, positions=positions, held=target, pattern=pattern)


def test_per_token_values_follow_the_tokens_through_arrange():
    model = model_of("stdit-tiny")
    model.install_attention(dense_attention)  # the mask comes from positions, whatever the row order
    clips = clips_of(GRIDS)
    plain = stream_of(model, clips)
    moving = ColumnStream(plain.bounds, plain.positions, plain.grids)
    losses = [model.loss(clips, s, slice(0, plain.bounds[-1])) for s in (plain, moving)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_held_samples_go_to_the_host_once_per_layout_not_per_block(name):
    # Finding a layout's runs of samples copies them to the host, which waits for the device
    # on a GPU: once per positions tensor (one layout here), not in each of the blocks (8 copies
    # before: 2 per block).
    from torch.overrides import TorchFunctionMode

    class HostCopies(TorchFunctionMode):
        count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            HostCopies.count += getattr(func, "__name__", "") == "cpu"
            return func(*args, **(kwargs or {}))

    model = model_of(name)
    clips = clips_of(GRIDS)
    stream = stream_of(model, clips)
    with HostCopies():
        model.loss(clips, stream, slice(0, stream.bounds[-1]))
    assert model.shape.layers > 1 and HostCopies.count == 2  # the runs' samples and counts
