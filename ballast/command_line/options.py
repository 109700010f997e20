"""The options several commands share, each defined once with one meaning, one spelling and
one range.

`--model`, `--max-len`, `--cluster`, `--world`, `--cost` and `--device-memory-gb` mean the same
in `simulate`, `verify`, `profile`, `bench` and `train`; `--degree`, `--cp` and `--routing` /
`--no-routing` in those that plan (`simulate`, `verify`, `bench`, `train`), `--tp` in `simulate`,
`verify` and `train`, `--pp` in those that run pipelines (`verify`, `train`), `--precision` in
those that start ranks (`verify`, `profile`, `bench`, `train`): each command adds an option with
`SharedOption.add` (argparse) or, for `train`'s config fields, `SharedOption.help`, giving its
own default and why that default suits it. Only defaults differ between commands. A numeric
option's type is a `vocabulary.value_checks.Numbers`: its range, finiteness included, is checked
where the flag is parsed, and the same object checks a config file's value. `--timeout` of the
commands that start ranks has one rule, `TIMEOUT`.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..vocabulary.model_shape import MODEL_PRESETS
from ..vocabulary.precision import Precision
from ..vocabulary.strategy import Strategy
from ..vocabulary.value_checks import at_least, positive

SEED = at_least(int, 0, "numpy's generators take no negative seed")
MIN_MAX_LEN = 2
"""The shortest --max-len: a sample of one token attends to nothing but itself, so a model
trained on such chunks learns no use of context (the next token of a chunk's last one is the
next chunk's)."""


SAME = object()
"""`SharedOption.add`'s `when_absent` when it is the command's default."""


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
TIMEOUT = at_least(float, MIN_TIMEOUT, "seconds: the ranks need seconds to start (importing torch) and to meet "
                                       "in the rendezvous store")


AUTO_STRATEGIES = "auto"
"""`--strategy auto`: the strategies Hydraulis' offline dynamic program proposes from a length
histogram (`planners/hydraulis_pool.py`): simulate's of --lengths, train's of the training data."""


def strategy_text(text: str) -> str:
    """`--strategy`'s value checked and written canonically: one strategy, or several separated
    by ';' (`parse_strategies` reads it back), or `auto`."""
    if text.strip() == AUTO_STRATEGIES:
        return AUTO_STRATEGIES
    try:
        return strategies_text(parse_strategies(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def strategies_text(strategies: Sequence[Strategy]) -> str:
    """The `--strategy` value of these strategies (`parse_strategies` reads it back)."""
    return ";".join(s.spec() for s in strategies)


def parse_strategies(text: str) -> tuple[Strategy, ...]:
    """The strategies of a `--strategy` value; ValueError naming the malformed one (`auto` is
    simulate's and train's, which have a length histogram before any step)."""
    if text == AUTO_STRATEGIES:
        raise ValueError("--strategy auto proposes strategies from a length histogram, in `ballast simulate` "
                         "(of --lengths) and `ballast train` (of the training data); give this command the "
                         "strategies themselves (simulate's table names those it proposed)")
    return tuple(Strategy.parse(part) for part in text.split(";"))


def refuse_with_strategy(given: Sequence[tuple[str, bool]]) -> None:
    """ValueError naming the first of the (flag, given) pairs given with --strategy: a strategy's
    pipelines bring their own TP and PP degrees and SP pools, its state lives in the canonical
    layout over every rank (no --zero1 or --fsdp), and its blocks are of one emulated node."""
    for flag, present in given:
        if present:
            raise ValueError(f"--strategy and {flag} do not combine: a strategy's pipelines bring their own TP and "
                             f"PP degrees, its state lives in the canonical layout over every rank, and its ranks "
                             f"are one node's")


def check_timeout(seconds: float) -> None:
    """ValueError when a --timeout is below `MIN_TIMEOUT`, infinite or not a number at all."""
    TIMEOUT.check("--timeout", seconds)


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
            when_absent: Any = SAME, **kwargs: Any) -> None:
        """Add the flag with this command's `default` and `why`; `when_absent`: what the
        arguments hold when the flag is not given, if not `default` (train: SUPPRESS, so that
        its config file's value stands)."""
        parser.add_argument(self.flag, type=self.type, metavar=self.metavar, help=self.help(default, why),
                            default=default if when_absent is SAME else when_absent, **kwargs)


class Formatter(argparse.HelpFormatter):
    """argparse's help, with a switch shown as `--NAME, --no-NAME` (it takes no value)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, OnOff):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


class OnOff(argparse.Action):
    """`--NAME` (on) and `--no-NAME` (off), the spelling of every switch; `--NAME on|off`, an
    older spelling of `simulate`'s, is still understood."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        flag = option_strings[0]
        super().__init__([flag, "--no-" + flag[2:]], dest, nargs="?", metavar="on|off", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string is not None and option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"argument {option_string}: takes no value, got {values!r}")
            setattr(namespace, self.dest, False)
        elif values is None or values in ("on", "off"):
            setattr(namespace, self.dest, values != "off")
        else:
            parser.error(f"argument {option_string}: expected no value (or on / off), got {values!r}")

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


@dataclass(frozen=True)
class SharedSwitch(SharedOption):
    """A shared on/off option: `--NAME` / `--no-NAME` (`OnOff`)."""

    def add(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: Any, why: str = "",
            when_absent: Any = SAME, **kwargs: Any) -> None:
        parser.add_argument(self.flag, action=OnOff, help=self.help("on" if default else "off", why),
                            default=default if when_absent is SAME else when_absent, **kwargs)


MODEL = SharedOption(
    "--model", f"the model: a preset ({', '.join(MODEL_PRESETS)}), hf:PATH (a Hugging Face causal LM "
               f"folder), diffusers:PATH (a diffusers WanTransformer3DModel folder) or a .json file with "
               f"ModelShape's fields", str, "MODEL")
MAX_LEN = SharedOption(
    "--max-len", "the longest sample a step holds, in tokens (a clip: its latent patches); every plan "
                 "must hold it", at_least(int, MIN_MAX_LEN, "a 1-token sample has no context to attend to"), "N")
CLUSTER = SharedOption(
    "--cluster", "the cluster: a preset (a100-64, a800-64, h100-32, h800-32, h200-32, any a100-N / a800-N / "
                 "h100-N / h800-N / h200-N, cpu: --world ranks as --nodes nodes) or a .toml/.json file with "
                 "Cluster's fields", str, "CLUSTER")
WORLD = SharedOption(
    "--world", "ranks: the local gloo ranks a command spawns (a power of two; under torchrun its processes), "
               "or the cluster size a simulation must match", positive(int), "N")
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
    "--degree", "the SP degree of the fixed-degree planners (static, bucket, wlb-llm)", positive(int), "N")
CP = SharedOption(
    "--cp", "static's context-parallel part c, a power of two: static USP, Ulysses over --degree / c ranks "
            "times context parallelism over c", positive(int), "C")
PRECISION = SharedOption(
    "--precision", "what the ranks' forward computes in: auto (bf16 autocast on CUDA devices, fp32 elsewhere), "
                   "bf16 (bf16 autocast on any device; on CPU it runs the bf16 dtypes, exchanges and "
                   "tolerances, not flash-attn, NCCL or CUDA placement) or fp32", precision, "auto|bf16|fp32")
ROUTING = SharedSwitch(
    "--routing", "route inter-node all-to-alls over every NIC of the node (Zeppelin's routing layer) where "
                 "the planner's rule says so: zeppelin in every wave that crosses nodes, ballast where that is "
                 "faster; --no-routing: never (`--routing on|off` is the older spelling)", bool, "")
TP = SharedOption(
    "--tp", "tensor-parallel degree t: every layer's weights split over t ranks inside a node (Megatron's split), "
            "plans made over the pool of world / (t p) TP groups (p: --pp)", positive(int), "T")
PP = SharedOption(
    "--pp", "pipeline stages p: the ranks (--world) as p stages of world / p ranks, the model's layers cut into p "
            "equal runs (the embedding on the first stage, the output layer and loss on the last), every step's "
            "plan laying out one stage's pool (world / (t p) ranks, t: --tp) and its micro-batches run through "
            "the stages in 1F1B order",
    positive(int), "P")
STRATEGY = SharedOption(
    "--strategy", "a heterogeneous strategy (Hydraulis'): pipelines side by side, each TxP or TxPxPOOL "
                  "(\"2x2,2x1,1x1,1x1\", or \"[(2,2),(1,4)]\"), on consecutive blocks of the ranks; several "
                  "separated by ';' are the strategies a step may take: train and simulate give each step the "
                  "one its plan is fastest under (hydraulis: by its own rule), verify runs them in turn, one a "
                  "step, so that each is checked; `auto` (simulate, train): those Hydraulis' offline dynamic "
                  "program proposes from a length histogram, simulate's of --lengths, train's of its data. The state "
                  "lives in one canonical layout over every rank; each step's pipelines gather their parameters "
                  "from it and reduce their gradients back", strategy_text, "STRATEGY")
SHARED = {option.flag: option for option in (MODEL, MAX_LEN, CLUSTER, WORLD, NODES, COST, DEVICE_MEMORY, DEGREE, CP,
                                             PRECISION, ROUTING, TP, PP, STRATEGY)}
