"""Hugging Face models (`--model hf:PATH`) in `ballast train`: their tokenizer, and the trained
model written back as a Hugging Face folder.

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
Under FSDP2 the parameters are sharded: every rank takes part in gathering the full state
dict (`get_model_state_dict` with `full_state_dict=True, cpu_offload=True`, which leaves it on
rank 0's CPU) and rank 0 writes the folder, into a temporary one renamed into place. Under TP
the executor gathers its TP groups' shards whole (`Executor.parameters`), FSDP2's with them.
Checkpoints are unaffected: they save the wrapper's state through DCP, as for every model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..dataset import check_vocab, load_tokenizer
from ..runtime import Executor
from ..vocabulary.model_shape import ModelShape
from ..models.hf import progress_bars

HF_MODEL_DIR = "hf-model"
"""The trained model's Hugging Face folder, under --out-dir."""
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                   "chat_template.json")
"""The files of a Hugging Face model folder that make up its tokenizer (copied when it trained with it)."""
WRAPPER_PREFIX = "hf."
"""State-dict keys of `HFCausalLM` are the transformers model's under its attribute `hf`."""
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


def save_hf_model(executor: Executor, shape: ModelShape, tokenizer: str, out: Path,
                  provenance: dict[str, Any]) -> Path | None:
    """Write the trained `HFCausalLM` the executor trains as `out/hf-model/` (collective: every
    rank calls it; the parameters are gathered to rank 0, which writes). Returns the folder on
    rank 0, None elsewhere. `provenance` (steps, data, ...) goes into its ballast.json."""
    model = executor.model
    if executor.tensor_parallel is None:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)  # full tensors on rank 0, {} elsewhere
    else:  # its split layers' shards gathered whole on every rank (FSDP2's too)
        state = dict(zip(executor.parameter_names, executor.parameters()))
    if dist.get_rank() != 0:
        return None
    weights = {}
    for key, tensor in state.items():
        if not key.startswith(WRAPPER_PREFIX):
            raise RuntimeError(f"state-dict key {key!r} of an hf model is not under {WRAPPER_PREFIX!r}")
        weights[key[len(WRAPPER_PREFIX):]] = tensor
    final, tmp = out / HF_MODEL_DIR, out / f".tmp-{HF_MODEL_DIR}"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a crash
    tmp.mkdir(parents=True)
    with progress_bars(shown=False):  # save_pretrained draws one per shard, and pops from the dict: ours
        model.hf.save_pretrained(tmp, state_dict=weights)
    note = _copy_tokenizer(shape, tokenizer, tmp)
    (tmp / "ballast.json").write_text(json.dumps(
        {"trained_from": shape.source, "layers": shape.layers, **provenance, "tokenizer": tokenizer,
         "tokenizer_files": note}, indent=1) + "\n")
    # An earlier run's folder (this run resumed it, or a longer one ran here) is moved aside, not
    # deleted, until the new one is in place: a crash in between leaves one of them whole.
    old = out / f".old-{HF_MODEL_DIR}"
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
