"""The plan contract (ballast/plans/plan.py): invariants, plain data, table."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.plans.plan import Group, MicroBatch, Plan, PlanError, Wave, fill_idle, splits_used
from ballast.vocabulary.model_shape import get_model_shape
from ballast.pricing import remapping

LENGTHS = [100, 200, 300, 400, 500, 600]


def good_plan() -> Plan:
    """Two waves on 4 ranks: a degree-2 group with two micro-batches next to two single ranks,
    then one degree-4 group and nothing else."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1]), MicroBatch([2], 0.25)]),
              Group(2, 1, [MicroBatch([3])]),
              Group(3, 1, [MicroBatch([4], 1.0)])]),
        Wave([Group(0, 4, [MicroBatch([5], 0.5)])]),
    ], planner="hand", info={"note": "made in a test", "degree": 2})


def test_good_plan_validates(cpu4, tiny4):
    plan = good_plan()
    plan.validate(cpu4, tiny4)
    plan.validate(cpu4)      # without a cost model: structure only
    assert plan.tokens == sum(LENGTHS)
    assert plan.degrees_used() == [1, 2, 4]
    assert plan.group_of(0, 1).start == 0 and plan.group_of(1, 3).degree == 4
    assert [len(list(plan.micro_batches()))] == [5]


def test_idle_groups_are_fine(cpu4, tiny4):
    plan = Plan([10, 20], [Wave(fill_idle([Group(2, 2, [MicroBatch([0, 1])])], 4))])
    assert [(g.start, g.degree) for g in plan.waves[0].groups] == [(0, 1), (1, 1), (2, 2)]
    plan.validate(cpu4, tiny4)
    assert plan.busy_micro_batches() == 1  # the fillers' empty micro-batches do not count


def test_recomputed_fraction_weighs_levels_by_tokens():
    # 300 tokens at 0, 300 at 0.25, 400 at 0, 500 at 1.0, 600 at 0.5, over 2100 tokens.
    assert good_plan().recomputed_fraction() == (300 * 0.25 + 500 * 1.0 + 600 * 0.5) / 2100
    assert good_plan().busy_micro_batches() == 5


def broken(edit) -> Plan:
    plan = good_plan()
    edit(plan)
    return plan


def w(plan, wave):
    return plan.waves[wave].groups


