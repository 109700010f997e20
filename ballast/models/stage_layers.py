"""A pipeline stage's blocks under the names they have in the whole model."""
from __future__ import annotations

from torch import nn


class StageLayers(nn.ModuleList):
    """Some blocks of a model's layer list, each registered under its index in the whole model
    ("layers.5.mlp.w1" stays so on the stage that keeps block 5): checkpoints of any split hold
    the same keys. Indexing is by position among the kept blocks, as a `ModuleList`'s."""

    def __init__(self, layers: nn.ModuleList, keep: range):
        super().__init__()
        for i in keep:
            self.add_module(str(i), layers[i])

    def __getitem__(self, index: int | slice) -> nn.Module | nn.ModuleList:
        if isinstance(index, slice):
            return nn.ModuleList(list(self._modules.values())[index])
        return list(self._modules.values())[index]
