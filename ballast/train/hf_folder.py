"""Hugging Face models (`--model hf:PATH`, `--model diffusers:PATH`) in `ballast train`: a causal
LM's tokenizer, and the trained model written back as a folder of the kind it came from.

Tokenizer. Without `--tokenizer`, an hf:PATH model trains with its folder's own
`tokenizer.json` when the folder has one, else with ballast's byte-level tokenizer (ids 0..255,
so the model's vocab_size must be at least 256). Whichever it is, every id it can emit must
have a row in the model's embedding: `check_tokenizer` says so, naming both numbers, before
anything is tokenised or any rank starts. ballast's own models keep the byte-level default.

Output. At the end of a run `save_hf_model` writes `<out-dir>/hf-model/`, which
`AutoModelForCausalLM.from_pretrained` loads: the trained weights (model.safetensors) and
config.json at the depth that was trained, through the model object's own `save_pretrained`;
the tokenizer files of the model's folder when it trained with that tokenizer, the
`--tokenizer` file as tokenizer.json when it trained with another one, none for the byte-level
tokenizer; and `ballast.json`, saying what was trained from what and with which tokenizer.
A diffusers Wan is written as `<out-dir>/diffusers-model/` (config.json and
diffusion_pytorch_model.safetensors through the model class's own `save_pretrained`, and
ballast.json), which `WanTransformer3DModel.from_pretrained` loads.
Under FSDP2 the parameters are sharded: every rank takes part in gathering the full state
dict (`get_model_state_dict` with `full_state_dict=True, cpu_offload=True`, which leaves it on
rank 0's CPU) and rank 0 writes the folder, into a temporary one renamed into place. Under TP
and PP the executor brings its state dict whole to rank 0's host a tensor at a time
(`Executor.state_on_host`: its TP group's shards gathered, FSDP2's with them, and each later
stage's sent by that stage's first rank; persistent buffers and frozen parameters with the
trained ones), under --strategy the trained ones a unit at a time from the canonical shards
and the rest from the model of record: no device ever holds the whole model.
Checkpoints are unaffected: they save the wrapper's state through DCP, as for every model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..dataset import check_vocab, load_tokenizer
from ..models import build_model
from ..runtime import Executor
from ..runtime.strategy import StrategyExecutor
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.value_checks import read_json
from ..models.diffusers_wan import save_wan
from ..models.hf import WRAPPER_PREFIX, progress_bars

HF_MODEL_DIR = "hf-model"
"""The trained model's Hugging Face folder, under --out-dir."""
DIFFUSERS_MODEL_DIR = "diffusers-model"
"""The trained diffusers model's folder, under --out-dir."""
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                   "chat_template.json")
"""The files of a Hugging Face model folder that make up its tokenizer (copied when it trained with it)."""
DIFFUSERS_WRAPPER_PREFIX = "wan."
"""State-dict keys of `DiffusersWan` are the diffusers model's under its attribute `wan`."""
BYTES_NOTE = ("no tokenizer files: trained with ballast's byte-level tokenizer, whose token ids are the "
              "UTF-8 bytes of the text (ids = list(text.encode('utf-8')); text = bytes(ids).decode('utf-8'))")


def resolve_tokenizer(configured: str | None, shape: ModelShape) -> str:
    """The tokenizer a run uses: `configured` (--tokenizer) when given, else an hf:PATH model's
    own tokenizer.json when its folder has one, else "bytes"."""
    if configured is not None:
        return configured
    if shape.hf_folder is not None and (shape.hf_folder / TOKENIZER_JSON).is_file():
        return str(shape.hf_folder / TOKENIZER_JSON)
    return "bytes"


def check_tokenizer(tokenizer: str, configured: str | None, shape: ModelShape) -> None:
    """ValueError, naming both numbers, when the tokenizer can emit ids the model's embedding has
    no row for. Loads the tokenizer only (cheap), so a mismatch is found before tokenising."""
    vocab = load_tokenizer(tokenizer).vocab_size
    if vocab <= shape.vocab:
        return
    folder = shape.hf_folder
    if folder is None:  # ballast's own models: the data pipeline's message (it raises here)
        return check_vocab(vocab, shape.vocab, shape.name)
    model = f"the model's vocab_size {shape.vocab} ({folder / 'config.json'})"
    if configured is None and tokenizer == "bytes":
        raise ValueError(f"hf:{folder} has no {TOKENIZER_JSON}, so it would train with ballast's byte-level "
                         f"tokenizer (vocab {vocab}), which needs a vocab_size of at least {vocab}; "
                         f"{model} is smaller: put the model's {TOKENIZER_JSON} in its folder or give --tokenizer")
    if configured is None:
        raise ValueError(f"tokenizer {tokenizer} (the model folder's own) has a vocab of {vocab} (added tokens "
                         f"included), more than {model}: its ids from {shape.vocab} up would have no embedding "
                         f"row; the folder's tokenizer and config.json disagree (or give --tokenizer)")
    raise ValueError(f"tokenizer {tokenizer} has a vocab of {vocab} (added tokens included), more than {model}: "
                     f"its ids from {shape.vocab} up would have no embedding row; use the model's own tokenizer "
                     f"or a model with a vocab_size of at least {vocab}")


