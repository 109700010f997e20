"""The executor runs any plan with the single-process gradient (gloo; one spawn of 4 ranks, one of 2).

Tolerances: see `runtime_cases`.
"""
from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist

from runtime_cases import (LENGTHS, PARAM_DRIFT, SHAPE, STEPS, assert_single_process_gradients, make_batches,
                           planner_plans)

from ballast import verify
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.precision import Precision
from ballast.pricing.cost import CostModel
from ballast.pricing.cost_sources import analytic_cost
from ballast.models import build_gpt
from ballast.plans.plan import Group, MicroBatch, Plan, Wave, fill_idle
from ballast.runtime import ActivationMeter, ProcessGroups, parallelize, run_local
from ballast.vocabulary.model_shape import ModelShape


def mixed_plan() -> Plan:
    """Three waves; the degree changes between waves; groups of one wave accumulate 3, 1 and 0
    micro-batches; recompute levels vary; an empty (lockstep padding) micro-batch; a 1-token
    sequence at degree 4 leaves three ranks with empty shards."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1], 0.5), MicroBatch([2]), MicroBatch([4], 1.0)]),
              Group(2, 1, [MicroBatch([3], 1.0)]), Group(3, 1)]),
        Wave([Group(0, 4, [MicroBatch([5, 6], 0.25), MicroBatch([8])])]),
        Wave([Group(0, 1, [MicroBatch([7])]), Group(1, 1, [MicroBatch([])]),
              Group(2, 2, [MicroBatch([9], 0.75)])]),
    ], planner="mixed")


def remapped_plan() -> Plan:
    """Zeppelin's remapping layer: wave 0 balances its groups' linear work over all 4 ranks
    (an idle rank takes a share; the last slot has 3 tokens, so one rank holds none; the slot's
    recompute levels differ); wave 1 has two domains, one of them a single group."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1], 0.5), MicroBatch([2]), MicroBatch([4], 1.0)]),
              Group(2, 1, [MicroBatch([3], 1.0)]), Group(3, 1)], remap=[(0, 4)]),
        Wave([Group(0, 1, [MicroBatch([5, 6]), MicroBatch([8])]), Group(1, 1, [MicroBatch([7])]),
              Group(2, 2, [MicroBatch([9], 0.75)])], remap=[(0, 2), (2, 2)]),
    ], planner="remapped")


def idle_ranks_plan() -> Plan:
    """Rank 3 runs nothing all step; rank 2's last backward is in wave 0; in the last wave
    ranks 0 and 1 run two and one micro-batches."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1]), MicroBatch([2])]), Group(2, 1, [MicroBatch([3, 4]), MicroBatch([5])]),
              Group(3, 1)]),
        Wave([Group(0, 1, [MicroBatch([6, 7]), MicroBatch([8])]), Group(1, 1, [MicroBatch([9])]), Group(2, 1),
              Group(3, 1)]),
    ], planner="idle-ranks")


def data_parallel_plan(world: int) -> Plan:
    """One wave of single-rank groups, sequences dealt round-robin."""
    return Plan(LENGTHS, [Wave([Group(r, 1, [MicroBatch(list(range(r, len(LENGTHS), world)))])
                                for r in range(world)])], planner="data-parallel")


def one_group_plan(world: int, recompute: float) -> Plan:
    return Plan(LENGTHS, [Wave([Group(0, world, [MicroBatch([0, 1, 2, 3, 4], recompute),
                                                 MicroBatch([5, 6, 7, 8, 9], recompute)])])])


def two_wave_plan() -> Plan:
    """For 2 ranks: degree 2, then two single ranks with 2 and 1 micro-batches."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 3]), MicroBatch([1])])]),
        Wave([Group(0, 1, [MicroBatch([2, 4, 5], 0.5), MicroBatch([6])]), Group(1, 1, [MicroBatch([7, 8, 9])])]),
    ], planner="two-waves")


def remapped_two_rank_plan() -> Plan:
    return Plan(LENGTHS, [
        Wave([Group(0, 1, [MicroBatch([0, 3]), MicroBatch([1])]), Group(1, 1, [MicroBatch([2, 4, 5], 0.5)])],
             remap=[(0, 2)]),
        Wave([Group(0, 2, [MicroBatch([6, 7, 8, 9])])]),
    ], planner="remapped")


