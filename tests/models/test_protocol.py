"""ballast's GPT implements the runtime's model protocol, and the runtime reaches the model only
through it (no runtime module imports a model family)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import ballast.runtime
from ballast.vocabulary.model_shape import MODEL_PRESETS
from ballast.models import GPT, PackedStream, ParallelModel, build_gpt


def test_gpt_implements_the_protocol():
    model = build_gpt(MODEL_PRESETS["tiny"])
    assert isinstance(model, ParallelModel)
    assert list(model.blocks()) == list(model.layers) and len(model.blocks()) == model.shape.layers
    seen = []

    def attend(q, k, v, stream):
        seen.append((q.shape, k.shape, stream))
        return torch.zeros_like(q)

    model.install_attention(attend)
    stream = PackedStream.from_lengths([3, 5])
    logits = model(torch.zeros(8, dtype=torch.long), stream)
    assert logits.shape == (8, model.shape.vocab)
    assert len(seen) == model.shape.layers and all(s is stream for _, _, s in seen)


def test_the_runtime_imports_no_model_family():
    runtime = Path(ballast.runtime.__file__).parent
    for path in runtime.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("models"):
                # the protocol, and the attention kernels and their index tensors every model family shares
                assert node.module in ("models.protocol", "models.kernels", "models.offset_causal",
                                       "models.stream_index"), \
                    f"{path.name} imports {node.module}"
    assert GPT.__module__ == "ballast.models.gpt"


def test_hf_model_without_position_ids_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    from ballast.models.hf import check_supported

    class NoPositions(LlamaForCausalLM):
        def forward(self, input_ids=None, **kwargs):  # no position_ids: shards could not be placed
            return super().forward(input_ids=input_ids, **kwargs)

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(ValueError, match="model type 'llama': its forward takes no position_ids"):
        check_supported(NoPositions(config), None)
