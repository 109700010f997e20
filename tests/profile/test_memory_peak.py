"""The step-peak meter and the memory model against a real step (`profile/memory_check.py`)."""
from __future__ import annotations

import pytest
import torch

from ballast.profile.memory_check import TOLERANCE, compare, measure_on_rank
from ballast.runtime import run_local
from ballast.runtime.memory import ActivationMeter, PeakMemoryMeter, mark_loss
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.sharding import Sharding


def test_peak_meter_sees_temporaries_and_what_was_held():
    held = torch.zeros(1000)                      # 4,000 B held before
    with PeakMemoryMeter([held]) as meter:
        a = torch.ones(2000)                      # + 8,000
        b = a * 2                                 # + 8,000: the peak, 20,000
        del a, b
        c = torch.ones(500)                       # 4,000 + 2,000 after the peak
    assert meter.peak == 20000 and meter.current() == 6000
    del c


def test_activation_meter_counts_weight_copies_and_the_loss_apart():
    linear = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True).clone()
    with ActivationMeter() as meter, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(linear(x), torch.zeros(4, dtype=torch.long))
    assert meter.weight_copy_bytes == 16 * 8 * 2             # the weight's bf16 copy (the bias's is not saved)
    assert meter.loss_bytes == 4 * 16 * 4                    # fp32 log-probabilities
    # the activations: the input's bf16 cast, the targets (int64) and the NLL's total weight
    assert meter.bytes == 4 * 8 * 2 + 4 * 8 + 4
    loss.backward()


class MarkedSoftmaxLoss(torch.autograd.Function):
    """A loss of its own autograd function, saving its softmax as the vocabulary-parallel one does."""

    @staticmethod
    def forward(ctx, logits):
        softmax = logits.softmax(-1)
        ctx.save_for_backward(mark_loss(softmax), logits.new_zeros(logits.shape[0]))
        return softmax.sum()

    @staticmethod
    def backward(ctx, grad):
        softmax, _ = ctx.saved_tensors
        return softmax * grad


def test_activation_meter_counts_a_marked_loss_tensor_apart():
    logits = torch.randn(4, 16, requires_grad=True).clone()
    with ActivationMeter() as meter:
        loss = MarkedSoftmaxLoss.apply(logits)
    assert meter.loss_bytes == 4 * 16 * 4     # the marked softmax, as log_softmax's output would be
    assert meter.bytes == 4 * 4               # its unmarked companion alone
    loss.backward()


@pytest.mark.slow
def test_tiny_gpt_peak_under_zero1_within_tolerance():
    shape = get_model_shape("tiny")
    per_rank = run_local(2, measure_on_rank, shape, [[64], [256, 128]], [(Sharding.ZERO1, "fp32")], 0)
    for (record,) in per_rank:
        row = compare(shape, 2, record)
        assert abs(row["ratio"] - 1) <= TOLERANCE, row
