"""`ballast verify`: plans of any planner, run on N ranks, train exactly like one process.

    command.py      the CLI: random batches -> every planner's plans -> ranks vs one process (rank 0
                    under torchrun) -> table, its verdict on every rank
    reference.py    the single-process reference: the whole batch as one packed stream
    distributed.py  the same steps under plans on every rank of a job
    errors.py       the two comparisons and their tolerances
"""
from .command import budget
from .distributed import train_all_planners, train_distributed, train_strategies
from .errors import GRAD_TOLERANCE, PARAM_TOLERANCE, Errors, errors_against, param_drift
from .reference import Trajectory, VerifyBatch, flatten, random_batches, reference_at, train_reference

__all__ = ["GRAD_TOLERANCE", "PARAM_TOLERANCE", "Errors", "Trajectory", "VerifyBatch", "budget", "errors_against",
           "flatten", "param_drift", "random_batches", "reference_at", "train_all_planners",
           "train_distributed", "train_reference", "train_strategies"]
