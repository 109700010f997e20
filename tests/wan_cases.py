"""What the diffusers Wan tests share: tiny Wan transformer folders, made here without a network
(config.json and seeded diffusion_pytorch_model.safetensors written by diffusers' own
`save_pretrained`); captioned clips and `video-latents:` folders for them; diffusers' own
forward as the reference; and how far a gradient is from it.

Gradient errors (`gradient_errors`) are per parameter, relative to the largest entry of that
parameter's reference gradient, floored at FLOOR of the largest entry of the whole gradient: a
parameter whose gradient is a sum that nearly cancels (the cross-attention key biases, which
reach the loss only through norm_k: 0.2-0.8% of the largest entry on these models) carries the
rounding of its terms, not of its size. Measured without the floor: up to 7.3e-6 on those
biases, 2e-6 elsewhere, over 6 seeds of the single-process comparison.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ballast.models.flow import TIMESTEP_SCALE, flow_pair, patchify, token_loss, unpatchify
from ballast.models.gaussian_clips import gaussian_clips
from ballast.vocabulary.clip import Clip

FLOOR = 0.01

TINY_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
"""The tiny Wan of diffusers' own tests (tests/models/transformers/test_models_transformer_wan.py):
2 heads of 12, 2 layers, patch (1, 2, 2), 4 latent channels, text width 16, RoPE over 32
patches per axis."""
SIX_HEADS = {**TINY_WAN, "num_attention_heads": 6, "attention_head_dim": 8}
"""The same with 6 heads of 8: SP degree 4 does not divide them, so it needs context parallelism."""


def save_wan(folder: Path, seed: int = 0, **overrides) -> Path:
    """A tiny Wan (`TINY_WAN` with `overrides`) with seeded weights, saved with `save_pretrained`."""
    from diffusers import WanTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = WanTransformer3DModel(**{**TINY_WAN, **overrides})
    model.save_pretrained(folder)
    assert (folder / "diffusion_pytorch_model.safetensors").is_file()
    return folder


def save_latents(folder: Path, grids: list[tuple[int, int, int]], text_dim: int = 16, seed: int = 0) -> Path:
    """A `video-latents:` folder of one clip per grid (frames, height, width in patches of
    (1, 2, 2), 4 channels): a smooth seeded latent and a caption of 1 + i % 5 tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    for i, (f, h, w) in enumerate(grids):
        base = torch.randn(4, 1, 1, 1, generator=generator)
        ramp = torch.linspace(-1, 1, 2 * w).view(1, 1, 1, -1) * torch.randn(4, 1, 1, 1, generator=generator)
        latent = (base + ramp + 0.1 * torch.randn(4, f, 2 * h, 2 * w, generator=generator)).contiguous()
        caption = torch.randn(1 + i % 5, text_dim, generator=generator)
        save_file({"latent": latent, "caption": caption}, str(folder / f"clip{i:03d}.safetensors"))
    return folder


def captioned(shape, grids: list[tuple[int, int, int]], seed: int = 0) -> list[Clip]:
    """Gaussian clips of these grids with captions of 1 + i % 4 tokens (texts of several lengths)."""
    clips = gaussian_clips(grids, shape, seed)
    return [Clip(c.latent, c.condition[:1 + i % 4], c.key) for i, c in enumerate(clips)]


def diffusers_loss(model: torch.nn.Module, clips: list[Clip], patch: tuple[int, int, int]) -> torch.Tensor:
    """The summed flow loss of `clips` through diffusers' own forward, clip by clip: ballast's flow
    targets, nothing of ballast's model code."""
    total = torch.zeros(())
    for clip in clips:
        noisy, target, t = flow_pair(clip, patch)
        grid = tuple(s // p for s, p in zip(clip.latent.shape[1:], patch))
        out = model(hidden_states=unpatchify(noisy, grid, patch)[None],
                    timestep=torch.tensor([t]) * TIMESTEP_SCALE, encoder_hidden_states=clip.condition[None]).sample
        total = total + token_loss(patchify(out[0], patch), target).sum()
    return total


def gradient_errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    """Every parameter's largest gradient error, relative to its own largest reference entry or
    FLOOR of the whole gradient's, whichever is larger (module docstring)."""
    floor = FLOOR * max(float(w.abs().max()) for w in want.values())
    return {name: float((got[name] - w).abs().max()) / max(float(w.abs().max()), floor) for name, w in want.items()}
