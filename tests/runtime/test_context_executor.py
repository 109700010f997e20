"""The executor runs plans whose groups have a CP part (u x c) with the single-process gradient:
plain, ZeRO-1, FSDP2 lockstep, a remap domain holding a CP group, a 6-head model whose
degree 4 only CP reaches, and video DiTs (full attention; spatial-temporal, whose 2D layouts
fall back to Ulysses x CP) (gloo, one spawn of 4 ranks). Tolerances: see `runtime_cases`."""
from __future__ import annotations

import pytest
import torch
from runtime_cases import (LENGTHS, SHAPE, assert_single_process_gradients, clip_batch, load_params, make_batches,
                           perturbed_params)

from ballast import verify
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import MODEL_PRESETS, ModelShape
from ballast.models import build_gpt, build_model
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ProcessGroups, parallelize, run_local

# 6 heads, 2 kv heads: Ulysses reaches degree 2 only; 4 = 2 x CP 2 or 1 x CP 4.
SIX_HEADS = ModelShape("six-heads", 2, 48, 6, 2, 64, 64)
# dit-tiny (full attention over whole clips) with CP: the longest clip, a single image, a
# single-patch-frame clip, and clips too short for every rank to hold a token.
DIT = MODEL_PRESETS["dit-tiny"]
GRIDS = [(4, 8, 8), (3, 4, 5), (1, 6, 6), (5, 1, 1), (1, 1, 3)]
# stdit-tiny on the same plan: the 4 x 64 clip at 1 x 4 holds whole frames and columns; the
# one-frame clips' frames balance over no group (a 36-token frame over 2 ranks, 3 tokens over 4),
# so their spatial blocks run the `context` fallback, in a remap slot too (1 x 2 in wave 3).
STDIT = MODEL_PRESETS["stdit-tiny"]


def dit_plan() -> Plan:
    """1 x 4 (two micro-batches, one fully recomputed), 2 x 2, then a remap domain of the world
    holding a 1 x 2 CP group and an idle group."""
    lengths = [f * h * w for f, h, w in GRIDS]
    return Plan(lengths, [
        Wave([Group(0, 4, [MicroBatch([0]), MicroBatch([4], 1.0)], cp=4)]),
        Wave([Group(0, 4, [MicroBatch([1, 3], 0.5)], cp=2)]),
        Wave([Group(0, 2, [MicroBatch([2])], cp=2), Group(2, 2)], remap=[(0, 4)]),
    ], shapes=GRIDS, planner="dit-context")


def context_plan() -> Plan:
    """u x c = 2 x 2, 1 x 4 and 1 x 2 beside a Ulysses group; recompute levels from 0 to 1; the
    1-token sequence at CP 4 leaves three ranks empty."""
    return Plan(LENGTHS, [
        Wave([Group(0, 4, [MicroBatch([0, 1, 2], 0.5), MicroBatch([3])], cp=2)]),
        Wave([Group(0, 2, [MicroBatch([4, 5], 1.0)], cp=2), Group(2, 2, [MicroBatch([6, 7])])]),
        Wave([Group(0, 4, [MicroBatch([8, 9])], cp=4)]),
    ], planner="context")


def lockstep_context_plan() -> Plan:
    return Plan(LENGTHS, [
        Wave([Group(0, 4, [MicroBatch([0, 1, 2], 0.5), MicroBatch([3])], cp=2)]),
        Wave([Group(0, 2, [MicroBatch([4, 5], 1.0), MicroBatch([])], cp=2),
              Group(2, 2, [MicroBatch([6]), MicroBatch([7])])]),
        Wave([Group(0, 4, [MicroBatch([8, 9])], cp=4)]),
    ], lockstep=True, planner="context-lockstep")


