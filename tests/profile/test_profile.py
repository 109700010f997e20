"""`ballast profile`: the fit recovers known coefficients, profiles load everywhere a cost model
does, oversized models fail early and clearly, and a tiny real profile runs on 2 gloo ranks."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from ballast.cli import main
from ballast.command_line.provenance import provenance
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.coefficients import InfeasibleError
from ballast.pricing.cost import CostModel
from ballast.pricing.cost_sources import get_cost_model
from ballast.planners import PLANNERS, PlannerOptions, get_planner
from ballast.profile.profiler import (all_to_all_value_bytes, check_states_fit, profile, shape_bytes_per_token_layer,
                                     state_bytes)
from ballast.profile.settings import Settings, default_lengths, held_out, plan_grid
from ballast.profile.check import make_plans
from ballast.profile.comparison import beyond_noise, summarise
from ballast.profile.context import (CheckedPlanner, checked_planners, context_bytes_per_token_layer, context_splits,
                                     splits_used)
from ballast.profile.coefficients import Coefficients
from ballast.profile.columns import TimeColumns
from ballast.profile.fit import fit
from ballast.profile.exchange import check_exchanged_values, expected_values
from ballast.profile.measure import combine
from ballast.profile.tensor_terms import TOKENS
from ballast.profile.residuals import prediction_errors as compare
from ballast.profile.grid import (Measurement, Point, build_context_grid, build_grid, remap_points, tiny_documents,
                                  verification_points)
from ballast.vocabulary.model_shape import get_model_shape
from ballast.plans.timeline import simulate

from synthetic_measurements import synthetic

TINY = get_model_shape("tiny")
# A deeper tiny model, so extrapolating from depths 1 and 2 to 8 is a real extrapolation.
DEEP = dataclasses.replace(TINY, name="tiny-8", layers=8)
TRUE = Coefficients(a_layer=2e-8, b_layer=4e-5, b_fixed=2e-5, g_layer=4e-3, g_fixed=5e-3, recompute_layer=0.4,
                    recompute_attention_layer=0.25,
                    latency_layer={2: 3e-3, 4: 5e-3}, bandwidth={2: 4e8, 4: 2e8}, call_latency={2: 6e-4, 4: 1e-3},
                    bytes_per_token_layer=shape_bytes_per_token_layer(TINY, 4), act_fixed=2600.0, act_layer=11000.0,
                    kept_layer=500.0, span_layer=3e-5, recompute_fixed_layer=2e-3)


def layer_bytes(value_bytes: int, shape=TINY, degrees=(1, 2, 4)) -> dict[int, float]:
    return {d: shape_bytes_per_token_layer(shape, value_bytes, d) for d in degrees}


def grid(depths=(1, 2), lengths=(128, 256, 512, 1024, 2048, 4096), degrees=(1, 2, 4)) -> list[Point]:
    return [p for depth in depths for p in build_grid(depth, lengths, degrees)]


def test_fit_recovers_exact_coefficients():
    got = fit(synthetic(grid(), TRUE, noise=0.0), layer_bytes(4))
    for name in ("a_layer", "b_layer", "b_fixed", "g_layer", "g_fixed", "recompute_layer",
                 "recompute_attention_layer", "act_fixed", "act_layer", "kept_layer", "span_layer", "recompute_fixed_layer"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-3, abs=1e-12), name
    for table in ("bandwidth", "call_latency", "latency_layer"):
        assert getattr(got, table) == pytest.approx(getattr(TRUE, table), rel=1e-3), table


def test_fit_recovers_the_remap_layers_overhead_and_prices_it():
    """Remap points (a degree-1 wave run as one remap domain, every group's copy as long as the
    others, so nothing moves) cost their plain twin plus the layer's overhead per token and per
    slot: the fit recovers both, the CostModel prices every point exactly (`remap_overhead`,
    recomputed blocks repeating their forward exchanges), and the remap terms are 0 without
    remap points."""
    lengths = (128, 256, 512, 1024, 2048, 4096)
    true = dataclasses.replace(TRUE, remap_token_layer=3e-6, remap_layer=2e-3)
    points = grid() + [p for depth in (1, 2) for p in remap_points(depth, lengths, tiny_documents(lengths), 4)]
    assert sum(p.remap for p in points) == 10 and any(p.remap and p.recompute_layers for p in points)
    measured = synthetic(points, true)
    got = fit(measured, layer_bytes(4))
    assert got.remap_token_layer == pytest.approx(3e-6, rel=1e-3) and got.remap_layer == pytest.approx(2e-3, rel=1e-3)
    assert got.b_layer == pytest.approx(true.b_layer, rel=1e-3) and got.g_layer == pytest.approx(true.g_layer, rel=1e-3)
    at = {depth: got.cost_model(dataclasses.replace(TINY, layers=depth), 4, 1e10, state_bytes(TINY)) for depth in (1, 2)}
    assert at[2].remap_per_token == pytest.approx(6e-6, rel=1e-3) and at[2].remap_latency == pytest.approx(4e-3, rel=1e-3)
    assert max(abs(row["time_error"]) for row in compare(measured, at)) < 1e-3
    assert "remap_layer" in got.to_dict()
    plain = fit(synthetic(grid(), TRUE), layer_bytes(4))
    assert plain.remap_token_layer == plain.remap_layer == 0.0 and "remap_layer" not in plain.to_dict()


def test_fit_with_noise_extrapolates_to_full_depth():
    """3% timing noise at depths 1 and 2: the depth-8 CostModel predicts depth-8 micro-batches
    (which the fit never saw) within a few percent, and its coefficients are close."""
    measured = synthetic(grid(), TRUE, noise=0.03, seed=1)
    got = fit(measured, layer_bytes(4))
    memory = 1e10
    truth = TRUE.cost_model(DEEP, 4, memory, state_bytes(DEEP))
    cost = got.cost_model(DEEP, 4, memory, state_bytes(DEEP))
    assert cost.a == pytest.approx(truth.a, rel=0.05)
    assert cost.b == pytest.approx(truth.b, rel=0.1)
    assert cost.g == pytest.approx(truth.g, rel=0.1)
    assert cost.bandwidth == pytest.approx(truth.bandwidth, rel=0.1)
    assert cost.act_per_token == pytest.approx(truth.act_per_token, rel=0.01)
    assert cost.kept == pytest.approx(truth.kept, rel=0.05)
    deep = synthetic(verification_points(8, [128, 1024, 4096], [1, 2, 4], 6), TRUE, noise=0.0)
    errors = [abs(row["time_error"]) for row in compare(deep, {8: cost})]
    assert max(errors) < 0.05, errors


def test_all_to_all_bytes_follow_the_precision_the_runs_used():
    """fp32 runs (CPU) send 4-byte values, bf16 autocast (GPU) 2-byte ones. The profile prices
    the values its runs sent, read from the bytes they sent, the same bytes the bandwidth is
    fitted from: a fixed 4 bytes made a GPU profile predict twice the transfer time it measured."""
    assert shape_bytes_per_token_layer(TINY, 4) == 2 * shape_bytes_per_token_layer(TINY, 2)
    # q and out carry `hidden` values, k and v `kv_dim`, each forward and backward.
    assert shape_bytes_per_token_layer(TINY, 2) == 2 * (2 * 128 + 2 * 64) * 2
    costs = {}
    for value_bytes in (4, 2):
        true = dataclasses.replace(TRUE, bytes_per_token_layer=shape_bytes_per_token_layer(TINY, value_bytes))
        measured = synthetic(grid(), true, noise=0.0)
        assert all_to_all_value_bytes(measured, TINY) == value_bytes
        got = fit(measured, layer_bytes(all_to_all_value_bytes(measured, TINY)))
        assert got.bandwidth == pytest.approx(TRUE.bandwidth, rel=1e-3)  # the link is the same
        at = {depth: got.cost_model(dataclasses.replace(TINY, layers=depth), 4, 1e10, state_bytes(TINY))
              for depth in (1, 2)}
        assert max(abs(row["time_error"]) for row in compare(measured, at)) < 1e-3
        costs[value_bytes] = got.cost_model(TINY, 4, 1e10, state_bytes(TINY))
    assert costs[2].bytes_per_token == costs[4].bytes_per_token / 2
    # No degree above 1: nothing was exchanged, so no value size was seen.
    assert all_to_all_value_bytes([m for m in synthetic(grid(), TRUE, 0.0) if m.point.degree == 1], TINY) is None
    # A packed stream or an odd split (a held-out batch of real lengths) need not send exactly its
    # largest shard on every rank: its bytes per value are still the size of its values.
    (odd,) = synthetic([Point(1, (1037, 16), 2, 0)], TRUE, noise=0.0)
    odd.comm_bytes *= 0.999
    odd.comm_values *= 0.999
    assert all_to_all_value_bytes(synthetic(grid(), TRUE, 0.0) + [odd], TINY) == 4


def test_replicated_kv_heads_are_counted_in_the_bytes_and_the_fit():
    """One kv head (multi-query attention): degrees 2 and 4 replicate it to 2 and 4 kv heads,
    so k and v carry 2x and 4x the values. The profile reads the value size from the bytes the
    runs sent only if it counts the replicas, fits the link's bandwidth from them, and its cost
    model prices every degree's exchange as measured."""
    mqa = dataclasses.replace(TINY, name="tiny-mqa", kv_heads=1)
    assert shape_bytes_per_token_layer(mqa, 4, 1) == 2 * (2 * 128 + 2 * 16) * 4
    assert shape_bytes_per_token_layer(mqa, 4, 4) == 2 * (2 * 128 + 2 * 4 * 16) * 4
    true = dataclasses.replace(TRUE, bytes_per_token_layer=shape_bytes_per_token_layer(mqa, 4))
    measured = synthetic(grid(), true, noise=0.0, shape=mqa)
    assert all_to_all_value_bytes(measured, mqa) == 4
    got = fit(measured, layer_bytes(4, mqa))
    assert got.bandwidth == pytest.approx(TRUE.bandwidth, rel=1e-3)
    at = {depth: got.cost_model(dataclasses.replace(mqa, layers=depth), 4, 1e10, state_bytes(mqa)) for depth in (1, 2)}
    assert max(abs(row["time_error"]) for row in compare(measured, at)) < 1e-3


