"""The weights of a Hugging Face folder (`hf:PATH`, `diffusers:PATH`) checked against its
config before any load.

transformers loads a folder whose weights do not fit its config with a report per process and
freshly initialised tensors where names are missing (mis-shaped ones end in a RuntimeError);
a safetensors file cut short, or an index naming a shard that is not there, end in tracebacks.
`check_weights` finds all of these first, from the safetensors headers alone (no tensor is
read), against the model the config builds on the meta device (no memory): one error naming
the folder, the file and the keys at fault. Values are checked once loaded (`check_finite`):
a NaN or an infinity in them is the folder's fault, not the data's. transformers and diffusers
name their files differently (`WeightFormat`); the checks are the same.

`StoredWeights` reads a model part's tensors from the files a tensor at a time, each TP shard as
its block of the stored tensor (safetensors' `get_slice` reads that block alone), so a rank of a
70B job reads its stage's shard, not the model (`PartLoad`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..vocabulary.value_checks import read_json
from .protocol import HeldBlock


@dataclass(frozen=True)
class WeightFormat:
    """How a library names a model folder's weight files."""

    prefix: str
    """The `--model` prefix messages name the folder with."""
    single: str
    """The one safetensors file of an unsharded model."""
    index: str
    """The index of a sharded one (its "weight_map" names the shard of every key)."""
    other: tuple[str, ...]
    """Weights in formats ballast does not load: a folder with only these would train from a
    random init as if it had none."""


TRANSFORMERS = WeightFormat("hf:", "model.safetensors", "model.safetensors.index.json",
                            ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"))
DIFFUSERS = WeightFormat("diffusers:", "diffusion_pytorch_model.safetensors",
                         "diffusion_pytorch_model.safetensors.index.json",
                         ("diffusion_pytorch_model.bin", "diffusion_pytorch_model.bin.index.json"))
SHOWN = 3
"""Keys an error names (then the count of the rest)."""


def weight_files(folder: Path, kind: WeightFormat = TRANSFORMERS) -> list[Path]:
    """The safetensors files holding the folder's weights ([] for a config-only folder); a
    ValueError when its index cannot be read or names files that are not there."""
    where = f"{kind.prefix}{folder}"
    if (folder / kind.single).is_file():
        return [folder / kind.single]
    index = folder / kind.index
    if not index.is_file():
        other = [name for name in kind.other if (folder / name).is_file()]
        if other:
            raise ValueError(f"{where}: its weights are {', '.join(other)}, and ballast loads safetensors "
                             f"only ({kind.single}, sharded or not): it would train from a random init instead; "
                             f"convert them (save_pretrained writes safetensors)")
        return []
    data = read_json(index, f"{where}:")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{where}: {kind.index} is not a safetensors index: it must map every key to its "
                         f"shard file under \"weight_map\"")
    names = sorted(set(weight_map.values()))
    absent = [name for name in names if not (folder / name).is_file()]
    if absent:
        raise ValueError(f"{where}: {kind.index} names {_some(absent)} ({len(absent)} of its {len(names)} shard "
                         f"files), which are not in the folder: a copy or download left unfinished?")
    return [folder / name for name in names]


def check_weights(folder: Path, kind: WeightFormat = TRANSFORMERS,
                  meta_model: Callable[[Path], nn.Module] | None = None) -> None:
    """ValueError naming the folder, the file and the keys when the weights are unreadable or
    do not match the model of the folder's config.json (missing, unexpected or mis-shaped
    tensors); nothing when the folder has no weights (a random init from the config).
    `meta_model` builds that model on the meta device (default: transformers' causal LM)."""
    files = weight_files(folder, kind)
    if not files:
        return
    from safetensors import SafetensorError, safe_open

    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    found[key] = (tuple(f.get_slice(key).get_shape()), path.name)
        except SafetensorError as e:  # the file's own damage, named with the file
            raise ValueError(f"{kind.prefix}{folder}: {path.name} is not a readable safetensors file ({e}): a copy cut "
                             f"short or damaged; {path.stat().st_size} bytes") from None
    expected, ignore_missing, ignore_unexpected = _model_tensors((meta_model or _causal_lm)(folder))
    missing, mis_shaped, known = [], [], set()
    for names, shape in expected:
        known.update(names)
        present = [n for n in names if n in found]  # tied tensors: any one of their names
        if not present:
            if not _ignored(names[0], ignore_missing):
                missing.append(names[0])
        mis_shaped += [f"{n} {list(found[n][0])} (config: {list(shape)}, in {found[n][1]})"
                       for n in present if found[n][0] != shape]
    unexpected = [f"{k} (in {found[k][1]})" for k in found if k not in known and not _ignored(k, ignore_unexpected)]
    problems = [f"{what}: {_some(keys)}" for what, keys in (
        ("mis-shaped", mis_shaped), ("missing from the files", missing), ("not in the model", unexpected)) if keys]
    if problems:
        raise ValueError(f"{kind.prefix}{folder}: its weights ({', '.join(p.name for p in files)}) do not match the model "
                         f"its config.json describes, which would train with tensors initialised afresh or "
                         f"left out; {'; '.join(problems)}: fix config.json or the weights")


