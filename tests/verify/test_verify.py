"""`ballast verify` from the command line: a passing run reports every planner, and exceeding a
tolerance is a non-zero exit (each run spawns 2 gloo ranks for one small step)."""
from __future__ import annotations

import re

import pytest

from ballast.cli import main
from ballast.vocabulary.model_shape import ModelShape, get_model_shape
from ballast.planners import PLANNERS as PLANNERS_ALL, PlannerOptions, get_planner
from ballast.planners.fits import check_fits
from ballast.verify.command import budget
from ballast.verify.reference import random_batches
from ballast.vocabulary.precision import Precision
from ballast.vocabulary.sharding import Sharding

PLANNERS = ["static", "ballast"]
# One step of 6 sequences up to 64 tokens: enough for both planners to lay out a batch that
# the budget `verify` derives makes them recompute, small enough to run in seconds.
ARGS = ["verify", "--world", "2", "--planners", ",".join(PLANNERS), "--model", "tiny", "--steps", "1",
        "--batch", "6", "--max-len", "64"]


def verdicts(out: str) -> list[tuple[str, str]]:
    """(planner, ok / FAIL) of every row of verify's table."""
    return re.findall(rf"^\W*({'|'.join(PLANNERS)})\W.*\b(ok|FAIL)\W*$", out, re.MULTILINE)


@pytest.mark.slow
def test_verify_passes_and_reports_a_row_per_planner(capsys):
    assert main(ARGS) == 0
    assert verdicts(capsys.readouterr().out) == [(name, "ok") for name in PLANNERS]


@pytest.mark.slow
def test_verify_fails_when_a_tolerance_is_exceeded(capsys):
    # Two ranks sum the gradient in another order than one process, and AdamW turns the rounding
    # of small gradient entries into visible update differences: one step leaves a drift of
    # ~1e-5 of the distance moved (measured 1.1e-5), far above 1e-9, far below the default 1e-3.
    assert main([*ARGS, "--param-tolerance", "1e-9"]) == 1
    out = capsys.readouterr().out
    assert verdicts(out) == [(name, "FAIL") for name in PLANNERS]
    assert "2 planner(s) exceed the tolerance: static, ballast" in out


def test_negative_tolerances_are_refused_before_any_rank_starts(capsys):
    assert main([*ARGS, "--grad-tolerance", "-1"]) == 2
    assert "argument --grad-tolerance: must be a finite number >= 0, got -1" in capsys.readouterr().err


@pytest.mark.slow
def test_verify_passes_for_every_planner_routed_over_two_emulated_nodes(capsys):
    args = ["verify", "--world", "4", "--nodes", "2", "--route-every-wave", "--planners", "all", "--model", "tiny",
            "--steps", "1", "--batch", "6", "--max-len", "64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "4 local gloo ranks as 2 nodes, every wave routed" in out
    rows = re.findall(r"^\W*([a-z-]+)\W+\d+\W+([\dx,]+)\W.*\b(ok|FAIL)\W*$", out, re.MULTILINE)
    assert sorted((name, verdict) for name, _, verdict in rows) == sorted((name, "ok") for name in PLANNERS_ALL)
    # Some plans hold Ulysses groups of 4 ranks, over both nodes: their exchanges ran routed.
    assert any("4" in degrees.split(",") for _, degrees, _ in rows)


@pytest.mark.parametrize("flags, message", [
    (["--routed"], "--route-every-wave routes exchanges between nodes, but --nodes is 1: give --nodes 2 or more"),
    (["--nodes", "3"], "cpu cluster: 2 ranks do not form 3 nodes of equal size")])
def test_routing_needs_nodes_that_divide_the_world_before_any_rank_starts(capsys, flags, message):
    assert main([*ARGS, *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("model", ["tiny", "stdit-tiny"])
@pytest.mark.parametrize("max_len", [1, 2, 8, 12])
def test_every_planner_plans_at_a_verify_budget_that_holds_no_token_without_recomputation(model, max_len):
    """verify's budget formula at a tiny --max-len (1.2 x half a sequence's recomputed
    activations over the states, given as --device-memory-gb under --fsdp in fp32) holds less
    than one token per rank without recomputation: every planner still lays out valid plans
    (ballast's packer divided by that zero capacity, flexsp by one rank's). FSDP2 in fp32,
    because its states lie above its after-backward peak for these models, so that budget is a
    device the cost model accepts; replicated and ZeRO-1 hold more after backward than their
    states (AdamW's temporaries, 4 bytes a parameter), and verify's default budget, no less than
    that peak, then holds tokens without recomputation. Up to max-len 12: tiny keeps 5/37 of a
    token's bytes under full recomputation (its loss's 3,072 of 37,888 are never recomputed), so
    1.2 x 16 / 2 x 5/37 holds a token."""
    shape = get_model_shape(model)
    _, priced = budget(shape, 2, max_len, sharding=Sharding.FSDP, precision=Precision.FP32)
    assert priced.states > priced.device.after_backward
    memory = priced.states + 1.2 * priced.act_per_token * priced.kept * max_len / 2
    cluster, cost = budget(shape, 2, max_len, memory / 1e9, sharding=Sharding.FSDP, precision=Precision.FP32)
    assert cost.max_tokens(1, 0.0) == 0
    batches = random_batches(shape, 3, 16, max_len, seed=0)  # verify's defaults
    for name in PLANNERS_ALL:
        planner = get_planner(name, cluster, cost, PlannerOptions(max_len=max_len, time_limit=2.0, lockstep=True))
        for batch in batches:
            planner.plan(batch.planned).validate(cluster, cost)


def test_default_budget_holds_max_len_where_the_heads_allow_degree_1_only():
    """3 heads: no SP degree above 1; the default budget must hold a --max-len sequence on one
    rank (it held only 0.6 of one: 'at most 153 tokens fit' for --max-len 256)."""
    shape = ModelShape("three-heads", 2, 96, 3, 3, 192, 256)
    _, cost = budget(shape, 2, 256)
    assert cost.degrees == [1]
    check_fits(cost, [256])
    assert cost.max_tokens(1, 1.0) < 1.3 * 256  # still a budget that needs recomputation
