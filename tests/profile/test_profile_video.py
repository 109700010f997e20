"""`ballast profile` for video DiTs: the fit recovers known spatial and temporal coefficients
(and so a and the spatial share), the default video grid separates the pattern's terms, video
profiles round-trip through JSON, and a tiny real profile of stdit-tiny runs on 2 gloo ranks."""
from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest

from ballast.cli import main
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import get_cost_model
from ballast.dataset.clip_sources import video_source
from ballast.vocabulary.model_shape import get_model_shape
from ballast.planners import PlannerOptions, get_planner
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.profile.sources import SOURCE_PACK_SHARES, check_source, packed_clips, scaled_clips, source_packs
from ballast.vocabulary.patterns import SPATIAL_TEMPORAL, fit_attention
from ballast.profile.coefficients import Coefficients
from ballast.profile.columns import TimeColumns, separates_rank_samples
from ballast.profile.grid import Point
from ballast.profile.fit import fit
from ballast.profile.residuals import prediction_errors
from ballast.profile.grid import Measurement, Point
from ballast.profile.video_grid import build_video_grid, video_clips
from ballast.profile.measure import point_plan
from ballast.profile.profiler import measured_bytes_per_token_layer, profile, shape_bytes_per_token_layer, state_bytes
from ballast.profile.settings import Settings, default_video_sizes, held_out, plan_grid
from ballast.vocabulary.samples import attention_units
from ballast.plans.timeline import simulate

from synthetic_measurements import synthetic

def attention_blocks(depth: int) -> tuple[int, ...]:
    return SPATIAL_TEMPORAL.block_counts(depth)


def spatial_temporal_a(spatial: float, temporal: float) -> tuple[float, float]:
    return fit_attention(SPATIAL_TEMPORAL, [spatial, temporal])


STDIT = get_model_shape("stdit-tiny")
DIT = get_model_shape("dit-tiny")
# A deeper STDiT, so that depths 2 and 4 extrapolate to 8.
DEEP = dataclasses.replace(STDIT, name="stdit-8", layers=8)
BYTES = shape_bytes_per_token_layer(STDIT, 4)
COMMON = dict(b_layer=4e-5, b_fixed=2e-5, g_layer=4e-3, g_fixed=5e-3, recompute_layer=0.4,
              recompute_attention_layer=0.25, latency_layer={2: 3e-3, 4: 5e-3}, bandwidth={2: 4e8, 4: 2e8},
              call_latency={2: 6e-4, 4: 1e-3}, bytes_per_token_layer=BYTES, act_fixed=2600.0,
              act_layer=11000.0, kept_layer=500.0, recompute_fixed_layer=2e-3)
# A spatial pair costs more than a temporal one (c_s != c_t), so the measured share is not 0.5.
C_S, C_T = 3e-8, 1e-8
TRUE_ST = Coefficients(a_layer=(C_S + C_T) / 2, spatial_layer=C_S, temporal_layer=C_T, attention="spatial-temporal",
                       **COMMON)
TRUE_FULL = Coefficients(a_layer=2e-8, attention="full", **COMMON)
DEGREES = (1, 2, 4)


def video_grid(attention: str, depths=(2, 4), sizes=(512, 2048), degrees=DEGREES) -> list[Point]:
    clips = video_clips(attention, sizes, degrees)
    return [p for depth in depths for p in build_video_grid(depth, clips, degrees)]


def exchanged(degrees=DEGREES) -> dict[int, float]:
    return {d: BYTES for d in degrees}


