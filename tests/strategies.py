"""Hypothesis strategies shared by the planners' tests: small clusters, models and batches."""
from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from ballast.vocabulary.cluster import Cluster
from ballast.pricing.coefficients import InfeasibleError
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import ModelShape, get_model_shape

SMALL = ModelShape("small", 8, 1024, 16, 16, 4096, 32000, gated_mlp=False)


def make_cluster(nodes: int, per_node: int, memory: float, g: float = 1e-3, inter_bw: float = 1e10) -> Cluster:
    """`nodes` x `per_node` devices: 100 GB/s all-to-alls inside a node, `inter_bw` across."""
    world = nodes * per_node
    bandwidth = {1 << i: (1e11 if 1 << i <= per_node else inter_bw) for i in range(1, world.bit_length())}
    return Cluster("t", nodes, per_node, memory, 1e14, 0.5, bandwidth, g)


def planner_setups(large_model: str, max_sequences: int):
    """(cluster, cost, lengths): a cluster whose memory holds the model's states (`small`,
    `tiny` or `large_model`), and a long-tailed batch whose every sequence fits some degree."""

    @st.composite
    def draw_setup(draw):
        cluster = make_cluster(draw(st.sampled_from([1, 2, 3, 4])), draw(st.sampled_from([1, 2, 4, 8])),
                               draw(st.floats(0.5, 24.0)) * 1e9, draw(st.sampled_from([0.0, 1e-3, 0.05])))
        shape = draw(st.sampled_from([SMALL, get_model_shape("tiny"), get_model_shape(large_model)]))
        try:
            cost = analytic_cost(shape, cluster)
        except InfeasibleError:
            assume(False)  # the states alone overflow the device: no plan exists
        limit = cost.max_tokens(cost.degrees[-1], 1.0)
        assume(limit >= 1)
        exponents = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=max_sequences))
        return cluster, cost, [max(1, int(limit ** x)) for x in exponents]

    return draw_setup()
