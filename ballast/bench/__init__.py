"""`ballast bench`: every planner trained side by side on this machine, measured.

setting.py  the knobs, the batches (one BatchStream, drawn once) and the interleaved schedule
ranks.py    the one job (local gloo ranks, or torchrun's): rank 0 plans and broadcasts, every rank runs
            and times each step
summary.py  per-planner numbers, the run-to-run noise, the data checks and the issue's targets
output.py   the rich table and the PNG bar chart
command.py  the CLI subcommand
"""
from .setting import ALL_PLANNERS, BenchInputs, BenchSetting, Slot, prepare, schedule
from .summary import summarise, targets

__all__ = ["ALL_PLANNERS", "BenchInputs", "BenchSetting", "Slot", "prepare", "schedule", "summarise", "targets"]
