"""Training data for video diffusion models: clip datasets as seeded, resumable global batches.

    stream = open_clip_stream("video-synthetic:3", geometry, tokens_per_step=8192, max_len=2048, seed=0)
    batch = stream.next_batch()    # batch.shapes -> planner, batch.samples (Clips) -> model.loss
    checkpoint["data"] = stream.state_dict()

Specs (`VIDEO_DATA_SYNTAX`):

  video-synthetic[:SEED]       procedural latent clips (`video_synthetic.py`) of DCP's any-size
                               bucket shapes, scaled down uniformly to fit max_len
  video-synthetic:SEED:PATH    the same content, shapes from a `videos:` clip list (pixels per line)
  video-latents:PATH           a folder of precomputed latents, one clip per .safetensors/.npy
                               file (`video_latents.py`)

A `ClipStream` batches a dataset exactly as `BatchStream` batches a corpus (`stream.EpochStream`:
epoch permutation seeded by (seed, epoch), the longest run of samples under tokens_per_step,
no batch across an epoch's end, the position as state). A sample is one whole clip: its tokens
are its latent patches F'·H'·W', and a clip over max_len (or with an axis longer than the model's
positions cover, `ModelShape.max_axis_patches`) is an error when the dataset is opened (every
shape is known up front), never skipped or cut. A clip's key, which seeds its noise and
timestep, is a hash of (seed, epoch, sample id): the same in whatever plan, new in every epoch.
"""
from __future__ import annotations

import hashlib
from typing import Protocol

import numpy as np
import torch

from ..vocabulary.clip import Clip
from ..vocabulary.model_shape import ModelShape, VideoGeometry
from .stream import EpochStream, GlobalBatch
from .video_latents import LATENTS_PREFIX, LatentFolder
from .video_synthetic import SYNTHETIC_PREFIX, SyntheticClips

VIDEO_DATA_SYNTAX = ("video-synthetic[:SEED[:PATH]] (procedural latent clips; PATH: a `videos:` clip list, "
                     "`frames height width` in pixels per line) | video-latents:PATH (a folder of "
                     ".safetensors/.npy latents [C, F, H, W])")


class ClipDataset(Protocol):
    """A finite, indexed set of clips whose shapes are all known up front."""

    name: str
    """The spec, for messages."""
    fingerprint: str
    """Changes whenever the clips could; a ClipStream's state is only valid for it."""
    shapes: np.ndarray
    """int64 [num_samples, 3]: every clip's (frames, height, width) in latent patches."""

    def clip_name(self, sample_id: int) -> str:
        """Where the clip comes from (a file, a clip list's line), for messages."""

    def content(self, sample_id: int) -> tuple[torch.Tensor, int | torch.Tensor]:
        """The clip's float32 latent [C, F, H, W] (latent pixels) and its condition."""

    def describe(self) -> str:
        """One line for the training log."""


def clip_key(seed: int, epoch: int, sample_id: int) -> int:
    """The noise/timestep seed of a clip drawn in `epoch`: a 63-bit hash of the draw alone."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class ClipStream(EpochStream):
    """Endless stream of global batches of whole clips over `dataset` (module docstring)."""

    def __init__(self, dataset: ClipDataset, geometry: VideoGeometry, tokens_per_step: int,
                 max_len: int, seed: int, max_axis: int | None = None) -> None:
        super().__init__(tokens_per_step, max_len, seed)
        self.dataset, self.geometry = dataset, geometry
        self.shapes = np.asarray(dataset.shapes, dtype=np.int64).reshape(-1, 3)
        self.num_samples = len(self.shapes)
        if self.num_samples == 0:
            raise ValueError(f"{dataset.name}: no clips")
        self._tokens = self.shapes.prod(axis=1)
        over = np.flatnonzero(self._tokens > max_len)
        if over.size:
            i = int(over[0])
            f, h, w = self.shapes[i].tolist()
            more = f" (and {over.size - 1} more)" if over.size > 1 else ""
            raise ValueError(f"{dataset.clip_name(i)} (sample {i}): {f} x {h} x {w} latent patches = "
                             f"{int(self._tokens[i])} tokens, over max_len {max_len}{more}; clips are "
                             f"never cut or skipped: raise --max-len or shorten the clip")
        over = np.flatnonzero(self.shapes.max(axis=1) > (max_axis or np.inf))
        if over.size:
            i = int(over[0])
            f, h, w = self.shapes[i].tolist()
            more = f" (and {over.size - 1} more)" if over.size > 1 else ""
            raise ValueError(f"{dataset.clip_name(i)} (sample {i}): {f} x {h} x {w} latent patches, an axis over "
                             f"the model's {max_axis} (the positions per axis of its RoPE table){more}; clips are "
                             f"never cut or skipped: shorten or downscale the clip")

    def sample_lengths(self, sample_ids: np.ndarray | list[int]) -> np.ndarray:
        """Tokens (latent patches) of each sample id."""
        return self._tokens[np.asarray(sample_ids, dtype=np.int64)]

    def planned_samples(self, sample_ids: np.ndarray | list[int]) -> list:
        """Each clip's (frames, height, width) in latent patches, as a planner plans it."""
        return [tuple(s) for s in self.shapes[np.asarray(sample_ids, dtype=np.int64)].tolist()]

    def sample_name(self, sample_id: int) -> str:
        return f"sample {sample_id} ({self.dataset.clip_name(sample_id)})"

    def sample_clip(self, sample_id: int, epoch: int) -> Clip:
        """The clip `sample_id` as drawn in `epoch` (its key depends on both)."""
        latent, condition = self.dataset.content(sample_id)
        pf, ph, pw = self.geometry.patch
        f, h, w = self.shapes[sample_id].tolist()
        expected = (self.geometry.latent_channels, f * pf, h * ph, w * pw)
        if tuple(latent.shape) != expected or latent.dtype != torch.float32:  # e.g. a file rewritten
            raise ValueError(f"{self.dataset.clip_name(sample_id)}: latent {list(latent.shape)} "
                             f"{latent.dtype}, indexed as {list(expected)} float32 when the data was opened")
        return Clip(latent=latent, condition=condition, key=clip_key(self.seed, epoch, sample_id))

    def make_batch(self, sample_ids: np.ndarray, epoch: int) -> GlobalBatch:
        ids = sample_ids.tolist()
        return GlobalBatch(sample_ids=ids, lengths=self.sample_lengths(sample_ids).tolist(),
                     samples=[self.sample_clip(i, epoch) for i in ids], epoch=epoch,
                     shapes=self.planned_samples(sample_ids))

    def state_identity(self) -> dict:
        return {"data": self.dataset.fingerprint}

    def describe(self) -> str:
        return self.dataset.describe()