def test_mixed_dtype_exchanges_are_priced_at_their_mix_and_a_wrong_count_is_an_error():
    """Under autocast an fp32 RoPE promotes q and k (and the cat q, k, v) to fp32 while the
    output is bf16: an HF model's runs sent 3.3 bytes per value, neither 2 nor 4, and the profile
    measured every point and then raised. The size is what the buffers held, bytes over values;
    only the count of values is the runtime's contract with the formula, checked per point."""
    measured = synthetic(grid(), TRUE, noise=0.0)
    for m in measured:  # two thirds of the values in fp32, a third in bf16
        m.comm_bytes = m.comm_values * (2 * 4 + 2) / 3
    assert all_to_all_value_bytes(measured, TINY) == pytest.approx(10 / 3)
    point = Point(1, (1024,), 2, 0)
    sent = expected_values(point, TINY, 512)
    assert sent == 512 * shape_bytes_per_token_layer(TINY, 1, 2)
    check_exchanged_values(point, TINY, 512, sent)
    check_exchanged_values(Point(1, (1023,), 2, 0), TINY, 512, 0)  # an uneven split is not read exactly
    with pytest.raises(ValueError, match="values"):
        check_exchanged_values(point, TINY, 512, sent * 3 // 4)


def test_fit_needs_recomputed_points():
    points = [p for p in grid() if p.recompute_layers == 0]
    with pytest.raises(ValueError, match="recompute"):
        fit(synthetic(points, TRUE, 0.0), layer_bytes(4))


def test_a_points_seconds_are_its_slowest_ranks_and_its_collective_seconds_their_mean():
    # A wave (and the check's step) ends with its slowest rank; the collectives price the link.
    point = Point(1, (256,), 2, 0)

    def record(seconds: float, comm: float) -> dict:
        return dict(seconds=seconds, comm_seconds=comm, comm_calls=4, comm_bytes=1000, activation_bytes=10,
                    tokens=128, context_seconds=0.0, context_calls=0, context_bytes=0, comm_values=250, context_values=0)

    per_rank = [{"records": [[record(1.0, 0.2), record(2.0, 0.1), record(1.5, 0.3)]]},
                {"records": [[record(1.2, 0.4), record(1.9, 0.3), record(1.1, 0.1)]]}]
    (median,) = combine([point], per_rank, "median")
    assert median.samples == pytest.approx([1.2, 2.0, 1.5])
    assert median.seconds == pytest.approx(1.5)
    assert median.comm_samples == pytest.approx([0.3, 0.2, 0.2])
    assert median.comm_seconds == pytest.approx(0.2)
    (fastest,) = combine([point], per_rank, "min")
    assert (fastest.seconds, fastest.comm_seconds) == pytest.approx((1.2, 0.2))


def test_grid_covers_lengths_degrees_and_recompute_levels():
    points = build_grid(4, [128, 1024, 4096], [1, 2])
    singles = {(p.lengths[0], p.degree, p.recompute_layers) for p in points if len(p.lengths) == 1}
    assert singles == {(s, d, c) for s in (128, 1024, 4096) for d in (1, 2) for c in (0, 2, 4)}
    assert any(len(p.lengths) > 1 for p in points)  # packed micro-batches too
    assert default_lengths(4096, quick=False) == (128, 256, 512, 1024, 2048, 4096)
    assert default_lengths(3000, quick=True) == (128, 512, 2048, 3000)


def test_held_out_points_are_real_batches_at_the_grids_splits_and_levels():
    """Held-out points: batches of stdlib code lengths (split at the grid's longest length) that
    the fit never sees, at the deepest reduced depth, each at a split and level the grid has."""
    settings = Settings(lengths=(128, 1024), depths=(1, 2), verify=0, held_out=6, seed=3)
    points = held_out(TINY, 4, settings)
    assert len(points) == 6 and points == held_out(TINY, 4, settings)  # seeded
    splits = {(d, 1) for d in (1, 2, 4)} | set(context_splits(TINY, 4))
    for p in points:
        assert p.layers == 2 and (p.degree, p.cp) in splits and p.recompute_layers in (0, 1, 2)
        assert max(p.lengths) <= 1024 and p.tokens <= 1024 and p.shapes is None
    assert len({p.lengths for p in points}) == 6  # every one a batch of its own
    assert held_out(TINY, 4, dataclasses.replace(settings, held_out=0)) == []
    with pytest.raises(ValueError, match="--held-out"):
        held_out(TINY, 4, dataclasses.replace(settings, held_out=-1))


def test_plan_grid_extrapolates_from_reduced_depths_and_rejects_bad_settings():
    grid, checks = plan_grid(TINY, 4, Settings(lengths=(128, 1024), depths=(1, 2), verify=3))
    assert {p.layers for p in grid} == {1, 2} and {p.degree for p in grid} == {1, 2, 4}
    assert len(checks) == 3 and all(p.layers == TINY.layers for p in checks)
    # At the model's own depth nothing is extrapolated, so nothing is checked.
    assert plan_grid(TINY, 2, Settings(lengths=(128,), depths=(4, 9), verify=3))[1] == []
    for world, settings in ((3, Settings((128,), (1,), 1)), (2, Settings((0,), (1,), 1)),
                            (2, Settings((128,), (0,), 1)), (2, Settings((128,), (1,), 1, repeats=0)),
                            (2, Settings((128,), (1,), 1, statistic="mean"))):
        with pytest.raises(ValueError):
            plan_grid(TINY, world, settings)


def profiled_cost(world: int = 4, memory_gb: float = 0.1) -> CostModel:
    shape = TINY
    return TRUE.cost_model(shape, world, memory_gb * 1e9, state_bytes(shape),
                           fit={"shape": shape.to_dict(), "load_average": {"median": 0.0},
                                "coefficients": {"act_fixed": TRUE.act_fixed}})


def test_profile_json_round_trips_and_plans_with_every_planner(tmp_path):
    cost = profiled_cost()
    path = tmp_path / "profile.json"
    cost.save(path, provenance())  # as `ballast profile` writes it: where the file comes from, beside the model
    assert json.loads(path.read_text())["provenance"]["torch"] == torch.__version__
    cluster = get_cluster("cpu", world_size=4, device_memory_gb=0.1)
    loaded = get_cost_model(str(path), TINY, cluster)
    # the file holds the profile's own fit; loading prices the run's memory: replicated fp32
    # states (16 B a parameter, as the profile's), and beside what the head was measured to save
    # (act_fixed: the final norm's input and output, the targets) the loss's 3 fp32 [tokens,
    # vocab] tensors at its backward, which the meter counts apart (so no fit holds them), 12 B x
    # 256 a token, folded into the activations, kept under recomputation
    assert cost.loss_per_token == TRUE.act_fixed > 0
    assert loaded.source == "profiled" and loaded.states == cost.states
    assert loaded.loss_per_token == TRUE.act_fixed + 12 * 256
    assert loaded.act_per_token == cost.act_per_token + 12 * 256
    assert loaded.kept * loaded.act_per_token == pytest.approx(cost.kept * cost.act_per_token + 12 * 256, rel=1e-12)
    assert dataclasses.replace(loaded, act_per_token=cost.act_per_token, kept=cost.kept,
                               loss_per_token=cost.loss_per_token) == cost
    assert loaded.comm_latency == {2: TRUE.latency_layer[2] * TINY.layers, 4: TRUE.latency_layer[4] * TINY.layers}
    lengths = [4000, 3000, 900, 700, 500, 300, 200, 120, 64, 33, 7, 1]
    for name in PLANNERS:
        plan = get_planner(name, cluster, loaded, PlannerOptions(time_limit=1.0)).plan(lengths)
        plan.validate(cluster, loaded)
        assert simulate(plan, loaded, 4).step_time > 0, name


def test_model_that_fits_no_degree_is_a_clear_error(capsys):
    with pytest.raises(InfeasibleError, match="does not fit --device-memory-gb 1.000 GB at any SP degree"):
        check_states_fit(get_model_shape("gpt-7b"), 1e9)
    # The command line says so before it spawns any rank.
    assert main(["profile", "--model", "gpt-7b", "--device-memory-gb", "1"]) == 2
    assert "give more than" in capsys.readouterr().err
    with pytest.raises(InfeasibleError):
        TRUE.cost_model(TINY, 2, device_memory=1e6, states=state_bytes(TINY))


def test_check_refuses_a_profile_measured_on_another_device(tmp_path, capsys):
    """`--check` runs plans on local gloo ranks on the CPU: a GPU profile predicts another device,
    so comparing the two would measure nothing but the difference of the devices."""
    path = tmp_path / "gpu-profile.json"
    # As `ballast profile` records it under torchrun on GPUs, and as profiles written before the
    # device was recorded did (the backend alone).
    for machine in (dict(device="cuda", backend="nccl", device_name="NVIDIA H100"), dict(backend="nccl")):
        cost = profiled_cost(world=2)
        dataclasses.replace(cost, fit={**cost.fit, "machine": machine}).save(path)
        assert main(["profile", "--check", str(path), "--plans", "1"]) == 2  # before any rank starts
        error = capsys.readouterr().err
        assert "was measured on cuda (nccl ranks)" in error and "local gloo ranks on the cpu" in error


@pytest.mark.slow
def test_tiny_real_profile_and_check_on_two_ranks(tmp_path):
    """A minimal grid on 2 gloo ranks: depth 1 and 2, two lengths, one full-depth check; the
    JSON loads and plans, and `--check` runs plans from it for real."""
    settings = Settings(lengths=(32, 128), depths=(1, 2), verify=1, warmup=1, repeats=1, held_out=2)
    cost = profile(TINY, 2, 0.05e9, settings, timeout=240)
    path = tmp_path / "profile.json"
    cost.save(path)
    loaded = get_cost_model(str(path), TINY, get_cluster("cpu", world_size=2, device_memory_gb=0.05))
    assert loaded.source == "profiled" and loaded.layers == TINY.layers and 2 in loaded.bandwidth
    # Local ranks are gloo on the CPU in fp32, and the profile says so whatever the machine has.
    machine = loaded.fit["machine"]
    assert (machine["device"], machine["backend"], loaded.fit["all_to_all_value_bytes"]) == ("cpu", "gloo", 4)
    assert loaded.bytes_per_token == TINY.layers * shape_bytes_per_token_layer(TINY, 4)
    # b may fit to 0 here: 32- and 128-token micro-batches are nearly all fixed seconds (g, g_r).
    assert loaded.a >= 0 and loaded.b >= 0 and 0 < loaded.kept < 1 and loaded.act_per_token > 0
    # Fit quality is not asserted here: a loaded machine's timings are noise at these sizes, and
    # the fit's accuracy is what the synthetic tests check. The report must be complete.
    assert len(loaded.fit["extrapolation"]) == 1 and loaded.fit["residuals"]["time"]["count"] == len(plan_grid(TINY, 2, settings)[0])
    # Held-out micro-batches of real lengths: measured, never fitted, reported apart.
    assert [row["lengths"] for row in loaded.fit["held_out"]] == [list(p.lengths) for p in held_out(TINY, 2, settings)]
    assert loaded.fit["held_out_error"]["time"]["count"] == 2
    # `grid` labels every measurement, in order.
    assert loaded.fit["grid"] == [Measurement.from_dict(m).point.label() for m in loaded.fit["measurements"]]
    # The grid ran CP (1 x 2) too, its terms fitted and its points reported apart.
    assert loaded.context_latency.keys() == {2} and loaded.context_attention > 0
    assert {"ulysses", "cp", "cp recomp", "context_collectives"} <= loaded.fit["residuals_by_kind"].keys()
    assert loaded.fit["states_measured"]["2"] == state_bytes(dataclasses.replace(TINY, layers=2))
    out, png = tmp_path / "check.json", tmp_path / "check.png"
    assert main(["profile", "--check", str(path), "--plans", "2", "--repeats", "1", "--max-len", "128",
                 "--tokens-per-step", "256", "--planners", "static,ballast", "--json", str(out),
                 "--png", str(png)]) == 0
    report = json.loads(out.read_text())
    assert report["provenance"]["commit"] and [p["planner"] for p in report["plans"]] == ["static", "ballast"]
    assert report["setting"]["planners"] == ["static", "ballast", "static 1x2cp"]
    assert report["summary"]["time"]["count"] == 2 and report["plans"][0]["measured_s"] > 0
    # The profile's one full-depth point, run again among the plans, gives the machine's drift.
    assert [p["point"] for p in report["drift"]["points"]] == [loaded.fit["extrapolation"][0]["point"]]
    assert report["drift"]["points"][0]["check_s"] > 0 and report["drift"]["ratio"] > 0
    assert png.stat().st_size > 0
    # The TP terms of degree 2 were measured on both ranks and fitted; the check runs plans on the
    # mesh's pool under TP (a TP rank priced over that link) and through a pipeline.
    terms = loaded.fit["tensor_parallel"]["2"]
    assert terms["bandwidth"] > 0 and terms["latency"] >= 0 and terms["value_bytes"] == 4
    # The factor is held to [1, t]; the fit itself is reported beside it (noise on 2 loaded cores
    # can move it anywhere, so only its presence is asserted).
    assert 1.0 <= terms["compute_factor"] <= 2.0 and len(loaded.fit["tensor_points"]) == 8  # 2 depths x 2 lengths x 2 levels
    assert terms["compute_factor"] == min(max(loaded.fit["compute_factors_fitted"]["2"], 1.0), 2.0)
    assert {row["tokens"] for row in loaded.fit["all_reduces"]} == set(TOKENS)
    for tp, pp in ((2, 1), (1, 2)):
        assert main(["profile", "--check", str(path), "--tp", str(tp), "--pp", str(pp), "--plans", "2", "--repeats",
                     "1", "--max-len", "128", "--tokens-per-step", "256", "--planners", "static,ballast", "--json",
                     str(out), "--png", str(png)]) == 0
        report = json.loads(out.read_text())
        assert (report["setting"]["tp"], report["setting"]["pp"]) == (tp, pp)
        assert report["summary"]["time"]["count"] == 2 and report["drift"]["ratio"] > 0  # on a plain model beside
        assert all(p["degrees"] == [1] and p["measured_s"] > 0 and p["predicted_s"] > 0 for p in report["plans"])


TRUE_CP = dataclasses.replace(TRUE, context_attention=1.3, context_latency_layer={2: 2e-3, 4: 4e-3},
                              context_call_latency={2: 5e-4, 4: 8e-4}, context_bandwidth={2: 3e8, 4: 1.5e8})
SPLITS = [(2, 2), (4, 2), (4, 4)]


def context_grid(depths=(1, 2), lengths=(128, 256, 512, 1024, 2048, 4096)) -> list[Point]:
    return grid(depths, lengths) + [p for depth in depths for p in build_context_grid(depth, lengths, SPLITS)]


def test_fit_recovers_context_parallel_coefficients():
    """Points run u x c (CP alone at degrees 2 and 4, 2 x 2 hybrid): the fit recovers the CP
    attention factor, the CP latency per degree and the CP collectives' own link, the other
    coefficients as without CP, and the cost model predicts every CP point exactly."""
    measured = synthetic(context_grid(), TRUE_CP, noise=0.0)
    gathered = {split: context_bytes_per_token_layer(TINY, 4, *split) for split in SPLITS}
    got = fit(measured, layer_bytes(4), "causal", gathered)
    for name in ("a_layer", "b_layer", "b_fixed", "g_layer", "g_fixed", "recompute_layer",
                 "recompute_attention_layer", "context_attention", "act_layer", "kept_layer", "recompute_fixed_layer"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE_CP, name), rel=1e-3, abs=1e-12), name
    for table in ("bandwidth", "latency_layer", "context_latency_layer", "context_bandwidth", "context_call_latency"):
        assert getattr(got, table) == pytest.approx(getattr(TRUE_CP, table), rel=1e-3), table
    at = {depth: got.cost_model(dataclasses.replace(TINY, layers=depth), 4, 1e10, state_bytes(TINY))
          for depth in (1, 2)}
    rows = compare([m for m in measured if m.point.cp > 1], at)
    assert len(rows) == 2 * 3 * 7 and max(abs(row["time_error"]) for row in rows) < 1e-6
    cost = got.cost_model(TINY, 4, 1e10, state_bytes(TINY))
    # 1e-5: the fit settles the CP points' span scaling by refits and a Nelder-Mead search (1e-4 steps)
    assert (cost.context_attention == pytest.approx(1.3, rel=1e-5)
            and cost.context_latency == pytest.approx({2: 8e-3, 4: 16e-3}, rel=1e-5))
    # Without CP points the fit is what it was: no CP terms, and its JSON as before.
    plain = fit(synthetic(grid(), TRUE, noise=0.0), layer_bytes(4))
    assert plain.context_latency_layer == {} and "context_attention" not in plain.to_dict()


