"""Building the value objects (Cluster, ModelShape, CostModel) from user-written files and dicts."""
from __future__ import annotations

import argparse
import functools
import json
import math
import types
from dataclasses import MISSING, dataclass, fields
from numbers import Integral, Real
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

@dataclass(frozen=True)
class Numbers:
    """The values a numeric option takes: finite numbers of `kind` from `low` (excluded when
    `low_open`) up to `high` (excluded when `high_open`). One definition checks a flag's text
    (as an argparse `type`) and a value from a config file or the Python API (`check`), so an
    infinity, a NaN or a value out of range is refused by name wherever it enters."""

    kind: type
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    why: str = ""
    """Why the range is what it is, said with a refusal."""

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        if self.low is not None and self.high is not None:
            return (f"{what} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{what} {'<' if self.high_open else '<='} {self.high:g}"
        return what

    def holds(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, Integral if self.kind is int else Real):
            return False
        if not math.isfinite(value):
            return False
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return low_ok and high_ok

    def check(self, flag: str, value: object) -> None:
        """ValueError naming `flag`, the range and the value when `value` is out of it."""
        if not self.holds(value):
            raise ValueError(f"{flag} must be {self.describe()}{self._why}, got {value}")

    def __call__(self, text: str) -> int | float:
        """argparse's `type`: the number `text` says, or an error naming the range."""
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}") from None
        if not self.holds(value):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}{self._why}, got {text}")
        return value

    @property
    def _why(self) -> str:
        return f" ({self.why})" if self.why else ""


def positive(kind: type) -> Numbers:
    """A finite `kind` above 0: a 0 or negative count, size or limit is refused by name at once,
    not met later as a ZeroDivisionError or taken for "use the default"."""
    return Numbers(kind, 0, low_open=True)


def at_least(kind: type, low: float, why: str = "") -> Numbers:
    return Numbers(kind, low, why=why)



def read_json(path: Path, what: str) -> Any:
    """The JSON value in `path`; a ValueError naming the file (as `what`), line and column when it
    does not parse."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {path}: cannot parse JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None


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


def check_types(value_object: Any, what: str, label: str) -> None:
    """Raise a ValueError naming the first field whose value does not have its annotated type.

    A file may say `nodes = "2"`, `nodes = 2.5` or `layers = true`; the range checks of
    `__post_init__` would meet them as TypeErrors, AttributeErrors or, worse, accept them.
    Mapping keys may be digit strings: JSON and TOML keys always are."""
    for name, hint in _hints(type(value_object)).items():
        value = getattr(value_object, name)
        if not _is(value, hint):
            if get_origin(hint) is dict and isinstance(value, dict):
                key, item = next((k, v) for k, v in value.items() if not (_is_key(k) and _is(v, get_args(hint)[1])))
                raise ValueError(f"{what} {label!r}: {name} must map SP degrees (integers) to numbers, "
                                 f"got {key!r} = {item!r}")
            raise ValueError(f"{what} {label!r}: {name} must be {_describe(hint)}, "
                             f"got {value!r} ({type(value).__name__})")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _is(value: Any, hint: Any) -> bool:
    """Whether `value` has type `hint` (bool is no int or float here: `true` is not 1)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_is(value, h) for h in get_args(hint))
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, Integral if hint is int else Real) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(_is_key(k) and _is(v, get_args(hint)[1]) for k, v in value.items())
    return isinstance(value, origin or hint)


def _is_key(key: Any) -> bool:
    return isinstance(key, Integral) and not isinstance(key, bool) or isinstance(key, str) and key.isdigit()


def _describe(hint: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "none"}
    if get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_describe(h) for h in get_args(hint))
    kinds = {dict: "a table", list: "a list"}
    return names.get(hint, kinds.get(get_origin(hint) or hint, getattr(hint, "__name__", str(hint))))
