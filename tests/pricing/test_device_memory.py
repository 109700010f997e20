"""The memory model per sharding mode (`pricing/device_memory.py`) against hand-worked numbers,
and what it changes: plans the old model (16 bytes per parameter over the world) accepted that
do not fit."""
from __future__ import annotations

import dataclasses

import pytest

from ballast.plans.plan import Group, MicroBatch, Plan, PlanError, Wave
from ballast.pricing.coefficients import InfeasibleError
from ballast.pricing.cost_sources import device_memory, get_cost_model
from ballast.pricing.device_memory import CanonicalLayout, DeviceMemory, ParameterCounts, reduction_buffer_bytes
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.sharding import Sharding, default_sharding

# 1000 parameters: 800 in linear layers, blocks of 200, a root of 200; 4 ranks; a 10-entry vocabulary.
COUNTS = ParameterCounts(total=1000, autocast=800, block=200, root=200)


def memory(sharding: Sharding, bf16: bool = False) -> DeviceMemory:
    return DeviceMemory(COUNTS, sharding, bf16, world_size=4, vocab=10)


@pytest.mark.parametrize("sharding, states, after_backward, bf16_states, bf16_after_backward", [
    # 4 P parameters + 4 P gradients (in the sync's buckets, no copy) + 8 P AdamW; after
    # backward AdamW's temporaries (4 P); bf16 autocast adds its copies, 2 bytes per
    # linear-layer parameter (1600 B)
    (Sharding.REPLICATED, 16000, 20000, 16000 + 1600, 20000),
    # AdamW's 8 P over 4 ranks; after backward its temporaries for the rank's 4 P / 4
    (Sharding.ZERO1, 4000 + 4000 + 2000, 10000 + 1000, 10000 + 1600, 11000),
    # 16 P / 4, the root (800 B) and two blocks (1600 B) gathered; after backward the root's
    # parameters and gradients (1600 B) and its fp32 reduction buffer (800 B). Under bf16 the
    # policy gathers the same units at 2 bytes per parameter (1200 B) and autocast makes no
    # copies; after backward the root's bf16 parameters and gradients (800 B) and the same fp32
    # buffer: 1600 B, more than AdamW's 4 P / 4 = 1000 B
    (Sharding.FSDP, 4000 + 800 + 1600, 4000 + 1600 + 800, 4000 + 1200, 4000 + 800 + 800),
])
def test_states_per_mode_by_hand(sharding, states, after_backward, bf16_states, bf16_after_backward):
    fp32, bf16 = memory(sharding), memory(sharding, bf16=True)
    assert fp32.states == states and fp32.after_backward == after_backward
    assert bf16.states == bf16_states and bf16.after_backward == bf16_after_backward
    assert bf16.autocast_copies == (0 if sharding is Sharding.FSDP else 1600)
    # the loss: 3 fp32 [tokens, vocab] tensors at its backward
    assert fp32.loss_per_token == 3 * 4 * 10


def test_reduction_buffer_is_what_the_runtime_allocates():
    assert reduction_buffer_bytes(Sharding.REPLICATED, COUNTS) == 0      # reduced in place in the gradients' buckets
    assert reduction_buffer_bytes(Sharding.ZERO1, COUNTS) == 0
    assert reduction_buffer_bytes(Sharding.FSDP, COUNTS) == 800          # the largest unit's reduce-scatter


def test_shape_counts_and_default_modes():
    tiny = get_model_shape("tiny")  # 4 blocks of 184,576; embedding and output 256 x 128; final norm 128
    counts = ParameterCounts.of_shape(tiny)
    assert (counts.total, counts.block, counts.root) == (803968, 184576, 2 * 256 * 128 + 128)
    assert counts.autocast == 4 * 184320 + 256 * 128   # blocks' matrices and the output layer
    assert default_sharding(get_cluster("cpu", world_size=2)) is Sharding.REPLICATED
    assert default_sharding(get_cluster("a100-64")) is Sharding.FSDP
    # auto precision: bf16 autocast on GPU clusters, fp32 on cpu
    assert device_memory(tiny, get_cluster("a100-64")).bf16
    assert not device_memory(tiny, get_cluster("cpu", world_size=2)).bf16
    # video models have no logits
    assert device_memory(get_model_shape("dit-tiny"), get_cluster("cpu", world_size=2)).loss_per_token == 0


def test_cost_model_prices_the_mode():
    shape, cluster = get_model_shape("tiny"), get_cluster("cpu", world_size=2, device_memory_gb=1.0)
    costs = {mode: get_cost_model("analytic", shape, cluster, sharding=mode) for mode in Sharding.flagged()}
    for mode, cost in costs.items():
        assert cost.states == device_memory(shape, cluster, mode).states and cost.device.sharding is mode
    assert costs[Sharding.REPLICATED].states > costs[Sharding.ZERO1].states > costs[Sharding.FSDP].states
    with pytest.raises(ValueError, match="precision must be one of"):
        get_cost_model("analytic", shape, cluster, precision="fp16")


def test_after_backward_must_fit():
    # replicated tiny: 16 P = 12.9 MB held, 20 P = 16.1 MB after backward
    shape = get_model_shape("tiny")
    with pytest.raises(InfeasibleError, match="after backward"):
        get_cost_model("analytic", shape, get_cluster("cpu", world_size=2, device_memory_gb=0.015))


def test_plan_the_old_model_accepted_is_refused():
    """A micro-batch of 200 tokens at degree 1 on tiny: the old model (16 P / N states, no loss
    term) held it in 17.5 MB (13.4 MB); replicated ranks hold 16 P and the loss's logits besides (20.4 MB)."""
    shape, cluster = get_model_shape("tiny"), get_cluster("cpu", world_size=2, device_memory_gb=0.0175)
    cost = get_cost_model("analytic", shape, cluster)
    old = dataclasses.replace(cost, states=16 * shape.params / 2, act_per_token=cost.act_per_token - cost.loss_per_token,
                              loss_per_token=0.0, device=None)
    plan = Plan([200, 1], [Wave([Group(0, 1, [MicroBatch([0], 0.0)]), Group(1, 1, [MicroBatch([1], 0.0)])])])
    plan.validate(cluster, old)
    with pytest.raises(PlanError, match="memory|GB"):
        plan.validate(cluster, cost)


def test_canonical_states_by_hand():
    # A strategy's rank: its 1000 compute parameters whole (4 P each of parameters and gradients),
    # and 1 / 8 of the whole model's 4000 (blocks of 800, a root of 800) as its canonical share of
    # 500: fp32 parameters of record (2000 B) and AdamW's state (4000 B). After backward the
    # reduced share's gradients (2000 B) and one full block's fp32 gradients in flight (3200 B).
    whole = ParameterCounts(total=4000, autocast=3200, block=800, root=800)
    held = DeviceMemory(COUNTS, Sharding.CANONICAL, False, world_size=2, vocab=10,
                        canonical=CanonicalLayout(whole, ranks=8))
    assert (held.parameters, held.gradients, held.optimizer) == (6000, 4000, 4000)
    assert held.states == 14000 and held.after_backward == 14000 + 2000 + 3200
    assert DeviceMemory(COUNTS, Sharding.CANONICAL, True, 2, 10, CanonicalLayout(whole, 8)).autocast_copies == 1600
    with pytest.raises(AssertionError):
        DeviceMemory(COUNTS, Sharding.ZERO1, False, 2, 10, CanonicalLayout(whole, 8))


def test_canonical_is_no_flag():
    with pytest.raises(ValueError, match="strategy's own mode"):
        Sharding.parse("canonical")
