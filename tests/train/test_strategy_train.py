"""`ballast train --strategy` for real on 8 gloo ranks: hydraulis chooses each step's strategy among
three (its stage 1, stage 2 and choice), the strategy changes across steps, a run resumed from the
canonical layout's checkpoint equals the uninterrupted one bit for bit, and ballast's choice over
the same strategies trains the same batches to the same losses; `--strategy auto` proposes its
strategies from the training data (on rank 0, as under torchrun) and trains under them.

The budget (MEMORY_GB) lets a lone rank hold at most 194 tokens without recomputation (Hydraulis
runs none), a (2,2) pipeline 506, and the corpus' documents are up to 300 bytes: a batch of short
documents can take the eight one-rank pipelines, one holding a longer document cannot.

Exactness: as `test_run.py`'s resume (the shards and AdamW state reload bit for bit, the plans are
the same), so the resumed losses equal the uninterrupted ones exactly. Across planners the
gradients are the batch's whatever the plan (summed in another order), so the losses agree to
LOSS_RTOL (as test_run.py's, measured there).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpora import jsonl_corpus
from train_runs import run_config

from ballast.command_line.options import parse_strategies
from ballast.planners.ballast.strategy import pooled as pooled_form
from ballast.runtime import run_local
from ballast.train.config import TrainConfig
from ballast.train.metrics import final_history

STRATEGIES = "2x2,2x1,1x1,1x1;1x4,2x2;1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1"
NAMES = [str(s) for s in parse_strategies(STRATEGIES)]
MAX_LEN, BUDGET, MEMORY_GB = 512, 512, 0.015
ONE_RANK_HOLDS = 194  # tokens, at MEMORY_GB without recomputation (the analytic cost model's), as Hydraulis runs
LOSS_RTOL = 1e-5

pytestmark = pytest.mark.slow


def config(corpus: tuple[str, str], out: Path, steps: int, planner: str = "hydraulis", **planning) -> TrainConfig:
    c = run_config(out, steps, model="tiny", source=corpus[0], cache_dir=corpus[1], max_len=MAX_LEN,
                   tokens_per_step=BUDGET, device_memory_gb=MEMORY_GB, planner=planner, decay_steps=4,
                   strategy=STRATEGIES)
    for key, value in planning.items():
        setattr(c.planner, key, value)
    return c


def _train_all(configs: list[TrainConfig], failing: TrainConfig) -> str:
    """Trains every config, then returns the ValueError `failing` raises (on every rank alike)."""
    from ballast.train.loop import train

    for c in configs:
        train(c)
    try:
        train(failing)
        return "no error"
    except ValueError as e:
        return str(e)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path | str]:
    """One spawn of 8 ranks: hydraulis 4 steps; 2 steps then resumed to 4; ballast 4 steps; then
    the hydraulis checkpoint resumed without --strategy (its error is "error")."""
    root = tmp_path_factory.mktemp("strategy-runs")
    corpus = jsonl_corpus(root, documents=200, longest=300, seed=0)
    outs: dict[str, Path | str] = {name: root / name for name in ("whole", "split", "ballast", "auto")}
    configs = [config(corpus, outs["whole"], 4), config(corpus, outs["split"], 2), config(corpus, outs["split"], 4),
               config(corpus, outs["ballast"], 4, planner="ballast"), config(corpus, outs["auto"], 2, strategy="auto")]
    outs["corpus"] = corpus
    configs[0].run.report = True
    failing = config(corpus, outs["whole"], 6, strategy=None, device_memory_gb=0.02)
    outs["error"] = run_local(8, _train_all, configs, failing, timeout=900)[0]
    return outs


def test_hydraulis_changes_strategy_and_resumes_bit_identical(runs):
    whole, split = (final_history(runs[run] / "metrics.jsonl") for run in ("whole", "split"))
    assert [r["loss"] for r in split] == [r["loss"] for r in whole]
    assert [r["strategy"] for r in split] == [r["strategy"] for r in whole]
    strategies = [r["strategy"] for r in whole]
    assert len(set(strategies)) > 1, f"every step took {strategies[0]}: the run would not change strategy"
    for r in whole:
        assert r["planner"] == "hydraulis" and r["layout"].count("|") == r["strategy"].count("),(")
        if max(r["lengths"]) > ONE_RANK_HOLDS:  # then no strategy of one-rank pipelines alone holds the batch
            assert r["strategy"] != NAMES[2], r
    assert whole[-1]["loss"] < whole[0]["loss"]
    meta = json.loads((runs["whole"] / "checkpoints" / "step-00000004" / "meta.json").read_text())
    assert meta["canonical"] is True and meta["world"] == 8
    summary = json.loads((runs["whole"] / "report" / "summary.json").read_text())
    assert summary["steps_by_strategy"] == {s: strategies.count(s) for s in set(strategies)}


def test_any_planner_trains_the_same_batches_to_the_same_losses(runs):
    hydraulis, ballast = (final_history(runs[run] / "metrics.jsonl") for run in ("whole", "ballast"))
    assert [r["sample_ids"] for r in ballast] == [r["sample_ids"] for r in hydraulis]
    assert [r["loss"] for r in ballast] == pytest.approx([r["loss"] for r in hydraulis], rel=LOSS_RTOL)
    # ballast may run a strategy's pooled form (identical replicas as one pipeline's pool): the same ranks
    pooled = {str(pooled_form(s)) for s in parse_strategies(STRATEGIES)}
    assert all(r["strategy"] in set(NAMES) | pooled for r in ballast)


def test_a_canonical_checkpoint_resumes_only_under_a_strategy(runs):
    assert "saved with --strategy (its state in the canonical layout); resume it with --strategy" in runs["error"]


def test_auto_proposes_strategies_from_the_training_data_and_trains_under_them(runs):
    from ballast.train.config_sources import load_toml
    from ballast.train.setup import with_proposed_strategies

    written = load_toml(runs["auto"] / "config.toml").planner.strategy
    # What rank 0 proposed is what the same config proposes here: the training data's lengths alone decide it.
    expected = with_proposed_strategies(config(runs["corpus"], runs["auto"], 2, strategy="auto"), 8).planner.strategy
    assert written == expected != "auto"
    names = {str(s) for s in parse_strategies(written)}
    history = final_history(runs["auto"] / "metrics.jsonl")
    assert len(history) == 2 and all(r["strategy"] in names and r["planner"] == "hydraulis" for r in history)
