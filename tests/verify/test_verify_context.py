"""`ballast verify --world 4 --planners all` on models whose 6 heads cap Ulysses at degree 2 (a
GPT, a Hugging Face Llama, a spatial-temporal video DiT): at a budget where the longest samples
need degree 4, the planners that run context parallelism pass with u x c plans of degree 4, and
the Ulysses-only ones are reported as unable to hold --max-len (one spawn of 4 gloo ranks per
model)."""
from __future__ import annotations

import json

import pytest
from hf_folders import save_model

from ballast.cli import main
from ballast.planners import PLANNERS

CP_PLANNERS = ("megatron-dynamic-cp", "ballast", "zeppelin", "wlb-llm")


def six_head_json(folder):
    path = folder / "six-heads.json"
    path.write_text(json.dumps({"name": "six-heads", "layers": 2, "hidden": 48, "heads": 6, "kv_heads": 2,
                                "ffn": 64, "vocab": 64}))
    return str(path)


def six_head_stdit(folder):
    path = folder / "stdit-six.json"
    path.write_text(json.dumps({"name": "stdit-six", "layers": 2, "hidden": 48, "heads": 6, "kv_heads": 6,
                                "ffn": 128, "vocab": 16, "gated_mlp": False, "attention": "spatial-temporal",
                                "cross_attention": True}))
    return str(path)


def six_head_hf(folder):
    return "hf:" + str(save_model(folder / "hf", "LlamaConfig", hidden_size=48, num_attention_heads=6,
                                  num_key_value_heads=2))


# Budgets (device memory, --max-len) at which Ulysses' widest degree (2: 6 heads) cannot hold
# --max-len under full recomputation and degree 4 with CP can, above what a step holds after
# backward (verify's cost model, worked by `budget`): JSON 271 and 542 tokens of 448, HF 183 and
# 366 of 240, the video DiT under FSDP2 178 and 357 latent patches of 256 (replicated, its states
# and AdamW's temporaries leave room for 2,594 patches at degree 2 on any budget it fits).
@pytest.mark.slow
@pytest.mark.parametrize("model, memory_gb, max_len, sharding", [(six_head_json, "0.00075", "448", []),
                                                                 (six_head_hf, "0.0015", "240", []),
                                                                 (six_head_stdit, "0.00054", "256", ["--fsdp"])])
def test_verify_runs_degree_4_with_context_parallelism_for_six_heads(tmp_path, capfd, model, memory_gb, max_len,
                                                                      sharding):
    args = ["verify", "--world", "4", "--planners", "all", "--model", model(tmp_path), "--steps", "1",
            "--batch", "6", "--max-len", max_len, "--device-memory-gb", memory_gb, *sharding]
    assert main(args) == 0
    out, err = capfd.readouterr()
    # transformers' loading bar: once per command (rank 0's first load), not per rank and planner
    # (a bar redraws itself after carriage returns, on one line)
    assert sum("Loading weights" in line for line in (out + err).split("\n")) <= 1, err
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    rows = {row[0]: row[2] for row in cells if row[-1] == "ok"}  # planner -> its degrees
    assert set(rows) == set(CP_PLANNERS) and len(cells) == len(rows), out
    assert any(split in rows[name].split(",") for name in CP_PLANNERS for split in ("2x2", "1x4")), rows
    for name in set(PLANNERS) - set(CP_PLANNERS):
        assert f"{name}: not run: it holds at most" in out


def test_no_planner_that_can_hold_max_len_is_an_error_before_any_rank_starts(tmp_path, capsys):
    # Replicated fp32: 16 B x 37,104 = 594 KB of states (742 KB after backward); a fully
    # recomputed token keeps 2 x 48 x 4 = 384 B and the loss's 12 B x 64 = 768 B: 0.75 MB hold
    # (750,000 - 593,664) / 1,152 = 135 tokens a rank, 271 at Ulysses' widest degree 2 (6 heads,
    # 2 kv heads), 542 at degree 4 with CP
    args = ["verify", "--world", "4", "--planners", "dcp,static", "--model", six_head_json(tmp_path),
            "--max-len", "448", "--device-memory-gb", "0.00075"]
    assert main(args) == 2
    assert ("no planner of --planners dcp,static can hold --max-len 448: dcp holds at most 271 tokens "
            "(ulysses-only splits, degrees up to 2)") in capsys.readouterr().err
