"""Models cut into pipeline stages (`protocol.StagedModel`, `runtime/pipeline/split.py`), in one
process: the stages chained compute the whole model's loss and gradients, and keep the whole
model's parameter names; what cannot be cut is refused by name.

Tolerance: the chain runs the same fp32 operations on the same rows in the same order as the
whole model (a stage hands the next its residual stream unrounded), so loss and gradients are
equal bit for bit; `torch.equal` is the check."""
from __future__ import annotations

import copy

import pytest
import torch

from hf_folders import save_model

from ballast.models import PackedStream, build_model
from ballast.models.protocol import StagedModel
from ballast.runtime.pipeline import split_model
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import MODEL_PRESETS, ModelShape, get_model_shape

LENGTHS = [5, 9, 1, 3]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> ModelShape:
    return get_model_shape("hf:" + str(save_model(tmp_path_factory.mktemp("hf") / "llama", "LlamaConfig",
                                                  num_hidden_layers=4, num_key_value_heads=2)))


def chained(shape: ModelShape, stages: int, recompute: int) -> tuple[torch.Tensor, dict, dict]:
    """(whole model's loss, its gradients by name, the stages' gradients by name) of one packed
    batch, the stages run one after another, each from the previous one's output."""
    model = build_model(shape, 0)
    generator = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, shape.vocab, (s + 1,), generator=generator) for s in LENGTHS]
    stream, local = PackedStream.from_lengths(LENGTHS), slice(0, sum(LENGTHS))
    whole = model.loss(samples, stream, local, recompute)
    whole.backward()
    mesh = JobMesh(stages, stages, pp=stages)
    parts = [copy.deepcopy(model) for _ in range(stages)]
    for stage, part in enumerate(parts):
        part.zero_grad(set_to_none=True)
        split_model(part, mesh, stage)
    outputs, received = [], None
    for part in parts:
        out = part.stage_forward(received, samples, stream, local, recompute)
        outputs.append((received, out))
        received = out.detach().requires_grad_()
    loss = outputs[-1][1]
    grad = None
    for received, out in reversed(outputs):
        out.backward(grad)
        grad = None if received is None else received.grad
    assert torch.equal(loss, whole)
    return ({n: p.grad for n, p in model.named_parameters()},
            {n: p.grad for part in parts for n, p in part.named_parameters()})


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("model", ["tiny", "llama"])
def test_stages_chained_are_the_whole_model(model, stages, llama, single_thread):
    shape = MODEL_PRESETS["tiny"] if model == "tiny" else llama
    whole, parts = chained(shape, stages, recompute=1)
    assert list(parts) == list(whole), "every parameter on one stage, under its whole-model name, in model order"
    for name, grad in whole.items():
        assert torch.equal(parts[name], grad), name


def test_a_stage_holds_its_part_only(llama):
    mesh = JobMesh(2, 2, pp=2)
    first, last = build_model(MODEL_PRESETS["tiny"]), build_model(MODEL_PRESETS["tiny"])
    split_model(first, mesh, 0)
    split_model(last, mesh, 1)
    assert (first.holds_embedding, first.holds_head) == (True, False)
    assert (last.holds_embedding, last.holds_head) == (False, True)
    assert [name for name, _ in last.blocks().named_children()] == ["2", "3"]
    assert list(last.blocks()) == [last.blocks()[0], last.blocks()[1]]  # indexed by position
    hf = build_model(llama)
    split_model(hf, mesh, 0)
    assert hf.holds_embedding and not hf.holds_head and isinstance(hf.hf.model.norm, torch.nn.Identity)
    assert {name.split(".")[3] for name, _ in hf.named_parameters() if ".layers." in name} == {"0", "1"}


def test_what_cannot_be_cut_is_refused(tmp_path):
    mesh = JobMesh(2, 2, pp=2)
    with pytest.raises(ValueError, match="PP degree 3 does not divide model 'tiny''s 4 layers"):
        JobMesh(3, 3, pp=3).check_model(MODEL_PRESETS["tiny"])
    with pytest.raises(ValueError, match="'dit-tiny' cannot be cut into pipeline stages"):
        mesh.check_model(MODEL_PRESETS["dit-tiny"])
    dit = build_model(MODEL_PRESETS["dit-tiny"])
    assert not isinstance(dit, StagedModel)
    with pytest.raises(ValueError, match="'dit-tiny' cannot be cut into pipeline stages"):
        split_model(dit, mesh, 0)
    tied_shape = get_model_shape("hf:" + str(save_model(tmp_path / "tied", "LlamaConfig", tie_word_embeddings=True)))
    with pytest.raises(ValueError, match="ties its embedding and output weights"):
        mesh.check_model(tied_shape)
    with pytest.raises(ValueError, match="tied embedding and output weights"):
        split_model(build_model(tied_shape), mesh, 0)
    # Granite multiplies its input embeddings inside the decoder's forward: a later stage's
    # hidden states would be multiplied again. (Gemma scales inside its embedding module, which
    # the first stage alone runs: it splits.)
    granite = build_model(get_model_shape("hf:" + str(save_model(tmp_path / "granite", "GraniteConfig",
                                                                 embedding_multiplier=2.0))))
    with pytest.raises(ValueError, match="transforms the input embeddings"):
        split_model(granite, mesh, 1)
