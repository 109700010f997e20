"""A step whose loss or gradient norm is not finite: stopped, or with --skip-nonfinite skipped.

The executor finds it after the gradient all-reduce and before AdamW, from values every rank
holds alike, and leaves the optimizer alone (`StepResult.applied`): the weights and AdamW's
state stay as they were, so no checkpoint is ever written from them. Rank 0, which alone
knows the batch's sample ids, names the samples of the micro-batches whose loss was not finite
(the data to look at), or, when every loss was finite and only the gradient was not, the
step's samples; when the loss of every micro-batch was not finite, the weights.
"""
from __future__ import annotations

from rich.console import Console

from ..dataset import EpochStream
from ..runtime import PeerFailed, StepResult
from .ahead import StepInput


def nonfinite_step(step: int, steps: int, result: StepResult, item: StepInput | None,
                    stream: EpochStream | None, skip: bool, console: Console) -> None:
    """A step whose loss or gradient norm was not finite (the optimizer did not step): with
    `skip`, rank 0 says so and the run goes on; otherwise every rank stops (all saw the same
    all-reduced values), rank 0 with the error naming the samples, the others as its echo."""
    message = None
    if item is not None:
        ids = [item.batch.sample_ids[i] for i in result.nonfinite_samples]
        micro_batches = [set(mb.seq_ids) for _, _, mb in item.plan.micro_batches() if mb.seq_ids]
        if len(micro_batches) > 1 and all(mb & set(result.nonfinite_samples) for mb in micro_batches):
            where = (f"a non-finite loss in every one of the step's {len(micro_batches)} micro-batches: the "
                     f"weights, more likely than the data, are the cause (a damaged or diverged model)")
        elif ids:
            where = f"a non-finite loss in the micro-batch(es) of {_sample_names(stream, ids)}"
        else:
            where = f"every micro-batch's loss finite; the step's samples: {_sample_names(stream, item.batch.sample_ids)}"
        message = (f"step {step + 1}/{steps}: loss {result.loss:g}, gradient norm {result.grad_norm:g}, with "
                   f"{where}")
    if skip:
        if message is not None:
            console.print(f"[yellow]warning:[/yellow] {message}: step skipped (--skip-nonfinite; the weights "
                          f"and AdamW's state are as before it)", highlight=False)
        return
    if message is None:
        raise PeerFailed(0, f"step {step + 1}/{steps}: a non-finite loss or gradient norm", user_error=True)
    raise ValueError(f"{message}: stopped before the optimizer step, so the weights and the last checkpoint "
                     f"are as before it (--skip-nonfinite skips such steps instead)")


def nothing_trained(start: int, steps: int, applied: int, rank: int) -> None:
    """Every step of the run skipped (--skip-nonfinite): the weights never changed, so there is
    no trained model to write (an hf-model/ of them would pass for one). Rank 0 stops with the
    error, the others as its echo."""
    if applied or start == steps:
        return
    message = (f"every one of the run's {steps - start} step(s) was skipped for a non-finite loss or gradient "
               f"norm (--skip-nonfinite): the weights never changed, so no trained model is written; the "
               f"warnings above say what each step met")
    if rank != 0:
        raise PeerFailed(0, message, user_error=True)
    raise ValueError(message)


def _sample_names(stream: EpochStream, ids: list[int], most: int = 8) -> str:
    names = ", ".join(stream.sample_name(i) for i in ids[:most])
    return names + (f" and {len(ids) - most} more" if len(ids) > most else "")
