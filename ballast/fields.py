"""Building the value objects (Cluster, ModelShape, CostModel) from user-written dicts."""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, TypeVar

T = TypeVar("T")


def from_fields(cls: type[T], data: dict[str, Any], what: str) -> T:
    """`cls(**data)`, with unknown and missing fields as ValueErrors naming them, not TypeErrors."""
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"unknown {what} field(s) {sorted(unknown)}; known: {sorted(known)}")
    missing = {name for name, f in known.items()
               if f.default is MISSING and f.default_factory is MISSING} - set(data)
    if missing:
        raise ValueError(f"{what} {data.get('name', data.get('model', '?'))!r}: missing field(s) {sorted(missing)}")
    return cls(**data)
