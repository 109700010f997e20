"""The shape of a Hugging Face causal-LM folder (`--model hf:PATH`), read from its config.json
alone: what the cost model and the planners need, and what every command checks before it
imports transformers' models. The model itself is `ballast.models.hf`'s."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .value_checks import read_json

HF_PREFIX = "hf:"
CAUSAL_LM_CLASSES = ("ForCausalLM", "LMHeadModel")
"""How transformers names its causal-LM classes (LlamaForCausalLM, GPT2LMHeadModel)."""
LLAMA_STYLE_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
"""The config.json keys ballast reads a decoder's shape from."""


def check_causal_decoder(config: dict, where: str) -> None:
    """ValueError naming the model type when a Hugging Face config is no causal decoder by what it
    is, whatever causal-LM class transformers would build for it: an encoder-decoder
    (`is_encoder_decoder`; T5, BART), or an encoder family (BERT, RoBERTa, ...: attention both
    ways, a decoder only when `is_decoder` makes it one, and never the Llama-style layout ballast
    trains), or a type transformers has no causal LM for at all."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    kind = config.get("model_type", "?")
    trains = "ballast trains causal decoders (Llama, Qwen2, Mistral and relatives)"
    if config.get("is_encoder_decoder"):
        raise ValueError(f"{where}: model type {kind!r} is an encoder-decoder (is_encoder_decoder): {trains}")
    if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        how = ("run as a decoder by is_decoder, not a Llama-style decoder" if config.get("is_decoder") else
               "with attention both ways (is_decoder false)")
        raise ValueError(f"{where}: model type {kind!r} is an encoder, {how}: {trains}")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"{where}: model type {kind!r} has no causal LM in transformers "
                         f"(AutoModelForCausalLM cannot build it): {trains}")


def hf_shape_fields(folder: str) -> dict[str, Any]:
    """`ModelShape`'s fields for the Hugging Face causal LM in `folder`, from its `config.json`
    alone (no weights read). Only a causal decoder passes (`check_causal_decoder`), in every
    command, planning ones included."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ValueError(f"hf:{folder}: no config.json there (a Hugging Face model folder has one)")
    config = read_json(path / "config.json", "model config")
    kind = config.get("model_type", "?")
    architectures = config.get("architectures") or []
    if architectures and not any(a.endswith(CAUSAL_LM_CLASSES) for a in architectures):
        raise ValueError(f"hf:{folder}: model type {kind!r} is {', '.join(architectures)}, not a causal LM "
                         f"(...ForCausalLM or ...LMHeadModel)")
    check_causal_decoder(config, f"hf:{folder}")
    missing = [k for k in LLAMA_STYLE_SIZES if k not in config]
    if missing:
        # GPT-2 and its kin are causal LMs of another layout: own size names (n_layer, n_embd,
        # ...), blocks at transformer.h where ballast switches recomputation at model.layers,
        # dropout in the residual stream that would make the gradient depend on the plan.
        raise ValueError(f"hf:{folder}: model type {kind!r} ({', '.join(architectures) or 'no architectures'}) is "
                         f"not a Llama-style decoder, the layout ballast trains (Llama, Qwen2, Mistral and "
                         f"relatives: decoder layers at model.layers, sizes named {', '.join(LLAMA_STYLE_SIZES)}): "
                         f"its config.json lacks {', '.join(missing)}")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if head_dim * heads != config["hidden_size"]:
        raise ValueError(f"hf:{folder}: model type {kind!r} has head_dim {head_dim} x {heads} heads != hidden "
                         f"{config['hidden_size']}: not supported")
    return dict(
        name=path.name, layers=config["num_hidden_layers"], hidden=config["hidden_size"], heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads, ffn=config["intermediate_size"],
        vocab=config["vocab_size"], gated_mlp=config.get("hidden_act", "silu") in ("silu", "swiglu"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)), source=f"{HF_PREFIX}{folder}",
        # Qwen2-style configs keep a window that is off unless use_sliding_window says otherwise.
        attention_window=config.get("sliding_window") if config.get("use_sliding_window", True) else None,
        max_positions=config.get("max_position_embeddings"))
