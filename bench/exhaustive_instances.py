"""Tiny instances for the exhaustive search (`ballast/plans/exhaustive.py`), as hypothesis
strategies: the cost models and batches the tests draw, and bench/optimum_gap.py draws many more
of. Needs hypothesis (the `test` extra), as its users do.

It lives here, outside the package (which ships no test helpers) and outside tests/ (which
bench scripts may not import, tests/test_imports.py): the tests import it through pytest's
`pythonpath` (pyproject.toml), the bench as its neighbour. One definition keeps optimum_gap's
record drawn from the very instances the tests draw (hypothesis, derandomized), so the test's
MISS_BOUND set from that record holds for them.

`hand_cost` has round coefficients, so times can be worked out by hand; `tiny_instances` draws
cost models and batches small enough for the search, `tiny_shaped_instances` the same with
video clips under every attention pattern.
"""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from ballast.pricing.cost import CostModel


def hand_cost(**change) -> CostModel:
    """Round coefficients, so micro-batch times can be worked out by hand:
    time = (1e-6 sum s^2 + 1e-3 sum s)(1 + 0.5 c) / d + 1000 sum s / (d bw(d)) + 0.01."""
    fields = dict(source="test", model="toy", a=1e-6, b=1e-3, g=0.01, bandwidth={2: 1e9, 4: 5e8},
                  bytes_per_token=1000.0, act_per_token=1e5, states=1e8, device_memory=1.1e9,
                  layers=4, heads=8, kv_heads=4, world_size=4, recompute=0.5, kept=0.1)
    return CostModel(**{**fields, **change})


@st.composite
def tiny_instances(draw):
    world = draw(st.sampled_from([1, 2, 4]))
    kept = draw(st.sampled_from([0.1, 0.5]))
    cap = draw(st.integers(200, 6000))                 # tokens per device without recomputation
    cost = hand_cost(
        world_size=world, kept=kept, layers=draw(st.sampled_from([1, 2, 4])),
        a=draw(st.sampled_from([1e-9, 1e-7, 1e-6, 1e-5])), b=draw(st.sampled_from([1e-5, 1e-4, 1e-3])),
        g=draw(st.sampled_from([0.0, 1e-3, 0.05, 0.5])), recompute=draw(st.sampled_from([0.0, 1 / 3, 1.0])),
        recompute_attention=draw(st.sampled_from([None, 0.1, 1.0])),  # None: docs/design.md's single r
        heads=draw(st.sampled_from([2, 8])), kv_heads=2, states=0.0, device_memory=cap * 1e5,
        bandwidth={d: draw(st.sampled_from([1e6, 1e8, 1e10])) for d in (2, 4) if d <= world},
        bytes_per_token=draw(st.sampled_from([10.0, 1e3, 1e5])))
    limit = cost.max_tokens(cost.degrees[-1], 1.0)
    lengths = draw(st.lists(st.integers(1, limit), min_size=1, max_size=6))
    return cost, lengths


@st.composite
def tiny_shaped_instances(draw):
    """`tiny_instances` whose batches hold clips (frames, height, width) of up to a few hundred
    tokens beside text, under a causal, full or spatial-temporal pattern: the attention work of
    two samples of equal tokens differs, which the bound and the planners must see."""
    cost, lengths = draw(tiny_instances())
    pattern = draw(st.sampled_from(["causal", "full", "spatial-temporal"]))
    cost = dataclasses.replace(cost, attention=pattern, spatial_share=draw(st.sampled_from([0.5, 0.2, 0.9])))
    limit = cost.max_tokens(cost.degrees[-1], 1.0)
    samples = []
    for s in lengths:
        frames, height = draw(st.integers(1, 5)), draw(st.integers(1, 5))
        width = max(1, s // (frames * height))
        clip = draw(st.booleans()) and frames * height * width <= limit
        samples.append((frames, height, width) if clip else s)
    return cost, samples
