"""Strategy: heterogeneous pipelines side by side (Hydraulis' strategies), their rank blocks and checks."""
from __future__ import annotations

import pytest

from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import MODEL_PRESETS
from ballast.vocabulary.strategy import PipelineLayout, Strategy


def test_parse_both_forms_and_round_trip():
    a = Strategy.parse("2x2,2x1,1x1,1x1")
    b = Strategy.parse("[(2,2),(2,1),(1,1),(1,1)]")
    assert a == b and str(a) == "[(2,2),(2,1),(1,1),(1,1)]"
    assert a.world_size == 8 and not a.homogeneous
    assert Strategy.from_list(a.to_list()) == a
    pooled = Strategy.parse("2x2x2")
    assert pooled.pipelines == (PipelineLayout(2, 2, 2),) and pooled.to_list() == [[2, 2, 2]]


@pytest.mark.parametrize("text", ["", "2x", "2x2x2x2", "axb", "2x0", "(2,2)"])
def test_malformed_strategies_name_the_item(text):
    with pytest.raises(ValueError, match="strategy|pipeline"):
        Strategy.parse(text)


def test_every_rank_in_exactly_one_pipeline_at_its_mesh_position():
    s = Strategy.parse("1x4,2x2")
    cluster = get_cluster("cpu", 8)
    ranks = [r for i in range(2) for r in s.ranks(i)]
    assert sorted(ranks) == list(range(8))
    # Each pipeline's mesh is a JobMesh of its own block: its global ranks are the block's, in
    # the layout start + (stage * pool + pool_index) * t + tp_index.
    for i, start in enumerate(s.starts()):
        mesh, p = s.mesh(i, cluster), s.pipelines[i]
        assert mesh.ranks == s.ranks(i) and mesh.first == start
        for stage in range(p.pp):
            for j in range(p.tp):
                rank = mesh.rank(stage, 0, j)
                assert rank == start + stage * p.tp + j and s.pipeline_of(rank) == i
                assert (mesh.coordinate(rank).stage, mesh.coordinate(rank).tp_index) == (stage, j)
    assert [s.pipeline_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_of_mesh_is_one_pipeline():
    s = Strategy.of_mesh(JobMesh(16, 8, tp=2, pp=2))
    assert s.pipelines == (PipelineLayout(2, 2, 4),) and s.homogeneous and s.world_size == 16


def test_check_coverage_nodes_and_model():
    cluster = get_cluster("cpu", 8)
    Strategy.parse("2x2,2x1,1x1,1x1").check(cluster, MODEL_PRESETS["tiny"])
    Strategy.parse("1x4,2x2").check(cluster, MODEL_PRESETS["tiny"])
    with pytest.raises(ValueError, match="holds 6 ranks.*has 8"):
        Strategy.parse("2x2,2x1").check(cluster)
    h100 = get_cluster("h100-16")
    Strategy.parse("4x2,1x4,1x4").check(h100)  # Hydraulis' own 16-GPU layouts
    Strategy.parse("4x2,1x8").check(h100)
    with pytest.raises(ValueError, match="pipeline 1 .*stage 0 .*inside one node"):
        Strategy.parse("1x6,4x1x2,1x2").check(h100)  # a 4-rank stage at ranks 6..9 straddles two nodes
    with pytest.raises(ValueError, match="TP degree 16 crosses a node"):
        Strategy.parse("16x1").check(h100)
    with pytest.raises(ValueError, match=r"pipeline 0 \(1,3\).*PP degree 3 does not divide"):
        Strategy.parse("1x3,1x5").check(cluster, MODEL_PRESETS["tiny"])


def test_block_clusters_are_the_pipelines_own_ranks():
    h100 = get_cluster("h100-32")
    s = Strategy.parse("4x2x2,1x4,1x4,2x2,1x2,1x2")  # 16 + 4 + 4 + 4 + 2 + 2 ranks
    s.check(h100)
    whole, inside = s.block_cluster(0, h100), s.block_cluster(3, h100)
    # Two whole nodes keep their NICs and ring; a share of a node is a node of its own ranks,
    # its exchanges and its ring at the node's all-to-all rates up to its size.
    assert (whole.nodes, whole.devices_per_node, whole.nics_per_node) == (2, 8, h100.nics_per_node)
    assert whole.ring_bandwidth == h100.ring_bandwidth and whole.bandwidth[16] == h100.bandwidth[16]
    assert (inside.nodes, inside.devices_per_node, sorted(inside.bandwidth)) == (1, 4, [2, 4])
    assert inside.ring_bandwidth == h100.bandwidth[4] and inside.bandwidth[2] == h100.bandwidth[2]
    assert s.block_cluster(5, h100).world_size == 2
    mesh = s.mesh(0, h100)
    assert (mesh.world_size, mesh.tp, mesh.pp, mesh.pool) == (16, 4, 2, 2)
    assert [s.mesh(i, h100).world_size for i in range(6)] == [len(s.ranks(i)) for i in range(6)]
    with pytest.raises(ValueError, match=r"pipeline 1 \(1,12\).*neither lies inside one node"):
        Strategy.parse("1x4,1x12").block_cluster(1, get_cluster("h100-16"))
    with pytest.raises(ValueError, match="pipeline 0 .*power of two.*not 6"):
        Strategy.parse("1x6,1x2").block_cluster(0, get_cluster("cpu", 8))
