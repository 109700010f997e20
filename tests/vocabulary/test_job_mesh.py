"""JobMesh: the TP x pool x PP layout of a job's ranks, its checks and the cluster its plans see."""
from __future__ import annotations

import pytest

from ballast.vocabulary.cluster import GB, get_cluster
from ballast.vocabulary.job_mesh import JobMesh, MeshCoordinate
from ballast.vocabulary.model_shape import MODEL_PRESETS, ModelShape


def test_rank_layout_tp_innermost_then_pool_then_stages():
    mesh = JobMesh(16, 8, tp=2, pp=2)
    assert (mesh.pool, mesh.stage_size) == (4, 8)
    assert mesh.coordinate(0) == MeshCoordinate(0, 0, 0)
    assert mesh.coordinate(1) == MeshCoordinate(0, 0, 1)
    assert mesh.coordinate(2) == MeshCoordinate(0, 1, 0)
    assert mesh.coordinate(9) == MeshCoordinate(1, 0, 1)
    assert all(mesh.rank(c.stage, c.pool_index, c.tp_index) == r for r in range(16) for c in [mesh.coordinate(r)])
    assert mesh.tp_ranks(5) == [4, 5]
    assert mesh.pool_ranks(5) == [1, 3, 5, 7]
    assert mesh.pp_ranks(5) == [5, 13]


def test_groups_partition_the_world_in_every_dimension():
    mesh = JobMesh(16, 8, tp=2, pp=2)
    for groups, size in ((mesh.tp_groups(), 2), (mesh.pools(), 4), (mesh.pipelines(), 2)):
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(16))
    # Every rank's own groups are among them.
    for r in range(16):
        assert mesh.tp_ranks(r) in mesh.tp_groups() and mesh.pool_ranks(r) in mesh.pools()
        assert mesh.pp_ranks(r) in mesh.pipelines()


def test_one_dimension_meshes_are_the_world():
    mesh = JobMesh(8, 8)
    assert mesh.pool == 8 and mesh.pools() == [list(range(8))] and mesh.tp_groups() == [[r] for r in range(8)]
    cluster = get_cluster("a100-64")
    assert JobMesh.of(cluster).pool_cluster(cluster) is cluster


@pytest.mark.parametrize("world, node, tp, pp, message", [
    (64, 8, 16, 1, "TP degree 16 crosses a node: it must divide the node's 8 devices"),
    (64, 8, 3, 1, "TP degree 3 crosses a node"),
    (64, 8, 2, 3, "TP degree 2 x PP degree 3 = 6 does not divide the world of 64 ranks"),
    (24, 8, 1, 2, "a pipeline stage of 12 ranks (world 24 / PP degree 2) neither holds whole nodes of 8"),
    (8, 8, 0, 1, "job mesh: tp must be an integer >= 1, got 0"),
])
def test_bad_meshes_name_the_value_and_the_limit(world, node, tp, pp, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        JobMesh(world, node, tp, pp)


@pytest.mark.parametrize("tp, pp, message", [
    (8, 1, "TP degree 8 does not divide model 'tiny''s 4 kv heads"),
    (16, 1, "TP degree 16 does not divide model 'tiny''s 8 heads"),
    (1, 8, "PP degree 8 does not divide model 'tiny''s 4 layers"),
])
def test_the_model_must_split(tp, pp, message):
    with pytest.raises(ValueError, match=message):
        JobMesh(64, 64, tp, pp).check_model(MODEL_PRESETS["tiny"])


def test_vocabulary_and_mlp_must_split():
    odd = ModelShape("odd", 2, 64, 4, 4, 128, 255)
    with pytest.raises(ValueError, match="TP degree 2 does not divide model 'odd''s 255 vocabulary"):
        JobMesh.of(get_cluster("cpu", 2), tp=2, shape=odd)


def test_ulysses_divides_a_tp_ranks_heads():
    tiny = MODEL_PRESETS["tiny"]  # 8 heads
    mesh = JobMesh(16, 16, tp=2)
    assert mesh.local_heads(tiny) == 4
    assert mesh.split_why_not(tiny, 4) is None
    why = mesh.split_why_not(tiny, 8)
    assert why is not None and "a TP rank's heads: 8 / TP degree 2" in why
    assert mesh.split_why_not(tiny, 8, cp=2) is None  # Ulysses 4 x CP 2


def test_pool_cluster_of_a100_nodes():
    cluster = get_cluster("a100-64")
    pool = JobMesh.of(cluster, tp=2).pool_cluster(cluster)
    assert (pool.nodes, pool.devices_per_node, pool.world_size) == (8, 4, 32)
    assert pool.device_memory == cluster.device_memory
    # A pool group of d ranks spans the d t devices of its block: their all-to-all bandwidth.
    assert pool.bandwidth == {d: cluster.bandwidth[2 * d] for d in (2, 4, 8, 16, 32)}
    # One NIC per GPU: the pool's ranks of TP index 0 each keep their own NIC, whole.
    assert pool.nics_per_node == 4 and pool.nic_bandwidth == cluster.nic_bandwidth


def test_pool_cluster_shares_a_nic_between_tp_indices():
    cluster = get_cluster("a800-64")  # 4 NICs per node of 8, two GPUs under each
    pool = JobMesh.of(cluster, tp=2).pool_cluster(cluster)
    assert pool.nic_devices == [[0], [1], [2], [3]] and pool.nic_bandwidth == 12.5 * GB


def test_pool_cluster_of_stages():
    cluster = get_cluster("a100-64")
    pool = JobMesh.of(cluster, tp=8, pp=4).pool_cluster(cluster)  # stages of 2 nodes, a TP group a node
    assert (pool.nodes, pool.devices_per_node) == (2, 1) and pool.bandwidth == {2: cluster.bandwidth[16]}
    small = JobMesh(8, 8, tp=2, pp=2).pool_cluster(get_cluster("a100-8"))  # stages of half a node
    assert (small.nodes, small.devices_per_node, small.nic_bandwidth) == (1, 2, None)


def test_mesh_of_another_cluster():
    with pytest.raises(ValueError, match="does not describe cluster 'a100-64'"):
        JobMesh(16, 8, tp=2).pool_cluster(get_cluster("a100-64"))
