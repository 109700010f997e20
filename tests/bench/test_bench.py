"""`ballast bench`: the interleaved schedule, the summary's arithmetic, and a real 2-rank run of
2 planners x 2 steps that writes the JSON and the PNG with the same batches for everyone."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
from corpora import jsonl_corpus

from ballast.bench import BenchSetting, prepare, schedule, summarise, targets
from ballast.bench.ranks import batch_digest
from ballast.bench.setting import drift_references, reference_steps
from ballast.cli import main
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost import CostModel
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import get_model_shape
from ballast.profile.grid import Measurement, Point

PLANNERS = ("static", "ballast")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, str]:
    """(source spec, cache dir) of 120 documents whose lengths are log-uniform in 16..600 bytes."""
    return jsonl_corpus(tmp_path_factory.mktemp("bench-corpus"), documents=120, longest=600, seed=1)


def test_schedule_interleaves_every_planner_each_step_rotating_the_order():
    names = ("a", "b", "c")
    slots = schedule(names, steps=4, warmup=2, repeats=2)
    assert len(slots) == len(names) * (2 + 2 * 4)
    turns = [slots[i:i + len(names)] for i in range(0, len(slots), len(names))]
    for t, turn in enumerate(turns):
        assert len({(s.round, s.step, s.batch) for s in turn}) == 1  # one batch per turn
        assert [s.planner for s in turn] == list(names[t % 3:] + names[:t % 3])
        assert [s.position for s in turn] == [0, 1, 2]
    assert [(s.round, s.batch) for s in slots[:6]] == [(-1, 0)] * 3 + [(-1, 1)] * 3
    measured = [s for s in slots if s.measured]
    # Every round runs the same measured batches (2..5), and each planner runs each once per round.
    assert Counter((s.round, s.batch, s.planner) for s in measured) == Counter(
        {(r, 2 + k, n): 1 for r in range(2) for k in range(4) for n in names})
    # Rotation: over the run every planner goes first equally often (10 turns: 4, 3, 3).
    assert sorted(Counter(turn[0].planner for turn in turns).values()) == [3, 3, 4]


def record(planner: str, round_: int, step: int, step_s: float, waves_s: float, predicted_s: float) -> dict:
    return dict(round=round_, step=step, batch=step, planner=planner, position=0, tokens=1000, loss=5.0,
                step_s=step_s, waves_s=waves_s, predicted_s=predicted_s, idle=0.0, sync_s=0.01, optimizer_s=0.01,
                cpu_share=1.0, plan_ms=2.0 if round_ == 0 else None, waves=1, micro_batches=2, degrees=[1],
                degree_splits=[[1, 1]], recomputed=0.5, rank_busy_s=[waves_s, 0.75 * waves_s],
                rank_wait_s=[0.0, 0.25 * waves_s],
                digests=[float(step), float(step)],
                rank_waves=[[([0.5 * waves_s, 0.45 * waves_s], 0.05 * waves_s)], [([0.75 * waves_s], 0.0)]])


def test_summary_throughput_noise_prediction_and_targets():
    records = []
    for r, scale in enumerate((1.0, 1.1)):  # the second round is 10% slower for everybody
        for k in range(3):
            records.append(record("static", r, k, 2.0 * scale, 1.8 * scale, 1.8))
            records.append(record("ballast", r, k, 1.0 * scale, 0.9 * scale, 1.2))
    summary = summarise(records, PLANNERS)
    static, ours = summary["planners"]["static"], summary["planners"]["ballast"]
    # Per batch the median over rounds (2.0 and 2.2 s: 2.1 s); the plain total is the mean.
    assert static["tokens_per_s"] == pytest.approx(3000 / (3 * 2.1))
    assert static["tokens_per_s_mean"] == pytest.approx(6000 / (3 * 2.0 + 3 * 2.2))
    assert ours["vs_static"] == pytest.approx(2.0) and ours["vs_static_paired"] == pytest.approx(2.0)
    assert ours["tokens_per_s_rounds"] == pytest.approx([1000.0, 1000 / 1.1])
    assert ours["round_spread"] == pytest.approx((1 - 1 / 1.1) / ((1 + 1 / 1.1) / 2))
    assert summary["noise"]["run_to_run"] == pytest.approx(ours["round_spread"])
    assert ours["vs_static_rounds"] == pytest.approx([2.0, 2.0]) and summary["noise"]["relative"] == 0.0
    # Per batch: predicted / median over rounds of the measured waves - 1.
    assert ours["prediction_error"] == pytest.approx(1.2 / (0.9 * 1.05) - 1)
    assert static["prediction_abs_error"] == pytest.approx(abs(1.8 / (1.8 * 1.05) - 1))
    assert ours["idle_fraction"] == pytest.approx(0.25 / 2)
    assert summary["same_batches"] and summary["loss_spread"] == 0.0
    assert summary["prediction_statistic"] == "median"
    # A cost model fitted on the fastest repeat is held against each batch's fastest round; the
    # throughput numbers stay medians whatever the model.
    fastest = summarise(records, PLANNERS, statistic="min")
    assert fastest["planners"]["ballast"]["prediction_error"] == pytest.approx(1.2 / 0.9 - 1)
    assert fastest["planners"]["static"]["prediction_abs_error"] == pytest.approx(0.0)
    assert fastest["planners"]["static"]["tokens_per_s"] == static["tokens_per_s"]
    assert fastest["prediction_statistic"] == "min"
    with pytest.raises(ValueError, match="statistic must be one of .*'mean'"):
        summarise(records, PLANNERS, statistic="mean")
    assert ours["prediction_error_drift_corrected"] is None  # no drift measured: none divided out
    # The machine 10% slower than at the profile: the prediction scaled by it, against the same waves.
    drifted = summarise(records, PLANNERS, drift=1.1)["planners"]["ballast"]
    assert drifted["prediction_error_drift_corrected"] == pytest.approx(1.2 * 1.1 / (0.9 * 1.05) - 1)
    assert drifted["prediction_error"] == ours["prediction_error"]
    # Bursts that every round scales alike leave the micro-batch composition equal to the whole step.
    assert ours["prediction_error_step"] == pytest.approx(ours["prediction_error"])
    t = targets(summary, seconds=100.0)
    assert t["ballast_vs_static"]["met"] and t["wall_seconds"]["met"]
    assert not t["prediction"]["met"]  # ballast's 27% error
    assert t["ballast_vs_others"]["worst"] == "static" and t["ballast_vs_others"]["met"]


def test_summary_sees_different_batches():
    records = [record("static", 0, 0, 1.0, 1.0, 1.0), record("ballast", 0, 0, 1.0, 1.0, 1.0)]
    records[1]["digests"] = [0.0, 7.0]
    assert not summarise(records, PLANNERS)["same_batches"]


@pytest.mark.slow
def test_bench_two_ranks_two_planners_two_steps(corpus, tmp_path):
    out = tmp_path / "bench.json"
    flags = ["--data", corpus[0], "--cache-dir", corpus[1], "--planners", ",".join(PLANNERS), "--steps", "2",
             "--warmup", "1", "--repeats", "1", "--max-len", "128", "--tokens-per-step", "512",
             "--json", str(out), "--timeout", "120"]
    assert main(["bench", *flags]) == 0
    result = json.loads(out.read_text())
    assert Path(out.with_suffix(".png")).stat().st_size > 0
    assert set(result["planners"]) == set(PLANNERS) and result["provenance"]["commit"]
    for s in result["planners"].values():
        assert s["tokens_per_s"] > 0 and 0 <= s["idle_fraction"] < 1 and s["predicted_s"] > 0
        assert s["plan_ms"] >= 0 and len(s["tokens_per_s_rounds"]) == 1
    assert result["planners"]["static"]["vs_static"] == pytest.approx(1.0)
    assert result["cost_model"]["source"] == "analytic" and result["noise"]["run_to_run"] is None
    assert result["drift"] is None  # no profile: nothing to hold the machine's speed against
    assert set(result["targets"]) == {"wall_seconds", "prediction", "ballast_vs_static", "ballast_vs_others"}
    # The records follow the schedule, and every rank and planner trained on the parent's batches.
    slots = schedule(PLANNERS, steps=2, warmup=1, repeats=1)
    records = result["records"]
    assert [(r["round"], r["batch"], r["planner"]) for r in records] == [(s.round, s.batch, s.planner) for s in slots]
    assert result["same_batches"] and result["loss_spread"] < 1e-4
    setting = BenchSetting(data=corpus[0], cache_dir=corpus[1], planners=PLANNERS, steps=2, warmup=1,
                           planner=dataclasses.replace(BenchSetting().planner, max_len=128), tokens_per_step=512)
    batches = prepare(setting, progress=False).batches
    assert [b["sample_ids"] for b in result["batches"]] == [b.sample_ids for b in batches]
    for r in records:
        assert r["digests"] == [batch_digest(batches[r["batch"]].samples)] * 2


def test_bench_a_video_dit_on_clips(tmp_path):
    """stdit-tiny on video-synthetic: the same clips for every planner and rank, static at SP degree 2."""
    out = tmp_path / "video.json"
    flags = ["--model", "stdit-tiny", "--data", "video-synthetic", "--planners", ",".join(PLANNERS), "--degree", "2",
             "--steps", "1", "--warmup", "1", "--repeats", "1", "--max-len", "256", "--tokens-per-step", "1024",
             "--json", str(out), "--timeout", "120"]
    assert main(["bench", *flags]) == 0
    result = json.loads(out.read_text())
    assert result["same_batches"] and result["loss_spread"] < 1e-4
    assert all(r["degrees"] == [2] for r in result["records"] if r["planner"] == "static")
    setting = BenchSetting(model="stdit-tiny", data="video-synthetic", planners=PLANNERS, steps=1, warmup=1,
                           planner=dataclasses.replace(BenchSetting().planner, max_len=256), tokens_per_step=1024)
    batches = prepare(setting, progress=False).batches
    assert all(r["digests"] == [batch_digest(batches[r["batch"]].samples)] * 2 for r in result["records"])


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--planners", "static,static"], ["--planners", "nope"],
                                 ["--max-len", "4096", "--tokens-per-step", "1024"], ["--device-memory-gb", "0.001"]])
def test_bench_rejects_bad_settings(bad, capsys):
    assert main(["bench", *bad]) == 2
    assert "ballast bench: error:" in capsys.readouterr().err


def test_summary_holds_predictions_against_micro_batches_reduced_one_by_one():
    """A burst hits a different micro-batch of the step in each round: the whole step is never fast,
    its micro-batches each are once, and a model fitted on the fastest repeat of single micro-batches
    predicts their sum."""
    records = []
    for r, seconds in enumerate(([1.3, 0.5], [1.0, 0.8])):
        for name in PLANNERS:
            rec = record(name, r, 0, 2.0, sum(seconds), 1.5)
            rec["rank_waves"] = [[(seconds, 0.0)], [([1.0], 0.0)]]  # rank 1 the lighter
            records.append(rec)
    fastest = summarise(records, PLANNERS, statistic="min")["planners"]["static"]
    assert fastest["prediction_error"] == pytest.approx(0.0)
    assert fastest["prediction_error_step"] == pytest.approx(1.5 / 1.8 - 1)


def test_reference_points_spread_over_every_round():
    assert reference_steps(6, 6) == [0, 1, 2, 3, 4, 5]
    assert reference_steps(2, 5) == [0, 0, 0, 1, 1]
    assert reference_steps(4, 2) == [0, 2]
    assert reference_steps(3, 0) == []


def profile_like_cost(shape_name: str, seconds: dict[tuple[int, int], float], device: str) -> dict:
    """The analytic cost model of `shape_name` on 2 CPU ranks as a profile JSON whose fit holds
    full-depth points of (length, degree) at the given seconds, measured on `device`."""
    shape = get_model_shape(shape_name)
    cost = analytic_cost(shape, get_cluster("cpu", 2))
    measurements = [Measurement(point=Point(shape.layers, (length,), degree, 0), seconds=s, comm_seconds=0.0,
                                comm_calls=0, comm_bytes=0, activation_bytes=1, shard_tokens=length // degree)
                    for (length, degree), s in seconds.items()]
    fit = dict(machine=dict(device=device, backend="gloo"), settings=dict(statistic="min"),
               measurements=[m.to_dict() for m in measurements])
    return {**cost.to_dict(), "fit": fit}


def test_only_a_profile_of_the_ranks_device_is_a_reference_for_the_bench():
    shape = get_model_shape("tiny")
    cpu = CostModel.from_dict(profile_like_cost("tiny", {(64, 1): 0.1, (128, 2): 0.2}, "cpu"))
    assert [m.point.lengths for m in drift_references(cpu, shape, "cpu")] == [(128,), (64,)]
    assert drift_references(cpu, shape, "cuda") == []
    gpu = CostModel.from_dict(profile_like_cost("tiny", {(64, 1): 0.1}, "cuda"))
    assert drift_references(gpu, shape, "cpu") == []
    assert [m.point.lengths for m in drift_references(gpu, shape, "cuda")] == [(64,)]
    assert drift_references(analytic_cost(shape, get_cluster("cpu", 2)), shape, "cpu") == []


@pytest.mark.slow
def test_bench_measures_the_machines_drift_since_the_profile(corpus, tmp_path):
    """The profile's full-depth points run again in every round: the drift is their seconds now
    over the profile's (here made-up: 1 s and 2 s, so the ratio is the measured seconds), reduced
    by the profile's statistic, and each planner's error is also reported with it divided out."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_like_cost("tiny", {(96, 1): 1.0, (128, 2): 2.0}, "cpu")))
    out = tmp_path / "bench.json"
    flags = ["--data", corpus[0], "--cache-dir", corpus[1], "--planners", ",".join(PLANNERS), "--steps", "2",
             "--warmup", "1", "--repeats", "3", "--max-len", "128", "--tokens-per-step", "512", "--cost", str(profile),
             "--json", str(out), "--timeout", "180"]
    assert main(["bench", *flags]) == 0
    result = json.loads(out.read_text())
    drift = result["drift"]
    assert [p["point"] for p in drift["points"]] == ["L4 1x128 d2 recomp0/4", "L4 1x96 d1 recomp0/4"]
    for p, profiled in zip(drift["points"], (2.0, 1.0)):
        assert len(p["rounds_s"]) == 3 and all(0 < s < 1.0 for s in p["rounds_s"])  # tiny points: well under 1 s
        assert p["check_s"] == pytest.approx(min(p["rounds_s"])) and p["profiled_s"] == profiled
        assert p["ratio"] == pytest.approx(p["check_s"] / profiled)
    assert drift["ratio"] == pytest.approx(sum(p["ratio"] for p in drift["points"]) / 2)
    for s in result["planners"].values():
        # A monotone map of every batch's error: the medians map alike.
        assert s["prediction_error_drift_corrected"] == pytest.approx((1 + s["prediction_error"]) * drift["ratio"] - 1)
    # The planners' records are the schedule's alone: the reference runs are not among them.
    assert len(result["records"]) == len(schedule(PLANNERS, steps=2, warmup=1, repeats=3))