def test_spatial_temporal_a_matches_the_blocks_on_every_clip():
    """a q(sigma) = spatial F S^2 + temporal S F^2 for any clip, and sigma is the spatial part's share."""
    a, share = spatial_temporal_a(3.0, 1.0)
    assert (a, share) == (2.0, 0.75)
    for clip in [(1, 1, 1), (4, 8, 8), (64, 2, 2), (5, 3, 7)]:
        f, s = clip[0], clip[1] * clip[2]
        assert a * attention_units([clip], "spatial-temporal", share)[0] == pytest.approx(3.0 * f * s * s + 1.0 * s * f * f)
    # Outside [0, 1] (an unconstrained fit): clamped, with a warning; nothing measured: a = 0.
    with pytest.warns(UserWarning, match="clamped"):
        assert spatial_temporal_a(-1.0, 2.0) == (1.0, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spatial_temporal_a(0.0, 0.0) == (0.0, 0.5)
    assert attention_blocks(4) == (2, 2) and attention_blocks(1) == (1, 0)  # spatial first, as STDiT


def test_fit_recovers_spatial_and_temporal_coefficients():
    got = fit(synthetic(video_grid("spatial-temporal"), TRUE_ST), exchanged(), "spatial-temporal")
    assert got.spatial_layer == pytest.approx(C_S, rel=1e-3) and got.temporal_layer == pytest.approx(C_T, rel=1e-3)
    for name in ("b_layer", "b_fixed", "g_layer", "g_fixed", "recompute_layer", "recompute_attention_layer",
                 "recompute_fixed_layer"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE_ST, name), rel=1e-3, abs=1e-12), name
    cost = got.cost_model(DEEP, 4, 1e10, state_bytes(DEEP))
    # 8 blocks: 4 spatial, 4 temporal; a = (4 c_s + 4 c_t) / 2, sigma = c_s / (c_s + c_t).
    assert cost.attention == "spatial-temporal"
    assert cost.a == pytest.approx(2 * (C_S + C_T), rel=1e-3)
    assert cost.spatial_share == pytest.approx(C_S / (C_S + C_T), rel=1e-3)
    assert got.to_dict()["spatial_layer"] == got.spatial_layer and got.to_dict()["attention"] == "spatial-temporal"


def test_rank_samples_are_fitted_for_clips_packed_at_every_degree_only():
    """w_l needs micro-batches of several samples at degree 1 and above (at one of them it is
    the span term again) and a clip model (text models have no conditioning of their own)."""
    packed = [(2, 2, 3)] * 4
    both = [Point.of(2, packed, d, 0) for d in (1, 2)] + [Point.of(2, [(4, 4, 4)], 2, 0)]
    assert separates_rank_samples(both, "full")
    assert not separates_rank_samples(both[:1] + both[2:], "full")
    assert not separates_rank_samples(both[1:], "full")
    text = [Point.of(2, [64] * 4, d, 0) for d in (1, 2)]
    assert not separates_rank_samples(text, "causal")


@pytest.mark.parametrize("attention", ["spatial-temporal", "full"])
def test_fit_recovers_the_span_term_and_prices_it(attention):
    """A cost per attended span (a clip under full attention; a frame or a patch column of a
    spatial-temporal block), per clip where a clip has several spans, per kernel call (a
    distinct span length) and per clip on every rank of a group (its conditioning): the grid's
    tiny clips, of a few shapes and of distinct ones, packed at every degree, let the fit tell
    them from each other, the pairs, the tokens and the fixed costs, and the CostModel it makes
    prices every grid point exactly."""
    true = dataclasses.replace(TRUE_ST if attention == "spatial-temporal" else TRUE_FULL, span_layer=2e-6,
                               sample_layer=5e-5 if attention == "spatial-temporal" else 0.0, call_layer=3e-5,
                               rank_sample_layer=4e-5)
    shape = STDIT if attention == "spatial-temporal" else DIT
    measured = synthetic(video_grid(attention), true)
    got = fit(measured, exchanged(), attention)
    assert got.span_layer == pytest.approx(2e-6, rel=1e-3)
    assert got.call_layer == pytest.approx(3e-5, rel=1e-3)
    assert got.rank_sample_layer == pytest.approx(4e-5, rel=1e-3)
    # A spatial-temporal clip has many spans and one sample: a cost of its own is told apart.
    assert got.sample_layer == pytest.approx(true.sample_layer, rel=1e-3, abs=1e-12)
    assert got.b_layer == pytest.approx(true.b_layer, rel=1e-3) and got.g_layer == pytest.approx(true.g_layer, rel=1e-3)
    at = {depth: got.cost_model(dataclasses.replace(shape, layers=depth), 4, 1e10, state_bytes(shape))
          for depth in (2, 4)}
    assert at[4].span_seconds == pytest.approx(4 * 2e-6, rel=1e-3)
    assert at[4].call_seconds == pytest.approx(4 * 3e-5, rel=1e-3)
    assert at[4].rank_sample_seconds == pytest.approx(4 * 4e-5, rel=1e-3)
    # Exact where no block or every block is recomputed: CostModel recomputes a level's share of
    # every span kind, the runtime the first blocks (at depth 2, level 1/2: the spatial one only).
    whole = [m for m in measured if m.point.recompute_layers in (0, m.point.layers)]
    assert max(abs(row["time_error"]) for row in prediction_errors(whole, at)) < 1e-3