def test_context_points_round_trip_and_say_their_split():
    point = Point(2, (64,) * 8, 4, 0, cp=2)
    assert point.ulysses == 2 and point.label() == "L2 8x64 d4=2x2cp recomp0/2"
    (measured,) = synthetic([point], TRUE_CP)
    assert measured.context_calls == 4 and measured.context_bytes > 0
    assert Measurement.from_dict(json.loads(json.dumps(measured.to_dict()))) == measured
    (plain,) = synthetic([Point(2, (64,), 2, 0)], TRUE)
    assert "cp" not in plain.to_dict()["point"] and "context_seconds" not in plain.to_dict()
    assert Measurement.from_dict(plain.to_dict()) == plain
    recorded = plain.to_dict()  # profiles recorded before the rename name the point's recomputed blocks so
    recorded["point"]["checkpoint_layers"] = recorded["point"].pop("recompute_layers")
    assert Measurement.from_dict(recorded) == plain
    with pytest.raises(ValueError, match="CP part 3"):
        Point(1, (64,), 4, 0, cp=3)


def test_context_grid_and_splits_follow_the_heads():
    """tiny (8 heads) on 4 ranks profiles CP at degree 2 and 4 and the 2 x 2 hybrid; a 6-head
    model's degree 4 has CP splits only (4 = 2 x 2 or 1 x 4), and video clips never run CP."""
    assert context_splits(TINY, 4) == SPLITS and context_splits(TINY, 1) == []
    six = dataclasses.replace(TINY, name="tiny-6h", hidden=96, heads=6, kv_heads=2)
    assert context_splits(six, 4) == SPLITS
    assert context_splits(get_model_shape("dit-tiny"), 4) == []
    grid_points, _ = plan_grid(TINY, 2, Settings(lengths=(128, 1024), depths=(1,), verify=0))
    context = [p for p in grid_points if p.cp > 1]
    assert {(p.degree, p.cp) for p in context} == {(2, 2)}
    assert {p.recompute_layers for p in context} == {0, 1} and any(len(p.lengths) > 1 and p.lengths[0] % 2 for p in context)