def remapped_context_plan() -> Plan:
    """A remap domain of the whole world over a 1 x 2 CP group, a rank with two sequences and
    an idle rank; then one over a 2 x 2 group alone."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1], 0.5), MicroBatch([2])], cp=2), Group(2, 1, [MicroBatch([3, 4])]),
              Group(3, 1)], remap=[(0, 4)]),
        Wave([Group(0, 4, [MicroBatch([5, 6, 7, 8, 9], 0.25)], cp=2)], remap=[(0, 4)]),
    ], planner="remapped-context")


def six_head_batches() -> list[verify.VerifyBatch]:
    generator = torch.Generator().manual_seed(2)
    return [verify.VerifyBatch(LENGTHS, [torch.randint(0, SIX_HEADS.vocab, (s + 1,), generator=generator)
                                   for s in LENGTHS]) for _ in range(2)]


def _worker(batches: list[verify.VerifyBatch], six: list[verify.VerifyBatch]) -> dict | None:
    groups = ProcessGroups()
    one = batches[:2]
    out = {name: verify.train_distributed(SHAPE, [plan.to_dict()] * len(one), one, 0, 1e-3, groups, **kw)
           for name, plan, kw in (("context", context_plan(), {}), ("zero1", context_plan(), {"zero1": True}),
                                  ("fsdp", lockstep_context_plan(), {"fsdp": True}),
                                  ("remapped", remapped_context_plan(), {}))}
    six_plans = [Plan(LENGTHS, [Wave([Group(0, 4, [MicroBatch(list(range(10)))], cp=cp)])]).to_dict() for cp in (2, 4)]
    out["six-heads"] = verify.train_distributed(SIX_HEADS, six_plans, six, 0, 1e-3, groups)
    # Video DiTs from perturbed parameters (adaLN-zero's zeros would make most gradients zero).
    for shape in (DIT, STDIT):
        model = build_model(shape, seed=0)
        executor = parallelize(model, get_cluster("cpu", world_size=4), groups=groups, lr=1e-3)
        load_params(model, perturbed_params(shape))
        result = executor.step(dit_plan(), clip_batch(shape, GRIDS).samples)
        out[shape.name] = (result.loss, verify.flatten(p.grad for p in model.parameters()))
    # Activations saved for backward: full recomputation keeps only the layers' inputs, the
    # gathered K/V included (the CP function saves it where recomputation can drop it).
    cluster = get_cluster("cpu", world_size=4)
    for recompute in (0.0, 1.0):
        executor = parallelize(build_gpt(SHAPE), cluster, groups=groups, measure_activations=True, lr=1e-3)
        plan = Plan(LENGTHS, [Wave([Group(0, 4, [MicroBatch(list(range(10)), recompute)], cp=2)])])
        out[f"recompute {recompute}"] = executor.step(plan, batches[0].samples).micro_batches[0]
    return out


@pytest.fixture(scope="module")
def world4() -> tuple[list[dict], list[verify.VerifyBatch]]:
    batches = make_batches()
    return run_local(4, _worker, batches, six_head_batches(), timeout=400), batches


@pytest.mark.slow
def test_context_parallel_plans_give_the_single_process_gradient(world4):
    ranks, batches = world4
    for name in ("context", "zero1", "fsdp", "remapped"):
        assert_single_process_gradients(ranks[0][name], batches)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [DIT, STDIT], ids=lambda s: s.name)
def test_video_clips_run_context_parallel_with_the_single_process_gradient(world4, shape):
    ranks, _ = world4
    loss, grads = ranks[0][shape.name]
    params = perturbed_params(shape)
    expected = verify.reference_at(shape, verify.Trajectory([], [], [params], params), [clip_batch(shape, GRIDS)])
    want = expected.grads[0]
    assert float((grads - want).abs().max() / want.abs().max()) <= verify.GRAD_TOLERANCE
    assert loss == pytest.approx(expected.losses[0], rel=verify.GRAD_TOLERANCE)


@pytest.mark.slow
def test_a_six_head_model_runs_degree_4_with_context_parallelism(world4):
    ranks, _ = world4
    result = ranks[0]["six-heads"]
    expected = verify.reference_at(SIX_HEADS, result, six_head_batches())
    for got, want in zip(result.grads, expected.grads, strict=True):
        assert float((got - want).abs().max() / want.abs().max()) <= verify.GRAD_TOLERANCE
    assert result.losses == pytest.approx(expected.losses, rel=verify.GRAD_TOLERANCE)


@pytest.mark.slow
def test_recomputed_cp_layers_keep_only_their_inputs(world4):
    ranks, _ = world4
    # 2 x 2: the ranks hold every token once (head-tail chunks per sequence, not 218 / 4 each).
    assert sum(rank["recompute 0.0"].tokens for rank in ranks) == sum(LENGTHS)
    for rank in ranks:
        full, recomputed = rank["recompute 0.0"], rank["recompute 1.0"]
        # A recomputed layer keeps its input (rows x 128 fp32); an unchecked one that and q,
        # the gathered K/V, the MLP's activations, ...: measured ~10x more. Had the CP function
        # kept its graph beyond the hooks, the meter would not see it: `test_context_parallel`
        # checks its autograd node holds no tensor outside `save_for_backward`.
        assert recomputed.tokens == full.tokens
        assert recomputed.activation_bytes < full.activation_bytes / 4
