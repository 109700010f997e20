"""`ballast train`: train a model on a real corpus with a planner, resumably, with metrics and plots.

On this machine it spawns `--world` gloo ranks on 127.0.0.1. Under `torchrun` (RANK and
WORLD_SIZE in the environment) it spawns nothing: each process joins the job torchrun
describes (NCCL on GPUs, gloo otherwise), single- or multi-node, and a restarted job
(`--max-restarts`) resumes from the newest checkpoint.
"""
from __future__ import annotations

import argparse
import math
import os
from datetime import timedelta

from rich.console import Console

from . import config as train_config
from .config import TrainConfig

# The trainer (torch.distributed, DCP, the data pipeline) is imported where it runs, so that
# `ballast --help` and the other subcommands do not pay for it.
HELP = "train on a corpus with a planner (local gloo ranks or torchrun); checkpoints, metrics, plots"
DEFAULT_WORLD = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    train_config.add_arguments(parser)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run(args: argparse.Namespace) -> int:
    config = train_config.from_args(args)
    if under_torchrun():
        summary = _run_torchrun(config)
    else:
        summary = _run_local(config)
    if summary is not None:
        print_summary(summary)
    return 0


def _run_torchrun(config: TrainConfig) -> dict | None:
    import torch.distributed as dist

    from ..runtime import init_distributed
    from .trainer import train

    world = int(os.environ["WORLD_SIZE"])
    if config.run.world is not None and config.run.world != world:
        raise ValueError(f"--world {config.run.world} does not match torchrun's WORLD_SIZE {world}")
    init_distributed(timeout=timedelta(seconds=config.run.timeout))
    try:
        return train(config)
    finally:
        dist.destroy_process_group()


def _run_local(config: TrainConfig) -> dict | None:
    from ..runtime import run_local
    from .trainer import Setup, make_planner, open_data

    world = config.run.world or DEFAULT_WORLD
    # Fail on user errors here, with a plain message, before any rank starts; the corpus is
    # tokenised once here (with a progress bar) and the ranks read it from the cache.
    setup = Setup.of(config, world)
    open_data(config, setup.shape, progress=True)
    make_planner(config, setup)
    results = run_local(world, _local_rank, config, timeout=math.inf,
                        collective_timeout=timedelta(seconds=config.run.timeout))
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        raise ValueError(errors[0])
    return results[0]["summary"]


def _local_rank(config: TrainConfig) -> dict:
    """One spawned rank. A ValueError every rank raises together (a setup error rank 0
    broadcast, a checkpoint that does not fit) comes back as a message, not a traceback."""
    from .trainer import train

    try:
        return {"summary": train(config), "error": None}
    except ValueError as e:
        return {"summary": None, "error": str(e)}


def print_summary(summary: dict) -> None:
    console = Console(highlight=False, soft_wrap=True)
    attempts = summary["attempts"]
    console.print(f"[bold]trained {summary['steps']} steps[/bold] with the {summary['planner']} planner on "
                  f"{summary['world']} ranks ({attempts} attempt{'s' * (attempts != 1)}): "
                  f"{summary['tokens']:,} tokens")
    console.print(f"  throughput  {summary['tokens_per_s']:,.0f} tokens/s, {summary['step_time_s']:.3f} s per "
                  f"step (cost model, {summary['cost_model']}: {summary['predicted_step_time_s']:.3f} s)")
    console.print(f"  idle        {summary['idle_fraction']:.1%} of rank time waiting for other groups")
    console.print(f"  loss        {summary['loss_first']:.4f} -> {summary['loss_last']:.4f} "
                  f"(first step -> mean of the last tenth)")
    console.print(f"  planning    {summary['plan_ms']:.1f} ms per step; steps waited "
                  f"{summary['plan_wait_ms']:.1f} ms for their plan")
    console.print(f"  metrics     {summary['metrics']}")
    console.print(f"  plots       {', '.join(summary['report'].values())}")
    console.print(f"  checkpoint  {summary['checkpoint']}")
