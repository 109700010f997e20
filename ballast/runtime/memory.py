"""Activation memory actually saved for backward, measured with saved-tensor hooks.

Allocator statistics do not exist on CPU, and on a GPU their peak also holds temporaries.
autograd's pack hook instead sees every tensor an operation saves for backward, including the
inputs that non-reentrant recomputation keeps for recomputation (it saves them through the
same mechanism, before its own hooks take over the recomputed region). The sum of their
distinct storages is what backward will hold on to. Parameters are model state, not
activations, and are left out; a storage saved by several operations (or through several
views) counts once.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor


class ActivationMeter:
    """Context manager: bytes of the distinct non-parameter storages saved for backward inside it.

        with ActivationMeter(model.parameters()) as meter:
            loss = loss_fn(model(x))
        meter.bytes
    """

    def __init__(self, parameters: Iterable[Tensor] = ()):
        self._parameters = {p.untyped_storage().data_ptr() for p in parameters}
        self._storages: dict[int, int] = {}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    def _pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        # A saved tensor stays alive until backward, so no two of them share an address.
        key = storage.data_ptr()
        if key not in self._parameters:
            self._storages[key] = storage.nbytes()
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
        return sum(self._storages.values())