def test_check_plans_include_context_parallel_ones():
    """On 2 ranks tiny's 8 heads allow Ulysses at degree 2, so only planners that run CP give
    CP groups: megatron-dynamic-cp (CP only) and static USP (1 x 2), which the check adds next to
    static; their rows are summarised apart."""
    # 30 MB per rank: a 4096-token sequence needs degree 2 even recomputed, so megatron-dynamic-cp runs CP.
    cost = TRUE_CP.cost_model(TINY, 2, 0.03e9, state_bytes(TINY), fit={"shape": TINY.to_dict()})
    planners = checked_planners(["static", "megatron-dynamic-cp", "ballast"], TINY, 2)
    assert [p.label for p in planners] == ["static", "megatron-dynamic-cp", "ballast", "static 1x2cp"]
    assert checked_planners(["ballast"], TINY, 2) == [CheckedPlanner("ballast")]
    assert [p.label for p in checked_planners(["static"], get_model_shape("dit-tiny"), 2)] == ["static"]
    plans = make_plans(cost, "stdlib", 8, 16384, 4096, planners, seed=0)
    by = {}
    for plan in plans:
        by.setdefault(plan.planner, set()).update(splits_used(plan))
    assert by["static 1x2cp"] == {"1x2"} and "1x2" in by["megatron-dynamic-cp"] and by["static"] == {"2x1"}
    rows = [dict(splits=splits_used(p), time_error=0.1 if "1x2" in splits_used(p) else 0.02, act_error=0.0,
                 predicted_s=1.0, composed_s=dict(median=1.0, min=1.0), time_error_step=0.0, noise=0.0,
                 time_error_beyond_noise=0.0) for p in plans]
    summary = summarise(rows)
    assert summary["time_context"]["median"] == pytest.approx(0.1) and summary["time_without_context"]["max"] == 0.02


