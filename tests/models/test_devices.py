"""Index tensors meet the tensors they index on their device: the attention paths run on `meta`
tensors (a device that is not the host's) under a mode that refuses any op mixing devices.

This covers where indices are built (the CPU cannot show a CUDA device-mismatch error, but the
same mismatch between `meta` and `cpu` is the same bug); it does not run a CUDA kernel."""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from ballast.models.kernels import local_attention, span_attention
from ballast.models.protocol import PackedStream
from ballast.vocabulary.patterns import SPATIAL, TEMPORAL


class OneDevice(TorchFunctionMode):
    """Fails any torch op whose tensor arguments sit on more than one device (a 0-d host tensor,
    which torch moves itself, aside)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        assert len(devices) <= 1, f"{getattr(func, '__name__', func)} mixes devices {sorted(map(str, devices))}"
        return func(*args, **(kwargs or {}))


CLIPS = [(3, 2, 2), (2, 1, 3), (1, 1, 2)]


@pytest.mark.parametrize("pattern", [SPATIAL, TEMPORAL])
def test_local_attention_builds_its_indices_on_the_inputs_device(pattern):
    stream = PackedStream.of(CLIPS, "meta")
    _, stream = stream.arrange(torch.zeros(0), pattern)
    q = torch.empty(stream.bounds[-1], 4, 8, device="meta")
    k = v = torch.empty(stream.bounds[-1], 2, 8, device="meta")
    with OneDevice():
        out = local_attention(q, k, v, stream)
    assert out.shape == q.shape and out.device.type == "meta"


def test_span_attention_builds_its_indices_on_the_inputs_device():
    q_bounds, k_bounds = (0, 2, 2, 7), (0, 4, 6, 12)
    q = torch.empty(7, 4, 8, device="meta")
    k = v = torch.empty(12, 2, 8, device="meta")
    with OneDevice():
        assert span_attention(q, k, v, q_bounds, k_bounds).shape == q.shape


class HostWork(TorchFunctionMode):
    """Records the ops that build an index on the host, copy one to the device or read one back."""

    NAMES = {"tensor", "arange", "to", "tolist", "__int__", "item", "cpu", "unique", "searchsorted"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("pattern", [SPATIAL, TEMPORAL])
def test_the_next_layers_reuse_the_first_ones_indices(pattern):
    # Every layer of a micro-batch attends over the same spans: their indices are built on the
    # host and copied to the device by the first layer only (a pageable copy per layer blocks
    # the host on a GPU).
    stream = PackedStream.of(CLIPS, "meta")
    _, stream = stream.arrange(torch.zeros(0), pattern)
    q = torch.empty(stream.bounds[-1], 4, 8, device="meta")
    k = v = torch.empty(stream.bounds[-1], 2, 8, device="meta")
    q_bounds, k_bounds = (0, 2, 2, 7), (0, 4, 6, stream.bounds[-1])
    local_attention(q, k, v, stream)
    span_attention(q[:7], k, v, q_bounds, k_bounds)
    with HostWork() as work:
        for _ in range(3):
            local_attention(q, k, v, stream)
            span_attention(q[:7], k, v, q_bounds, k_bounds)
    assert work.calls == []
