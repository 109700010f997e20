"""Pipeline parallelism (`runtime/pipeline/`) trains exactly like one process, alone and under
tensor parallelism: the tiny GPT and a tiny Hugging Face Llama (grouped-query attention) under
PP 2 (2 gloo ranks), PP 2 x pool 2 and TP 2 x PP 2 (4 ranks), and a 2-layer GPT under TP 2 x PP 2
x pool 2 (8 ranks), with plans whose micro-batches differ in length, layout and recompute level
inside one 1F1B schedule: Ulysses over the pool, two one-rank groups of unequal micro-batch
counts, CP over the pool, a 1-token sequence that leaves a rank of its group without a row;
ZeRO-1 over each stage's pool too. The ranks sit where the job's `JobMesh` puts them (TP
innermost, then the pool, PP outermost).

Tolerance (fp32): the loss and every gradient at the same parameters match one process's to
`runtime_cases.GRAD_RTOL` (1e-5 of the largest entry), as the executor's tests. A stage hands the
next the exact fp32 rows it computed, and a received row's gradient goes back exact, so the
pipeline adds no rounding of its own; only the order of float sums differs from one process
(per-shard partial sums, the pool's all-reduce, attention over a packed stream; under TP the
row-parallel layers' and the split loss's all-reduces of t partial sums): measured 5e-7 to 6e-7
of the largest entry without TP, up to 1.2e-6 with it. A lost, doubled or misrouted micro-batch,
a stage's gradient not sent back, a row paired with another's gradient, or a loss or a
replicated gradient a TP group counts more than once moves the error by orders of magnitude.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from runtime_cases import GRAD_RTOL, LENGTHS, SHAPE, make_batches

from hf_folders import save_model

from ballast import verify
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ProcessGroups, run_local
from ballast.runtime.pipeline import pipeline_slots
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import ModelShape, get_model_shape

SMALL = ModelShape("tiny-2-layers", 2, 32, 4, 2, 64, 64)
"""The 8-rank case's model: 2 layers (one a stage), 4 heads and 2 kv heads (2 and 1 a TP rank)."""


def one_rank_plan(tp: int = 1) -> Plan:
    """A pool of one rank: two waves, micro-batches of 42, 12, 84, 79 and 26 tokens at levels
    0.5, 0, 1, 0, 0."""
    return Plan(LENGTHS, [
        Wave([Group(0, 1, [MicroBatch([0, 1], 0.5), MicroBatch([2]), MicroBatch([3, 4, 5], 1.0)])]),
        Wave([Group(0, 1, [MicroBatch([6, 7, 8]), MicroBatch([9])])]),
    ], planner="pipeline-one-rank", tp=tp, pp=2)


def pool_plan() -> Plan:
    """A pool of two ranks: Ulysses 2 x 1 (two micro-batches); two one-rank groups running three
    micro-batches and one; CP 1 x 2 (the 1-token sequence leaves one rank without a row)."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1], 0.5), MicroBatch([3])])]),
        Wave([Group(0, 1, [MicroBatch([2]), MicroBatch([4, 5], 1.0), MicroBatch([6])]),
              Group(1, 1, [MicroBatch([7])])]),
        Wave([Group(0, 2, [MicroBatch([8]), MicroBatch([9], 0.5)], cp=2)]),
    ], planner="pipeline-pool", pp=2)


def tp_pool_plan() -> Plan:
    """The 8-rank case's plan over a pool of two: Ulysses 2 x 1 (two micro-batches, the second
    with the 1-token sequence alone, so one pool rank and its TP group hold no row), then CP
    1 x 2 at full recomputation."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1, 2, 3], 0.5), MicroBatch([8])])]),
        Wave([Group(0, 2, [MicroBatch([4, 5, 6, 7, 9], 1.0)], cp=2)]),
    ], planner="pipeline-tp-pool", tp=2, pp=2)


def test_every_rank_of_a_pool_walks_the_same_slots():
    plan = pool_plan()
    slots = [pipeline_slots(plan, rank) for rank in (0, 1)]
    assert [len(s) for s in slots] == [7, 7]
    assert [(s.wave, s.micro_batch.seq_ids) for s in slots[1]] == [
        (0, [0, 1]), (0, [3]), (1, [7]), (1, []), (1, []), (2, [8]), (2, [9])]