def save_hf_model(executor: Executor | StrategyExecutor, shape: ModelShape, tokenizer: str, out: Path,
                  provenance: dict[str, Any]) -> Path | None:
    """Write the trained `HFCausalLM` the executor trains as `out/hf-model/` (collective: every
    rank calls it; the parameters are gathered to rank 0, which writes). Returns the folder on
    rank 0, None elsewhere. `provenance` (steps, data, ...) goes into its ballast.json."""
    weights = _gathered(executor, WRAPPER_PREFIX)
    if weights is None:
        return None
    shell = build_model(shape, weights=False)  # the user's class whole (the executor's may be cut or split)

    def write(folder: Path) -> None:
        with progress_bars(shown=False):  # save_pretrained draws one per shard, and pops from the dict: ours
            shell.hf.save_pretrained(folder, state_dict=weights)
        note = _copy_tokenizer(shape, tokenizer, folder)
        _write_record(folder, shape, {**provenance, "tokenizer": tokenizer, "tokenizer_files": note})

    return _replace(out / HF_MODEL_DIR, write)


def save_diffusers_model(executor: Executor | StrategyExecutor, shape: ModelShape, out: Path,
                         provenance: dict[str, Any]) -> Path | None:
    """Write the trained `DiffusersWan` the executor trains as `out/diffusers-model/`, which the
    model class's `from_pretrained` loads (collective, as `save_hf_model`)."""
    weights = _gathered(executor, DIFFUSERS_WRAPPER_PREFIX)
    if weights is None:
        return None

    def write(folder: Path) -> None:
        save_wan(dict(build_model(shape, weights=False).wan.config), weights, folder)
        _write_record(folder, shape, provenance)

    return _replace(out / DIFFUSERS_MODEL_DIR, write)


def export_model(executor: Executor | StrategyExecutor, shape: ModelShape, tokenizer: str, out: Path,
                 provenance: dict[str, Any]) -> Path | None:
    """The trained model written back as the kind of folder it came from (`hf:PATH`,
    `diffusers:PATH`); None for ballast's own models, and on ranks other than 0 (collective)."""
    if shape.hf_folder is not None:
        return save_hf_model(executor, shape, tokenizer, out, provenance)
    if shape.diffusers_folder is not None:
        return save_diffusers_model(executor, shape, out, provenance)
    return None


def folder_loader(shape: ModelShape) -> str | None:
    """What loads the folder `export_model` writes for `shape`: the class whose `from_pretrained` takes it."""
    if shape.hf_folder is not None:
        return "AutoModelForCausalLM"
    if shape.diffusers_folder is not None:
        return read_json(shape.diffusers_folder / "config.json", "model config")["_class_name"]
    return None


def _gathered(executor: Executor | StrategyExecutor, prefix: str) -> dict[str, torch.Tensor] | None:
    """The user's model's whole state dict (the wrapper's keys under `prefix`, without it), on
    rank 0's CPU; None on the other ranks. Collective: under FSDP2, TP and strategies every rank
    takes part."""
    if isinstance(executor, StrategyExecutor) or executor.tensor_parallel is not None or executor.mesh.pp > 1:
        # The canonical shards a unit at a time, or TP's and the stages' a tensor at a time, to rank 0's host.
        state = executor.state_on_host()
    else:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(executor.model, options=options)  # full tensors on rank 0, {} elsewhere
    if dist.get_rank() != 0:
        return None
    weights = {}
    for key, tensor in state.items():
        if not key.startswith(prefix):
            raise RuntimeError(f"state-dict key {key!r} of the wrapped model is not under {prefix!r}")
        weights[key[len(prefix):]] = tensor
    return weights


def _write_record(folder: Path, shape: ModelShape, provenance: dict[str, Any]) -> None:
    """`ballast.json`: what was trained from what."""
    (folder / "ballast.json").write_text(json.dumps(
        {"trained_from": shape.source, "layers": shape.layers, **provenance}, indent=1) + "\n")


def _replace(final: Path, write: Callable[[Path], None]) -> Path:
    """`write` a folder into a temporary one, then put it at `final`. An earlier run's folder
    (this run resumed it, or a longer one ran here) is moved aside, not deleted, until the new
    one is in place: a crash in between leaves one of them whole."""
    tmp, old = final.parent / f".tmp-{final.name}", final.parent / f".old-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a crash
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _copy_tokenizer(shape: ModelShape, tokenizer: str, into: Path) -> str:
    """Copy the files of the tokenizer the model trained with into `into`; says what it did."""
    if tokenizer == "bytes":
        return BYTES_NOTE
    given = Path(tokenizer)
    own = shape.hf_folder / TOKENIZER_JSON
    if own.is_file() and (given.resolve() == own.resolve() or given.read_bytes() == own.read_bytes()):
        copied = [name for name in TOKENIZER_FILES if (own.parent / name).is_file()]
        for name in copied:
            shutil.copy2(own.parent / name, into / name)
        return f"the model folder's tokenizer files: {', '.join(copied)}"
    shutil.copy2(given, into / TOKENIZER_JSON)
    return f"{TOKENIZER_JSON} is {given} (--tokenizer), which the model trained with"
