"""The weights of a Hugging Face folder (`hf:PATH`) checked against its config before any load.

transformers loads a folder whose weights do not fit its config with a report per process and
freshly initialised tensors where names are missing (mis-shaped ones end in a RuntimeError);
a safetensors file cut short, or an index naming a shard that is not there, end in tracebacks.
`check_weights` finds all of these first, from the safetensors headers alone (no tensor is
read), against the model the config builds on the meta device (no memory): one error naming
the folder, the file and the keys at fault. Values are checked once loaded (`check_finite`):
a NaN or an infinity in them is the folder's fault, not the data's.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..vocabulary.value_checks import read_json

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
OTHER_FORMATS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
"""Weights in formats ballast does not load: a folder with only these would train from a random
init as if it had none."""
SHOWN = 3
"""Keys an error names (then the count of the rest)."""


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files holding the folder's weights ([] for a config-only folder); a
    ValueError when its index cannot be read or names files that are not there."""
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    index = folder / INDEX
    if not index.is_file():
        other = [name for name in OTHER_FORMATS if (folder / name).is_file()]
        if other:
            raise ValueError(f"hf:{folder}: its weights are {', '.join(other)}, and ballast loads safetensors "
                             f"only ({SINGLE}, sharded or not): it would train from a random init instead; "
                             f"convert them (save_pretrained writes safetensors)")
        return []
    data = read_json(index, f"hf:{folder}:")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"hf:{folder}: {INDEX} is not a safetensors index: it must map every key to its "
                         f"shard file under \"weight_map\"")
    names = sorted(set(weight_map.values()))
    absent = [name for name in names if not (folder / name).is_file()]
    if absent:
        raise ValueError(f"hf:{folder}: {INDEX} names {_some(absent)} ({len(absent)} of its {len(names)} shard "
                         f"files), which are not in the folder: a copy or download left unfinished?")
    return [folder / name for name in names]


def check_weights(folder: Path) -> None:
    """ValueError naming the folder, the file and the keys when the weights are unreadable or
    do not match the model of the folder's config.json (missing, unexpected or mis-shaped
    tensors); nothing when the folder has no weights (a random init from the config)."""
    files = weight_files(folder)
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
            raise ValueError(f"hf:{folder}: {path.name} is not a readable safetensors file ({e}): a copy cut "
                             f"short or damaged; {path.stat().st_size} bytes") from None
    expected, ignore_missing, ignore_unexpected = _model_tensors(folder)
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
        raise ValueError(f"hf:{folder}: its weights ({', '.join(p.name for p in files)}) do not match the model "
                         f"its config.json describes, which would train with tensors initialised afresh or "
                         f"left out; {'; '.join(problems)}: fix config.json or the weights")


def check_finite(folder: Path, state: dict[str, torch.Tensor]) -> None:
    """ValueError naming the folder and the tensors when loaded weights hold a NaN or an
    infinity (a file whose bytes were overwritten with its header intact, or a diverged model's):
    every loss would be non-finite, and the data would look to blame."""
    bad = [f"{name} ({int((~torch.isfinite(t)).sum())} of {t.numel()} values)" for name, t in state.items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"hf:{folder}: its weights hold non-finite values (NaN or infinity) in {_some(bad)}: a "
                         f"damaged file (bytes overwritten) or a diverged model, which could only give non-finite "
                         f"losses; use an intact copy of the weights")


def _model_tensors(folder: Path) -> tuple[list[tuple[list[str], tuple[int, ...]]], set[str], set[str]]:
    """(names and shape of every tensor of the model the config builds, tied names together;
    the model's patterns of keys to ignore when missing, and when unexpected)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    by_tensor: dict[int, tuple[list[str], tuple[int, ...]]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), ([], tuple(tensor.shape)))[0].append(name)
    return (list(by_tensor.values()), set(model._keys_to_ignore_on_load_missing or ()),
            set(model._keys_to_ignore_on_load_unexpected or ()))


def _ignored(key: str, patterns: set[str]) -> bool:
    return any(re.search(p, key) for p in patterns)


def _some(items: list[str]) -> str:
    """The first few items and how many more."""
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more