def _groups(tp: int) -> ProcessGroups:
    return ProcessGroups(JobMesh.of(get_cluster("cpu", world_size=dist.get_world_size()), tp=tp, pp=2))


def _train(shape: ModelShape, plan: Plan, batches: list[verify.VerifyBatch], groups: ProcessGroups,
           zero1: bool = False) -> verify.Trajectory:
    return verify.train_distributed(shape, [plan.to_dict()] * len(batches), batches, 0, 1e-3, groups, zero1=zero1)


def _worker(shapes: dict[str, ModelShape], batches: dict[str, list[verify.VerifyBatch]]) -> dict | None:
    """On 2 ranks PP 2; on 4 ranks PP 2 x pool 2 (and ZeRO-1), then TP 2 x PP 2; on 8 ranks the
    small GPT under TP 2 x PP 2 x pool 2."""
    torch.set_num_threads(1)
    world = dist.get_world_size()
    out = {}
    if world == 8:
        out["small-tp"] = _train(SMALL, tp_pool_plan(), batches["small"], _groups(tp=2))
        return out if dist.get_rank() == 0 else None
    groups = _groups(tp=1)
    plan = one_rank_plan() if world == 2 else pool_plan()
    for name in ("gpt", "llama"):
        out[name] = _train(shapes[name], plan, batches[name], groups)
    if world == 4:
        out["gpt-zero1"] = _train(SHAPE, plan, batches["gpt"][:1], groups, zero1=True)
        tp_groups = _groups(tp=2)
        for name in ("gpt", "llama"):
            out[f"{name}-tp"] = _train(shapes[name], one_rank_plan(tp=2), batches[name], tp_groups)
    return out if dist.get_rank() == 0 else None


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[dict[str, ModelShape], dict[str, list[verify.VerifyBatch]]]:
    llama = get_model_shape("hf:" + str(save_model(tmp_path_factory.mktemp("hf") / "llama", "LlamaConfig",
                                                   num_key_value_heads=2)))
    generator = torch.Generator().manual_seed(3)
    batch = {name: verify.VerifyBatch(LENGTHS, [torch.randint(0, shape.vocab, (s + 1,), generator=generator)
                                                for s in LENGTHS]) for name, shape in (("llama", llama),
                                                                                         ("small", SMALL))}
    return ({"gpt": SHAPE, "llama": llama, "small": SMALL},
            {"gpt": make_batches()[:2], "llama": [batch["llama"]], "small": [batch["small"]]})


def assert_exact(shape: ModelShape, result: verify.Trajectory, steps: list[verify.VerifyBatch], name: str) -> None:
    expected = verify.reference_at(shape, result, steps)
    for got, want in zip(result.grads, expected.grads, strict=True):
        assert float((got - want).abs().max() / want.abs().max()) <= GRAD_RTOL, name
    assert result.losses == pytest.approx(expected.losses, rel=GRAD_RTOL), name


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4], ids=["pp2", "pp2-pool2-and-tp2-pp2"])
def test_pipeline_gradients_are_one_process(models, world, single_thread):
    shapes, batches = models
    results = run_local(world, _worker, shapes, batches, timeout=600)[0]
    runs = ["gpt", "llama"] + (["gpt-zero1", "gpt-tp", "llama-tp"] if world == 4 else [])
    for name in runs:
        model = name.split("-")[0]
        steps = batches[model][:len(results[name].grads)]
        assert_exact(shapes[model], results[name], steps, name)
    # Every stage's AdamW stepped its own parameters: two steps land where one process's do.
    assert verify.param_drift(results["gpt"], verify.train_reference(SHAPE, batches["gpt"], 0, 1e-3)) \
        <= verify.PARAM_TOLERANCE


@pytest.mark.slow
def test_tp2_pp2_pool2_on_eight_ranks_is_one_process(models, single_thread):
    shapes, batches = models
    result = run_local(8, _worker, shapes, batches, timeout=600)[0]["small-tp"]
    assert_exact(SMALL, result, batches["small"], "small-tp")
