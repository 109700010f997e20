"""`ballast train` for real on 2 gloo ranks: resume, ZeRO-1, FSDP2, two pipeline stages, metrics, plots,
planners, a killed rank, rank 0's data preparation outlasting the collective timeout.

The corpus is a seeded JSONL of English-like documents with long-tailed lengths (16..2000
bytes, byte tokenizer), and the memory budget is set so that the longest sequence (MAX_LEN)
needs SP degree 2 or recomputation: `ballast` then mixes degrees and checkpoint levels while
`static` runs one layout, so the planners' plans really differ.

Exactness. A resumed run reloads bit-identical parameters and AdamW state (DCP writes the raw
tensors), the data stream's position and the planner's state, and replays the same plans on
the same number of threads, so its losses equal the uninterrupted run's bit for bit. Two
planners' plans sum the same per-token losses in a different order (packing, SP shards,
all-reduce), so their losses agree only up to float rounding that AdamW then carries along:
LOSS_RTOL bounds it (measured 1.6e-7 over 12 steps; a lost or doubled micro-batch moves a
loss by ~1e-2).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from corpora import jsonl_corpus
from train_runs import run_config, text_memory_gb

import ballast
from ballast.cli import main
from ballast.dataset import BatchStream, build_corpus
from ballast.runtime import PeerFailed, run_local
from ballast.train.config import TrainConfig
from ballast.train.metrics import StepRecord, final_history

MAX_LEN = 256
BUDGET = 1024
LOSS_RTOL = 1e-5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, str]:
    """(source spec, cache dir) of 250 documents whose lengths are log-uniform in 16..2000."""
    return jsonl_corpus(tmp_path_factory.mktemp("corpus"), documents=250, longest=2000, seed=0)


@pytest.fixture(scope="module")
def one_epoch_corpus(tmp_path_factory) -> tuple[str, str]:
    """A corpus of 7 steps per epoch (50 samples): a whole epoch trains in seconds."""
    return jsonl_corpus(tmp_path_factory.mktemp("small-corpus"), documents=40, longest=600, seed=0)


def flags(corpus: tuple[str, str], out: Path, steps: int, *extra: str) -> list[str]:
    return ["--model", "tiny", "--data", corpus[0], "--cache-dir", corpus[1], "--max-len", str(MAX_LEN),
            "--tokens-per-step", str(BUDGET), "--device-memory-gb", f"{text_memory_gb('tiny', MAX_LEN):.6f}",
            "--warmup-steps", "2", "--steps", str(steps), "--out-dir", str(out), "--timeout", "60", "--no-report",
            *extra]


def config(corpus: tuple[str, str], out: Path, steps: int, **optimizer) -> TrainConfig:
    return run_config(out, steps, model="tiny", source=corpus[0], cache_dir=corpus[1], max_len=MAX_LEN,
                      tokens_per_step=BUDGET, device_memory_gb=text_memory_gb("tiny", MAX_LEN), **optimizer)


SHARDINGS = {"": {}, "-zero1": {"zero1": True}, "-fsdp": {"fsdp": True}, "-tp": {"tp": 2}, "-pp": {"pp": 2}}
"""Suffix of a run's name -> how its ranks hold the model: optimizer settings, a TP degree (2 on
2 ranks: every layer split over both, plans over a pool of one), or pipeline stages (2 on 2
ranks: each stage a pool of one)."""


def _train_all(configs: list[TrainConfig], failing: TrainConfig) -> tuple[list[dict | None], str]:
    """Trains every config, then returns the ValueError `failing` raises (on every rank, before
    any collective, so the ranks stay in step)."""
    from ballast.train.loop import train

    summaries = [train(c) for c in configs]
    try:
        train(failing)
        return summaries, "no error"
    except ValueError as e:
        return summaries, str(e)


def reference_stream(corpus: tuple[str, str]) -> BatchStream:
    return BatchStream(build_corpus(corpus[0], cache_dir=corpus[1], progress=False), BUDGET, MAX_LEN, 0)


def reference_ids(corpus: tuple[str, str], steps: int) -> list[list[int]]:
    """The sample ids of the first `steps` batches, straight from the data pipeline."""
    stream = reference_stream(corpus)
    return [stream.next_batch().sample_ids for _ in range(steps)]


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in final_history(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict[str, Path]:
    """One spawn of 2 ranks: 4 steps; 2 steps then resume to 4; the same two with ZeRO-1, with
    FSDP2, with TP 2 and as 2 pipeline stages; then an attempt to resume the FSDP2 checkpoint
    without FSDP (its error is "error")."""
    root = tmp_path_factory.mktemp("runs")
    build_corpus(corpus[0], cache_dir=corpus[1], progress=False)  # tokenise once, before the ranks
    outs = {f"{run}{suffix}": root / f"{run}{suffix}" for suffix in SHARDINGS for run in ("whole", "split")}
    configs = []
    for suffix, sharding in SHARDINGS.items():
        made = [config(corpus, outs["whole" + suffix], 4, report=not suffix, **sharding),
                config(corpus, outs["split" + suffix], 2, decay_steps=4, **sharding),
                config(corpus, outs["split" + suffix], 4, decay_steps=4, **sharding)]
        for c in made:  # the one-stage run's batches: under PP ballast would hold outliers for later steps
            c.planner.defer_outliers = not sharding.get("pp")
        configs += made
    for run, steps in (("whole", 4), ("split", 2), ("split", 4)):  # wlb-llm holds samples for later steps
        outs[f"{run}-wlb"] = root / f"{run}-wlb"
        configs.append(config(corpus, outs[f"{run}-wlb"], steps, decay_steps=4))
        configs[-1].planner.planner = "wlb-llm"
    unsharded_resume = config(corpus, outs["whole-fsdp"], 6)
    outs["error"] = run_local(2, _train_all, configs, unsharded_resume, timeout=600)[0][1]
    return outs


@pytest.mark.parametrize("suffix", list(SHARDINGS))
def test_resume_equals_uninterrupted(runs, suffix):
    whole, split = runs["whole" + suffix], runs["split" + suffix]
    assert len(losses(whole)) == 4
    assert losses(split) == losses(whole)  # bit for bit: see the module docstring
    raw = (split / "metrics.jsonl").read_text().splitlines()
    assert len(raw) == 4, "the resumed run re-ran no step: it started after the 2-step checkpoint"
    # keep_checkpoints=2: the newest two remain
    assert sorted(p.name for p in (whole / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]


def test_samples_held_for_later_steps_resume_bit_identical(runs, corpus):
    whole, split = (final_history(runs[run] / "metrics.jsonl") for run in ("whole-wlb", "split-wlb"))
    assert [r["loss"] for r in split] == [r["loss"] for r in whole]
    assert [r["sample_ids"] for r in split] == [r["sample_ids"] for r in whole]
    assert whole[1]["held"] > 0, "wlb-llm held nothing across the checkpoint: the test would prove nothing"
    drawn = [i for batch in reference_ids(corpus, 4) for i in batch]
    trained = [i for r in whole for i in r["sample_ids"]]
    assert len(trained) == len(set(trained)) and set(trained) <= set(drawn)
    assert len(trained) + whole[-1]["held"] == len(drawn)
    summary = json.loads((runs["whole-wlb"] / "report" / "summary.json").read_text())
    assert summary["steps_holding"] == sum(r["held"] > 0 for r in whole) and summary["most_held"] >= whole[1]["held"]


def test_fsdp_trains_like_replicated_parameters(runs):
    # Same batches, same gradients (summed in another order: reduce-scatter), lockstep plans.
    replicated, sharded = losses(runs["whole"]), losses(runs["whole-fsdp"])
    assert sharded == pytest.approx(replicated, rel=LOSS_RTOL)
    # the gradient norm, from the shards' squares under FSDP, is the replicated gradient's
    norms = [[r["grad_norm"] for r in final_history(runs[run] / "metrics.jsonl")] for run in ("whole", "whole-fsdp")]
    assert norms[1] == pytest.approx(norms[0], rel=LOSS_RTOL) and min(norms[0]) > 0
    assert "saved with FSDP; resume with the same --fsdp setting" in runs["error"]


def test_tensor_parallelism_trains_like_whole_layers(runs):
    # Same batches, same gradients (split matmuls' partial sums, the loss's split softmax), one
    # pool rank: every step runs degree 1, so the planner's budget held a TP shard's memory.
    whole, split = (final_history(runs[run] / "metrics.jsonl") for run in ("whole", "whole-tp"))
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in whole], rel=LOSS_RTOL)
    assert [r["grad_norm"] for r in split] == pytest.approx([r["grad_norm"] for r in whole], rel=LOSS_RTOL)
    assert {d for r in split for d in r["degrees"]} == {1}
    assert json.loads((runs["whole-tp"] / "checkpoints" / "step-00000004" / "meta.json").read_text())["tp"] == 2


def test_a_pipeline_trains_like_one_stage(runs):
    # Same batches and gradients (the stages' chain is exact; the sums' order differs), each
    # step's one-rank plan run through two stages, its layout logged as the pipeline's.
    assert losses(runs["whole-pp"]) == pytest.approx(losses(runs["whole"]), rel=LOSS_RTOL)
    layouts = [r["layout"] for r in final_history(runs["whole-pp"] / "metrics.jsonl")]
    assert all(layout.startswith("pp2[1x1 recompute") and "in 1F1B]" in layout for layout in layouts), layouts


def test_metrics_fields_and_every_sample_once(runs, corpus):
    history = final_history(runs["whole"] / "metrics.jsonl")
    assert set(history[0]) == set(StepRecord.__dataclass_fields__)
    assert [r["sample_ids"] for r in history] == reference_ids(corpus, 4)
    ids = [i for r in history for i in r["sample_ids"]]
    assert len(ids) == len(set(ids))
    for r in history:
        assert r["tokens"] == sum(r["lengths"]) <= BUDGET and max(r["lengths"]) <= MAX_LEN
        assert r["loss"] > 0 and r["step_time"] > 0 and r["predicted_step_time"] > 0
        assert 0 <= r["idle_fraction"] < 1 and len(r["rank_idle"]) == 2
        assert r["waves"] >= 1 and set(r["degrees"]) <= {1, 2} and 0 <= r["recomputed"] <= 1
    assert history[-1]["loss"] < history[0]["loss"]


def test_report_is_written(runs):
    report = runs["whole"] / "report"
    for name in ("loss", "tokens_per_s", "lengths", "gantt"):
        assert (report / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["attempts"] == 1 and summary["cost_model"] == "analytic"
    assert summary["provenance"]["commit"]
    assert (runs["whole"] / "config.toml").is_file()
    # without the plots (`report = false`): the summary alone
    assert [p.name for p in (runs["whole-zero1"] / "report").iterdir()] == ["summary.json"]


def test_static_and_ballast_train_the_same_model(corpus, tmp_path, capsys):
    """Same seed, same data, different plans, same loss curve; `static` through the Python API
    (`ballast.Trainer`), `ballast` through the command line."""
    steps = 12
    static_config = config(corpus, tmp_path / "static", steps)
    static_config.planner.planner, static_config.checkpoint.checkpoint_interval = "static", 0
    summary = ballast.Trainer(static_config).fit()
    assert summary["steps"] == steps and summary["planner"] == "static"
    assert main(["train", "--planner", "ballast", "--no-resume", "--checkpoint-interval", "0",
                 *flags(corpus, tmp_path / "ballast", steps)]) == 0
    assert f"trained {steps} steps with the ballast planner" in capsys.readouterr().out
    static, ours = (final_history(tmp_path / p / "metrics.jsonl") for p in ("static", "ballast"))
    assert [r["sample_ids"] for r in static] == [r["sample_ids"] for r in ours]
    layouts = [[(r["waves"], r["degrees"], r["micro_batches"], r["recomputed"]) for r in history]
               for history in (static, ours)]
    assert layouts[0] != layouts[1], "the planners made the same plans: the test would prove nothing"
    worst = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(static, ours))
    print(f"largest relative loss difference static vs ballast over {steps} steps: {worst:.2e}")
    assert worst <= LOSS_RTOL
    assert ours[-1]["loss"] < ours[0]["loss"] - 1.0


def test_killed_rank_restarts_from_the_checkpoint(one_epoch_corpus, tmp_path):
    """torchrun --max-restarts 1, one epoch: rank 1 is SIGKILLed in the middle of step 3 (its
    peer then fails in a collective with it); the job resumes from step 2 and finishes, and its
    history trains every sample of the epoch exactly once."""
    stream = reference_stream(one_epoch_corpus)
    epoch = []
    while stream.epoch == 0:
        epoch.append(stream.next_batch().sample_ids)
    steps = len(epoch)
    out = tmp_path / "faulty"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", "-m", "ballast.cli", "train",
               *flags(one_epoch_corpus, out, steps, "--checkpoint-interval", "2")]
    env = {**os.environ, "BALLAST_FAULT_AT_STEP": "3"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "BALLAST_FAULT_AT_STEP=3: SIGKILL after its first forward pass of the step" in output
    assert "resumed from" in output and f"trained {steps} steps" in output
    raw = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 3 not in [r["step"] for r in raw if r["attempt"] == 0], "the killed step completed"
    history = final_history(out / "metrics.jsonl")
    assert [r["step"] for r in history] == list(range(steps))
    assert [r["attempt"] for r in history] == [0, 0] + [1] * (steps - 2)
    rerun = [r["loss"] for r in raw if r["step"] == 2]
    assert len(rerun) == 2 and rerun[0] == rerun[1], "step 2, re-run from the checkpoint, changed"
    assert [r["sample_ids"] for r in history] == epoch
    trained = sorted(i for r in history for i in r["sample_ids"])
    assert trained == list(range(stream.num_samples)) and {r["epoch"] for r in history} == {0}


SLOW_PREPARATION = 6.0
"""Seconds rank 0 prepares in `_wait_for_rank0`: longer than COLLECTIVE_TIMEOUT."""
COLLECTIVE_TIMEOUT = timedelta(seconds=4)


def _wait_for_rank0() -> list:
    """`from_rank0` with a preparation slower than the collective timeout, then a failing one."""
    from ballast.train.loop import from_rank0

    def slow() -> tuple[str, str]:
        time.sleep(SLOW_PREPARATION)
        return "rank 0's own", "everyone's"

    def bad() -> tuple[str, str]:
        raise ValueError("bad corpus")

    got: list = [from_rank0(slow)]
    try:
        from_rank0(bad)
    except (ValueError, PeerFailed) as e:  # rank 0's own error; the others stop with PeerFailed
        got.append(str(e))
    return got


def test_ranks_wait_for_rank0_data_beyond_the_collective_timeout():
    results = run_local(2, _wait_for_rank0, timeout=120, collective_timeout=COLLECTIVE_TIMEOUT)
    assert results == [[("rank 0's own", "everyone's"), "bad corpus"],
                       [(None, "everyone's"), "stopped: rank 0 failed: bad corpus"]]
