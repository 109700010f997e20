"""The profile's TP terms: the all-reduce link is fitted exactly from timings that follow its
formula, a profile prices a TP rank from its own link (not a preset's), and a profile without
one is refused under --tp with the degree named."""
from __future__ import annotations

import dataclasses

import pytest

from ballast.pricing.cost_sources import get_cost_model
from ballast.pricing.tensor_parallel import (ALL_REDUCES_PER_LAYER, ROOT_ALL_REDUCES, TensorLink,
                                             all_reduce_seconds_per_token, ring_bytes)
from ballast.profile.tensor_link import TOKENS, fit_tensor_link, tensor_degrees
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import get_model_shape

from test_profile import TINY, profiled_cost

LINK = TensorLink(bandwidth=3e8, latency=2e-4, value_bytes=4)


def timed(link: TensorLink, degree: int, hidden: int = TINY.hidden) -> list[dict]:
    """Rows as `time_all_reduces` returns them, each exactly the link's seconds."""
    return [dict(degree=degree, tokens=n, bytes=n * hidden * 4, value_bytes=4,
                 seconds=link.latency + ring_bytes(n * hidden * 4, degree) / link.bandwidth) for n in TOKENS]


def test_the_link_is_fitted_exactly_per_degree():
    slower = TensorLink(1e8, 5e-4, 4)
    links = fit_tensor_link(timed(LINK, 2) + timed(slower, 4))
    for degree, link in ((2, LINK), (4, slower)):
        assert links[degree].bandwidth == pytest.approx(link.bandwidth, rel=1e-9)
        assert links[degree].latency == pytest.approx(link.latency, rel=1e-9)
        assert links[degree].value_bytes == 4


def test_degrees_are_those_the_world_and_the_shape_split():
    assert tensor_degrees(TINY, 1) == [] and tensor_degrees(TINY, 2) == [2] and tensor_degrees(TINY, 8) == [2, 4]  # its 4 kv heads
    assert tensor_degrees(dataclasses.replace(TINY, kv_heads=2), 8) == [2]  # 2 kv heads split 2 ways at most
    assert tensor_degrees(get_model_shape("dit-tiny"), 4) == []  # video models declare no TP split


def test_a_profile_prices_a_tp_rank_from_its_measured_link(tmp_path):
    cost = profiled_cost(world=2)
    path = tmp_path / "profile.json"
    dataclasses.replace(cost, fit={**cost.fit, "tensor_link": {"2": dataclasses.asdict(LINK)}}).save(path)
    cluster = get_cluster("cpu", world_size=2, device_memory_gb=0.1)
    whole = get_cost_model(str(path), TINY, cluster)
    rank = get_cost_model(str(path), TINY, cluster, mesh=JobMesh.of(cluster, tp=2, shape=TINY))
    calls = ALL_REDUCES_PER_LAYER * TINY.layers + ROOT_ALL_REDUCES
    per_token = calls * ring_bytes(TINY.hidden * 4, 2) / LINK.bandwidth
    assert per_token == all_reduce_seconds_per_token(TINY, LINK, 2)
    # A TP rank computes half of every matmul and all-reduces every token's hidden state over the
    # measured link (not the cpu preset's all-to-all bandwidth), one latency per call.
    assert rank.b == pytest.approx(whole.b / 2 + per_token, rel=1e-12)
    assert rank.a == pytest.approx(whole.a / 2, rel=1e-12)
    assert rank.g == pytest.approx(whole.g + calls * LINK.latency, rel=1e-12)
    assert rank.world_size == 1 and rank.heads == TINY.heads // 2 and rank.states < whole.states


def test_a_profile_without_the_degrees_link_is_refused_under_tp(tmp_path):
    path = tmp_path / "profile.json"
    profiled_cost(world=2).save(path)
    cluster = get_cluster("cpu", world_size=2, device_memory_gb=0.1)
    with pytest.raises(ValueError, match=r"measured no TP link of degree 2 \(it has: none\)"):
        get_cost_model(str(path), TINY, cluster, mesh=JobMesh.of(cluster, tp=2, shape=TINY))