def test_fit_with_noise_extrapolates_spatial_temporal_to_full_depth():
    """3% noise at depths 2 and 4: the depth-8 model predicts depth-8 clips it never saw."""
    got = fit(synthetic(video_grid("spatial-temporal"), TRUE_ST, noise=0.03, seed=1), exchanged(), "spatial-temporal")
    truth = TRUE_ST.cost_model(DEEP, 4, 1e10, state_bytes(DEEP))
    cost = got.cost_model(DEEP, 4, 1e10, state_bytes(DEEP))
    # a within 20%, the share within 0.1: a clip of many frames or columns has many spans too, so
    # under 3% noise the span term takes some of a's part (seeds 1-3: a 0.85-0.90x, share +0.03
    # to +0.10); the predictions below are what must hold.
    assert cost.a == pytest.approx(truth.a, rel=0.2) and cost.spatial_share == pytest.approx(truth.spatial_share, abs=0.1)
    deep = synthetic([Point.of(8, [clip], d, k) for clip in [(2, 32, 32), (512, 2, 2), (16, 8, 8), (8, 12, 20)]
                      for d, k in ((1, 0), (4, 8), (2, 4))], TRUE_ST)
    errors = [abs(row["time_error"]) for row in prediction_errors(deep, {8: cost})]
    assert max(errors) < 0.05, errors


def test_fit_recovers_full_attention():
    measured = synthetic(video_grid("full", depths=(1, 2)), TRUE_FULL)
    got = fit(measured, exchanged(), "full")
    assert got.a_layer == pytest.approx(TRUE_FULL.a_layer, rel=1e-3)
    assert got.spatial_layer is None and "spatial_layer" not in got.to_dict()
    at = {depth: got.cost_model(dataclasses.replace(DIT, layers=depth), 4, 1e10, state_bytes(DIT)) for depth in (1, 2)}
    assert max(abs(row["time_error"]) for row in prediction_errors(measured, at)) < 1e-3
    with pytest.raises(ValueError, match="cannot price"):
        got.cost_model(STDIT, 4, 1e10, state_bytes(STDIT))


def test_default_video_grid_separates_the_attention_terms():
    """The design matrix of the fit over the default grid has full rank: F S^2 and S F^2 (and
    tokens) are not collinear, for spatial-temporal; full attention's units and tokens neither."""
    for shape in (STDIT, DIT):
        settings = Settings(default_video_sizes(2048, False, shape.attention), (2, 4) if shape is STDIT else (1, 2),
                            verify=0)
        for world in (2, 4):
            grid, _ = plan_grid(shape, world, settings)
            assert all(p.shapes is not None for p in grid)
            degrees = sorted({p.degree for p in grid if p.degree > 1})
            x = np.column_stack(TimeColumns(grid, degrees, [], True, shape.attention).at(0.3, 0.4))
            x = x / np.linalg.norm(x, axis=0)
            assert np.linalg.matrix_rank(x, tol=1e-9) == x.shape[1], (shape.name, world)
    # Clips of one aspect (S / F fixed) at every token count would leave the spatial and
    # temporal columns proportional (n S and n F): the grid's clips are chosen so that they are not.
    same = [Point.of(2, [clip], 1, 0) for clip in [(8, 8, 8), (16, 8, 16), (4, 4, 8)]]
    x = np.column_stack(TimeColumns(same, [], [], False, "spatial-temporal").at(0.3, 0.4))
    assert np.linalg.matrix_rank(x[:, :2] / np.linalg.norm(x[:, :2], axis=0), tol=1e-9) == 1
    clips = video_clips("spatial-temporal", (512, 2048), (1, 2))
    assert {math.prod(c) for c in clips} == {512, 2048}
    assert min(c[0] for c in clips) >= 2 and min(c[1] * c[2] for c in clips) >= 4  # a frame, a column per rank


