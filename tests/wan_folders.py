"""Tiny diffusers Wan transformer folders, made here without a network: config.json and seeded
diffusion_pytorch_model.safetensors written by diffusers' own `save_pretrained`; and latent
clips with captions for them (`video-latents:` folders)."""
from __future__ import annotations

from pathlib import Path

import torch

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
