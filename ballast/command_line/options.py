"""The options several commands share, each defined once with one meaning.

`--model`, `--max-len`, `--cluster`, `--world`, `--cost` and `--device-memory-gb` mean the same
in `simulate`, `verify`, `profile`, `bench` and `train`, `--degree` and `--cp` in those that plan
with a fixed-degree planner (`simulate`, `bench`, `train`), `--precision` in those that start
ranks (`verify`, `profile`, `bench`, `train`): each command adds an option with
`SharedOption.add` (argparse) or, for `train`'s config fields, `SharedOption.help`, giving its
own default and why that default suits it. Only defaults differ between commands. `--timeout`
of the commands that start ranks has one rule, `check_timeout`.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from ..vocabulary.model_shape import MODEL_PRESETS
from ..vocabulary.precision import Precision


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a `kind` above 0. A 0 or negative count, size or limit is refused by
    name at once, not met later as a ZeroDivisionError or taken for "use the default"."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be {what} > 0, got {text}")
        return value
    return parse


def precision(text: str) -> Precision:
    """An argparse type: a `Precision` by its name (auto, bf16, fp32)."""
    try:
        return Precision(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(p.value for p in Precision)}, "
                                         f"got {text!r}") from None


MIN_TIMEOUT = 30.0
"""Least --timeout of a command that starts ranks: they need seconds to start (importing torch,
more on a busy machine) and to meet in the rendezvous store, which waits with the same timeout."""


def check_timeout(seconds: float) -> None:
    """ValueError when a --timeout is below `MIN_TIMEOUT` (or not a number at all: NaN)."""
    if not seconds >= MIN_TIMEOUT:
        raise ValueError(f"--timeout {seconds:g} is below {MIN_TIMEOUT:g} seconds: the ranks need seconds to start "
                         f"(importing torch) and to meet in the rendezvous store")


@dataclass(frozen=True)
class SharedOption:
    """A flag with one meaning across the commands."""

    flag: str
    meaning: str
    type: Callable[[str], Any]
    metavar: str

    def help(self, default: Any, why: str = "") -> str:
        """The flag's help: its meaning, then this command's default and why it suits it."""
        if default is None:
            return f"{self.meaning} (default: {why or 'unset'})"
        return f"{self.meaning} (default: {default}{'; ' + why if why else ''})"

    def add(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: Any, why: str = "",
            **kwargs: Any) -> None:
        parser.add_argument(self.flag, type=self.type, default=default, metavar=self.metavar,
                            help=self.help(default, why), **kwargs)


MODEL = SharedOption(
    "--model", f"the model: a preset ({', '.join(MODEL_PRESETS)}), hf:PATH (a Hugging Face causal LM "
               f"folder) or a .json file with ModelShape's fields", str, "MODEL")
MAX_LEN = SharedOption(
    "--max-len", "the longest sample a step holds, in tokens (a clip: its latent patches); every plan "
                 "must hold it", positive(int), "N")
CLUSTER = SharedOption(
    "--cluster", "the cluster: a preset (a100-64, a800-64, h100-32, h800-32, h200-32, any a100-N / a800-N / "
                 "h100-N / h800-N / h200-N, cpu: --world ranks as --nodes nodes) or a .toml/.json file with "
                 "Cluster's fields", str, "CLUSTER")
WORLD = SharedOption(
    "--world", "ranks: the local gloo ranks a command spawns (a power of two), or the cluster size a "
               "simulation must match", positive(int), "N")
NODES = SharedOption(
    "--nodes", "nodes the ranks form: the cpu preset's emulated nodes (each rank under its own NIC), or the "
               "node count a cluster must have", positive(int), "N")
COST = SharedOption(
    "--cost", "the cost model: analytic (from the model shape and the cluster), published (FlexSP's "
              "GPT profile on A100s), auto (published where FlexSP measured the model and cluster, else "
              "analytic) or a `ballast profile` JSON", str, "COST")
DEVICE_MEMORY = SharedOption(
    "--device-memory-gb", "usable memory per device in GB that plans must fit, on any cluster and over a "
                          "--cost profile's", positive(float), "GB")
DEGREE = SharedOption(
    "--degree", "the SP degree of the fixed-degree planners (static, bucket)", positive(int), "N")
CP = SharedOption(
    "--cp", "static's context-parallel part c, a power of two: static USP, Ulysses over --degree / c ranks "
            "times context parallelism over c", positive(int), "C")
PRECISION = SharedOption(
    "--precision", "what the ranks' forward computes in: auto (bf16 autocast on CUDA devices, fp32 elsewhere), "
                   "bf16 (bf16 autocast on any device; on CPU it runs the bf16 dtypes, exchanges and "
                   "tolerances, not flash-attn, NCCL or CUDA placement) or fp32", precision, "auto|bf16|fp32")
SHARED = {option.flag: option for option in (MODEL, MAX_LEN, CLUSTER, WORLD, NODES, COST, DEVICE_MEMORY, DEGREE, CP,
                                             PRECISION)}
