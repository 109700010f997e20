"""bench/peers/deepspeed_ulysses.py: DeepSpeed-Ulysses trains the same model on the same batches
as ballast, so its loss equals ballast's step by step. The 2-rank run needs DeepSpeed (the peers
virtualenv, bench/peers/requirements.txt) and is skipped without it; the packing runs anywhere."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

PEERS = Path(__file__).resolve().parents[2] / "bench" / "peers"
sys.path.insert(0, str(PEERS))  # the ranks are spawned and import the script by its module name
import deepspeed_ulysses as peer  # noqa: E402

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
LOSS_RTOL = 1e-5
"""fp32 on both sides. The forward is the same arithmetic (same weights, same per-sequence SDPA
over the same rows, all-to-alls only move values), but the gradients are reduced differently
(ballast: one flattened SUM all-reduce; DeepSpeed ZeRO-2: bucketed reduce-scatter of gradients
scaled by the world size and averaged), which may differ in the last bits; after one AdamW step
that moves the second step's loss by rounding-sized amounts. 1e-5 relative is `ballast verify`'s
gradient tolerance; a wrong mask, a shard off by one token or a gradient off by the world size
changes the loss by 1e-3 or more. (Measured: identical to the last bit on these 2 steps.)"""


def test_pack_restarts_positions_per_sequence_and_pads_to_the_degree():
    samples = [torch.arange(6), torch.arange(10, 14), torch.arange(20, 23)]  # lengths 5, 3, 2
    inputs, targets, positions, bounds, tokens = peer.pack(samples, sp=4)
    assert tokens == 10 and len(inputs) == 12  # padded to a multiple of 4
    assert inputs.tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 20, 21, 0, 0]
    assert targets.tolist() == [1, 2, 3, 4, 5, 11, 12, 13, 21, 22, peer.IGNORE, peer.IGNORE]
    assert positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 0, 1]
    assert bounds == [0, 5, 8, 10, 12]  # the padding is a sequence of its own


def test_local_attention_never_crosses_a_sequence_boundary():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 7, 2, 4), torch.randn(1, 7, 1, 4), torch.randn(1, 7, 1, 4)
    out = peer._local_attention(q, k, v, bounds=[0, 3, 7], scaling=None)
    alone = peer._local_attention(q[:, 3:], k[:, 3:], v[:, 3:], bounds=[0, 4], scaling=None)
    torch.testing.assert_close(out[:, 3:], alone)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed: the peers' extra lives in its own "
                                               "virtualenv (bench/peers/requirements.txt)")
def test_deepspeed_ulysses_loss_equals_ballast_on_two_steps(tmp_path):
    out = tmp_path / "peers.json"
    peer.main(["--model", str(tmp_path / "hf-tiny-llama"), "--steps", "2", "--warmup", "0", "--repeats", "1",
               "--tokens-per-step", "4096", "--max-len", "2048", "--skip-memory", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["same_batches"]
    assert result["peer"]["engine"]["zero_stage"] == peer.ZERO_STAGE
    agreement = result["systems"][peer.PEER]["loss_vs_static"]
    assert len(agreement["steps"]) == 2
    assert agreement["max_rel"] <= LOSS_RTOL, agreement
    assert result["systems"]["ballast"]["loss_vs_static"]["max_rel"] <= LOSS_RTOL
