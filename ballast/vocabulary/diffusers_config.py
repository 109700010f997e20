"""The shape of a diffusers Wan transformer folder (`--model diffusers:PATH`), read from its
config.json alone: what simulate prices and every other command checks before it imports
diffusers. The model itself is `ballast.models.diffusers_wan`'s.

A `WanTransformer3DModel` folder (Wan 2.1 text-to-video, Wan 2.2 TI2V, trained text-to-video,
and each T2V-A14B expert) is a full-attention video DiT: `num_layers` blocks of self-attention with 3-D RoPE over every
clip, cross-attention to the clip's text and a GELU feed-forward of `ffn_dim`, conditioned on
the timestep by adaLN. Its token is a `patch_size` block of `in_channels` latent channels. The
VAE's compression comes from the pipeline folder's `../vae/config.json` when the transformer
sits in one (`scale_factor_temporal`, `scale_factor_spatial`), else from Wan 2.1's VAE (4, 8),
the defaults diffusers' own WanPipeline takes without a VAE.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .value_checks import read_json

DIFFUSERS_PREFIX = "diffusers:"
WAN_CLASS = "WanTransformer3DModel"
"""The diffusers class ballast trains (a config's `_class_name`)."""
WAN_SIZES = ("patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "text_dim", "ffn_dim",
             "num_layers")
"""The config.json keys the shape is read from (diffusers writes every argument of the class)."""
RATIONALE = "ballast trains text-to-video WanTransformer3DModel (Wan 2.1 T2V, Wan 2.2 TI2V and T2V-A14B)"
WAN_VAE = {"scale_factor_temporal": 4, "scale_factor_spatial": 8}
"""Wan 2.1's VAE: what diffusers' WanPipeline assumes without one."""
ROPE_MAX_SEQ_LEN = 1024
"""The class's default `rope_max_seq_len`: positions per axis its RoPE table holds."""


def wan_shape_fields(folder: str) -> dict[str, Any]:
    """`ModelShape`'s fields for the Wan transformer in `folder` (ValueError naming the folder and
    what it cannot be: no config, another class, image conditioning, missing sizes)."""
    path = Path(folder)
    where = f"{DIFFUSERS_PREFIX}{folder}"
    if not (path / "config.json").is_file():
        raise ValueError(f"{where}: no config.json there (a diffusers model folder has one; for a pipeline "
                         f"folder give its transformer/ subfolder)")
    config = read_json(path / "config.json", "model config")
    kind = config.get("_class_name") if isinstance(config, dict) else None
    if kind != WAN_CLASS:
        raise ValueError(f"{where}: class {kind!r} (config.json's _class_name) is not supported: {RATIONALE}")
    missing = [k for k in WAN_SIZES if k not in config]
    if missing:
        raise ValueError(f"{where}: its config.json lacks {', '.join(missing)}")
    image = [k for k in ("image_dim", "added_kv_proj_dim") if config.get(k) is not None]
    if image:
        raise ValueError(f"{where}: image conditioning ({', '.join(image)}: Wan 2.1 I2V's CLIP image tokens) is "
                         f"not supported: {RATIONALE}; its clips carry text embeddings only")
    channels, out = config["in_channels"], config.get("out_channels") or config["in_channels"]
    if out != channels:
        raise ValueError(f"{where}: in_channels {channels} != out_channels {out} (an image-to-video model whose "
                         f"input carries conditioning channels) is not supported: {RATIONALE}")
    patch = tuple(config["patch_size"])
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    vae = _vae_config(path)
    return dict(
        name=path.name, layers=config["num_layers"], hidden=heads * head_dim, heads=heads, kv_heads=heads,
        ffn=config["ffn_dim"], vocab=channels * math.prod(patch), gated_mlp=False, source=f"{DIFFUSERS_PREFIX}{folder}",
        attention="full", cross_attention=True, caption_dim=config["text_dim"],
        video=dict(frames_in=vae["scale_factor_temporal"], frames_out=1, causal_first_frame=True,
                   space=vae["scale_factor_spatial"], patch=patch, latent_channels=channels),
        max_axis_patches=config.get("rope_max_seq_len", ROPE_MAX_SEQ_LEN))


def _vae_config(transformer: Path) -> dict[str, int]:
    """The compression of the pipeline's VAE beside the transformer folder, else Wan 2.1's."""
    vae = transformer.parent / "vae" / "config.json"
    config = read_json(vae, "VAE config") if vae.is_file() else {}
    return {key: config.get(key, default) for key, default in WAN_VAE.items()}