def remapping_zeppelin_plan(world: int) -> Plan:
    """Zeppelin's plan where remapping pays: all-to-alls nearly free, no fixed cost, little
    attention work (it remaps the whole wave on 2 and on 4 ranks)."""
    from ballast.planners import get_planner

    cluster = get_cluster("cpu", world_size=world)
    base = analytic_cost(SHAPE, cluster)
    cost = CostModel.from_dict({**base.to_dict(), "g": 0.0, "a": base.a * 0.01,
                                "bandwidth": {2: 1e13}})
    plan = get_planner("zeppelin", cluster, cost).plan(LENGTHS)
    assert plan.waves[0].remap == [(0, world)], plan.info["remap"]
    return plan


# A long pole and five short sequences: ballast remaps the pole (`poles.py`).
POLE_LENGTHS = [120, 3, 4, 5, 2, 7]


def remapping_ballast_plan() -> Plan:
    """ballast's plan where a long pole decides the step: a profile that measured degree 2 alone
    caps SP there (context parallelism lifts a head cap, not a profile's), where
    the 120-token sequence holds 60 tokens per rank of the 45 that fit, so alone it recomputes;
    remapped over all 4 ranks it keeps 4/17 of those for attention beside an even share and
    needs no recomputation, and the short ones run beside it on the other two ranks."""
    from ballast.planners import get_planner

    cluster = get_cluster("cpu", world_size=4)
    base = analytic_cost(SHAPE, cluster)
    cost = CostModel.from_dict({**base.to_dict(), "g": 0.0, "heads": 2, "kv_heads": 2, "comm_latency": {},
                                "device_memory": base.states + 45 * base.act_per_token,
                                "bandwidth": {2: 1e13}})
    plan = get_planner("ballast", cluster, cost).plan(POLE_LENGTHS)
    assert plan.waves[0].remap == [(0, 4)] and cost.min_recompute(120, 2) > 0, plan.table()
    assert [mb.recompute for g in plan.waves[0].groups for mb in g.micro_batches] == [0.0] * 3
    return plan


def pole_batches() -> list[verify.VerifyBatch]:
    generator = torch.Generator().manual_seed(1)
    return [verify.VerifyBatch(POLE_LENGTHS, [torch.randint(0, SHAPE.vocab, (s + 1,), generator=generator)
                                        for s in POLE_LENGTHS]) for _ in range(2)]


def _errors(groups: ProcessGroups, batches: list[verify.VerifyBatch]) -> list[str]:
    """Messages of the ValueErrors a bad plan or batch raises (on every rank, no collective)."""
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    model = build_gpt(SHAPE)
    executor = parallelize(model, cluster, groups=groups, lr=1e-3)
    odd = parallelize(build_gpt(ModelShape("odd-heads", 1, 48, 6, 2, 64, 64)), cluster, groups=groups, lr=1e-3)
    samples = batches[0].samples
    cases = [
        (executor, Plan(LENGTHS, [Wave([Group(0, 2, [MicroBatch(list(range(10)))])])]), samples),
        (executor, Plan(LENGTHS, [Wave([Group(0, 8, [MicroBatch(list(range(10)))])])]), samples),
        (executor, Plan(LENGTHS, [Wave(fill_idle([Group(0, 1, [MicroBatch([*range(10), 99])])], 4))]), samples),
        (executor, mixed_plan(), samples[:-1]),
        (executor, mixed_plan(), [*samples[:-1], samples[-1][:-1]]),
        (odd, Plan(LENGTHS, [Wave([Group(0, 4, [MicroBatch(list(range(10)))])])]), samples),
    ]
    messages = []
    try:
        parallelize(model, cluster, groups=groups, precision="fp16", lr=1e-3)
        messages.append("no error")
    except ValueError as e:
        messages.append(f"{type(e).__name__}: {e}")
    for runner, plan, batch in cases:
        try:
            runner.step(plan, batch)
            messages.append("no error")
        except ValueError as e:
            messages.append(f"{type(e).__name__}: {e}")
    return messages


# Small enough that the tiny model's 3.2 MB of gradients fill a dozen buckets.
SMALL_BUCKETS = 2**18


def _sync_log(groups: ProcessGroups, batch: verify.VerifyBatch, zero1: bool) -> list[tuple[str, int]]:
    """One step of the mixed plan, logged in order on this rank: every gradient hook ("hook",
    once a parameter's gradient is accumulated, after the sync's own hook) and every all-reduce
    or reduce-scatter issued (with its elements)."""
    executor = parallelize(build_gpt(SHAPE), get_cluster("cpu", world_size=4), groups=groups, zero1=zero1,
                           bucket_bytes=SMALL_BUCKETS, lr=1e-3)
    log: list[tuple[str, int]] = []
    for p in executor.model.parameters():
        p.register_post_accumulate_grad_hook(lambda _: log.append(("hook", 0)))

    def logged(collective, name, elements):
        def run(*args, **kwargs):
            log.append((name, elements(*args)))
            return collective(*args, **kwargs)
        return run

    with mock.patch.object(dist, "all_reduce", logged(dist.all_reduce, "all_reduce", lambda t, *_: t.numel())), \
            mock.patch.object(dist, "reduce_scatter", logged(dist.reduce_scatter, "reduce_scatter",
                                                             lambda _, parts, *__: sum(t.numel() for t in parts))):
        executor.step(mixed_plan(), batch.samples)
    return log


