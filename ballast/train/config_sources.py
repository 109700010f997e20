"""Where a training run's configuration comes from (`config.py`'s `TrainConfig`, later ones
winning): the defaults, a `--config FILE` TOML, and one command-line flag per field, whose help
text is the field's docstring."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import inspect
import tomllib
import typing
from pathlib import Path
from typing import Any

from ..command_line.options import SHARED
from .config import TrainConfig, field_range, flag_of


def _sections() -> dict[str, type]:
    return {f.name: typing.get_type_hints(TrainConfig)[f.name] for f in dataclasses.fields(TrainConfig)}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under every field of a dataclass (the string literal after its annotation)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _scalar_type(cls: type, name: str) -> type:
    """The field's type without `| None`: int, float, str or bool."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _coerce(value: Any, kind: type, where: str) -> Any:
    """A TOML value checked against the field's type (an int is a fine float)."""
    if kind is float and type(value) is int:
        return float(value)
    if issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{where}: expected one of {', '.join(str(k.value) for k in kind)}, got {value!r}") from None
    if type(value) is not kind:
        raise ValueError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value


def load_toml(path: str | Path) -> TrainConfig:
    """A config from a TOML file; unknown sections or keys and mistyped values are a ValueError."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"config {path}: cannot read ({e.strerror or e})") from e
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config {path}: not valid TOML: {e}") from e
    config = TrainConfig()
    sections = _sections()
    for section, values in data.items():
        if section not in sections or not isinstance(values, dict):
            raise ValueError(f"config {path}: unknown section [{section}]; sections: {', '.join(sections)}")
        target = getattr(config, section)
        names = {f.name for f in dataclasses.fields(target)}
        for key, value in values.items():
            if key not in names:
                raise ValueError(f"config {path}: unknown key {key!r} in [{section}]; "
                                 f"keys: {', '.join(sorted(names))}")
            kind = _scalar_type(type(target), key)
            setattr(target, key, _coerce(value, kind, f"config {path}: [{section}] {key}"))
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` and one flag per field; unset flags leave the file's (or default) value."""
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML file with [model], [data], [planner], [optimizer], [run], "
                             "[checkpoint] sections; flags override it")
    for section, cls in _sections().items():
        group = parser.add_argument_group(section)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            kind = _scalar_type(cls, f.name)
            flag = flag_of(f)
            # A flag other commands share keeps their meaning; its field's docstring says why
            # train's default suits a run.
            dest = f"{section}.{f.name}"
            if flag in SHARED:
                SHARED[flag].add(group, f.default, docs[f.name], when_absent=argparse.SUPPRESS, dest=dest)
                continue
            common = {"dest": dest, "default": argparse.SUPPRESS}
            if kind is bool:
                group.add_argument(flag, action=argparse.BooleanOptionalAction,
                                   help=f"{docs[f.name]} (default: {f.default})", **common)
            elif issubclass(kind, enum.Enum):  # a shared option's value type: its own parser
                group.add_argument(flag, type=SHARED[flag].type, metavar=SHARED[flag].metavar, **common)
            else:
                group.add_argument(flag, type=field_range(f) or kind, metavar={int: "N", float: "X"}.get(kind, "TEXT"),
                                   help=f"{docs[f.name]} (default: {f.default})", **common)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then `--config`, then every flag given on the command line; validated."""
    config = load_toml(args.config) if args.config else TrainConfig()
    for dest, value in vars(args).items():
        section, dot, name = dest.partition(".")
        if dot and section in _sections():
            setattr(getattr(config, section), name, value)
    config.validate()
    return config
