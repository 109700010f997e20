"""Index tensors of a packed stream, built on the host from the plan's Python ints and copied
to the device: which rows go together (`equal_groups`), the rows of a list of spans
(`token_order`), and the copy itself (`to_device`). The attention kernels, context parallelism
and the video models' condition attention share them."""
from __future__ import annotations

import torch
from torch import Tensor


def to_device(index: Tensor, device: torch.device) -> Tensor:
    """A host-built index or length tensor on `device`, copied without blocking the host on a
    GPU (from pinned memory, which the copy needs to be asynchronous: a pageable source makes
    the host wait for the device to drain). Indices built on the host are the rule here: they
    come from the plan's Python ints."""
    if index.device == device:
        return index
    if device.type == "cuda":
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)


# Index and length tensors an attention call needs are built on the host from the micro-batch's
# bounds (Python ints) and copied to the device. Every layer of a micro-batch asks for the same
# ones, so they are cached by value (the bounds and the device, small LRU caches): built and
# copied at the first layer, not per layer; a new micro-batch's bounds make new entries.
METADATA_CACHE = 16
"""Entries each attention-metadata cache keeps: a micro-batch needs a few (its patterns' spans,
query and key bounds), a remap slot or a profile's next run replaces them."""


def equal_groups(sizes: Tensor) -> tuple[Tensor | None, list[int], list[int]]:
    """Items (spans, samples' runs) grouped by equal size, however far apart they sit.

    sizes: [items] int64 (CPU). Returns (order, group sizes, group counts): taking the items in
    `order` (None: the items' own order) puts every group's items together, in their own order,
    groups ordered by where their first item is (so items that already come in runs of equal
    sizes, each size in one run, keep their order); group g has `counts[g]` items of size
    `sizes[g]`. All vectorised: the Python work is per group, not per item."""
    if sizes.numel() == 0:
        return None, [], []
    values, inverse = torch.unique(sizes, return_inverse=True)
    positions = torch.arange(sizes.numel())
    first = torch.full((values.numel(),), sizes.numel(), dtype=torch.long).scatter_reduce_(
        0, inverse, positions, "amin")
    key = first[inverse]  # a group's key: where its first item is
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    group_keys, counts = torch.unique_consecutive(sorted_key, return_counts=True)
    if torch.equal(order, positions):
        order = None
    return order, sizes[group_keys].tolist(), counts.tolist()


def token_order(starts: Tensor, lengths: Tensor) -> Tensor:
    """The rows of consecutive spans (start, length): starts[0] .. + lengths[0], then the next."""
    total = int(lengths.sum())
    span_offsets = torch.cumsum(lengths, 0) - lengths
    return torch.repeat_interleave(starts - span_offsets, lengths, output_size=total) + torch.arange(total)