def _world4_worker(batches: list[verify.VerifyBatch], planners: dict[str, list[dict]],
                   poles: list[verify.VerifyBatch]) -> dict:
    groups = ProcessGroups()
    out = {"errors": _errors(groups, batches)}
    out["ballast-poles"] = verify.train_distributed(SHAPE, [remapping_ballast_plan().to_dict()] * len(poles), poles,
                                                    0, 1e-3, groups)
    # Errors left every rank in step: training goes on.
    for name, plan in (("mixed", mixed_plan()), ("data-parallel", data_parallel_plan(4)),
                       ("remapped", remapped_plan()), ("zeppelin-remapped", remapping_zeppelin_plan(4))):
        out[name] = verify.train_distributed(SHAPE, [plan.to_dict()] * STEPS, batches, 0, 1e-3, groups)
    out["mixed-zero1"] = verify.train_distributed(SHAPE, [mixed_plan().to_dict()] * STEPS, batches, 0, 1e-3,
                                                  groups, zero1=True)
    for zero1 in (False, True):
        name = "idle-ranks" + ("-zero1" if zero1 else "")
        out[name] = verify.train_distributed(SHAPE, [idle_ranks_plan().to_dict()], batches[:1], 0, 1e-3, groups,
                                             zero1=zero1)
        out[f"sync log{' zero1' if zero1 else ''}"] = _sync_log(groups, batches[0], zero1)
    out["planners"] = {name: verify.train_distributed(SHAPE, plans, batches[:1], 0, 1e-3, groups)
                       for name, plans in planners.items()}
    cluster = get_cluster("cpu", world_size=4)
    for recompute in (0.0, 1.0):
        model = build_gpt(SHAPE)
        executor = parallelize(model, cluster, groups=groups, measure_activations=True, lr=1e-3)
        result = executor.step(one_group_plan(4, recompute), batches[0].samples)
        out[f"recompute {recompute}"] = (verify.flatten(p.grad for p in model.parameters()), result)
    model = build_gpt(SHAPE)
    executor = parallelize(model, cluster, groups=groups, lr=1e-3)
    out["mixed-step"] = executor.step(mixed_plan(), batches[0].samples)
    out["remapped-step"] = executor.step(remapped_plan(), batches[0].samples)
    return out


def _world2_worker(batches: list[verify.VerifyBatch], planners: dict[str, list[dict]]) -> dict | None:
    groups = ProcessGroups()
    out = {name: verify.train_distributed(SHAPE, [plan.to_dict()], batches[:1], 0, 1e-3, groups)
           for name, plan in (("two-waves", two_wave_plan()), ("remapped", remapped_two_rank_plan()),
                              ("zeppelin-remapped", remapping_zeppelin_plan(2)))}
    out["planners"] = {name: verify.train_distributed(SHAPE, plans, batches[:1], 0, 1e-3, groups)
                       for name, plans in planners.items()}
    out["two-waves-bf16"] = verify.train_distributed(SHAPE, [two_wave_plan().to_dict()], batches[:1], 0, 1e-3,
                                                     groups, precision=Precision.BF16)
    return out if dist.get_rank() == 0 else None


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def batches() -> list[verify.VerifyBatch]:
    return make_batches()


@pytest.fixture(scope="module")
def world4(batches) -> list[dict]:
    return run_local(4, _world4_worker, batches, planner_plans(4, batches), pole_batches(), timeout=400)


@pytest.fixture(scope="module")
def world2(batches) -> dict:
    return run_local(2, _world2_worker, batches, planner_plans(2, batches), timeout=300)[0]


@pytest.fixture(scope="module")
def reference(batches) -> verify.Trajectory:
    return verify.train_reference(SHAPE, batches, 0, 1e-3)


@pytest.mark.slow
def test_hand_built_plans_give_the_single_process_gradient(world4, world2, batches):
    for result in (world4[0]["mixed"], world4[0]["data-parallel"], world2["two-waves"]):
        assert_single_process_gradients(result, batches)


