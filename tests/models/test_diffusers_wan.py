"""diffusers' Wan transformers (`diffusers:PATH`) in one process: the shape read from the folder,
the packed stream against diffusers' own forward clip by clip, the folder written back, and the
errors before any rank starts.

The reference uses no ballast code but the flow targets: the folder loaded with
`WanTransformer3DModel.from_pretrained` (diffusers' own attention processor), every clip run
through its forward alone ([1, C, F, H, W] latent, [1] timestep, [1, L, text_dim] text), the
per-token squared error summed. ballast's packed stream computes the same fp32 function in
another order: a linear map for the Conv3d patch embedding, one attention over the packed
clips, cross-attention batched by clip size with masked padding. Tolerance GRAD_RTOL: 1e-5 of
the largest entry of each parameter's reference gradient, as for transformers' models in
`test_hf_causal_lm.py`, floored for the nearly cancelling ones (`wan_cases.gradient_errors`);
the loss to 1e-5 relative. Measured: gradients 2e-6 (the cross-attention key biases), losses
1e-7 (`test_packed_stream_is_diffusers_forward_clip_by_clip`, -s prints them); losing the
one-token clip from the packed stream moves the loss by 1.1e-2 and the gradient by 0.65.
"""
from __future__ import annotations

import json
import sys

import pytest
import torch
from wan_cases import SIX_HEADS, TINY_WAN, captioned, diffusers_loss, gradient_errors, save_wan

from ballast.dataset.video import open_clip_stream
from ballast.models import PackedStream, build_model, check_buildable
from ballast.vocabulary.clip import Clip
from ballast.vocabulary.model_shape import get_model_shape

GRAD_RTOL = 1e-5
GRIDS = [(3, 4, 6), (1, 5, 5), (2, 3, 1), (1, 1, 1), (4, 2, 2), (1, 2, 7)]
"""A clip, an image, a column, one token, and others; none a multiple of another's shape."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_wan(tmp_path_factory.mktemp("wan") / "tiny")


def test_shape_is_read_from_the_config_alone(folder, tmp_path):
    shape = get_model_shape(f"diffusers:{folder}")
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.ffn) == (2, 24, 2, 2, 32)
    assert shape.vocab == 4 * 4 and shape.caption_dim == 16 and shape.max_axis_patches == 32
    assert shape.attention == "full" and shape.cross_attention and not shape.gated_mlp
    geometry = shape.video_geometry
    assert (geometry.patch, geometry.latent_channels, geometry.space, geometry.frames_in) == ((1, 2, 2), 4, 8, 4)
    # In a pipeline folder the VAE beside it gives the compression (Wan 2.2's: 16x space).
    pipeline = tmp_path / "pipeline"
    save_wan(pipeline / "transformer")
    (pipeline / "vae").mkdir()
    (pipeline / "vae" / "config.json").write_text(json.dumps({"scale_factor_spatial": 16,
                                                               "scale_factor_temporal": 4}))
    assert get_model_shape(f"diffusers:{pipeline / 'transformer'}").video_geometry.space == 16


def test_packed_stream_is_diffusers_forward_clip_by_clip(folder):
    from diffusers import WanTransformer3DModel

    shape = get_model_shape(f"diffusers:{folder}")
    clips = captioned(shape, GRIDS)
    reference = WanTransformer3DModel.from_pretrained(folder)
    want_loss = diffusers_loss(reference, clips, shape.video_geometry.patch)
    want_loss.backward()
    want = {name: p.grad for name, p in reference.named_parameters()}
    model = build_model(shape)
    stream = PackedStream.of([model.sample_shape(c) for c in clips])
    for recompute in (0, 2):
        model.zero_grad()
        loss = model.loss(clips, stream, slice(0, stream.bounds[-1]), recompute)
        loss.backward()
        errors = gradient_errors({name.removeprefix("wan."): p.grad for name, p in model.named_parameters()}, want)
        worst = max(errors, key=errors.get)
        print(f"recompute {recompute}: loss {abs(loss.item() / want_loss.item() - 1):.1e}, gradient "
              f"{errors[worst]:.1e} ({worst})")
        assert loss.item() == pytest.approx(want_loss.item(), rel=GRAD_RTOL) and errors[worst] <= GRAD_RTOL
    # The wrapper's reference (what verify compares with) is diffusers' forward itself, value for value.
    assert torch.equal(model.reference_loss(clips).detach(), want_loss.detach())


def test_synthetic_clips_with_their_captions_are_diffusers_forward(folder):
    """A step's batch of `video-synthetic` clips as train opens it for the Wan (captions of its
    text width, one per shape kind) trains the function diffusers' forward computes."""
    from diffusers import WanTransformer3DModel

    shape = get_model_shape(f"diffusers:{folder}")
    batch = next(open_clip_stream("video-synthetic:1", shape.video_geometry, 48, 64, 0, shape.caption_dim,
                                  shape.max_axis_patches))
    assert len(batch.samples) > 1 and all(c.condition.shape[1] == shape.caption_dim for c in batch.samples)
    model = build_model(shape)
    stream = PackedStream.of([model.sample_shape(c) for c in batch.samples])
    with torch.no_grad():
        packed = model.loss(batch.samples, stream, slice(0, stream.bounds[-1])).item()
        alone = diffusers_loss(WanTransformer3DModel.from_pretrained(folder), batch.samples, model.patch).item()
    assert packed == pytest.approx(alone, rel=GRAD_RTOL)