class StoredWeights:
    """A folder's safetensors weights read a tensor at a time (`protocol.PartLoad`): the file of
    every key from the headers, read once."""

    def __init__(self, folder: Path, kind: WeightFormat = TRANSFORMERS):
        from safetensors import safe_open

        self.folder, self.kind = folder, kind
        self.files: dict[str, Path] = {}
        """The file holding each key."""
        for path in weight_files(folder, kind):
            with safe_open(path, framework="pt") as f:
                self.files.update((key, path) for key in f.keys())

    def holds_every_key(self, model: nn.Module) -> bool:
        """Whether the files hold every tensor of `model`'s state dict under its own name (tied
        tensors: under one of their names), so that any part of it can be read."""
        expected, _, _ = _model_tensors(model)
        return all(any(n in self.files for n in names) for names, _ in expected)

    def read(self, key: str, dtype: torch.dtype, block: tuple[slice, ...] | None = None) -> torch.Tensor:
        """Tensor `key` as `dtype`, whole or its `block` (a slice per dimension), reading that
        block alone (safetensors' `get_slice`); ValueError naming the folder and the key when the
        files lack it or hold it non-finite (`check_finite`)."""
        from safetensors import safe_open

        if key not in self.files:
            raise ValueError(f"{self.kind.prefix}{self.folder}: its weights hold no {key!r}, which the model has")
        with safe_open(self.files[key], framework="pt") as f:
            stored = f.get_slice(key)
            value = stored[:] if block is None else stored[block]
        check_finite(self.folder, {key: value}, self.kind)
        return value.to(dtype)

    def read_part(self, part: nn.Module, prefix: str, held: HeldBlock) -> None:
        """Copy into every tensor of `part`'s state dict (its names `prefix` + the files' keys;
        a DTensor's local shard) the stored one, or the block `held` names, a tensor at a time; a
        tensor tied to another once, under the name the files hold. ValueError naming the folder
        and the key when the files lack it or hold it mis-shaped (or as `read`)."""
        tensors: dict[int, list[tuple[str, torch.Tensor]]] = {}
        for name, tensor in part.state_dict(keep_vars=True).items():
            tensors.setdefault(id(tensor), []).append((name, tensor))
        for named in tensors.values():
            name, tensor = next(((n, t) for n, t in named if n.removeprefix(prefix) in self.files), named[0])
            key = name.removeprefix(prefix)
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            if local.numel() == 0:  # an FSDP2 shard past the end of an uneven split
                continue
            value = self.read(key, local.dtype, held(name, tensor))
            if tuple(value.shape) != tuple(local.shape):
                raise ValueError(f"{self.kind.prefix}{self.folder}: {key} holds {list(value.shape)} where this part "
                                 f"of the model has {list(local.shape)}")
            with torch.no_grad():
                local.copy_(value)


def check_finite(folder: Path, state: dict[str, torch.Tensor], kind: WeightFormat = TRANSFORMERS) -> None:
    """ValueError naming the folder and the tensors when loaded weights hold a NaN or an
    infinity (a file whose bytes were overwritten with its header intact, or a diverged model's):
    every loss would be non-finite, and the data would look to blame."""
    bad = [f"{name} ({int((~torch.isfinite(t)).sum())} of {t.numel()} values)" for name, t in state.items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{kind.prefix}{folder}: its weights hold non-finite values (NaN or infinity) in {_some(bad)}: a "
                         f"damaged file (bytes overwritten) or a diverged model, which could only give non-finite "
                         f"losses; use an intact copy of the weights")


def _causal_lm(folder: Path) -> nn.Module:
    """The transformers causal LM of the folder's config, on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _model_tensors(model: nn.Module) -> tuple[list[tuple[list[str], tuple[int, ...]]], set[str], set[str]]:
    """(names and shape of every tensor of `model`, tied names together; the model's patterns of
    keys to ignore when missing, and when unexpected)."""
    by_tensor: dict[int, tuple[list[str], tuple[int, ...]]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), ([], tuple(tensor.shape)))[0].append(name)
    return (list(by_tensor.values()), set(getattr(model, "_keys_to_ignore_on_load_missing", None) or ()),
            set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()))


def _ignored(key: str, patterns: set[str]) -> bool:
    return any(re.search(p, key) for p in patterns)


def _some(items: list[str]) -> str:
    """The first few items and how many more."""
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more