@pytest.mark.slow
def test_remapped_plans_give_the_single_process_gradient(world4, world2, batches, reference):
    for result in (world4[0]["remapped"], world2["remapped"], world4[0]["zeppelin-remapped"],
                   world2["zeppelin-remapped"]):
        assert_single_process_gradients(result, batches)
    assert verify.param_drift(world4[0]["remapped"], reference) <= PARAM_DRIFT


@pytest.mark.slow
def test_a_remapped_long_pole_gives_the_single_process_gradient(world4):
    assert_single_process_gradients(world4[0]["ballast-poles"], pole_batches())


@pytest.mark.slow
def test_bf16_autocast_on_cpu_stays_near_fp32(world2, batches):
    # The GPU's precision on CPU: its dtypes and exchanges, not its kernels (flash-attn, CUDA
    # varlen), NCCL or device placement. Matmuls, attention and all-to-alls in bf16 (8-bit
    # mantissa, 2^-9 = 2e-3 relative rounding per operation), parameters and gradients fp32. Through 4
    # layers and the loss the gradient moves ~1e-2 of its largest entry from the fp32
    # single-process one (measured 1.2e-2); a wrong shard or a lost micro-batch moves it by
    # O(1). The loss, a mean over 218 tokens, moves ~1e-5 (measured 9e-6).
    result = world2["two-waves-bf16"]
    expected = verify.reference_at(SHAPE, result, batches[:1])
    got, want = result.grads[0], expected.grads[0]
    assert float((got - want).abs().max() / want.abs().max()) <= 3e-2
    assert result.losses[0] == pytest.approx(expected.losses[0], rel=1e-3)
    assert result.grads[0].dtype == torch.float32


@pytest.mark.slow
def test_remapping_balances_every_slot_over_its_domain(world4):
    # Wave 0 slot by slot: 103 tokens (42 + 61), then 12, then 3, each over all 4 ranks; its
    # slots run at their lowest recompute level (0.5, 0 and 1.0 of the layers).
    records = [[mb for mb in rank["remapped-step"].micro_batches if mb.wave == 0] for rank in world4]
    assert [[mb.tokens for mb in rank] for rank in records] == [[26, 3, 1], [26, 3, 1], [26, 3, 1], [25, 3, 0]]
    layers = SHAPE.layers
    assert {tuple(mb.recompute_layers for mb in rank) for rank in records} == {(round(0.5 * layers), 0, layers)}


@pytest.mark.slow
def test_every_registered_planner_gives_the_single_process_gradient(world4, world2, batches):
    assert world4[0]["planners"] and world4[0]["planners"].keys() == world2["planners"].keys()
    for result in [*world4[0]["planners"].values(), *world2["planners"].values()]:
        assert_single_process_gradients(result, batches)


@pytest.mark.slow
def test_five_steps_under_two_plans_end_with_the_same_parameters(world4, reference):
    mixed, data_parallel = world4[0]["mixed"], world4[0]["data-parallel"]
    assert verify.param_drift(mixed, data_parallel) <= PARAM_DRIFT
    assert verify.param_drift(mixed, reference) <= PARAM_DRIFT
    assert verify.param_drift(data_parallel, reference) <= PARAM_DRIFT


@pytest.mark.slow
def test_zero1_gives_the_single_process_gradient_and_ends_where_replicated_training_does(world4, batches):
    # The gradients are reduce-scattered to their owners (gathered back for the check), a sum in
    # another order than the all-reduce's: equal up to float rounding, which AdamW magnifies on
    # small gradients as it does between plans (PARAM_DRIFT).
    assert_single_process_gradients(world4[0]["mixed-zero1"], batches)
    assert verify.param_drift(world4[0]["mixed-zero1"], world4[0]["mixed"]) <= PARAM_DRIFT


@pytest.mark.slow
def test_ranks_idle_in_the_last_waves_or_the_whole_step_keep_the_gradient_exact(world4, batches):
    for result in (world4[0]["idle-ranks"], world4[0]["idle-ranks-zero1"]):
        assert_single_process_gradients(result, batches)


@pytest.mark.slow
def test_gradient_reductions_start_before_backward_ends(world4):
    # The mixed plan's last backward is in wave 2 on ranks 0, 2 and 3, in wave 1 on rank 1. Each
    # rank's first bucket (the output layer's gradients, ready first) is reduced while backward
    # still accumulates other gradients; one all-reduce after backward would follow every hook.
    for key, collective in (("sync log", "all_reduce"), ("sync log zero1", "reduce_scatter")):
        for rank in world4:
            log = rank[key]
            first = next(i for i, (name, _) in enumerate(log) if name == collective)
            later_hooks = sum(1 for name, _ in log[first:] if name == "hook")
            assert later_hooks >= 10, (key, log)


