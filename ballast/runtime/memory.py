"""Memory actually held, measured: activations saved for backward (`ActivationMeter`, with
saved-tensor hooks) and the peak of a whole step (`PeakMemoryMeter`, with a dispatch mode).

Allocator statistics do not exist on CPU, and on a GPU their peak also holds temporaries.
autograd's pack hook instead sees every tensor an operation saves for backward, including the
inputs that non-reentrant recomputation keeps for recomputation (it saves them through the
same mechanism, before its own hooks take over the recomputed region). The sum of their
distinct storages is what backward will hold on to. Parameters are model state, not
activations, and are left out; a storage saved by several operations (or through several
views) counts once. Two kinds of saved tensors are not a micro-batch's per-token activations
and are counted apart, so that a profile's fit (per token, no intercept) does not spread them
over its tokens: autocast's bf16 copies of parameters (a constant per micro-batch; the cost
model prices them from the parameter count, `pricing/device_memory.py`) and the loss's fp32
log-probabilities (priced with the loss's other [tokens, vocab] tensors as a term apart).
"""
from __future__ import annotations

import weakref
from typing import Iterable

import torch
import torch.utils._pytree
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass


class ActivationMeter:
    """Context manager: bytes of the distinct storages saved for backward inside it, by kind
    (`saved_kind`; `bytes`: the activations).

        with ActivationMeter() as meter:
            loss = loss_fn(model(x))
        meter.bytes
    """

    def __init__(self):
        self._storages: dict[str, dict[int, int]] = {kind: {} for kind in SAVED_KINDS}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    def _pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        # A saved tensor stays alive until backward, so no two of them share an address.
        self._storages[saved_kind(tensor)][storage.data_ptr()] = storage.nbytes()
        return tensor

    @staticmethod
    def _unpack(tensor: Tensor) -> Tensor:
        return tensor

    def __enter__(self) -> ActivationMeter:
        assert self._hooks is None, "ActivationMeter is not re-entrant"
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(*exc)
        self._hooks = None

    @property
    def bytes(self) -> int:
        """Activations: what is saved but weight copies and the loss's log-probabilities."""
        return sum(self._storages["activations"].values())

    @property
    def weight_copy_bytes(self) -> int:
        return sum(self._storages["weight copies"].values())

    @property
    def loss_bytes(self) -> int:
        return sum(self._storages["loss"].values())


SAVED_KINDS = ("activations", "parameters", "weight copies", "loss")


def saved_kind(tensor: Tensor) -> str:
    """What a saved tensor is: a parameter (an `nn.Parameter`, or a view of one: `linear` saves
    its weight transposed; under FSDP2 the gathered, unsharded one, itself an `nn.Parameter`), a
    cast of a parameter (it, or the tensor it views, made by a copy of a parameter: autocast's
    weight copies, which `linear` saves transposed), the loss's log-probabilities (log_softmax's
    saved output: the cross-entropy's; or a tensor a loss marked with `mark_loss`), or an
    activation. A leaf that requires a gradient but is no parameter is an activation: a
    pipeline stage's received hidden states, which it holds until its backward sends their
    gradient back."""
    base = tensor._base if tensor._base is not None else tensor
    if isinstance(base, torch.nn.Parameter):
        return "parameters"
    node = base.grad_fn
    name = type(node).__name__ if node is not None else ""
    if name == "ToCopyBackward0" and any(isinstance(getattr(n, "variable", None), torch.nn.Parameter)
                                         for n, _ in node.next_functions if n is not None):
        return "weight copies"
    return "loss" if name == "LogSoftmaxBackward0" or getattr(base, LOSS_MARK, False) else "activations"


LOSS_MARK = "_ballast_loss"
"""The attribute `mark_loss` sets: a loss's [tokens, vocab] tensor that no grad_fn names (a custom
autograd function's saved tensor is made without one)."""


def mark_loss(tensor: Tensor) -> Tensor:
    """`tensor`, marked as a loss's [tokens, vocab] tensor for `saved_kind`: what a loss computed
    by its own autograd function saves in place of log_softmax's output (the vocabulary-parallel
    loss's softmax), so that the meter counts it apart as it counts the log-probabilities."""
    setattr(tensor, LOSS_MARK, True)
    return tensor


def storages(tensor: Tensor) -> list[torch.UntypedStorage]:
    """The storages behind `tensor`: its own, or its inner tensors' for a wrapper subclass
    (FSDP2's DTensor parameters and gradients hold a local shard)."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        inner = (getattr(tensor, name) for name in names)
        return [s for t in inner if isinstance(t, Tensor) for s in storages(t)]
    return [tensor.untyped_storage()]


class PeakMemoryMeter(TorchDispatchMode):
    """Context manager: the peak bytes of live tensor storages on this process inside it, the
    tensors alive at its start (`resident`: parameters, gradients, optimizer state) included.

    CPU allocators keep no statistics, so the meter keeps its own: every storage an operation
    returns is tracked until it dies (a weak reference's callback), and after every operation
    the live storages' current sizes are summed (current, not at creation: FSDP2 frees and
    refills its unsharded parameters by resizing their storages, which no operation sees). What
    it cannot see, it leaves out: a collective library's own buffers, the allocator's rounding
    and caching (a GPU's allocator statistics hold those). Backward's operations are seen (the
    autograd engine carries the mode to its thread).

        with PeakMemoryMeter(resident) as meter:
            executor.step(plan, samples)
        meter.peak
    """

    def __init__(self, resident: Iterable[Tensor] = ()):
        super().__init__()
        self._live: dict[int, weakref.ref] = {}
        self.peak = 0
        for tensor in resident:
            self._track(tensor)

    def _track(self, tensor: Tensor) -> None:
        for storage in storages(tensor):
            key = id(storage)
            if key not in self._live or self._live[key]() is not storage:
                self._live[key] = weakref.ref(storage, lambda _, key=key: self._live.pop(key, None))

    def current(self) -> int:
        """Bytes of the live storages now."""
        alive = (ref() for ref in list(self._live.values()))
        return sum(s.nbytes() for s in alive if s is not None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, Tensor):
                self._track(tensor)
        self.peak = max(self.peak, self.current())
        return out
