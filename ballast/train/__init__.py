"""`ballast train`: real training on a real corpus with any planner.

    config.py      TrainConfig: typed sections, what no run can use refused
    config_sources.py  a TrainConfig from the defaults, a TOML file and one flag per field
    ahead.py       rank 0 draws and plans step k + 1 while step k trains
    loop.py        the loop: data -> plan -> executor -> metrics, checkpoints
    checkpoint.py  DCP model/optimizer state + data position, RNG, planner; atomic
    checkpoint_files.py  which folders are checkpoints, which can be trusted, which one resumes
    metrics.py     metrics.jsonl, progress display, summary
    plots.py       the report folder's PNGs
    hf_folder.py   Hugging Face models: the tokenizer they train with, the trained model as an HF folder
    trainer.py     Trainer: runs the loop on local gloo ranks, or joins torchrun's job
    command.py     the CLI: flags -> TrainConfig -> Trainer

In Python: `ballast.Trainer(config).fit()`; or `ballast.train.loop.train(config)` on every
rank of a job you initialised yourself.
"""
from .config import TrainConfig
from .config_sources import load_toml
from .trainer import Trainer

__all__ = ["TrainConfig", "Trainer", "load_toml"]