@pytest.mark.slow
def test_every_rank_reduces_the_same_buckets_in_the_same_order(world4):
    elements = sum(p.numel() for p in build_gpt(SHAPE).parameters())
    for key, collective in (("sync log", "all_reduce"), ("sync log zero1", "reduce_scatter")):
        orders = [[n for name, n in rank[key] if name == collective] for rank in world4]
        if collective == "all_reduce":  # the step's last all-reduce is the loss's and the flags'
            orders = [order[:-1] for order in orders]
        assert all(order == orders[0] for order in orders)
        # Every gradient once, in a dozen buckets of at most SMALL_BUCKETS bytes (no parameter is larger).
        assert len(orders[0]) >= 10 and sum(orders[0]) == elements
        assert all(n * 4 <= SMALL_BUCKETS for n in orders[0])


@pytest.mark.slow
def test_recomputation_keeps_gradients_and_saves_activation_memory(world4):
    for rank in world4:
        (grads_off, off), (grads_on, on) = rank["recompute 0.0"], rank["recompute 1.0"]
        # Recomputation repeats the same fp32 forward on the same inputs.
        torch.testing.assert_close(grads_on, grads_off, rtol=0, atol=1e-7)
        assert [mb.recompute_layers for mb in on.micro_batches] == [SHAPE.layers] * 2
        saved_off = sum(mb.activation_bytes for mb in off.micro_batches)
        saved_on = sum(mb.activation_bytes for mb in on.micro_batches)
        # Recomputed blocks keep only their input (hidden floats per token) of a layer's many.
        assert 0 < saved_on < 0.5 * saved_off


@pytest.mark.slow
def test_step_reports_waves_and_micro_batches_per_rank(world4):
    results = [rank["mixed-step"] for rank in world4]
    assert len({round(r.loss, 6) for r in results}) == 1 and all(r.tokens == sum(LENGTHS) for r in results)
    for r in results:
        assert len(r.waves) == 3 and all(w.busy >= 0 and w.wait >= 0 for w in r.waves)
        assert 0 <= r.idle_fraction <= 1
    # Rank 3 is idle in wave 0; rank 1's wave-2 micro-batch is empty: neither runs anything.
    assert [mb.wave for mb in results[3].micro_batches] == [1, 1, 2]
    assert [mb.wave for mb in results[1].micro_batches] == [0, 0, 0, 1, 1]
    assert [mb.tokens for mb in results[0].micro_batches if mb.seq_ids == [8]] == [1]


@pytest.mark.slow
def test_user_errors_are_value_errors_before_any_collective(world4):
    for rank in world4:
        precision, fewer_ranks, more_ranks, unknown_sequence, few_samples, short_sample, odd_heads = rank["errors"]
        assert "precision must be a Precision (auto, bf16, fp32), got 'fp16'" in precision
        assert "PlanError" in fewer_ranks and "rank 2 is in no group" in fewer_ranks
        assert "PlanError" in more_ranks and "outside the cluster's 4 ranks" in more_ranks
        assert "PlanError" in unknown_sequence and "sequence 99 is not in the batch" in unknown_sequence
        assert "the plan has 10 samples but 9 were given" in few_samples
        assert "sample 9 is 25 " in short_sample and "the plan has it as 26" in short_sample
        assert "SP degree 4" in odd_heads and "attention heads (6)" in odd_heads


def test_activation_meter_counts_saved_storages_once_and_no_parameters():
    weight = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8, requires_grad=True).clone()  # an activation: not a leaf
    with ActivationMeter() as meter:
        y = x @ weight          # saves x and the weight
        z = (y * y).sum()       # saves y (twice, one storage)
    assert meter.bytes == x.numel() * 4 + y.numel() * 4
    z.backward()


def test_activation_meter_counts_a_received_leaf_as_an_activation():
    """A pipeline stage's received hidden states are a leaf that requires a gradient but no
    parameter: the stage holds them until its backward, so they are its activations, and
    autocast's copy of them is no weight copy."""
    weight = torch.nn.Parameter(torch.randn(8, 8))
    received = torch.randn(4, 8).requires_grad_()
    with ActivationMeter() as meter, torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.layer_norm(received, (8,)) @ weight
        received_copy = received @ weight         # autocast saves received's bf16 copy
    assert meter.weight_copy_bytes == 8 * 8 * 2   # the weight's bf16 copy, once
    # received (fp32, by layer_norm), its bf16 copy, and layer_norm's output cast, mean and rstd
    assert meter.bytes == 4 * 8 * 4 + 4 * 8 * 2 + 4 * 8 * 2 + 2 * 4 * 4
    (y.sum() + received_copy.sum()).backward()
