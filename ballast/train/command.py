"""`ballast train`: train a model on a real corpus with a planner, resumably, with metrics and plots.

The flags (and `--config`) make a `TrainConfig`; `Trainer` (trainer.py) runs it on local gloo
ranks or under `torchrun`.
"""
from __future__ import annotations

import argparse

from rich.console import Console

from . import config_sources as train_config
from .trainer import Trainer

HELP = "train on a corpus with a planner (local gloo ranks or torchrun); checkpoints, metrics, plots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    train_config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    summary = Trainer(train_config.from_args(args)).fit()
    if summary is not None:
        print_summary(summary)
    return 0


def print_summary(summary: dict) -> None:
    console = Console(highlight=False, soft_wrap=True)
    attempts, by_planner = summary["attempts"], summary["steps_by_planner"]
    planners = (f"the {next(iter(by_planner))} planner" if len(by_planner) == 1 else
                "planners " + ", ".join(f"{name} ({steps})" for name, steps in by_planner.items()))
    console.print(f"[bold]trained {summary['steps']} steps[/bold] with {planners} on {summary['world']} ranks "
                  f"({attempts} attempt{'s' * (attempts != 1)}): {summary['tokens']:,} tokens")
    console.print(f"  throughput  {summary['tokens_per_s']:,.0f} tokens/s, {summary['step_time_s']:.3f} s per "
                  f"step (cost model, {summary['cost_model']}: {summary['predicted_step_time_s']:.3f} s)")
    console.print(f"  idle        {summary['idle_fraction']:.1%} of rank time waiting for other groups")
    console.print(f"  loss        {summary['loss_first']:.4f} -> {summary['loss_last']:.4f} "
                  f"(first step -> mean of the last tenth)")
    if summary["skipped_steps"]:
        console.print(f"  skipped     {summary['skipped_steps']} step(s) whose loss or gradient norm was not "
                      f"finite (--skip-nonfinite; metrics.jsonl marks them)")
    if summary.get("steps_holding"):
        console.print(f"  held        outliers waited for later steps after {summary['steps_holding']} step(s), "
                      f"at most {summary['most_held']} at once (--no-defer-outliers: none)")
    console.print("  layouts     " + ", ".join(f"{layout} ({steps} step{'s' * (steps != 1)})"
                                               for layout, steps in summary["layouts"].items()))
    if summary["steps_by_strategy"]:
        console.print("  strategies  " + ", ".join(f"{strategy} ({steps} step{'s' * (steps != 1)})"
                                                   for strategy, steps in summary["steps_by_strategy"].items()))
    console.print(f"  planning    {summary['plan_ms']:.1f} ms per step; steps waited "
                  f"{summary['plan_wait_ms']:.1f} ms for their plan")
    console.print(f"  metrics     {summary['metrics']}")
    console.print(f"  plots       {', '.join(summary['report'].values())}")
    console.print(f"  checkpoint  {summary['checkpoint']}")
    if summary.get("hf_model"):
        console.print(f"  hf model    {summary['hf_model']} ({summary['hf_model_loader']}.from_pretrained)")
