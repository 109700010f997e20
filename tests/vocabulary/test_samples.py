"""Samples with shapes: attention units per pattern against a direct count of attended pairs,
text unchanged, shaped plans through JSON, malformed samples (ballast/samples.py)."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import MODEL_PRESETS, get_model_shape
from ballast.plans.plan import Group, MicroBatch, Plan, PlanError, Wave
from ballast.vocabulary.samples import attention_units, check_samples
from ballast.pricing.bounds import lower_bound

PATTERNS = ("causal", "full", "spatial-temporal")


def attended_pairs(frames: int, height: int, width: int, kind: str) -> int:
    """(query, key) pairs a block attends over a clip, counted from the mask itself."""
    tokens = list(itertools.product(range(frames), range(height * width)))   # (frame, patch) in order
    def attends(i, j):
        (fq, pq), (fk, pk) = tokens[i], tokens[j]
        return {"causal": j <= i, "full": True, "spatial": fq == fk, "temporal": pq == pk}[kind]
    return sum(attends(i, j) for i in range(len(tokens)) for j in range(len(tokens)))


@settings(max_examples=30)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.sampled_from([0.5, 0.25, 1.0]))
def test_units_are_the_attended_pairs_flops(frames, height, width, share):
    # One attended pair costs QK^T and AV: 4 head-dim FLOPs forward. A causal unit is s^2 for
    # s(s+1)/2 pairs (the analytic a = 6 L h / F prices 2 s^2 h forward FLOPs: s^2 / 2 pairs,
    # the diagonal left out), so a unit is half a pair and a bidirectional mask costs 2 units
    # per pair. Under spatial-temporal, `share` of the blocks use the frame mask.
    clip, n = (frames, height, width), frames * height * width
    full = attended_pairs(*clip, "full")
    assert attention_units([clip], "full")[0] == 2 * full == 2 * n * n
    mixed = share * attended_pairs(*clip, "spatial") + (1 - share) * attended_pairs(*clip, "temporal")
    assert attention_units([clip], "spatial-temporal", share)[0] == pytest.approx(2 * mixed, rel=1e-12)
    causal = attended_pairs(*clip, "causal")
    assert attention_units([clip], "causal")[0] == n * n == 2 * causal - n   # s^2 = 2 pairs - diagonal


def test_text_is_priced_exactly_as_before():
    # A text length, its 1-tuple and a (1, 1, s) clip are the same sample under causal attention:
    # bit-identical to the text-only model's s^2, so every recorded text result stands.
    cost = analytic_cost(get_model_shape("llama3-8b"), get_cluster("h100-32"))
    lengths = [1, 17, 4096, 131072, 393216]
    s = np.asarray(lengths, dtype=np.float64)
    assert (cost.units(lengths) == s * s).all()
    assert (cost.units([(1, 1, x) for x in lengths]) == s * s).all()
    assert cost.time(lengths, 4, 0.5) == cost.time([(1, 1, x) for x in lengths], 4, 0.5)
    assert lower_bound(cost, lengths) == lower_bound(cost, [(1, 1, x) for x in lengths])
    assert check_samples([(5,), [2, 3, 4]]) == [5, (2, 3, 4)]


def test_equal_tokens_differ_in_work_by_shape():
    # 4096 tokens as one frame of 64 x 64, or 64 frames of 8 x 8, or 4096 frames of one patch:
    # under spatial-temporal attention their work differs several-fold; under full it does not.
    clips = [(1, 64, 64), (64, 8, 8), (4096, 1, 1)]
    st_units = attention_units(clips, "spatial-temporal")
    assert st_units[0] / st_units[1] > 30 and st_units[2] / st_units[1] > 30
    assert len(set(attention_units(clips, "full"))) == 1


def test_shaped_costs_follow_units():
    cluster = get_cluster("h200-32")
    for name in ("stdit3-1b", "stdit3-5b", "wan-1.3b", "wan-14b", "stdit-tiny", "dit-tiny"):
        shape = MODEL_PRESETS[name]
        cost = analytic_cost(shape, cluster)
        assert cost.attention == shape.attention and cost.units([(3, 4, 5)])[0] > 0
        clip = (15, 45, 80)
        flat = dataclasses.replace(cost, attention="causal")
        # the same tokens: memory and all-to-alls agree, attention does not
        assert cost.memory([clip], 4, 0.0) == flat.memory([54000], 4, 0.0)
        assert cost.time([clip], 4, 0.0) != flat.time([54000], 4, 0.0)


def test_video_presets():
    # Parameter counts of the published models (Open-Sora 1.2: 1.1B; Wan 2.1: 1.3B and 14B)
    params = {name: MODEL_PRESETS[name].params / 1e9 for name in ("stdit3-1b", "stdit3-5b", "wan-1.3b", "wan-14b")}
    assert params["stdit3-1b"] == pytest.approx(1.1, abs=0.15)
    assert params["stdit3-5b"] == pytest.approx(5.0, abs=0.2)
    assert params["wan-1.3b"] == pytest.approx(1.4, abs=0.1)
    assert params["wan-14b"] == pytest.approx(14.0, abs=0.3)
    cluster = get_cluster("h100-32")
    # heads must divide the degree: Wan 1.3B's 12 heads allow 1, 2, 4; Wan 14B's 40 up to 8
    assert analytic_cost(MODEL_PRESETS["wan-1.3b"], cluster).degrees == [1, 2, 4]
    assert analytic_cost(MODEL_PRESETS["wan-14b"], cluster).degrees == [1, 2, 4, 8]
    assert analytic_cost(MODEL_PRESETS["stdit3-1b"], cluster).degrees == [1, 2, 4, 8, 16]


def test_malformed_samples_are_named():
    with pytest.raises(ValueError, match="sequence 1 has length 0"):
        check_samples([3, 0])
    with pytest.raises(ValueError, match=r"sample 2 has shape \(2, 0, 3\)"):
        check_samples([3, 4, (2, 0, 3)])
    with pytest.raises(ValueError, match=r"sample 0 has shape \(2, 3\)"):
        check_samples([(2, 3)])
    with pytest.raises(ValueError, match="sample 0 is 2.5"):
        check_samples([2.5])
    with pytest.raises(ValueError, match="attention pattern 'sparse'"):
        attention_units([3], "sparse")


def test_shaped_plan_round_trips_through_json():
    plan = Plan([20, 7], [Wave([Group(0, 1, [MicroBatch([0, 1])])])], shapes=[(1, 4, 5), 7])
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.samples == [(1, 4, 5), 7] and again.mb_samples(again.waves[0].groups[0].micro_batches[0]) == [(1, 4, 5), 7]
    assert "shapes" not in Plan([20], [Wave([Group(0, 1, [MicroBatch([0])])])]).to_dict()
    with pytest.raises(PlanError, match="shapes do not match its lengths"):
        Plan([21, 7], [Wave([Group(0, 1, [MicroBatch([0, 1])])])], shapes=[(1, 4, 5), 7])
