"""Tensor parallelism trains exactly like one process (gloo): the GPT and Hugging Face causal LMs
under TP 2 (2 ranks) and TP 2 x pool 2 (4 ranks) with Ulysses and CP groups in the pool, ZeRO-1
and FSDP2 over the pool; the gathered TP shards of every gradient equal the single-process one.

Tolerance: `runtime_cases.GRAD_RTOL` (verify's 1e-5, relative to the largest entry). TP changes
only summation orders: a row-parallel layer's all-reduce adds t partial products, f's backward
adds t partial input gradients, the loss adds the ranks' partial softmax denominators; each is
float32 rounding, ~1e-7 relative per sum. Measured 6e-7 to 1.2e-6 here; a shard lost or counted
twice errs by O(1).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hf_folders import save_model
from runtime_cases import GRAD_RTOL, LENGTHS, SHAPE

from ballast import verify
from ballast.models import build_model
from ballast.models.gpt import GPT, build_gpt
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ProcessGroups, parallelize, run_local
from ballast.runtime.tensor_parallel import parallelize_tensors
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import MODEL_PRESETS, ModelShape, get_model_shape

STEPS = 2


def batches_for(shape: ModelShape) -> list[verify.VerifyBatch]:
    generator = torch.Generator().manual_seed(0)
    return [verify.VerifyBatch(LENGTHS, [torch.randint(0, shape.vocab, (s + 1,), generator=generator)
                                         for s in LENGTHS]) for _ in range(STEPS)]


def one_rank_plan() -> Plan:
    """A pool of one rank (2 ranks, TP 2): two micro-batches, one half recomputed."""
    return Plan(LENGTHS, [Wave([Group(0, 1, [MicroBatch(list(range(5)), 0.5), MicroBatch(list(range(5, 10)))])])],
                tp=2)


def pool_plan() -> Plan:
    """A pool of two ranks (4 ranks, TP 2): Ulysses over both, then CP over both (u = 1, c = 2),
    then each pool rank alone, one fully recomputed; a micro-batch of one 1-token sequence leaves
    a pool rank, and so its whole TP group, an empty shard."""
    return Plan(LENGTHS, [Wave([Group(0, 2, [MicroBatch([0, 1], 0.25), MicroBatch([8]), MicroBatch([2])])]),
                          Wave([Group(0, 2, [MicroBatch([3, 4, 5])], cp=2)]),
                          Wave([Group(0, 1, [MicroBatch([6])]), Group(1, 1, [MicroBatch([7, 9], 1.0)])])], tp=2)


def lockstep_pool_plan() -> Plan:
    return Plan(LENGTHS, [Wave([Group(0, 2, [MicroBatch([0, 1, 2, 3]), MicroBatch([4, 5, 6])], cp=2)]),
                          Wave([Group(0, 1, [MicroBatch([7, 8])]), Group(1, 1, [MicroBatch([9])])])],
                tp=2, lockstep=True)


def _replicas_agree(executor) -> bool:
    """Whether every TP rank holds the same whole parameters (the norms) after the steps: their
    gradients come out of all-reduces, identical on every rank, or the replicas would drift."""
    tp = executor.tensor_parallel
    for name, p in zip(executor.parameter_names, executor._params):
        if not tp.is_split(name):
            copies = [torch.empty_like(p) for _ in range(tp.degree)]
            dist.all_gather(copies, p.detach().contiguous(), group=tp.group)
            if any(not torch.equal(c, copies[0]) for c in copies):
                return False
    return True


def _train(shape, plan: Plan, batches, groups, **sharding) -> verify.Trajectory:
    return verify.train_distributed(shape, [plan.to_dict()] * STEPS, batches, 0, 1e-3, groups, **sharding)


def _errors(groups: ProcessGroups, batches) -> list[str]:
    """The ValueErrors of plans a TP job cannot run (raised on every rank before any collective)."""
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    executor = parallelize(build_gpt(SHAPE), cluster, groups=groups, lr=1e-3)
    odd = parallelize(build_gpt(ModelShape("odd-heads", 1, 48, 6, 2, 64, 64)), cluster, groups=groups, lr=1e-3)
    odd_batch = [s % 64 for s in batches[0].samples]
    messages = []
    for runner, plan, samples in ((executor, Plan(LENGTHS, [Wave([Group(0, 2, [MicroBatch(list(range(10)))])])]),
                                   batches[0].samples),
                                  (odd, Plan(LENGTHS, [Wave([Group(0, 2, [MicroBatch(list(range(10)))])])], tp=2),
                                   odd_batch)):
        try:
            runner.step(plan, samples)
            messages.append("no error")
        except ValueError as e:
            messages.append(str(e))
    return messages


def _world4_worker(gpt_batches, hf_shape, hf_batches) -> dict:
    cluster = get_cluster("cpu", world_size=4)
    groups = ProcessGroups(JobMesh.of(cluster, tp=2))
    out = {"errors": _errors(groups, gpt_batches),
           "gpt": _train(SHAPE, pool_plan(), gpt_batches, groups),
           "gpt-fsdp": _train(SHAPE, lockstep_pool_plan(), gpt_batches, groups, fsdp=True),
           "hf-zero1": _train(hf_shape, pool_plan(), hf_batches, groups, zero1=True)}
    executor = parallelize(build_model(hf_shape), cluster, groups=groups, lr=1e-3)
    out["norm"] = executor.step(pool_plan(), hf_batches[0].samples).grad_norm
    out["replicas agree"] = _replicas_agree(executor)
    return out if dist.get_rank() == 0 else None


def _world2_worker(gpt_batches, hf_shape, hf_batches) -> dict:
    groups = ProcessGroups(JobMesh.of(get_cluster("cpu", world_size=2), tp=2))
    out = {"gpt": _train(SHAPE, one_rank_plan(), gpt_batches, groups),
           "hf-tied": _train(hf_shape, one_rank_plan(), hf_batches, groups)}
    return out if dist.get_rank() == 0 else None


def assert_exact(shape: ModelShape, result: verify.Trajectory, batches) -> None:
    expected = verify.reference_at(shape, result, batches)
    for got, want in zip(result.grads, expected.grads, strict=True):
        assert got.shape == want.shape
        assert float((got - want).abs().max() / want.abs().max()) <= GRAD_RTOL
    assert result.losses == pytest.approx(expected.losses, rel=GRAD_RTOL)


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def hf_shapes(tmp_path_factory) -> dict[str, ModelShape]:
    root = tmp_path_factory.mktemp("hf")
    # Qwen2: biased q, k, v (column-parallel biases), 2 kv heads of 4 (a TP rank holds one);
    # Llama with the output layer tied to the embedding (one vocabulary-split matrix).
    return {"qwen2": get_model_shape(f"hf:{save_model(root / 'qwen2', 'Qwen2Config', num_key_value_heads=2)}"),
            "tied": get_model_shape(f"hf:{save_model(root / 'tied', 'LlamaConfig', tie_word_embeddings=True)}")}


@pytest.fixture(scope="module")
def world4(hf_shapes) -> dict:
    shape = hf_shapes["qwen2"]
    return run_local(4, _world4_worker, batches_for(SHAPE), shape, batches_for(shape), timeout=400)[0]


@pytest.fixture(scope="module")
def world2(hf_shapes) -> dict:
    shape = hf_shapes["tied"]
    return run_local(2, _world2_worker, batches_for(SHAPE), shape, batches_for(shape), timeout=300)[0]


@pytest.mark.slow
def test_tp2_on_two_ranks_gives_the_single_process_gradient(world2, hf_shapes):
    assert_exact(SHAPE, world2["gpt"], batches_for(SHAPE))
    assert_exact(hf_shapes["tied"], world2["hf-tied"], batches_for(hf_shapes["tied"]))


@pytest.mark.slow
def test_tp2_times_a_pool_of_two_with_ulysses_and_cp_gives_the_single_process_gradient(world4, hf_shapes):
    shape = hf_shapes["qwen2"]
    assert_exact(SHAPE, world4["gpt"], batches_for(SHAPE))
    assert_exact(SHAPE, world4["gpt-fsdp"], batches_for(SHAPE))
    assert_exact(shape, world4["hf-zero1"], batches_for(shape))
    # The executor's first step starts from the weights hf-zero1's did: its norm is that gradient's.
    expected = verify.reference_at(shape, world4["hf-zero1"], batches_for(shape))
    assert world4["norm"] == pytest.approx(float(expected.grads[0].norm()), rel=GRAD_RTOL)
    assert world4["replicas agree"]


@pytest.mark.slow
def test_plans_a_tp_job_cannot_run_are_value_errors(world4):
    made_for_one, heads = world4["errors"]
    assert "made for TP degree 1 and PP degree 1; the job runs TP 2 x PP 1 x pool 2" in made_for_one
    assert "a TP rank's heads: 6 / TP degree 2" in heads


# --- no ranks -------------------------------------------------------------------------------
def test_models_without_a_tensor_parallel_plan_are_refused():
    with pytest.raises(ValueError, match="declares no tensor-parallel plan"):
        parallelize_tensors(build_model(MODEL_PRESETS["dit-tiny"]), None, 2, 0)


@pytest.mark.parametrize("plan, message", [
    ({"layers.*.attention.wq": "colwise_rep"}, "splits layers.\\*.attention.wq as 'colwise_rep'"),
    ({"layers.*.attention.wz": "colwise"}, "names layers.\\*.attention.wz, which is no module of it"),
    ({"layers.*.attention_norm": "colwise"}, "layers.0.attention_norm as 'colwise', but it is a RMSNorm"),
    ({"layers.*.attention.wq": "colwise"}, "must split exactly one module as 'embedding'"),
])
def test_a_plan_that_cannot_split_is_refused_before_any_module_is(plan, message, monkeypatch):
    model = build_gpt(SHAPE)
    before = [n for n, _ in model.named_modules()]
    monkeypatch.setattr(GPT, "tensor_parallel_plan", lambda self: plan)
    with pytest.raises(ValueError, match=message):
        parallelize_tensors(model, None, 2, 0)
    assert [n for n, _ in model.named_modules()] == before and isinstance(model.output, torch.nn.Linear)