def test_error_beyond_noise_is_what_a_plans_own_rounds_leave_unexplained():
    # rounds 1.00, 1.04, 1.10 s, measured (median) 1.04 s
    rounds, measured = [1.10, 1.00, 1.04], 1.04
    assert beyond_noise(1.08, rounds, measured) == 0.0  # inside the spread: all noise
    assert beyond_noise(1.20, rounds, measured) == pytest.approx(0.10 / 1.04)  # above the slowest round
    assert beyond_noise(0.95, rounds, measured) == pytest.approx(-0.05 / 1.04)  # below the fastest
    assert beyond_noise(1.0, [1.0], 1.0) == 0.0


def test_default_text_grid_with_context_points_has_full_rank():
    """The fit's columns over the default grid (CP points included) are independent on 2 and 4
    ranks: the CP attention factor, the CP latencies and the Ulysses ones are all determined."""
    for world in (2, 4):
        points, _ = plan_grid(TINY, world, Settings(default_lengths(4096, False), (1, 2), verify=0))
        degrees = sorted({p.ulysses for p in points if p.ulysses > 1})
        context_degrees = sorted({p.degree for p in points if p.cp > 1})
        assert context_degrees == [d for d in (2, 4) if d <= world]
        x = np.column_stack(TimeColumns(points, degrees, context_degrees, True, "causal").at(0.3, 0.4))
        assert np.linalg.matrix_rank(x / np.linalg.norm(x, axis=0), tol=1e-9) == x.shape[1], world
