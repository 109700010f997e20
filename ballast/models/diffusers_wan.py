"""diffusers' Wan transformers (`--model diffusers:PATH`, `WanTransformer3DModel`) behind the
runtime's model protocol, the model object unmodified.

Wan's own forward takes one batch of clips of one (F, H, W): it computes its patch embedding
(a Conv3d), its 3-D RoPE grid and its unpatchify from the input's shape, and its timestep per
clip. A packed micro-batch holds clips of every shape, and a rank holds any slice of it (or,
under context parallelism, chunks of every clip), so `DiffusersWan.forward` runs the model's
own modules token by token outside that forward, each clip getting its own of everything:

  - patch embedding: the Conv3d's weight as a linear map of a token's patch values (a Conv3d
    whose kernel equals its stride is exactly that), in the (C, pf, ph, pw) order of `flow.py`;
  - timestep and text: the model's `condition_embedder` on every clip's t x 1000 and text, each
    clip's projection then given to its tokens as Wan 2.2 TI2V's per-token timestep
    `[B, seq_len, 6, hidden]`, which the blocks take without change;
  - RoPE: the model's own cos/sin table at each token's (frame, row, column) in its own clip;
  - blocks: called as the forward calls them, with ballast's attention processor
    (`wan_attention.py`) reached through their `rotary_emb` and `encoder_hidden_states`;
  - output: norm_out modulated per token, proj_out, and the patch values put back from
    diffusers' (pf, ph, pw, C) order into the flow targets' (C, pf, ph, pw).
The loss is `clip_objective`'s rectified flow. `reference_loss` runs the same clips one by one
through the model's own forward instead: what `ballast verify` compares every plan with.

Errors before any rank starts: diffusers missing, a class or config ballast does not train
(`vocabulary.diffusers_config`), weights that do not fit the config (`hf_weights`), dropout.
"""
from __future__ import annotations

import functools
import importlib.util
import itertools
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..vocabulary.clip import Clip
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import FULL
from .clip_objective import ClipFlowObjective
from .flow import TIMESTEP_SCALE, flow_pair, patchify, token_loss, unpatchify
from .hf_weights import DIFFUSERS, check_finite, check_weights, weight_files
from .protocol import INPUT, AttentionFn, PackedStream
from .video_conditioning import HeldSamples
from .wan_attention import BallastWanProcessor, PackedRotary, PackedText

TESTED = "0.42.1"
"""The diffusers version ballast's tests run (pyproject's `diffusers` extra pins its range)."""


@functools.cache
def wan_class() -> type[nn.Module]:
    """diffusers' WanTransformer3DModel; a ValueError saying how to install it when diffusers or
    accelerate (which its `from_pretrained` of a Wan folder needs) is not installed."""
    missing = [name for name in ("diffusers", "accelerate") if not _importable(name)]
    if missing:
        raise ValueError(f"--model diffusers:PATH needs {' and '.join(missing)}, not installed here: pip install "
                         f"'ballast[diffusers]' (tested with diffusers {TESTED})")
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # a module set to None in sys.modules (how the tests hide one)
        return False


def _meta_model(folder: Path) -> nn.Module:
    """The model of the folder's config on the meta device (what `check_weights` compares with)."""
    cls = wan_class()
    with torch.device("meta"):
        return cls.from_config(cls.load_config(folder, local_files_only=True))


def check_wan_folder(shape: ModelShape) -> None:
    """ValueError before any rank starts: diffusers missing, or weights that do not fit the config."""
    assert shape.diffusers_folder is not None, shape.source
    wan_class()
    check_weights(shape.diffusers_folder, DIFFUSERS, _meta_model)


def build_wan(shape: ModelShape, seed: int = 0, load: bool = True) -> DiffusersWan:
    """The Wan transformer of `shape.source` (`diffusers:PATH`) at `shape.layers` blocks: its
    weights when the folder has them and `load`, else a random init from its config that depends only on
    `seed` (every rank builds the same model). fp32: the runtime's precision autocasts."""
    cls, folder = wan_class(), shape.diffusers_folder
    assert folder is not None, shape.source
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if load and weight_files(folder, DIFFUSERS):  # check_wan_folder found them whole and fitting
            wan = cls.from_pretrained(folder, torch_dtype=torch.float32, local_files_only=True)
            check_finite(folder, wan.state_dict(), DIFFUSERS)
        else:
            wan = cls.from_config(cls.load_config(folder, local_files_only=True))
    if shape.layers < len(wan.blocks):  # profiling builds reduced-depth copies
        wan.blocks = nn.ModuleList(list(wan.blocks)[:shape.layers])
        wan.register_to_config(num_layers=shape.layers)
    wan.train()
    return DiffusersWan(wan, shape)


