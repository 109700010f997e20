"""`video-latents:PATH`: a folder of precomputed VAE latents, one clip per file.

  NAME.safetensors   a tensor `latent` [C, F, H, W] (floating), optionally `caption` [L, D]
                     (a caption embedding, floating) or `label` (an integer, 0-d or 1 element)
  NAME.npy           the latent [C, F, H, W] (floating); condition label 0

Files are found anywhere under PATH (hidden folders and files skipped), sample id i is the i-th
in sorted relative path order. The folder is indexed once from the files' headers (nothing of
the data is read) and every clip is loaded when its batch is drawn, memory-mapped, as float32.
C must be the model's latent channels and the patch must divide F, H and W. Every file is
captioned, with one embedding width D, or none is (a model takes one kind of condition: a
caption-conditioned model's text width, or labels); a captioned file's label is ignored.
Anything else is a ValueError naming the file.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from ..vocabulary.model_shape import VideoGeometry

LATENTS_PREFIX = "video-latents"
SUFFIXES = (".safetensors", ".npy")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
INT_DTYPES = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8")


def _header(path: Path) -> tuple[list[int], str, list[int] | None, str | None]:
    """(latent shape, latent dtype, caption shape or None, label dtype or None) of a file."""
    if path.suffix == ".npy":
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as e:
            raise ValueError(f"{path}: not a readable .npy array ({e})") from e
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"{path}: latent dtype {array.dtype} is not floating")
        return list(array.shape), str(array.dtype), None, None
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            info = {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype())
                    for k in ("latent", "caption", "label") if k in names}
    except Exception as e:
        raise ValueError(f"{path}: not a readable .safetensors file ({e})") from e
    if "latent" not in info:
        raise ValueError(f"{path}: no tensor named `latent` (has {', '.join(sorted(names)) or 'none'})")
    shape, dtype = info["latent"]
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{path}: latent dtype {dtype} is not floating")
    caption = None
    if "caption" in info:
        caption, caption_dtype = info["caption"]
        if len(caption) != 2 or min(caption) < 1:
            raise ValueError(f"{path}: caption of shape {list(caption)} is not a 2-D [tokens, dim] embedding")
        if caption_dtype not in FLOAT_DTYPES:
            raise ValueError(f"{path}: caption dtype {caption_dtype} is not floating")
    label = None
    if "label" in info:
        label_shape, label = info["label"]
        if label not in INT_DTYPES or int(np.prod(label_shape)) != 1:
            raise ValueError(f"{path}: label must be one integer, got {label} of shape {list(label_shape)}")
    return list(shape), dtype, caption, label


class LatentFolder:
    """The clip dataset of `video-latents:PATH` (module docstring)."""

    def __init__(self, folder: str, geometry: VideoGeometry, caption_dim: int | None = None) -> None:
        self.name, self.geometry = f"{LATENTS_PREFIX}:{folder}", geometry
        root = Path(folder)
        if not root.is_dir():
            raise ValueError(f"{self.name}: no such folder")
        self.files = sorted((p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()
                             and not any(part.startswith(".") for part in p.relative_to(root).parts)),
                            key=lambda p: p.relative_to(root).as_posix())
        if not self.files:
            raise ValueError(f"{self.name}: no .safetensors or .npy files in the folder")
        channels, patch = geometry.latent_channels, geometry.patch
        shapes, self.labelled, listing = [], [], hashlib.sha256()
        self.caption_dim: int | None = None
        for i, path in enumerate(self.files):
            shape, dtype, caption, label = _header(path)
            if len(shape) != 4:
                raise ValueError(f"{path}: latent of shape {shape} is not [channels, frames, height, width]")
            if shape[0] != channels:
                raise ValueError(f"{path}: latent has {shape[0]} channels, the model's VAE has {channels}")
            if min(shape) < 1 or any(n % p for n, p in zip(shape[1:], patch)):
                raise ValueError(f"{path}: latent frames x height x width {shape[1]} x {shape[2]} x {shape[3]} "
                                 f"is not a whole number of {patch[0]} x {patch[1]} x {patch[2]} patches")
            dim = None if caption is None else caption[1]
            if i == 0:
                self.caption_dim = dim
            elif dim != self.caption_dim:
                first = "no caption" if self.caption_dim is None else f"captions of width {self.caption_dim}"
                raise ValueError(f"{path}: {'no caption' if dim is None else f'caption of width {dim}'}, but "
                                 f"{self.files[0]} has {first}: every clip needs the same kind of condition")
            shapes.append([n // p for n, p in zip(shape[1:], patch)])
            self.labelled.append(label is not None)
            listing.update(f"{path.relative_to(root).as_posix()}|{shape}|{dtype}|{caption}|{label}|"
                           f"{path.stat().st_size}\n".encode())
        self.shapes = np.array(shapes, dtype=np.int64)
        if caption_dim is not None and (self.caption_dim or 0) != caption_dim:
            has = f"captions of width {self.caption_dim}" if self.caption_dim else "labels (no `caption` tensor)"
            takes = f"caption embeddings of width {caption_dim}" if caption_dim else "class labels"
            raise ValueError(f"{self.name}: its clips carry {has} ({self.files[0]}), but the model is "
                             f"conditioned on {takes}")
        self.fingerprint = f"{self.name}|{geometry}|{listing.hexdigest()[:16]}"

    def clip_name(self, sample_id: int) -> str:
        return str(self.files[sample_id])

    def content(self, sample_id: int) -> tuple[torch.Tensor, int | torch.Tensor]:
        path = self.files[sample_id]
        try:
            if path.suffix == ".npy":
                array = np.load(path, mmap_mode="r", allow_pickle=False)
                return torch.from_numpy(np.array(array, dtype=np.float32)), 0
            with safe_open(str(path), framework="pt") as f:
                latent = f.get_tensor("latent").to(torch.float32).contiguous()
                if self.caption_dim is not None:
                    return latent, f.get_tensor("caption").to(torch.float32).contiguous()
                label = int(f.get_tensor("label").reshape(-1)[0]) if self.labelled[sample_id] else 0
        except Exception as e:
            raise ValueError(f"{path}: cannot read the clip ({e})") from e
        if label < 0:
            raise ValueError(f"{path}: label {label} is negative")
        return latent, label

    def describe(self) -> str:
        tokens = self.shapes.prod(axis=1)
        kinds = {s: sum(p.suffix == s for p in self.files) for s in SUFFIXES}
        condition = (f"caption embeddings of width {self.caption_dim}" if self.caption_dim is not None
                     else f"labels ({sum(self.labelled)} labelled files, the rest 0)")
        return (f"{self.name}: {len(self.files)} clips ({', '.join(f'{n} {s}' for s, n in kinds.items() if n)}), "
                f"{self.geometry.latent_channels} latent channels, {tokens.min()}..{tokens.max()} patches, {condition}")
