"""`ballast verify --strategy`: Hydraulis' heterogeneous strategies on 8 gloo ranks, changing
between steps, pass for planners placed on their pipelines, on the GPT and a Hugging Face Llama;
flags a strategy does not combine with, and malformed strategies, are one clear line."""
from __future__ import annotations

import re

import pytest

from hf_folders import save_model

from ballast.cli import main

STRATEGIES = "2x2,2x1,1x1,1x1;1x4,2x2"
# verify's default batches (16 sequences up to 256 tokens) give every pipeline of both strategies
# sequences under these planners; smaller ones left the TP pipelines idle on CPU, where gloo's
# all-reduce latency makes TP the slower layout for short sequences.
ARGS = ["verify", "--world", "8", "--strategy", STRATEGIES, "--planners", "ballast,hydraulis", "--steps", "2"]


def rows(out: str) -> list[tuple[str, str, str]]:
    """(planner, busy pipelines per step, ok / FAIL) of every row of verify's table."""
    return re.findall(r"^\W*(ballast|hydraulis)\W+([\d/,]+)\W.*\b(ok|FAIL)\W*$", out, re.MULTILINE)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", "llama"])
def test_two_strategies_in_turn_pass_on_every_pipeline(model, tmp_path, capsys):
    extra = []
    if model == "llama":
        model = "hf:" + str(save_model(tmp_path / "llama", "LlamaConfig", num_key_value_heads=2, num_hidden_layers=4))
        # Its width (64) is a quarter of the GPT's: only sequences up to 1,024 tokens give its TP
        # pipelines work that outweighs their all-reduces' latency on gloo; 0.2 GB a rank holds them
        # without recomputation, which hydraulis needs (it recomputes nothing).
        extra = ["--max-len", "1024", "--device-memory-gb", "0.2"]
    assert main([*ARGS, "--model", model, *extra]) == 0
    out = capsys.readouterr().out
    assert "under strategies [(2,2),(2,1),(1,1),(1,1)] then [(1,4),(2,2)]" in out
    # Every pipeline of both strategies trains sequences, so every layout's gather, passes and
    # reduction ran: a verify that idles a pipeline would check less than it says.
    assert rows(out) == [("ballast", "4/4,2/2", "ok"), ("hydraulis", "4/4,2/2", "ok")]


@pytest.mark.parametrize("extra, message", [
    (["--tp", "2"], "--strategy and --tp do not combine"),
    (["--zero1"], "--strategy and --zero1 do not combine"),
])
def test_flags_a_strategy_does_not_take(extra, message, capsys):
    assert main([*ARGS, *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_malformed_strategy_is_refused_before_any_rank_starts(capsys):
    assert main(["verify", "--world", "8", "--strategy", "2x2,2y1"]) == 2
    assert "argument --strategy: strategy '2x2,2y1': '2y1' is not a pipeline" in capsys.readouterr().err