def save_wan(config: dict, weights: dict[str, Tensor], folder: Path) -> None:
    """Write `weights` (a whole state dict) and `config` as a diffusers folder, through the
    model class's own `save_pretrained` on a meta-device shell that takes the tensors as they
    are (no second copy of the weights)."""
    cls = wan_class()
    with torch.device("meta"):
        shell = cls.from_config(config)
    shell.load_state_dict(weights, assign=True)
    shell.save_pretrained(folder)


class DiffusersWan(ClipFlowObjective, nn.Module):
    """A diffusers WanTransformer3DModel as a `ParallelModel`; `wan` is the model object itself."""

    def __init__(self, wan: nn.Module, shape: ModelShape):
        super().__init__()
        dropout = [name for name, m in wan.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]
        if dropout:
            raise ValueError(f"model {shape.name!r}: dropout in {dropout[0]} (and {len(dropout) - 1} more) is not "
                             f"supported: the gradient would depend on the plan")
        self.wan = wan
        self.shape = shape
        self.processor = BallastWanProcessor()
        wan.set_attn_processor(self.processor)

    def blocks(self) -> nn.ModuleList:
        return self.wan.blocks

    def install_attention(self, attend: AttentionFn) -> None:
        self.processor.attend = attend

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) [1, tokens, 1, head_dim] of tokens at these (sample, frame, row, column)
        positions: the model's own table, frame, row and column parts at each token's own."""
        rope = self.wan.rope
        parts = [rope.t_dim, rope.h_dim, rope.w_dim]
        return tuple(torch.cat([part.index_select(0, positions[:, axis]) for axis, part in
                                zip((1, 2, 3), table.split(parts, dim=1))], dim=1)[None, :, None]
                     for table in (rope.freqs_cos, rope.freqs_sin))

    def forward(self, tokens: Tensor, timesteps: Tensor, conditions: Sequence[Tensor], stream: PackedStream,
                recompute_layers: int = 0) -> Tensor:
        """Predicted velocity [tokens held, patch values] of the noisy patch tokens this process
        holds (see `video_dit.VideoDiT.forward`: the same contract)."""
        if tokens.dim() != 2 or tokens.shape != (stream.positions.shape[0], self.shape.vocab):
            raise ValueError(f"tokens of shape {tuple(tokens.shape)} do not match the stream's "
                             f"{stream.positions.shape[0]} positions x {self.shape.vocab} patch values")
        if not 0 <= recompute_layers <= len(self.wan.blocks):
            raise ValueError(f"recompute_layers {recompute_layers} is outside 0..{len(self.wan.blocks)}")
        wan, device = self.wan, stream.positions.device
        text = torch.cat([c.to(device, torch.float32) for c in conditions])[None]
        time, projection, text, _ = wan.condition_embedder(timesteps.to(device).float() * TIMESTEP_SCALE, text)
        conv = wan.patch_embedding
        x = F.linear(tokens.to(device, conv.weight.dtype), conv.weight.flatten(1), conv.bias)
        x, stream = stream.arrange(x, FULL)
        held = HeldSamples.of(stream)
        modulation = projection.unflatten(1, (6, -1)).index_select(0, held.index)[None]
        rotary = PackedRotary(*self.rope(stream.positions), stream)
        packed = PackedText(text[0], tuple(itertools.accumulate((len(c) for c in conditions), initial=0)), held)
        x = x[None]
        for i, block in enumerate(wan.blocks):
            if i < recompute_layers:
                x = checkpoint(block, x, packed, modulation, rotary, use_reentrant=False)
            else:
                x = block(x, packed, modulation, rotary)
        x, stream = stream.arrange(x[0], INPUT)
        # Wan's output head with a per-token time embedding (its TI2V branch), then unpatchify.
        time = time.index_select(0, stream.positions[:, 0])[None]
        shift, scale = (wan.scale_shift_table.unsqueeze(0) + time.unsqueeze(2)).chunk(2, dim=2)
        x = (wan.norm_out(x[None].float()) * (1 + scale.squeeze(2)) + shift.squeeze(2)).type_as(x)
        out = wan.proj_out(x)[0]
        return out.unflatten(1, (-1, self.shape.video_geometry.latent_channels)).transpose(1, 2).flatten(1)

    def reference_loss(self, samples: Sequence[Clip]) -> Tensor:
        """The summed loss of `samples` (as `loss` of them whole) through the model's own forward,
        clip by clip: diffusers' patch embedding, RoPE, timestep path, attention processor and
        unpatchify, nothing of ballast's but the flow targets. What verify compares plans with."""
        total = torch.zeros(())
        for clip in samples:
            grid = self.sample_shape(clip)
            noisy, target, t = flow_pair(clip, self.patch)
            out = self.wan(hidden_states=unpatchify(noisy, grid, self.patch)[None],
                           timestep=torch.tensor([t], dtype=torch.float32) * TIMESTEP_SCALE,
                           encoder_hidden_states=clip.condition[None].float(), return_dict=False)[0]
            total = total + token_loss(patchify(out[0], self.patch), target).sum()
        return total
