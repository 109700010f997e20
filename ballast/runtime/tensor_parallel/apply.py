"""Tensor parallelism applied to a built model (torchtitan's way: the model stays single-device
code; its `tensor_parallel_plan` names the modules to split, and each is replaced in place by its
split counterpart holding this rank's shard). `TensorParallel` is what the runtime keeps of it:
the group, and which parameters are split along which dimension (checks gather them whole)."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from ...models.protocol import (COLWISE, ROWWISE, TENSOR_PARALLEL_STYLES, VOCAB_EMBEDDING, VOCAB_OUTPUT,
                                StagedModel, TensorParallelModel)
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

SPLIT_DIM = {COLWISE: 0, ROWWISE: 1, VOCAB_EMBEDDING: 0, VOCAB_OUTPUT: 0}
"""The dimension of the weight each style splits (a linear's weight is [out, in])."""


@dataclass
class TensorParallel:
    """This rank's part in its TP group, and the parameters the split left it a shard of."""

    group: ProcessGroup
    degree: int
    index: int
    split_dims: dict[str, int] = field(default_factory=dict)
    """Parameter name (as `named_parameters` gives it, which FSDP2 keeps) -> the dimension it is
    split along; a parameter not here is whole on every rank."""

    def is_split(self, name: str) -> bool:
        return name in self.split_dims

    def whole_shape(self, name: str, shard: torch.Size) -> tuple[int, ...]:
        """The shape of parameter `name` whole, from its shard's on this rank."""
        if not self.is_split(name):
            return tuple(shard)
        dim = self.split_dims[name]
        return (*shard[:dim], shard[dim] * self.degree, *shard[dim + 1:])

    def whole(self, names: list[str], tensors: list[Tensor]) -> list[Tensor]:
        """Each of `tensors` (the parameter `names` names, or its gradient) whole: the group's
        shards concatenated where the parameter is split (a collective of the group, for checks)."""
        out = []
        for name, t in zip(names, tensors, strict=True):
            if not self.is_split(name):
                out.append(t)
                continue
            shards = [torch.empty_like(t) for _ in range(self.degree)]
            dist.all_gather(shards, t.contiguous(), group=self.group)
            out.append(torch.cat(shards, dim=self.split_dims[name]))
        return out


def _pattern(name: str) -> re.Pattern:
    """A plan's module name as a regular expression: `*` is a block's index."""
    return re.compile(r"\d+".join(re.escape(part) for part in name.split("*")))


def parallelize_tensors(model: TensorParallelModel, group: ProcessGroup, degree: int, index: int) -> TensorParallel:
    """Split `model` in place over a TP group of `degree` ranks, this rank holding shard `index`
    (every rank holding the same whole weights before: each built alike, from one seed or folder).
    ValueError, before any module is replaced, when the model declares no plan, its plan names a
    style or module that cannot be split so, or it does not split the embedding and the output
    layer it holds (a pipeline stage may hold neither)."""
    if not isinstance(model, TensorParallelModel):
        raise ValueError(f"model {model.shape.name!r} ({type(model).__name__}) declares no tensor-parallel plan: "
                         f"tensor parallelism splits text models (ballast's GPT, Hugging Face causal LMs)")
    found = _modules_to_split(model, model.tensor_parallel_plan())
    modules = dict(model.named_modules())
    tp = TensorParallel(group, degree, index)
    replaced: dict[int, nn.Parameter] = {}  # a tied output layer shares the embedding's shard
    for name, style in sorted(found.items(), key=lambda item: item[1] != VOCAB_EMBEDDING):
        old = modules[name]
        if style == VOCAB_EMBEDDING:
            new = VocabParallelEmbedding(old, group, degree, index)
        elif style == ROWWISE:
            new = RowParallelLinear(old, group, degree, index)
        else:
            new = ColumnParallelLinear(old, group, degree, index, weight=replaced.get(id(old.weight)))
        replaced[id(old.weight)] = new.weight
        parent, _, child = name.rpartition(".")
        setattr(modules[parent] if parent else model, child, new)
    tp.split_dims = _split_dims(model, found)
    if VOCAB_OUTPUT in found.values():
        start = index * model.shape.vocab // degree
        model.install_cross_entropy(functools.partial(vocab_parallel_cross_entropy, start=start, group=group))
    return tp


def split_dims_of(model: nn.Module) -> dict[str, int]:
    """The dimension tensor parallelism splits each of `model`'s parameters along, by name, as
    `parallelize_tensors` would ({} for a model that declares no plan): what the canonical layout
    of a strategy lays out TP-major (`runtime/canonical.py`)."""
    if not isinstance(model, TensorParallelModel):
        return {}
    return _split_dims(model, _modules_to_split(model, model.tensor_parallel_plan()))


def _split_dims(model: nn.Module, found: dict[str, str]) -> dict[str, int]:
    """Parameter name -> split dimension of the modules `found` splits (module name -> style). By
    name after every replacement: a tied output layer's weight is the embedding's, named once."""
    split = {id(m.weight): SPLIT_DIM[found[n]] for n, m in model.named_modules() if n in found}
    split.update({id(m.bias): 0 for n, m in model.named_modules()
                  if found.get(n) in (COLWISE, VOCAB_OUTPUT) and m.bias is not None})
    return {n: split[id(p)] for n, p in model.named_parameters() if id(p) in split}


def _modules_to_split(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """Module name -> style, every plan entry matched and checked."""
    found: dict[str, str] = {}
    for pattern, style in plan.items():
        if style not in TENSOR_PARALLEL_STYLES:
            raise ValueError(f"model {model.shape.name!r}: its tensor-parallel plan splits {pattern} as {style!r}; "
                             f"ballast splits modules as {', '.join(TENSOR_PARALLEL_STYLES)}")
        wanted = nn.Embedding if style == VOCAB_EMBEDDING else nn.Linear
        matched = [(n, m) for n, m in model.named_modules() if _pattern(pattern).fullmatch(n)]
        if not matched:
            raise ValueError(f"model {model.shape.name!r}: its tensor-parallel plan names {pattern}, which is no "
                             f"module of it")
        for name, module in matched:
            if type(module) is not wanted:
                raise ValueError(f"model {model.shape.name!r}: tensor parallelism splits {name} as {style!r}, but "
                                 f"it is a {type(module).__name__}, not an {wanted.__name__}")
            found[name] = style
    held = (model.holds_embedding, model.holds_head) if isinstance(model, StagedModel) else (True, True)
    for style, holds in zip((VOCAB_EMBEDDING, VOCAB_OUTPUT), held):
        if list(found.values()).count(style) != holds:
            count = "exactly one module" if holds else "no module (this pipeline stage holds none)"
            raise ValueError(f"model {model.shape.name!r}: its tensor-parallel plan must split {count} as {style!r}: "
                             f"the vocabulary-parallel loss needs the embedding and the output layer split")
    return found
