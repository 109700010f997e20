"""`ballast train`: real training on a real corpus with any planner.

    config.py      TrainConfig: typed sections, TOML, one flag per field
    ahead.py       rank 0 draws and plans step k + 1 while step k trains
    trainer.py     the loop: data -> plan -> executor -> metrics, checkpoints
    checkpoint.py  DCP model/optimizer state + data position, RNG, planner; atomic, resumable
    metrics.py     metrics.jsonl, progress display, summary
    plots.py       the report folder's PNGs
    command.py     the CLI: local gloo ranks, or torchrun

In Python: `ballast.train.trainer.train(config)` on every rank of an initialised job.
"""
from .config import TrainConfig, load_toml

__all__ = ["TrainConfig", "load_toml"]
