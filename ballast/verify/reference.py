"""The single-process reference `ballast verify` and the runtime tests compare with.

The whole batch runs in one process, with plain AdamW: no runtime, no plan; as one packed
stream, or, for a user's model with a forward of its own (a diffusers Wan), through that
forward clip by clip. `train_reference` trains K steps that way; `reference_at` takes the loss and gradient of
each step at the parameters a distributed run started it from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..vocabulary.model_shape import ModelShape
from ..models import PackedStream, ParallelModel, build_model
from ..models.gaussian_clips import gaussian_clips


@dataclass
class VerifyBatch:
    """One step's samples as verify and the runtime tests draw them: what the single-process
    reference and every planner's ranks train on (a stream's `dataset.GlobalBatch` without its
    sample ids and epoch)."""

    lengths: list[int]
    """Training tokens of every sample."""
    samples: list
    """samples[i]: lengths[i] + 1 token ids (inputs and, shifted by one, their targets), or a `Clip`."""
    shapes: list[tuple[int, int, int]] | None = None
    """Every clip's (frames, height, width) in latent patches; None for text."""

    @property
    def planned(self) -> list:
        """What a planner plans: the clips' shapes, or the text lengths."""
        return self.lengths if self.shapes is None else self.shapes


@dataclass
class Trajectory:
    losses: list[float]
    grads: list[Tensor]
    """Per step, every parameter's gradient flattened into one vector."""
    start_params: list[Tensor]
    """Per step, the parameters the step started from, flattened."""
    params: Tensor
    """Parameters after the last step, flattened."""


def random_batches(shape: ModelShape, steps: int, batch: int, max_len: int, seed: int) -> list[VerifyBatch]:
    """Long-tailed sizes (log-uniform in 1..max_len tokens): random token ids for a text model,
    random latent clips for a video model (`random_clips`)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        lengths = [int(s) for s in np.clip(np.round(np.exp(rng.uniform(0, math.log(max_len), batch))), 1, max_len)]
        if not shape.pattern.clips:
            out.append(VerifyBatch(lengths, [torch.from_numpy(rng.integers(0, shape.vocab, s + 1)) for s in lengths]))
        else:
            out.append(random_clips(shape, lengths, rng))
    return out


def random_clips(shape: ModelShape, sizes: list[int], rng: np.random.Generator) -> VerifyBatch:
    """A clip of at most each size in tokens, of every kind a video model must take: a random
    split of the size into frames x height x width patches (single images, single-patch frames
    and long thin clips among them, no axis over `shape.max_axis_patches`), with Gaussian
    latents, conditions and keys (`gaussian_clips`)."""
    grids = []
    for size in sizes:
        axis = min(size, shape.max_axis_patches or size)
        frames = int(rng.integers(1, axis + 1))
        height = int(rng.integers(1, min(size // frames, axis) + 1))
        width = int(rng.integers(1, min(size // (frames * height), axis) + 1))
        grids.append((frames, height, width))
    clips = gaussian_clips(grids, shape, int(rng.integers(0, 2 ** 62)))
    return VerifyBatch([f * h * w for f, h, w in grids], clips, grids)


def flatten(tensors) -> Tensor:
    """Detached copy of the tensors as one vector on the CPU (parameters or gradients, in model
    order, from any device), where runs on different devices compare."""
    return torch.cat([t.detach().reshape(-1) for t in tensors]).to("cpu", copy=True)


def _whole_batch_backward(model: ParallelModel, batch: VerifyBatch, bf16: bool) -> float:
    """Loss and gradient of the whole batch in this process, on the model's device (under bf16
    autocast with `bf16`, as the executor's forward under `Precision.BF16`): through the user's
    own model's forward sample by sample where the model has one
    (`protocol.ParallelModel.reference_loss`), else as one packed stream."""
    own = getattr(model, "reference_loss", None)
    device = next(model.parameters()).device
    stream = PackedStream.of([model.sample_shape(s) for s in batch.samples], device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = own(batch.samples) if own is not None else model.loss(batch.samples, stream, slice(0, stream.bounds[-1]))
        loss = loss / sum(batch.lengths)
    loss.backward()
    return loss.item()


def train_reference(shape: ModelShape, batches: list[VerifyBatch], seed: int, lr: float, bf16: bool = False,
                    device: torch.device | str = "cpu") -> Trajectory:
    """The steps in one process on `device`: the whole batch as one packed stream, plain AdamW
    (the forward in fp32, or under bf16 autocast)."""
    model = build_model(shape, seed).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, grads, starts = [], [], []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        starts.append(flatten(model.parameters()))
        losses.append(_whole_batch_backward(model, batch, bf16))
        grads.append(flatten(p.grad for p in model.parameters()))
        optimizer.step()
    return Trajectory(losses, grads, starts, flatten(model.parameters()))


def reference_at(shape: ModelShape, trajectory: Trajectory, batches: list[VerifyBatch], bf16: bool = False,
                 device: torch.device | str = "cpu") -> Trajectory:
    """Single-process loss and gradient on `device` of every step at the parameters `trajectory`
    started it from (the forward in fp32, or under bf16 autocast)."""
    model = build_model(shape).to(device)
    losses, grads = [], []
    for params, batch in zip(trajectory.start_params, batches, strict=True):
        torch.nn.utils.vector_to_parameters(params.to(device), model.parameters())
        model.zero_grad(set_to_none=True)
        losses.append(_whole_batch_backward(model, batch, bf16))
        grads.append(flatten(p.grad for p in model.parameters()))
    return Trajectory(losses, grads, trajectory.start_params, trajectory.params)
