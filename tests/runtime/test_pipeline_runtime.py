"""Pipeline parallelism (`runtime/pipeline/`) trains exactly like one process: the tiny GPT and a
tiny Hugging Face Llama (grouped-query attention) under 2 stages of one rank (2 gloo ranks) and
2 stages of a pool of 2 (4 ranks), with plans whose micro-batches differ in length, layout and
recompute level inside one 1F1B schedule: Ulysses over the pool, two one-rank groups of unequal
micro-batch counts, CP over the pool, a 1-token sequence that leaves a rank of its group without a
row; ZeRO-1 over each stage's pool too.

Tolerance (fp32): the loss and every gradient at the same parameters match one process's to
`runtime_cases.GRAD_RTOL` (1e-5 of the largest entry), as the executor's tests. A stage hands the
next the exact fp32 rows it computed, and a received row's gradient goes back exact, so the
pipeline adds no rounding of its own; only the order of float sums differs from one process
(per-shard partial sums, the pool's all-reduce, attention over a packed stream): measured 5e-7
to 6e-7 of the largest entry. A lost, doubled or misrouted micro-batch, a stage's gradient not
sent back, or a row paired with another's gradient moves the error by orders of magnitude.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from runtime_cases import LENGTHS, SHAPE, make_batches

from hf_folders import save_model

from ballast import verify
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ProcessGroups, run_local
from ballast.runtime.pipeline import PipelineConfig, pipeline_slots
from ballast.vocabulary.model_shape import ModelShape, get_model_shape


def one_rank_plan() -> Plan:
    """A pool of one rank: two waves, micro-batches of 42, 12, 84, 79 and 26 tokens at levels
    0.5, 0, 1, 0, 0."""
    return Plan(LENGTHS, [
        Wave([Group(0, 1, [MicroBatch([0, 1], 0.5), MicroBatch([2]), MicroBatch([3, 4, 5], 1.0)])]),
        Wave([Group(0, 1, [MicroBatch([6, 7, 8]), MicroBatch([9])])]),
    ], planner="pipeline-one-rank")


def pool_plan() -> Plan:
    """A pool of two ranks: Ulysses 2 x 1 (two micro-batches); two one-rank groups running three
    micro-batches and one; CP 1 x 2 (the 1-token sequence leaves one rank without a row)."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1], 0.5), MicroBatch([3])])]),
        Wave([Group(0, 1, [MicroBatch([2]), MicroBatch([4, 5], 1.0), MicroBatch([6])]),
              Group(1, 1, [MicroBatch([7])])]),
        Wave([Group(0, 2, [MicroBatch([8]), MicroBatch([9], 0.5)], cp=2)]),
    ], planner="pipeline-pool")


def test_every_rank_of_a_pool_walks_the_same_slots():
    plan = pool_plan()
    slots = [pipeline_slots(plan, rank) for rank in (0, 1)]
    assert [len(s) for s in slots] == [7, 7]
    assert [(s.wave, s.micro_batch.seq_ids) for s in slots[1]] == [
        (0, [0, 1]), (0, [3]), (1, [7]), (1, []), (1, []), (2, [8]), (2, [9])]


def _worker(shapes: dict[str, ModelShape], batches: dict[str, list[verify.VerifyBatch]], plan: Plan,
            stages: int, zero1: bool) -> dict | None:
    torch.set_num_threads(1)
    pipeline = PipelineConfig.of_world(dist.get_world_size(), stages)
    groups = ProcessGroups(pipeline.pools())
    out = {name: verify.train_distributed(shape, [plan.to_dict()] * len(batches[name]), batches[name], 0, 1e-3,
                                          groups, pipeline=pipeline)
           for name, shape in shapes.items()}
    if zero1:
        out["gpt-zero1"] = verify.train_distributed(SHAPE, [plan.to_dict()], batches["gpt"][:1], 0, 1e-3, groups,
                                                    zero1=True, pipeline=pipeline)
    return out if dist.get_rank() == 0 else None


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[dict[str, ModelShape], dict[str, list[verify.VerifyBatch]]]:
    llama = get_model_shape("hf:" + str(save_model(tmp_path_factory.mktemp("hf") / "llama", "LlamaConfig",
                                                   num_key_value_heads=2)))
    generator = torch.Generator().manual_seed(3)
    hf_batch = verify.VerifyBatch(LENGTHS, [torch.randint(0, llama.vocab, (s + 1,), generator=generator)
                                            for s in LENGTHS])
    return {"gpt": SHAPE, "llama": llama}, {"gpt": make_batches()[:2], "llama": [hf_batch]}


@pytest.mark.slow
@pytest.mark.parametrize("world, plan", [(2, one_rank_plan()), (4, pool_plan())], ids=["pp2", "pp2-pool2"])
def test_pipeline_gradients_are_one_process(models, world, plan, single_thread):
    shapes, batches = models
    results = run_local(world, _worker, shapes, batches, plan, 2, world == 4)[0]
    runs = [(name, shapes[name], batches[name]) for name in shapes]
    if world == 4:
        runs.append(("gpt-zero1", SHAPE, batches["gpt"][:1]))
    for name, shape, steps in runs:
        expected = verify.reference_at(shape, results[name], steps)
        for got, want in zip(results[name].grads, expected.grads, strict=True):
            assert float((got - want).abs().max() / want.abs().max()) <= verify.GRAD_TOLERANCE, name
        assert results[name].losses == pytest.approx(expected.losses, rel=verify.GRAD_TOLERANCE), name
    # Every stage's AdamW stepped its own parameters: two steps land where one process's do.
    assert verify.param_drift(results["gpt"], verify.train_reference(SHAPE, batches["gpt"], 0, 1e-3)) \
        <= verify.PARAM_TOLERANCE
