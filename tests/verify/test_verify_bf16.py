"""`ballast verify --precision bf16` on CPU ranks: bf16 autocast on the CPU against the fp32
single-process reference, within BF16_GAP_MULTIPLE x the model's own bf16-vs-fp32 gap.

What this covers: the bf16 autocast dtypes, the bf16 exchanges and gathers, and the tolerance of
the GPT, an HF causal LM with grouped-query heads and a video DiT on 2 and 4 gloo ranks. What it
does not: flash-attn, NCCL, CUDA placement and streams, which run on GPUs only."""
from __future__ import annotations

import re

import pytest

from ballast.cli import main
from hf_folders import save_model

ARGS = ["verify", "--precision", "bf16", "--planners", "ballast", "--steps", "1", "--batch", "6", "--max-len", "48"]


def rows(out: str) -> list[list[str]]:
    """The cells of verify's table rows."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]


@pytest.mark.slow
@pytest.mark.parametrize("model, world", [("tiny", 2), ("hf-llama-gqa", 4), ("dit-tiny", 4), ("stdit-tiny", 2)])
def test_bf16_verify_passes_against_the_fp32_reference(tmp_path, capsys, model, world):
    if model == "hf-llama-gqa":
        model = f"hf:{save_model(tmp_path / 'llama', 'LlamaConfig', num_key_value_heads=2)}"
    assert main([*ARGS, "--model", model, "--world", str(world)]) == 0
    out = capsys.readouterr().out
    assert "in bf16" in out
    [row] = rows(out)
    loss, grad_rel, tolerances, verdict = float(row[4]), float(row[6]), row[9], row[10]
    grad_tolerance = float(tolerances.split(",")[0])
    # bf16 really ran: its error is far above fp32's rounding (~1e-6), and within its tolerance.
    assert verdict == "ok" and 1e-4 < grad_rel <= grad_tolerance and loss <= grad_tolerance


def test_bf16_tolerances_are_the_stated_multiple_of_the_single_process_gap():
    import torch

    from ballast.verify.errors import BF16_GAP_MULTIPLE, GRAD_TOLERANCE, PARAM_TOLERANCE, bf16_tolerances
    from ballast.verify.reference import Trajectory

    start = [torch.zeros(3)]
    fp32_at = Trajectory([2.0], [torch.tensor([1.0, -2.0, 0.5])], start, torch.ones(3))
    bf16_at = Trajectory([2.002], [torch.tensor([1.0, -2.02, 0.5])], start, torch.ones(3))
    fp32_end = Trajectory([2.0], fp32_at.grads, start, torch.tensor([1.0, 1.0, 1.0]))
    bf16_end = Trajectory([2.0], fp32_at.grads, start, torch.tensor([1.0, 1.0, 1.1]))
    grad, param = bf16_tolerances(fp32_at, bf16_at, fp32_end, bf16_end)
    assert grad == pytest.approx(BF16_GAP_MULTIPLE * 0.01)  # 0.02 of the largest entry, 2
    assert param == pytest.approx(BF16_GAP_MULTIPLE * 0.1 / 3 ** 0.5)
    same = bf16_tolerances(fp32_at, fp32_at, fp32_end, fp32_end)
    assert same == (GRAD_TOLERANCE, PARAM_TOLERANCE)  # never below fp32's
