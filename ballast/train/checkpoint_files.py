"""A checkpoint's folder as resuming reads it: which folders are committed checkpoints, which of
them can be trusted, which one to resume, and whether it holds the run's model (`checkpoint.py`
writes and loads them).

Trusted only once checked (`check`): a checkpoint whose meta.json does not parse, whose DCP
`.metadata` is missing or unreadable, whose shard files are missing or shorter than the
metadata says (a copy cut short, a full disk), or whose files do not match their SHA-256 (bytes
overwritten in place) is `Damaged`, and resuming falls back to the newest older checkpoint that
checks out (`resumable`), saying so. A checkpoint of another model is refused before anything is
loaded, the data stream's position included: its meta.json's model against the run's
(`check_same_model`: architecture and shape, not the name or path), then, when DCP loads, the
tensors' names and shapes (`check_model`; all an older checkpoint without a model record gets).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch.distributed.checkpoint as dcp

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.value_checks import read_json
from . import checksums

PREFIX = "step-"
META = "meta.json"


def folder_name(step: int) -> str:
    """The folder of the checkpoint after `step` completed steps."""
    return f"{PREFIX}{step:08d}"


def committed(root: Path) -> list[Path]:
    """Committed checkpoints under `root`, oldest first: every `step-NNNNNNNN` folder, whole or
    not. Only a finished save renames its folder to that name, so one that lacks a file
    (meta.json too) is a damaged checkpoint, for `check` to find, never "no checkpoint"."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest(root: Path) -> Path | None:
    found = committed(root)
    return found[-1] if found else None


class Damaged(ValueError):
    """A checkpoint that cannot be trusted; the message names its folder and what is wrong."""


META_KEYS = ("step", "world", "zero1", "fsdp", "data", "planner", "config")


def read_meta(path: Path) -> dict:
    """meta.json of a committed checkpoint: step, data position, planner state, world, config."""
    try:
        meta = read_json(path / META, "checkpoint file")
    except FileNotFoundError:
        raise Damaged(f"checkpoint {path}: {META} is missing (the step, the data's position and the "
                      f"planner's state)") from None
    except OSError as e:
        raise Damaged(f"checkpoint {path}: cannot read {META}: {e.strerror}") from None
    except ValueError as e:
        raise Damaged(str(e)) from None
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise Damaged(f"checkpoint {path}: {META} lacks {', '.join(missing)}")
    return meta


def check(path: Path) -> dict:
    """meta.json of the checkpoint at `path` once every file it needs is there whole and, when it
    has a manifest, matches its SHA-256 (every byte is read); `Damaged` naming the folder and the
    problem otherwise."""
    meta = read_meta(path)
    for rank in range(meta["world"]):
        if not (path / f"rng-rank{rank}.pt").is_file():
            raise Damaged(f"checkpoint {path}: rng-rank{rank}.pt is missing (saved by {meta['world']} ranks)")
    needed: dict[str, int] = {}
    for info in _metadata(path).storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        shard = path / name
        if not shard.is_file():
            raise Damaged(f"checkpoint {path}: shard {name} is missing")
        if shard.stat().st_size < size:
            raise Damaged(f"checkpoint {path}: shard {name} is truncated ({shard.stat().st_size} of "
                          f"{size} bytes)")
    if checksums.present(path) and (wrong := checksums.verify(path)) is not None:
        raise Damaged(f"checkpoint {path}: {wrong}")
    return meta


def _metadata(path: Path):
    """DCP's `.metadata` of the checkpoint: what it holds and where."""
    if not (path / ".metadata").is_file():
        raise Damaged(f"checkpoint {path}: .metadata is missing (torch.distributed.checkpoint's index "
                      f"of the shards)")
    try:
        return dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # a pickle cut short raises any of several types
        raise Damaged(f"checkpoint {path}: .metadata is unreadable ({type(e).__name__}: {e})") from None


def resumable(root: Path, warn: Callable[[str], None]) -> Path | None:
    """The newest checkpoint under `root` that checks out; None when there is none at all.
    Damaged ones are skipped with a warning naming them when an older one checks out; when
    none does, the newest one's damage is the error."""
    found = committed(root)
    damage: list[Damaged] = []
    for path in reversed(found):
        try:
            meta = check(path)
        except Damaged as e:
            damage.append(e)
            continue
        for skipped in damage:
            warn(f"{skipped}; resuming from the older {path.name}")
        if not checksums.present(path):
            model = "" if "model" in meta else ", and its model by tensor shapes"
            warn(f"checkpoint {path} has no {checksums.MANIFEST} (written by a ballast before checksums): its "
                 f"files are checked by size only{model}")
        return path
    if damage:
        raise Damaged(f"{root} holds no usable checkpoint: {damage[0]}" +
                      (f" (and {len(damage) - 1} older damaged one(s))" if len(damage) > 1 else ""))
    return None


MODEL_LABELS = ("name", "source")
"""What `model_record` holds besides the model's identity: a renamed file or a moved folder holds
the same model."""


def model_record(shape: ModelShape) -> dict:
    """What meta.json says of the model: its name and source, its shape's numbers and, for an
    hf:PATH or diffusers:PATH model, the architecture its config.json names (two families may
    share the numbers).
    As JSON gives it back (tuples as lists), so that records compare equal."""
    record = {**shape.to_dict(), "architecture": None}
    if shape.hf_folder is not None:
        config = read_json(shape.hf_folder / "config.json", "model config")
        record["architecture"] = ", ".join(config.get("architectures") or [config.get("model_type", "?")])
    if shape.diffusers_folder is not None:
        record["architecture"] = read_json(shape.diffusers_folder / "config.json", "model config")["_class_name"]
    return json.loads(json.dumps(record))


def check_same_model(path: Path, meta: dict, shape: ModelShape) -> None:
    """ValueError naming the checkpoint, its model and the run's when meta.json records another
    model than `shape` (a field of either record the other lacks, a newer ballast's, is not
    compared). A checkpoint without a record is left to `check_model`."""
    saved = meta.get("model")
    if not isinstance(saved, dict):
        return
    mine = model_record(shape)
    differ = [key for key in mine if key in saved and key not in MODEL_LABELS and saved[key] != mine[key]]
    if differ:
        listed = "; ".join(f"{key} {saved[key]} there, {mine[key]} here" for key in differ[:3])
        more = f"; {len(differ) - 3} more" if len(differ) > 3 else ""
        raise ValueError(f"checkpoint {path} holds another model: {_label(saved)}, not this run's {_label(mine)} "
                         f"({listed}{more}): resume it with its own model, or give this run another "
                         f"--checkpoint-dir or --out-dir")


def _label(record: dict) -> str:
    source = record.get("source") or "ballast's own"
    kind = f", {record['architecture']}" if record.get("architecture") else ""
    return f"{record.get('name')!r} ({source}{kind})"


def check_model(path: Path, model_state: dict, key: str = "model") -> None:
    """ValueError when the checkpoint holds another model than the one whose state dict (as DCP
    saves it, `get_model_state_dict`, under `key`) is `model_state`: a parameter it lacks, or of
    another shape."""
    saved = _metadata(path).state_dict_metadata
    for name, tensor in model_state.items():
        entry = saved.get(f"{key}.{name}")
        if entry is None:
            raise ValueError(f"checkpoint {path} holds another model: it has no parameter {name}")
        if tuple(entry.size) != tuple(tensor.shape):
            raise ValueError(f"checkpoint {path} holds another model: {name} has shape {tuple(entry.size)} "
                             f"there, {tuple(tensor.shape)} here")