def test_video_grid_plans_and_settings():
    grid, checks = plan_grid(DEEP, 2, Settings((256, 1024), (2, 4), verify=2))
    assert {p.layers for p in grid} == {2, 4} and len(checks) == 2 and {p.layers for p in checks} == {8}
    assert any(len(p.shapes) > 1 for p in grid)  # a packed micro-batch of several clips
    with pytest.raises(ValueError, match="even depth"):
        plan_grid(STDIT, 2, Settings((256,), (1, 2), verify=0))
    plan = point_plan(grid[-1], 2)
    assert plan.shapes is not None and plan.samples == [*grid[-1].shapes] * (2 // grid[-1].degree)
    assert default_video_sizes(2048, quick=True) == (512, 2048)
    assert default_video_sizes(2048, False, "full") == (256, 512, 1024, 2048)
    assert default_video_sizes(2048, True, "full") == (512, 1024, 2048)


def test_measurements_and_video_profiles_round_trip(tmp_path):
    point = Point.of(2, [(4, 8, 8), (16, 2, 2)], 2, 1)
    assert point.lengths == (256, 64) and point.label() == "L2 4x8x8+16x2x2 d2 recomp1/2"
    m = synthetic([point], TRUE_ST)[0]
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    text = synthetic([Point(1, (128, 128), 1, 0)], TRUE_FULL)[0]
    assert "shapes" not in text.to_dict()["point"]  # text measurements as they were
    assert Measurement.from_dict(text.to_dict()) == text
    with pytest.raises(ValueError, match="do not match"):
        Point(1, (10,), 1, 0, ((2, 2, 2),))

    cost = TRUE_ST.cost_model(STDIT, 2, 0.1e9, state_bytes(STDIT),
                              fit={"shape": STDIT.to_dict(), "coefficients": TRUE_ST.to_dict()})
    path = tmp_path / "profile.json"
    cost.save(path)
    loaded = get_cost_model(str(path), STDIT, get_cluster("cpu", world_size=2, device_memory_gb=0.1))
    # (the fit's tables by degree come back with string keys, as JSON has them)
    assert dataclasses.replace(loaded, fit={}) == dataclasses.replace(cost, fit={})
    assert loaded.attention == "spatial-temporal"
    assert loaded.spatial_share == pytest.approx(0.75) and loaded.a == pytest.approx(C_S + C_T)
    stored = json.loads(path.read_text())
    assert stored["fit"]["coefficients"]["spatial_layer"] == C_S and stored["fit"]["coefficients"]["temporal_layer"] == C_T
    batch = [(4, 8, 8), (16, 4, 4), (2, 16, 16), (30, 2, 3), (1, 1, 7)]
    plan = get_planner("ballast", get_cluster("cpu", world_size=2, device_memory_gb=0.1), loaded,
                       PlannerOptions(time_limit=1.0)).plan(batch)
    assert plan.shapes == batch and simulate(plan, loaded, 2).step_time > 0


def test_measured_exchange_bytes_and_scaled_check_clips():
    measured = synthetic(video_grid("spatial-temporal"), TRUE_ST)
    assert measured_bytes_per_token_layer(measured) == pytest.approx(BYTES)
    assert measured_bytes_per_token_layer([m for m in measured if m.point.degree == 1]) == 0.0
    source = scaled_clips(video_source(STDIT.video_geometry), 2048)
    tokens = source.shapes.prod(axis=1)
    assert tokens.max() <= 2048 and tokens.min() >= 1 and len(source.shapes) == len(video_source().shapes)


def test_video_grid_holds_source_packs_apart_from_the_check_and_held_out_batches():
    """Packs of the model's own clips: at every profiled depth and degree, d x the grid's largest
    clip of tokens and twice that (a rank's share of the check's default step), at no and full
    recomputation, seeded, and no batch the check or a held-out point draws (another seed of the
    same source)."""
    settings = Settings(default_video_sizes(2048, False, "spatial-temporal"), (2, 4), verify=0, seed=3)
    packs = source_packs(STDIT, (2, 4), (1, 2), 2048, settings.seed)
    assert packs == source_packs(STDIT, (2, 4), (1, 2), 2048, settings.seed)
    assert SOURCE_PACK_SHARES == (1, 2)
    expected = [(depth, d, share, level) for depth in (2, 4) for d in (1, 2) for share in (1, 2)
                for level in (0, depth)]
    assert [(p.layers, p.degree, p.recompute_layers) for p in packs] == [(L, d, k) for L, d, _, k in expected]
    source = check_source("video", STDIT, 2048)
    known = {tuple(map(int, shape)) for shape in source.shapes}
    for p, (_, d, share, _) in zip(packs, expected):
        assert len(p.shapes) >= 10 * share and set(p.shapes) <= known  # tens of the source's clips
        assert d * share * 2048 / 2 < p.tokens <= d * share * 2048
    grid, _ = plan_grid(STDIT, 2, settings)
    assert all(p in grid for p in packs)
    check = LengthStream(source, BatchSpec(tokens_per_step=2048, max_len=2048), settings.seed).next_batch()
    held = held_out(STDIT, 2, settings)
    drawn = {tuple(p.shapes) for p in packs}
    assert tuple(check) not in drawn and not drawn & {tuple(p.shapes) for p in held}
    with pytest.raises(AssertionError):
        source_packs(get_model_shape("tiny"), (1,), (1,), 512, 0)  # text grids hold none


def test_video_held_out_points_reach_the_largest_source_pack_of_their_degree():
    """A video profile's held-out micro-batches are as large as the check's (a rank's share of its
    step, past one clip), within what the grid measured: up to the largest source pack of their
    degree; every clip one of the scaled source's."""
    settings = Settings(default_video_sizes(2048, False, "spatial-temporal"), (2, 4), verify=0, held_out=24, seed=3)
    held = held_out(DIT, 2, settings)
    known = {tuple(map(int, shape)) for shape in check_source("video", DIT, 2048).shapes}
    assert len(held) == 24 and {p.degree for p in held} == {1, 2}
    for p in held:
        assert set(p.shapes) <= known and p.tokens <= p.degree * SOURCE_PACK_SHARES[-1] * 2048
    assert any(p.tokens > p.degree * 2048 for p in held)  # past one clip per rank, where the check's plans go
    assert any(p.tokens < 1024 for p in held)  # and the small micro-batches planners also form


def test_held_out_clips_fill_their_budget_as_a_planner_packs_them():
    """A held-out pack takes each draw that fits what is left: within a few tokens of its budget
    at every size (the source's smallest clip is 3 tokens), where the stream's own batches stop at
    the first clip that overflows, far short at small budgets; seeded, every clip the source's."""
    source = check_source("video", DIT, 2048)
    known = {tuple(map(int, shape)) for shape in source.shapes}
    for budget in (40, 256, 700, 2048, 8192):
        for seed in range(5):
            batch = packed_clips(source, budget, 2048, seed)
            assert batch == packed_clips(source, budget, 2048, seed) and set(batch) <= known
            assert budget - 4 <= sum(math.prod(c) for c in batch) <= budget
    stopped = [sum(map(math.prod, LengthStream(source, BatchSpec(tokens_per_step=256, max_len=2048), s).next_batch()))
               for s in range(20)]
    assert min(stopped) < 256 // 2  # why the held-out points pack instead


@pytest.mark.slow
def test_tiny_real_stdit_profile_and_check_on_two_ranks(tmp_path):
    """stdit-tiny on 2 gloo ranks at depth 2 (its smallest), clips of two token counts, one
    round: the profile fits and saves, `--check` runs video plans against it."""
    settings = Settings(lengths=(64, 256), depths=(2,), verify=1, warmup=1, repeats=1, held_out=2)
    cost = profile(STDIT, 2, 0.2e9, settings, timeout=240)
    path = tmp_path / "profile.json"
    cost.save(path)
    loaded = get_cost_model(str(path), STDIT, get_cluster("cpu", world_size=2, device_memory_gb=0.2))
    assert loaded.source == "profiled" and loaded.attention == "spatial-temporal" and 0 <= loaded.spatial_share <= 1
    video = loaded.fit["video"]
    assert video["attention"] == "spatial-temporal" and video["spatial_blocks"] == video["temporal_blocks"] == 2
    assert loaded.bytes_per_token > 0 and 2 in loaded.bandwidth and loaded.act_per_token > 0
    assert len(loaded.fit["extrapolation"]) == 1 and loaded.fit["extrapolation"][0]["shapes"]
    # Held-out batches of scaled DCP clips (a clip cannot be cut below a frame: the grid's limit
    # holds), up to the largest source pack of their degree
    held = loaded.fit["held_out"]
    assert len(held) == settings.held_out and all(
        row["shapes"] and max(row["lengths"]) <= 256 and sum(row["lengths"]) <= row["degree"] * 2 * 256 for row in held)
    out = tmp_path / "check.json"
    assert main(["profile", "--check", str(path), "--plans", "2", "--repeats", "1", "--planners", "static,ballast",
                 "--json", str(out), "--png", str(tmp_path / "check.png")]) == 0
    report = json.loads(out.read_text())
    assert report["setting"]["max_len"] == 256 and report["summary"]["time"]["count"] == 2
