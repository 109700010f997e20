"""Tiny Hugging Face causal-LM folders, made here without a network: config.json and seeded
model.safetensors written by transformers' own `save_pretrained`."""
from __future__ import annotations

from pathlib import Path

import torch

# initializer_range 0.1, not 0.02: at 0.02 the attention scores of a random model are ~0.1 and
# softmax is nearly uniform, so positions (RoPE and its scaling) would barely move the logits.
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, initializer_range=0.1)


def save_model(folder: Path, config_class: str, seed: int = 0, **overrides) -> Path:
    """A tiny causal LM of `config_class` with seeded weights, saved with `save_pretrained`
    (config.json and model.safetensors)."""
    import transformers

    config = getattr(transformers, config_class)(**{**COMMON, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder
