"""Every partition of a list into non-empty blocks, for the tests' brute-force references."""
from __future__ import annotations

from typing import Iterator


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every set partition of `items` (Bell(n) of them), each once: the first item alone, or
    added to a block of a partition of the rest."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield part[:k] + [[first, *part[k]]] + part[k + 1:]