# Each case breaks one invariant; the message must say where (wave, group, micro-batch) and what.
CASES = {
    "duplicate sequence": (
        lambda p: w(p, 0)[1].micro_batches[0].seq_ids.append(0),
        r"wave 0, group 1 .*micro-batch 0: sequence 0 already appears in wave 0, group 0"),
    "duplicate in a later wave": (
        lambda p: w(p, 1)[0].micro_batches[0].seq_ids.append(3),
        r"wave 1, group 0 .*: sequence 3 already appears in wave 0, group 1"),
    "missing sequence": (
        lambda p: w(p, 0)[2].micro_batches[0].seq_ids.clear(),
        r"sequence 4 \(500 tokens\) is in no micro-batch"),
    "two missing": (
        lambda p: w(p, 0)[0].micro_batches.pop(0),
        r"sequence 0 \(100 tokens\) is in no micro-batch \(and 1 more\)"),
    "id out of range": (
        lambda p: w(p, 0)[2].micro_batches[0].seq_ids.append(6),
        r"wave 0, group 2 .*micro-batch 0: sequence 6 is not in the batch of 6"),
    "negative id": (
        lambda p: w(p, 1)[0].micro_batches[0].seq_ids.append(-1),
        r"wave 1, group 0 .*micro-batch 0: sequence -1 is not in the batch"),
    "misaligned group": (
        lambda p: w(p, 0).__setitem__(slice(None), [Group(0, 1), Group(1, 2, [MicroBatch([0, 1, 2, 3, 4])]),
                                                    Group(3, 1)]),
        r"wave 0, group 1 \(ranks 1..2\): not aligned: start 1 is not divisible by size 2"),
    "overlapping groups": (
        lambda p: w(p, 0).__setitem__(1, Group(1, 1, [MicroBatch([3])])),
        r"wave 0, group 1 \(ranks 1..1\): rank 1 is also in another group of the wave"),
    "uncovered rank": (
        lambda p: (w(p, 0).pop(2), w(p, 0)[1].micro_batches.append(MicroBatch([4]))),
        r"wave 0: rank 3 is in no group"),
    "non-power-of-two group": (
        lambda p: w(p, 1).__setitem__(0, Group(0, 3, [MicroBatch([5])])),
        r"wave 1, group 0 \(ranks 0..2\): size 3 is not a power of two"),
    "group beyond the cluster": (
        lambda p: w(p, 1).__setitem__(0, Group(0, 8, [MicroBatch([5])])),
        r"wave 1, group 0 \(ranks 0..7\): outside the cluster's 4 ranks"),
    "group at a negative rank": (
        lambda p: w(p, 1).insert(0, Group(-2, 2)),
        r"wave 1, group 0 \(ranks -2..-1\): outside the cluster's 4 ranks"),
    "memory overflow": (
        # replicated fp32: 16 B x 803,968 = 12.9 MB of states and 30000 x 37,888 B (17 h values
        # of 4 B per layer, 34,816, and the loss's 12 B x 256, 3,072) = 1.137 GB
        lambda p: p.lengths.__setitem__(3, 30_000),
        r"wave 0, group 1 \(ranks 2..2\), micro-batch 0: sequences \[3\] \(30000 tokens\) need "
        r"1\.15 GB per device at SP degree 1 and recompute 0\.00; the device has 1\.00 GB"),
    "recompute above 1": (
        lambda p: setattr(w(p, 0)[0].micro_batches[1], "recompute", 1.5),
        r"wave 0, group 0 .*micro-batch 1: recompute level 1.5 is outside 0..1"),
    "recompute below 0": (
        lambda p: setattr(w(p, 1)[0].micro_batches[0], "recompute", -0.25),
        r"wave 1, group 0 .*micro-batch 0: recompute level -0.25 is outside 0..1"),
    "lockstep with unequal counts": (
        lambda p: setattr(p, "lockstep", True),
        r"wave 0: lockstep plan but groups run \[1, 2\] micro-batches"),
    "remap domain not aligned": (
        lambda p: p.waves[0].remap.append((1, 2)),
        r"wave 0, remap domain ranks 1..2: neither the whole cluster nor an aligned power-of-two block"),
    "remap domain of one rank": (
        lambda p: p.waves[0].remap.append((3, 1)),
        r"wave 0, remap domain ranks 3..3: neither"),
    "overlapping remap domains": (
        lambda p: p.waves[0].remap.extend([(0, 4), (2, 2)]),
        r"wave 0, remap domain ranks 2..3: overlaps another remap domain"),
    "group partly outside its remap domain": (
        lambda p: p.waves[1].remap.append((0, 2)),
        r"wave 1, remap domain ranks 0..1: group of ranks 0..3 is partly outside it"),
    "remapped slot over memory": (
        # 28000 + 30000 tokens balanced over 2 ranks: 29000 per rank beside the 30000 one rank
        # holds for attention (4/17 of them) need 12.9 MB + (29000 + 1000 x 4/17) x 37,888 B =
        # 1.12 GB without recomputation (~26.1K tokens fit), and the slot runs at its lowest
        # level (0) although the 30000 are at 1.
        lambda p: (p.lengths.__setitem__(3, 28_000), p.lengths.__setitem__(4, 30_000),
                   p.waves[0].remap.append((2, 2))),
        r"wave 0, remap domain ranks 2..3: slot 0: a rank holding 30000 tokens for attention and 29000 "
        r"balanced needs 1.12 GB at recompute 0.00; the device has 1.00 GB"),
    "CP part not a power of two": (
        lambda p: setattr(w(p, 1)[0], "cp", 3),
        r"wave 1, group 0 \(ranks 0..3\): CP part 3 is not a power of two dividing the group's size 4"),
    "CP part above the group": (
        lambda p: setattr(w(p, 0)[0], "cp", 4),
        r"wave 0, group 0 \(ranks 0..1\): CP part 4 is not a power of two dividing the group's size 2"),
    "non-positive loss normaliser": (
        lambda p: setattr(p, "tokens", 0),
        r"loss normaliser tokens=0 must be positive"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_validate_catches(case, cpu4, tiny4):
    edit, message = CASES[case]
    plan = broken(edit)
    with pytest.raises(PlanError, match=message):
        plan.validate(cpu4, tiny4)


def test_memory_is_checked_at_the_groups_degree_and_checkpoint(cpu4, tiny4):
    # 30000 tokens do not fit one device without recomputation (~26.1K do), but they fit with
    # any recomputation at degree 1, or at degree 2 without it: the same sequence passes there.
    assert tiny4.max_tokens(1, 0.0) < 30_000 <= min(tiny4.max_tokens(1, 0.25), tiny4.max_tokens(2, 0.0))
    plan = Plan([30_000], [Wave([Group(0, 1, [MicroBatch([0], 0.25)]), Group(1, 1), Group(2, 2)])])
    plan.validate(cpu4, tiny4)
    plan.waves[0].groups[0].micro_batches[0].recompute = 0.0
    with pytest.raises(PlanError, match="micro-batch 0"):
        plan.validate(cpu4, tiny4)
    plan = Plan([30_000], [Wave([Group(0, 2, [MicroBatch([0])]), Group(2, 2)])])
    plan.validate(cpu4, tiny4)


def test_remapped_micro_batch_is_checked_by_its_domain_not_its_group(cpu4, tiny4):
    # 80000 tokens at degree 2 hold 40000 per rank, over what fits without recomputation
    # (~26.1K). In a remap domain of all 4 ranks they keep 4/17 of those 40000 where attention
    # runs and 13/17 of their 20000 balanced share: ~24.7K token-equivalents, which fit.
    assert tiny4.min_recompute(80_000, 2) > 0 and remapping.min_recompute(tiny4, 40_000, 20_000) == 0.0
    plan = Plan([80_000, 10], [Wave([Group(0, 2, [MicroBatch([0])]), Group(2, 1, [MicroBatch([1])]), Group(3, 1)],
                                    [(0, 4)])])
    plan.validate(cpu4, tiny4)
    plan.waves[0].remap.clear()
    with pytest.raises(PlanError, match=r"group 0 .*micro-batch 0: sequences \[0\] \(80000 tokens\)"):
        plan.validate(cpu4, tiny4)


def test_heads_not_divisible():
    cluster = get_cluster("cpu", world_size=16, device_memory_gb=1.0)
    cost = analytic_cost(get_model_shape("tiny"), cluster)   # 8 heads: degree 16 impossible
    plan = Plan([100, 200], [Wave([Group(0, 16, [MicroBatch([0, 1])])])])
    with pytest.raises(PlanError, match=r"wave 0, group 0 \(ranks 0..15\): SP degree 16 does not divide "
                                        r"the attention heads \(8\)"):
        plan.validate(cluster, cost)
    # an idle group of that size runs nothing, so it does not matter
    Plan([100], [Wave([Group(0, 8, [MicroBatch([0])]), Group(8, 8)])]).validate(cluster, cost)
    # degree 8 does not divide the 4 kv heads: the runtime replicates them, the plan is valid
    Plan([100, 200], [Wave([Group(0, 8, [MicroBatch([0, 1])]), Group(8, 8)])]).validate(cluster, cost)
    # nor does the cluster alone, without a model
    plan.validate(cluster)


def test_context_parallelism_lifts_the_head_rule():
    cluster = get_cluster("cpu", world_size=16, device_memory_gb=1.0)
    cost = analytic_cost(get_model_shape("tiny"), cluster)   # 8 heads
    # degree 16 as Ulysses 8 x CP 2, or CP 16 alone: valid; Ulysses 16 x CP 1 is not
    for cp in (2, 16):
        Plan([100, 200], [Wave([Group(0, 16, [MicroBatch([0, 1])], cp)])]).validate(cluster, cost)
    # the Ulysses part must still divide the heads: 16 = 16 x 1 fails above, and a 6-head model's 4 = 4 x 1
    six = dataclasses.replace(cost, heads=6, kv_heads=2)
    with pytest.raises(PlanError, match=r"SP degree 4 does not divide the attention heads \(6\)"):
        Plan([100], [Wave([Group(0, 4, [MicroBatch([0])]), *fill_idle([], 16)[4:]])]).validate(cluster, six)
    Plan([100], [Wave([Group(0, 4, [MicroBatch([0])], 2), *fill_idle([], 16)[4:]])]).validate(cluster, six)
    # spatial-temporal attention runs a CP part too (its 2D layouts' fallback, `video_sp.py`),
    # its Ulysses part under the same head rule
    video = dataclasses.replace(analytic_cost(get_model_shape("stdit-tiny"), cluster), heads=6, kv_heads=6)
    with pytest.raises(PlanError, match=r"SP degree 4 does not divide the attention heads \(6\)"):
        Plan([100], [Wave([Group(0, 4, [MicroBatch([0])]), *fill_idle([], 16)[4:]])],
             shapes=[(2, 5, 10)]).validate(cluster, video)
    Plan([100], [Wave([Group(0, 4, [MicroBatch([0])], 2), *fill_idle([], 16)[4:]])],
         shapes=[(2, 5, 10)]).validate(cluster, video)


def test_memory_is_checked_at_the_split(cpu4, tiny4):
    # gathered K and V take memory Ulysses does not: a micro-batch that fits at (4, 1) need not at (1, 4)
    tokens = tiny4.max_tokens(4, 0.0, 1)
    assert tiny4.max_tokens(4, 0.0, 4) < tokens
    plan = Plan([tokens], [Wave([Group(0, 4, [MicroBatch([0])], 1)])])
    plan.validate(cpu4, tiny4)
    plan.waves[0].groups[0].cp = 4
    with pytest.raises(PlanError, match=r"at SP degree 4 \(CP 4\) and recompute 0.00"):
        plan.validate(cpu4, tiny4)


def test_lockstep_plan_with_fillers_validates(cpu4, tiny4):
    plan = Plan([10, 20, 30], [Wave([Group(0, 2, [MicroBatch([0]), MicroBatch([1])]),
                                     Group(2, 2, [MicroBatch([2]), MicroBatch([])])])], lockstep=True)
    plan.validate(cpu4, tiny4)


# --- plain data --------------------------------------------------------------------------------
def test_json_round_trip():
    plan = good_plan()
    plan.lockstep, plan.tokens = False, 1234
    plan.waves[0].remap.append((0, 4))
    plan.waves[1].groups[0].cp = 2
    text = plan.to_json()
    assert isinstance(json.loads(text), dict)
    # a group's CP part is written only where there is one, so plans without it read as before
    assert [[g.get("cp") for g in wave] for wave in json.loads(text)["waves"]] == [[None, None, None], [2]]
    back = Plan.from_json(text)
    assert back == plan
    assert back.to_json() == text
    # the round trip keeps every field that matters to the runtime
    assert back.waves[0].groups[0].micro_batches[1].recompute == 0.25
    assert (back.waves[0].remap, back.waves[1].remap) == ([(0, 4)], [])
    assert (back.tokens, back.planner, back.info) == (1234, "hand", {"note": "made in a test", "degree": 2})


def test_plan_recorded_with_the_old_checkpoint_key_loads():
    recorded = {"lengths": [5, 7], "tokens": 12, "lockstep": False,
                "waves": [[{"start": 0, "degree": 1, "micro_batches": [{"seq_ids": [0, 1], "checkpoint": 0.5}]}]]}
    plan = Plan.from_dict(recorded)
    assert plan.waves[0].groups[0].micro_batches[0].recompute == 0.5
    assert json.loads(plan.to_json())["waves"][0][0]["micro_batches"] == [{"seq_ids": [0, 1], "recompute": 0.5}]


def test_default_tokens_is_sum_of_lengths():
    assert Plan([3, 4], []).tokens == 7
    assert Plan([3, 4], [], tokens=5).tokens == 5


MALFORMED = {
    "not a dict": [],
    "no waves": {"lengths": [1], "tokens": 1, "lockstep": False},
    "no lengths": {"waves": [], "tokens": 1, "lockstep": False},
    "no tokens": {"lengths": [1], "waves": [], "lockstep": False},
    "waves not a list": {"lengths": [1], "waves": 3, "tokens": 1, "lockstep": False},
    "group without degree": {"lengths": [1], "tokens": 1, "lockstep": False,
                             "waves": [[{"start": 0, "micro_batches": []}]]},
    "micro-batch without recompute": {"lengths": [1], "tokens": 1, "lockstep": False,
                                       "waves": [[{"start": 0, "degree": 1, "micro_batches": [{"seq_ids": [0]}]}]]},
    "sequence id not a number": {"lengths": [1], "tokens": 1, "lockstep": False,
                                 "waves": [[{"start": 0, "degree": 1,
                                             "micro_batches": [{"seq_ids": ["first"], "recompute": 0}]}]]},
    "remap of a wave that is not there": {"lengths": [1], "tokens": 1, "lockstep": False, "remap": [[3, 0, 2]],
                                          "waves": [[{"start": 0, "degree": 1, "micro_batches": []}]]},
    "degree not a number": {"lengths": [1], "tokens": 1, "lockstep": False,
                            "waves": [[{"start": 0, "degree": "two", "micro_batches": []}]]},
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_from_dict_malformed(case):
    with pytest.raises(PlanError, match="malformed plan"):
        Plan.from_dict(copy.deepcopy(MALFORMED[case]))


# --- table -------------------------------------------------------------------------------------
def test_table():
    text = good_plan().table()
    lines = text.splitlines()
    assert lines[0] == "plan by hand: 6 sequences, 2100 tokens, 2 wave(s)"
    assert lines[1].split() == ["wave", "ranks", "deg", "mbs", "seqs", "tokens", "recomp", "longest"]
    # one row per busy group: wave, ranks, degree, micro-batches, sequences, tokens, mean recompute, longest
    assert [line.split() for line in lines[2:]] == [
        ["0", "0-1", "2", "2", "3", "600", "0.12", "300"],
        ["0", "2-2", "1", "1", "1", "400", "0.00", "400"],
        ["0", "3-3", "1", "1", "1", "500", "1.00", "500"],
        ["1", "0-3", "4", "1", "1", "600", "0.50", "600"],
    ]


def test_table_truncates_and_skips_idle_groups():
    plan = Plan(list(range(1, 9)), [Wave([Group(r, 1, [MicroBatch([r])]) for r in range(8)] + [Group(8, 8)])],
                lockstep=True)
    lines = plan.table(max_rows=3).splitlines()
    assert lines[0].endswith("1 wave(s), lockstep")
    assert len(lines) == 2 + 3 + 1 and lines[-1] == "... 5 more groups"


def test_a_groups_degree_prints_as_u_x_c_everywhere():
    """Every log and table prints a group with a CP part as u x c, Ulysses alone as its degree."""
    plan = Plan([8, 8, 8], [Wave([Group(0, 2, [MicroBatch([0])], cp=2), Group(2, 2, [MicroBatch([1])])]),
                            Wave([Group(0, 4, [MicroBatch([2])], cp=2)])])
    assert splits_used([plan]) == ["2", "1x2", "2x2"]
    assert "1x2" in plan.table()
