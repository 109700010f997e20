"""ballast's GPT implements the runtime's model protocol, and the runtime reaches the model only
through it (no runtime module imports a model family)."""
from __future__ import annotations

import ast
from pathlib import Path

import torch

import ballast.runtime
from ballast.model_shape import MODEL_PRESETS
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
                # the protocol, and the attention kernels every model family shares
                assert node.module in ("models.protocol", "models.kernels"), f"{path.name} imports {node.module}"
    assert GPT.__module__ == "ballast.models.gpt"
