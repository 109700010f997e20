"""Heterogeneous strategies (`runtime/strategy.py`, `runtime/canonical.py`) train exactly like one
process: on 8 gloo ranks the tiny GPT runs three steps under three strategies, Hydraulis'
[(2,2),(2,1),(1,1),(1,1)], then [(1,4),(2,2)], then pools of their own ([(1,1)x4,(2,1)x2]: Ulysses,
CP and Ulysses x CP in two waves beside Ulysses over TP ranks' heads), and a tiny Hugging Face
Llama (grouped-query attention, 4 layers) the first two; every pipeline holds sequences, in
micro-batches of unequal lengths and recompute levels. The state lives in the canonical layout
throughout: each step gathers every pipeline's compute parameters from it and reduces their
gradients back, so a change of strategy between steps is just the next step; the GPT runs with
both movements (`Movement.SLICED`: each rank receives and returns only the ranges it holds, and
`FULL`: every rank gathers and reduces every whole unit).

Tolerance (fp32): the loss and every gradient at the same parameters match one process's to
`runtime_cases.GRAD_RTOL` (1e-5 of the largest entry), as the pipeline and TP tests. The gather
copies exact fp32 values and the reduction adds each gradient once (zeros elsewhere), so the
movement adds only the order of float sums across pipelines to what their runtimes already do
(measured 3e-7 to 4e-7 of the largest entry on the GPT, up to 8e-7 through
`ballast verify` on the Llama). A gradient a pool or TP group counted
twice, a pipeline's part dropped or a shard reduced into the wrong place is off by orders of
magnitude. Three AdamW steps on the shards land where one process's AdamW does within
`verify.PARAM_TOLERANCE` (AdamW is elementwise: sharding it changes no value).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from runtime_cases import GRAD_RTOL, LENGTHS, SHAPE, make_batches

from hf_folders import save_model

from ballast import verify
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.plans.strategy_plan import StrategyPlan
from ballast.pricing.parameter_movement import Movement
from ballast.runtime import run_local
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import ModelShape, get_model_shape
from ballast.vocabulary.strategy import Strategy


def part(ids: list[int], tp: int, pp: int, waves: list[list[Group]]) -> tuple[list[int], Plan]:
    """A pipeline's sequences (the batch's ids) and its plan of them."""
    return ids, Plan([LENGTHS[j] for j in ids], [Wave(groups) for groups in waves], sum(LENGTHS), tp=tp, pp=pp)


def strategy_plan(text: str, parts: list[tuple[list[int], Plan]]) -> StrategyPlan:
    return StrategyPlan(Strategy.parse(text), [p for _, p in parts], [ids for ids, _ in parts], LENGTHS,
                        planner=f"hand {text}")


def hydraulis_16() -> StrategyPlan:
    """[(2,2),(2,1),(1,1),(1,1)]: the 61- and 37-token sequences through TP 2 x PP 2, three through
    TP 2 alone, the rest on two one-rank pipelines."""
    return strategy_plan("2x2,2x1,1x1,1x1", [
        part([3, 0], 2, 2, [[Group(0, 1, [MicroBatch([0], 0.5), MicroBatch([1])])]]),
        part([7, 1, 4], 2, 1, [[Group(0, 1, [MicroBatch([0, 1]), MicroBatch([2], 1.0)])]]),
        part([9, 8], 1, 1, [[Group(0, 1, [MicroBatch([0, 1])])]]),
        part([5, 2, 6], 1, 1, [[Group(0, 1, [MicroBatch([0]), MicroBatch([1, 2], 0.5)])]]),
    ])


def deep_and_wide() -> StrategyPlan:
    """[(1,4),(2,2)]: a four-stage pipeline of three micro-batches beside TP 2 x PP 2."""
    return strategy_plan("1x4,2x2", [
        part([0, 1, 2, 3, 4], 1, 4, [[Group(0, 1, [MicroBatch([0, 1]), MicroBatch([2], 1.0), MicroBatch([3, 4])])]]),
        part([5, 6, 7, 8, 9], 2, 2, [[Group(0, 1, [MicroBatch([0, 1], 0.5), MicroBatch([2, 3, 4])])]]),
    ])


def pools() -> StrategyPlan:
    """[(1,1)x4,(2,1)x2]: a pool of four (Ulysses 2 and CP 2 side by side, then Ulysses 2 x CP 2),
    and TP 2 over a pool of two (Ulysses over the TP ranks' heads, then two one-rank groups)."""
    return strategy_plan("1x1x4,2x1x2", [
        part([3, 0, 5, 8], 1, 1, [[Group(0, 2, [MicroBatch([0])]), Group(2, 2, [MicroBatch([1, 3])], cp=2)],
                                   [Group(0, 4, [MicroBatch([2], 0.5)], cp=2)]]),
        part([7, 1, 2, 4, 6, 9], 2, 1, [[Group(0, 2, [MicroBatch([0, 1])])],
                                         [Group(0, 1, [MicroBatch([2]), MicroBatch([3, 4])]),
                                          Group(1, 1, [MicroBatch([5])])]]),
    ])


def _worker(shapes: dict[str, ModelShape], plans: dict[str, list[dict]],
            batches: dict[str, list[verify.VerifyBatch]]) -> dict | None:
    torch.set_num_threads(1)
    out = {name: verify.train_strategies(shapes[name.split("/")[0]], plans[name], batches[name.split("/")[0]], 0,
                                         1e-3, movement=Movement(name.split("/")[1]))
           for name in plans}
    return out if dist.get_rank() == 0 else None


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> ModelShape:
    return get_model_shape("hf:" + str(save_model(tmp_path_factory.mktemp("hf") / "llama", "LlamaConfig",
                                                   num_key_value_heads=2, num_hidden_layers=4)))


def test_hand_plans_are_valid_strategy_plans():
    cluster = get_cluster("cpu", 8)
    for plan in (hydraulis_16(), deep_and_wide(), pools()):
        plan.validate(cluster)
        assert all(p.lengths for p in plan.parts), "every pipeline trains something"


@pytest.mark.slow
def test_strategies_changing_between_steps_train_like_one_process(llama, single_thread):
    steps = [hydraulis_16(), deep_and_wide(), pools()]
    generator = torch.Generator().manual_seed(5)
    llama_batch = verify.VerifyBatch(LENGTHS, [torch.randint(0, llama.vocab, (s + 1,), generator=generator)
                                               for s in LENGTHS])
    batches = {"gpt": make_batches()[:3], "llama": [llama_batch, llama_batch]}
    plans = {"gpt/sliced": [p.to_dict() for p in steps], "gpt/full": [p.to_dict() for p in steps],
             "llama/sliced": [p.to_dict() for p in steps[:2]]}
    shapes = {"gpt": SHAPE, "llama": llama}
    results = run_local(8, _worker, shapes, plans, batches, timeout=600)[0]
    for name, result in results.items():
        model = name.split("/")[0]
        expected = verify.reference_at(shapes[model], result, batches[model])
        for got, want in zip(result.grads, expected.grads, strict=True):
            assert float((got - want).abs().max() / want.abs().max()) <= GRAD_RTOL, name
        assert result.losses == pytest.approx(expected.losses, rel=GRAD_RTOL), name
    reference = verify.train_reference(SHAPE, batches["gpt"], 0, 1e-3)
    for movement in ("sliced", "full"):
        assert verify.param_drift(results[f"gpt/{movement}"], reference) <= verify.PARAM_TOLERANCE, movement
