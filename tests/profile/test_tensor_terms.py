"""The profile's TP terms: the all-reduce link and the compute factor are fitted exactly from
timings that follow their formulas, a profile prices a TP rank from its own terms (not a
preset's), and a profile without them is refused under --tp with the degree named."""
from __future__ import annotations

import dataclasses

import pytest

from ballast.pricing.cost_sources import get_cost_model
from ballast.pricing.tensor_parallel import (ALL_REDUCES_PER_LAYER, ROOT_ALL_REDUCES, TensorTerms,
                                             all_reduce_seconds_per_token, ring_bytes, sharded)
from ballast.profile.tensor_terms import TOKENS, fit_tensor_terms, tensor_degrees, tensor_points
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import get_model_shape

from ballast.profile.profiler import state_bytes

from test_profile import TINY, TRUE, profiled_cost

LINK = TensorTerms(bandwidth=3e8, latency=2e-4, value_bytes=4)


def timed(link: TensorTerms, degree: int, hidden: int = TINY.hidden) -> list[dict]:
    """Rows as `time_all_reduces` returns them, each exactly the link's seconds."""
    return [dict(degree=degree, tokens=n, bytes=n * hidden * 4, value_bytes=4,
                 seconds=link.latency + ring_bytes(n * hidden * 4, degree) / link.bandwidth) for n in TOKENS]


def test_the_link_and_the_compute_factor_are_fitted_exactly_per_degree():
    slower = TensorTerms(1e8, 5e-4, 4, compute_factor=1.3)
    points = tensor_points(TINY, (512, 1024, 4096), (1, 2))
    assert [(p.layers, p.lengths, p.recompute_layers) for p in points] == [
        (depth, (n,), k) for depth in (1, 2) for n in (1024, 4096) for k in (0, depth)]
    # Seconds as the whole model at each depth and a TP rank of degree 4 under the slower terms
    # would run them, on a machine 10% slower than the profile's (both layouts measured side by
    # side see it alike); degree 2 has no points measured and keeps its compute split exactly.
    costs = {depth: coefficients_at(depth) for depth in (1, 2)}
    mesh = JobMesh(world_size=4, devices_per_node=4, tp=4)

    def seconds(point, terms):
        cost = costs[point.layers]
        slow = dataclasses.replace(cost, a=cost.a * 1.1, b=cost.b * 1.1)
        rank = sharded(slow, dataclasses.replace(TINY, layers=point.layers), terms, mesh) if terms else slow
        return rank.time(list(point.lengths), 1, point.recompute_layers / point.layers)

    measured = {4: {"tp": [seconds(p, slower) for p in points], "whole": [seconds(p, None) for p in points]}}
    terms, fitted = fit_tensor_terms(timed(LINK, 2) + timed(slower, 4), points, measured, costs, TINY)
    for degree, link, factor in ((2, LINK, 1.0), (4, slower, 1.3)):
        assert terms[degree].bandwidth == pytest.approx(link.bandwidth, rel=1e-9)
        assert terms[degree].latency == pytest.approx(link.latency, rel=1e-9)
        assert terms[degree].value_bytes == 4
    assert terms[2].compute_factor == 1.0
    # The drift is in both layouts' compute, which the fit takes as the whole model measured it:
    # the factor comes out exact, where one fitted against the profile's own prediction would be
    # off by the drift.
    assert terms[4].compute_factor == pytest.approx(1.3, rel=1e-9) and fitted == {4: pytest.approx(1.3, rel=1e-9)}


def test_a_compute_factor_outside_its_bounds_is_held_to_them_and_reported_as_fitted():
    # Measured TP seconds below what the link's fixed terms alone predict (the fit goes negative)
    # and far above the whole model's (the fit goes past t): the terms keep 1 and t.
    points = tensor_points(TINY, (512, 1024, 4096), (1, 2))
    costs = {depth: coefficients_at(depth) for depth in (1, 2)}
    whole = [costs[p.layers].time(list(p.lengths), 1, p.recompute_layers / p.layers) for p in points]
    for tp_seconds, bound in (([1e-9] * len(points), 1.0), ([w * 50 for w in whole], 2.0)):
        terms, fitted = fit_tensor_terms(timed(LINK, 2), points, {2: {"tp": tp_seconds, "whole": whole}}, costs, TINY)
        assert terms[2].compute_factor == bound and (fitted[2] < 1.0 if bound == 1.0 else fitted[2] > 2.0)


def coefficients_at(depth: int):
    return TRUE.cost_model(dataclasses.replace(TINY, layers=depth), 4, 0.1e9, state_bytes(TINY))


def test_degrees_are_those_the_world_and_the_shape_split():
    assert tensor_degrees(TINY, 1) == [] and tensor_degrees(TINY, 2) == [2] and tensor_degrees(TINY, 8) == [2, 4]  # its 4 kv heads
    assert tensor_degrees(dataclasses.replace(TINY, kv_heads=2), 8) == [2]  # 2 kv heads split 2 ways at most
    assert tensor_degrees(get_model_shape("dit-tiny"), 4) == []  # video models declare no TP split


def test_a_profile_prices_a_tp_rank_from_its_measured_terms(tmp_path):
    cost = profiled_cost(world=2)
    path = tmp_path / "profile.json"
    terms = dataclasses.replace(LINK, compute_factor=1.2)
    dataclasses.replace(cost, fit={**cost.fit, "tensor_parallel": {"2": dataclasses.asdict(terms)}}).save(path)
    cluster = get_cluster("cpu", world_size=2, device_memory_gb=0.1)
    whole = get_cost_model(str(path), TINY, cluster)
    rank = get_cost_model(str(path), TINY, cluster, mesh=JobMesh.of(cluster, tp=2, shape=TINY))
    calls = ALL_REDUCES_PER_LAYER * TINY.layers + ROOT_ALL_REDUCES
    per_token = calls * ring_bytes(TINY.hidden * 4, 2) / LINK.bandwidth
    assert per_token == all_reduce_seconds_per_token(TINY, LINK, 2)
    # A TP rank computes its shard's share of the compute at the measured factor and all-reduces
    # every token's hidden state over the measured link (not the cpu preset's all-to-all
    # bandwidth), one latency per call.
    assert rank.b == pytest.approx(whole.b * 1.2 / 2 + per_token, rel=1e-12)
    assert rank.a == pytest.approx(whole.a * 1.2 / 2, rel=1e-12)
    assert rank.g == pytest.approx(whole.g + calls * LINK.latency, rel=1e-12)
    assert rank.world_size == 1 and rank.heads == TINY.heads // 2 and rank.states < whole.states


def test_a_profile_without_the_degrees_terms_is_refused_under_tp(tmp_path):
    path = tmp_path / "profile.json"
    profiled_cost(world=2).save(path)
    cluster = get_cluster("cpu", world_size=2, device_memory_gb=0.1)
    with pytest.raises(ValueError, match=r"measured no TP terms of degree 2 \(it has: none\)"):
        get_cost_model(str(path), TINY, cluster, mesh=JobMesh.of(cluster, tp=2, shape=TINY))