def is_video_data(spec: str) -> bool:
    """Whether a `--data` spec names clips (`open_clip_stream`) rather than a text corpus."""
    return spec.partition(":")[0] in (SYNTHETIC_PREFIX, LATENTS_PREFIX)


def check_data_kind(spec: str, shape: ModelShape) -> None:
    """ValueError unless the data suits the model: clips for a video DiT, text for a language model."""
    video_model, video_data = shape.pattern.clips, is_video_data(spec)
    if video_model != video_data:
        raise ValueError(f"model {shape.name!r} is a {'video DiT' if video_model else 'language model'} but "
                         f"--data {spec!r} is {'video clips' if video_data else 'text'}: "
                         f"{'use video-synthetic or video-latents:PATH' if video_model else 'use a text corpus'}")


def open_clip_dataset(spec: str, geometry: VideoGeometry, max_len: int, caption_dim: int | None = None
                      ) -> ClipDataset:
    """The clip dataset a `--data` spec names (`VIDEO_DATA_SYNTAX`); ValueError if malformed.
    `caption_dim`: the model's (`ModelShape.caption_dim`): synthetic clips carry captions of that
    width when it is above 0, labels otherwise; a latent folder's conditions must be that kind
    (None: whatever they are)."""
    kind, _, rest = spec.partition(":")
    if kind == SYNTHETIC_PREFIX:
        seed_text, _, path = rest.partition(":")
        if seed_text == "" and path == "":
            seed = 0
        elif not (seed_text.isascii() and seed_text.isdigit()):
            raise ValueError(f"--data {spec}: SEED must be a non-negative integer, got {seed_text!r} "
                             f"(syntax: {VIDEO_DATA_SYNTAX})")
        else:
            seed = int(seed_text)
        if rest.count(":") >= 1 and path == "":
            raise ValueError(f"--data {spec}: empty clip list path (syntax: {VIDEO_DATA_SYNTAX})")
        return SyntheticClips(seed, geometry, max_len, clip_list=path or None, caption_dim=caption_dim or 0)
    if kind == LATENTS_PREFIX:
        if not rest:
            raise ValueError(f"--data {spec}: no folder given (syntax: {VIDEO_DATA_SYNTAX})")
        return LatentFolder(rest, geometry, caption_dim)
    raise ValueError(f"--data {spec}: not video data (syntax: {VIDEO_DATA_SYNTAX})")


def open_clip_stream(spec: str, geometry: VideoGeometry, tokens_per_step: int, max_len: int,
                     seed: int, caption_dim: int | None = None, max_axis: int | None = None) -> ClipStream:
    """The trainer's entry point: the clip stream of a `--data` spec for a model of `geometry`
    (`ModelShape.video_geometry`), `caption_dim` (`open_clip_dataset`) and longest clip axis in
    patches `max_axis` (`ModelShape.max_axis_patches`), batched like `BatchStream` with the run's seed."""
    return ClipStream(open_clip_dataset(spec, geometry, max_len, caption_dim), geometry, tokens_per_step,
                      max_len, seed, max_axis)