def test_folder_written_back_loads_with_the_same_weights_and_outputs(folder, tmp_path):
    from diffusers import WanTransformer3DModel

    from ballast.models.diffusers_wan import save_wan as write_folder

    model = build_model(get_model_shape(f"diffusers:{folder}"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # trained, as far as the folder can tell
    write_folder(dict(model.wan.config), {k.removeprefix("wan."): v for k, v in model.state_dict().items()},
                 tmp_path / "out")
    loaded = WanTransformer3DModel.from_pretrained(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.wan.state_dict().values()))
    clips = captioned(model.shape, GRIDS[:3])
    with torch.no_grad():
        assert torch.equal(diffusers_loss(loaded, clips, model.patch), model.reference_loss(clips))


def test_profiled_depths_are_the_folders_first_blocks(folder):
    import dataclasses

    shape = get_model_shape(f"diffusers:{folder}")
    whole, shallow = build_model(shape), build_model(dataclasses.replace(shape, layers=1))
    assert len(shallow.blocks()) == 1 and shallow.wan.config.num_layers == 1
    assert torch.equal(shallow.wan.blocks[0].attn1.to_q.weight, whole.wan.blocks[0].attn1.to_q.weight)


# --------------------------------------------------------------------------------------------
# errors: one line each, before any rank starts


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return f"diffusers:{folder}"


@pytest.mark.parametrize("changes, message", [
    ({"_class_name": "LTXVideoTransformer3DModel"}, "class 'LTXVideoTransformer3DModel' (config.json's _class_name) "
                                                    "is not supported"),
    ({"image_dim": 1280, "added_kv_proj_dim": 24}, "image conditioning (image_dim, added_kv_proj_dim"),
    ({"in_channels": 36}, "in_channels 36 != out_channels 4"),
])
def test_configs_ballast_does_not_train_are_refused_from_the_config(tmp_path, changes, message):
    spec = edit_config(save_wan(tmp_path / "wan"), **changes)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_model_shape(spec)


def test_missing_config_and_mismatched_weights(tmp_path):
    with pytest.raises(ValueError, match="no config.json there"):
        get_model_shape(f"diffusers:{tmp_path}")
    spec = edit_config(save_wan(tmp_path / "wan"), ffn_dim=48)
    with pytest.raises(ValueError, match=r"do not match the model its config.json describes.*mis-shaped: "
                                         r"blocks.0.ffn.net.0.proj.weight \[32, 24\] \(config: \[48, 24\]"):
        check_buildable(get_model_shape(spec))


def test_clips_the_model_cannot_take(folder):
    model = build_model(get_model_shape(f"diffusers:{folder}"))
    [clip] = captioned(model.shape, [(1, 2, 2)])
    with pytest.raises(ValueError, match=r"latent width 5 is not a positive multiple of the patch's 2"):
        model.sample_shape(Clip(torch.zeros(4, 1, 4, 5), clip.condition, 0))
    with pytest.raises(ValueError, match=r"1 x 1 x 33 patches; model 'tiny'\'s positions cover at most 32"):
        model.sample_shape(Clip(torch.zeros(4, 1, 2, 66), clip.condition, 0))
    with pytest.raises(ValueError, match=r"caption embeddings \[tokens, 16\]"):
        model.sample_shape(Clip(clip.latent, 3, 0))


def test_dropout_is_refused(folder):
    from ballast.models.diffusers_wan import DiffusersWan

    model = build_model(get_model_shape(f"diffusers:{folder}"))
    model.wan.blocks[1].attn1.to_out[1].p = 0.1
    with pytest.raises(ValueError, match=r"dropout in blocks.1.attn1.to_out.1 .* the gradient would depend on the plan"):
        DiffusersWan(model.wan, model.shape)


@pytest.mark.parametrize("hidden", [("diffusers",), ("accelerate",), ("diffusers", "accelerate")])
def test_without_diffusers_planning_works_and_building_says_how_to_install(folder, monkeypatch, hidden):
    from ballast.models import diffusers_wan

    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)  # `import NAME` raises ImportError
    diffusers_wan.wan_class.cache_clear()
    try:
        shape = get_model_shape(f"diffusers:{folder}")  # simulate's part: the config alone
        with pytest.raises(ValueError, match=rf"needs {' and '.join(hidden)}, not installed here: "
                                             r"pip install 'ballast\[diffusers\]'"):
            check_buildable(shape)
    finally:
        diffusers_wan.wan_class.cache_clear()


def test_six_heads_need_context_parallelism_at_degree_4(tmp_path):
    shape = get_model_shape(f"diffusers:{save_wan(tmp_path / 'six', **{k: SIX_HEADS[k] for k in SIX_HEADS})}")
    assert shape.heads == 6 and shape.supports_degree(2) and not shape.supports_degree(4)
    shape.check_degree(4, cp=2)
    assert TINY_WAN["num_attention_heads"] == 2
