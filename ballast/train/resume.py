"""Which checkpoint a run resumes from, and what it says of the settings that differ from the
checkpoint's.

Resuming is the default: the log's first line names the checkpoint, or says the run starts
fresh. A resumed run may change settings (more --steps, another planner, another world); the
ones that change the plans or the batches from the resumed step on are named in a note, so a
log never reads as one setting's run when it is two.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from . import checkpoint_files
from .config import PlannerConfig, TrainConfig, flag_of

PLAN_SETTINGS = [("planner", f.name) for f in dataclasses.fields(PlannerConfig) if f.name != "plan_ahead"] + \
    [("data", "max_len")]
"""The config fields that change a step's plan for the same batch (planning ahead changes when
a plan is made, not the plan)."""


def checkpoint_to_resume(config: TrainConfig, console: Console) -> str | None:
    """The checkpoint to resume from, said in the log's first line either way (resuming is the
    default): the newest one that checks out, damaged newer ones skipped with a warning."""
    root = config.checkpoint_path
    if not config.checkpoint.resume:
        found = checkpoint_files.latest(root)
        if found is not None:
            raise ValueError(f"{root} holds checkpoints (newest {found.name}) and --no-resume was given: "
                             f"remove them or choose another --checkpoint-dir")
        console.print(f"starting fresh (--no-resume): checkpoints go to {root}", highlight=False)
        return None
    found = checkpoint_files.resumable(root, warn=lambda message: console.print(
        f"[yellow]warning:[/yellow] {message}", highlight=False))
    if found is None:
        console.print(f"starting fresh: no checkpoint in {root}", highlight=False)
        return None
    console.print(f"resuming from {found} (to start fresh instead, give another --out-dir or --checkpoint-dir; "
                  f"--no-resume refuses a folder that holds checkpoints)", highlight=False)
    return str(found)


def say_what_changed(path: Path, meta: dict, config: TrainConfig, world: int, console: Console) -> None:
    """A warning when the batches' size differs from the checkpoint's, and a note naming every
    setting that changes the plans (the planner, the world, `PLAN_SETTINGS`) that does."""
    saved = meta["data"].get("tokens_per_step")
    if saved != config.data.tokens_per_step:
        console.print(f"[yellow]warning:[/yellow] resuming {path} with --tokens-per-step "
                      f"{config.data.tokens_per_step}; it was saved with {saved}: the steps from "
                      f"{meta['step']} on draw batches of the new size", highlight=False)
    then, defaults = meta["config"], TrainConfig()
    changed = [f"--world {world} (was {meta['world']})"] if meta["world"] != world else []
    for section, name in PLAN_SETTINGS:
        # a field newer than the checkpoint's ballast had its default then
        was = then.get(section, {}).get(name, getattr(getattr(defaults, section), name))
        now = getattr(getattr(config, section), name)
        if was != now:
            field = next(f for f in dataclasses.fields(getattr(config, section)) if f.name == name)
            changed.append(f"{flag_of(field)} {_shown(now)} (was {_shown(was)})")
    if changed:
        console.print(f"note: resuming {path.name} with settings that change the plans from step {meta['step']} "
                      f"on: {', '.join(changed)}", highlight=False)


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)
