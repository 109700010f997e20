"""`ballast.Trainer`: the Python entry point of `ballast train`, on local ranks or under torchrun.

    summary = ballast.Trainer(config).fit()

Outside torchrun it spawns `config.run.world` gloo ranks on 127.0.0.1 (2 if unset). Under
`torchrun` (RANK and WORLD_SIZE in the environment) it spawns nothing: each process joins the
job torchrun describes (NCCL on GPUs, gloo otherwise), single- or multi-node, and a restarted
job (`--max-restarts`) resumes from the newest checkpoint.
"""
from __future__ import annotations

import math
import os
from datetime import timedelta

from rich.console import Console

from ..command_line.output_paths import check_output_folder
from ..runtime import under_torchrun
from .config import TrainConfig

DEFAULT_WORLD = 2


class Trainer:
    """Trains `config.model` on `config.data` with `config.planner`'s plans; see `TrainConfig`."""

    def __init__(self, config: TrainConfig):
        config.validate()
        self.config = config

    def fit(self) -> dict | None:
        """Train to `config.run.steps` (resuming from the newest checkpoint unless told not to).
        Returns the run's summary (tokens/s, idle, loss, report paths) on rank 0, None elsewhere."""
        if int(os.environ.get("RANK", "0")) == 0:  # the process that writes the run folder and the log
            check_output_folder(self.config.run.out_dir, "--out-dir")
            console = Console(soft_wrap=True, highlight=False)
            for warning in self.config.warnings():
                console.print(f"[yellow]warning:[/yellow] {warning}")
        return self._fit_torchrun() if under_torchrun() else self._fit_local()

    def _fit_torchrun(self) -> dict | None:
        import torch.distributed as dist

        from ..runtime import init_distributed, job_world
        from .loop import train

        job_world(self.config.run.world, None)  # a --world that torchrun's contradicts: before joining
        init_distributed(timeout=timedelta(seconds=self.config.run.timeout))
        try:
            return train(self.config)
        finally:
            dist.destroy_process_group()

    def _fit_local(self) -> dict | None:
        from ..runtime import run_local
        from .loop import train
        from .setup import Setup, make_planner, open_data, with_proposed_strategies

        world = self.config.run.world or DEFAULT_WORLD
        # Fail on user errors here, with a plain message, before any rank starts; a corpus is
        # tokenised once here (with a progress bar) and the ranks read it from the cache.
        config = with_proposed_strategies(self.config, world, console=Console(soft_wrap=True))
        setup = Setup.of(config, world)
        open_data(config, setup.shape, setup.tokenizer, progress=True)
        make_planner(config, setup)
        # A rank's error comes back once, as that rank's (a ValueError as `RankInputError`).
        return run_local(world, train, config, timeout=math.inf,
                         collective_timeout=timedelta(seconds=config.run.timeout))[0]
