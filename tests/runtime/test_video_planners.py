"""The video DiTs under every planner's plans train exactly like one process.

`stdit-tiny` (spatial and temporal blocks in turn: 2D sequence parallelism, `video_sp.py`) runs
one step of one batch of clips under the plan of every registered planner, `dit-tiny` (full
attention: Ulysses) under the planners whose plans hold every path, both also under a hand-made
plan with remap domains, on 4 gloo ranks (degrees 1, 2
and 4 side by side), with replicated parameters, ZeRO-1 and FSDP2 (lockstep plans,
`PlannerOptions(lockstep=True)`); `plan_names` says which plans each model and sharding runs. The
step's loss and every parameter's gradient must be those of one process running the whole
batch as one packed stream (`verify.reference_at`), which equals the sum of each clip alone
(`tests/models/test_video_models.py` proves that). One `run_local` spawn runs everything: an executor per (model, sharding), reused across plans, its parameters reset to the
same values before every step; rank 0 compares with the reference inside the job and returns
only the errors.

The batch (`GRIDS`, patches frames x height x width) holds a single image (F = 1), clips of
fewer frames than the degree, single-patch frames, a one-token clip, one huge frame (at degree
4 its frames do not balance: the spatial blocks fall back to Ulysses) and a long clip that at
`verify.budget` (as `ballast verify` plans) needs SP degree 2 or more even fully recomputed.
`test_the_plans_exercise_every_path` asserts what the plans and the ranks actually ran: every
degree, mixed degrees within a wave, several waves, recomputation, remap domains, the 2D
layouts and the Ulysses fallback.

The parameters are the initial ones moved by noise (`runtime_cases.perturbed_params`):
adaLN-zero starts with zero gates and a zero final layer, under which most gradients are zero.

Tolerance: GRAD_RTOL of `runtime_cases` (1e-5; only the order of float sums differs), applied
per parameter, relative to the largest entry of that parameter's reference gradient (stricter
than verify's over all parameters at once, as in `tests/models/test_hf_causal_lm.py`), and to
the loss relative to itself. Measured (`test_print_measured_errors`, -s): gradients 1.4e-6 to
1.7e-6 (norm weights, whose gradient sums over every token), losses 1e-7, over every model,
sharding and plan. Losing the one-token clip moves the gradient by 6e-2 and the
loss by 1.3e-3; losing the 5-token one by 0.26 and 4.7e-3.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from runtime_cases import GRAD_RTOL, clip_batch, load_params, perturbed_params

from ballast import verify
from ballast.pricing.cost import CostModel
from ballast.vocabulary.cluster import Cluster, get_cluster
from ballast.vocabulary.model_shape import MODEL_PRESETS, ModelShape
from ballast.vocabulary.sharding import Sharding
from ballast.models import build_model
from ballast.planners import PLANNERS, PlannerOptions, get_planner
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import (ProcessGroups, StreamShard, VideoShard, full_tensor, parallelize, run_local,
                             sequence_parallel_attention, video_layouts)
from ballast.runtime.remap import RemappedStream

MODELS = ("stdit-tiny", "dit-tiny")
MODES = ("plain", "zero1", "fsdp")
GRIDS = [
    (4, 8, 8),    # 0: 256 tokens, the longest: SP degree 2 or more under plan_budget
    (1, 14, 14),  # 1: one huge frame: alone at degree 4 its frames layout does not balance
    (3, 4, 5),    # 2: F = 3 < 4
    (1, 6, 6),    # 3: a single image
    (2, 3, 4),    # 4: F = 2
    (5, 1, 1),    # 5: single-patch frames (one column of 5 tokens)
    (1, 1, 1),    # 6: one token: alone at degree 4, three ranks hold nothing
    (6, 2, 3),    # 7
    (2, 5, 3),    # 8
    (3, 2, 2),    # 9
]
LENGTHS = [math.prod(g) for g in GRIDS]
MAX_LEN = max(LENGTHS)


def remapped_plan() -> Plan:
    """Lockstep (so every sharding runs it): wave 0 one remap domain over the whole
    cluster (degrees 2 and 1 side by side, an idle rank in slot 0, the long clip recomputed
    fully in its slot, the slot's lowest level applied to all of it); wave 1 two domains, one a
    single group of degree 2 whose second slot is empty; wave 2 the one-token clip and the
    column of single-patch frames at degree 4 (no remap: 2D layouts with empty shards)."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0], 1.0), MicroBatch([9])]),
              Group(2, 1, [MicroBatch([2], 0.5), MicroBatch([4])]),
              Group(3, 1, [MicroBatch([]), MicroBatch([3])])], remap=[(0, 4)]),
        Wave([Group(0, 1, [MicroBatch([7]), MicroBatch([8])]), Group(1, 1, [MicroBatch([]), MicroBatch([])]),
              Group(2, 2, [MicroBatch([1], 0.75), MicroBatch([])])], remap=[(0, 2), (2, 2)]),
        Wave([Group(0, 4, [MicroBatch([6]), MicroBatch([5], 0.5)])]),
    ], lockstep=True, planner="remapped", shapes=GRIDS)


WORLD = 4
"""The ranks of the job: degrees 1, 2 and 4, mixed within a wave."""


def plan_names(model: str, mode: str) -> list[str]:
    """The plans `model` runs under sharding `mode`. Replicated, the STDiT runs every planner's
    plan and the hand-made one; the DiT, whose full attention is Ulysses over the packed stream
    (the GPT's path, which `tests/runtime/test_executor.py` runs under every planner), runs the
    planners whose plans together hold every degree, several waves, recompute levels 0 to 1 and
    mixed degrees in a wave (`test_the_plans_exercise_every_path` checks it), and the
    hand-made one for remap domains. FSDP2 changes how parameters are held, not what a plan runs: ballast's
    lockstep plan and the hand-made one (`tests/runtime/test_fsdp.py` runs several planners'
    lockstep plans sharded, on the GPT). ZeRO-1 changes only how the step's gradients are summed
    (a reduce-scatter per bucket to their owners, the replicated all-reduce's twin): ballast's."""
    if mode == "zero1":
        return ["ballast"]
    if mode == "plain":
        return [*PLANNERS, "remapped"] if model == "stdit-tiny" else ["ballast", "dcp", "flexsp", "remapped"]
    return ["ballast", "remapped"]


def plan_budget(shape: ModelShape) -> tuple[Cluster, CostModel]:
    """verify's default budget priced as under FSDP2, for every mode's plans: there the longest
    clip needs SP (`test_the_batch_has_every_kind_of_clip`). Replicated and ZeRO-1 hold more
    after backward than their states leave (AdamW's temporaries, 4 bytes a parameter), which
    verify's budget does not go below, and that holds every clip of this batch on one rank.
    The runtime checks here are of exactness, not memory: any mode runs these plans."""
    return verify.budget(shape, WORLD, MAX_LEN, sharding=Sharding.FSDP)


def planner_plans(name: str, lockstep: bool, names: list[str]) -> dict[str, dict]:
    """The named plans of the batch: a registered planner's at `plan_budget` or the hand-made one."""
    shape = MODEL_PRESETS[name]
    cluster, cost = plan_budget(shape)
    options = PlannerOptions(max_len=MAX_LEN, lockstep=lockstep, time_limit=2.0, seed=0)
    out = {}
    for planner in names:
        if planner == "remapped":
            plan = remapped_plan()
            plan.validate(get_cluster("cpu", world_size=WORLD))
        else:
            plan = get_planner(planner, cluster, cost, options).plan(GRIDS)
            plan.validate(cluster, cost)
        out[planner] = plan.to_dict()
    return out


def all_plans() -> dict[str, dict[str, dict[str, dict]]]:
    """model -> sharding -> planner -> plan (FSDP2 runs the lockstep ones)."""
    return {name: {mode: planner_plans(name, mode == "fsdp", plan_names(name, mode)) for mode in MODES}
            for name in MODELS}


# --------------------------------------------------------------------------------------------
# on the ranks


def _recording(seen: set, model: str):
    """The runtime's attention, recording what each call ran on: (model, kind, pattern,
    degree, layout); kind is `2d` (a VideoShard), `ulysses` (a StreamShard of degree > 1),
    `remapped` (a remap domain's slot; degree: the rank's group's) or `local`."""
    def attend(q, k, v, stream):
        if isinstance(stream, RemappedStream):
            shard = stream.shard
            seen.add((model, "remapped", stream.pattern, shard.degree if isinstance(shard, StreamShard) else 1, None))
        elif isinstance(stream, VideoShard):
            seen.add((model, "2d", stream.pattern, stream.degree, stream.layout))
        elif isinstance(stream, StreamShard) and stream.degree > 1:
            seen.add((model, "ulysses", stream.pattern, stream.degree, None))
        else:
            seen.add((model, "local", stream.pattern, 1, None))
        return sequence_parallel_attention(q, k, v, stream)
    return attend


def errors_of(loss: float, grads: dict[str, torch.Tensor], reference: tuple[float, dict[str, torch.Tensor]]
              ) -> tuple[float, float, str]:
    """Relative loss error, the largest per-parameter gradient error (relative to that
    parameter's largest reference entry) and the parameter where it occurs."""
    want_loss, want = reference
    assert grads.keys() == want.keys()
    worst, where = 0.0, ""
    for name, expected in want.items():
        error = float((grads[name] - expected).abs().max() / expected.abs().max())
        if error >= worst:
            worst, where = error, name
    return abs(loss - want_loss) / abs(want_loss), worst, where


def _world_worker(plans: dict, params: dict[str, torch.Tensor], references: dict, batch: verify.VerifyBatch) -> dict:
    """Every model x sharding x plan: one step from `params`; rank 0 returns the errors, every
    rank what its attention calls ran on."""
    groups = ProcessGroups()
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    rank0 = dist.get_rank() == 0
    out: dict = {"errors": {}, "attention": set()}
    for name, by_mode in plans.items():
        for mode, by_planner in by_mode.items():
            model = build_model(MODEL_PRESETS[name], seed=0)
            executor = parallelize(model, cluster, groups=groups, fsdp=mode == "fsdp", zero1=mode == "zero1",
                                   lr=1e-3)
            model.install_attention(_recording(out["attention"], name))
            for i, (planner, plan) in enumerate(by_planner.items()):
                load_params(model, params[name])  # the previous step's AdamW update undone
                if i == 0:  # the reset reaches every shard
                    assert torch.equal(verify.flatten(full_tensor(p) for p in model.parameters()), params[name])
                result = executor.step(Plan.from_dict(plan), batch.samples)
                grads = {n: g for (n, _), g in zip(model.named_parameters(), executor.gradients(), strict=True)}
                if rank0:
                    out["errors"][name, mode, planner] = errors_of(result.loss, grads, references[name])
    return out


# --------------------------------------------------------------------------------------------
# fixtures


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def batch() -> verify.VerifyBatch:
    return clip_batch(MODEL_PRESETS[MODELS[0]], GRIDS)


@pytest.fixture(scope="module")
def params() -> dict[str, torch.Tensor]:
    return {name: perturbed_params(MODEL_PRESETS[name]) for name in MODELS}


@pytest.fixture(scope="module")
def references(batch, params) -> dict[str, tuple[float, dict[str, torch.Tensor]]]:
    """One process, the whole batch as one packed stream: loss and every parameter's gradient."""
    out = {}
    for name in MODELS:
        shape = MODEL_PRESETS[name]
        start = verify.Trajectory([], [], [params[name]], params[name])
        reference = verify.reference_at(shape, start, [batch])
        names = [(n, p.shape) for n, p in build_model(shape).named_parameters()]
        pieces = torch.split(reference.grads[0], [math.prod(s) for _, s in names])
        out[name] = (reference.losses[0], {n: g.view(s) for (n, s), g in zip(names, pieces, strict=True)})
    return out


@pytest.fixture(scope="module")
def world(batch, params, references) -> tuple[list[dict], dict]:
    """Every rank's results and the plans they ran."""
    plans = all_plans()
    return run_local(WORLD, _world_worker, plans, params, references, batch, timeout=600), plans


# --------------------------------------------------------------------------------------------
# in this process


def test_the_batch_has_every_kind_of_clip(batch, references):
    frames = [f for f, _, _ in GRIDS]
    assert 1 in frames and any(1 < f < 4 for f in frames)
    assert any(h * w == 1 and f > 1 for f, h, w in GRIDS)
    assert [MODEL_PRESETS[m].video_geometry.latent_channels for m in MODELS] == [4, 4]  # one batch fits both
    for model in MODELS:
        _, cost = plan_budget(MODEL_PRESETS[model])
        assert cost.max_tokens(1, 1.0) < MAX_LEN <= cost.max_tokens(2, 1.0)
    layouts = video_layouts([GRIDS[1]], 4)
    assert not layouts["frames"].balances() and layouts["columns"].balances()
    # Every parameter has a gradient: the comparison is not of zeros.
    for _, grads in references.values():
        assert all(float(g.abs().max()) > 0 for g in grads.values()), [n for n, g in grads.items() if not g.any()]


# --------------------------------------------------------------------------------------------
# on 4 ranks


@pytest.mark.slow
def test_every_planners_plans_give_the_single_process_gradient(world):
    ranks, plans = world
    errors = ranks[0]["errors"]
    failures = []
    for name, by_mode in plans.items():
        for mode, by_planner in by_mode.items():
            assert list(by_planner) == plan_names(name, mode)
            assert mode != "fsdp" or all(plan["lockstep"] for plan in by_planner.values())
            for planner in by_planner:
                loss, grad, where = errors[name, mode, planner]
                if loss > GRAD_RTOL or grad > GRAD_RTOL:
                    failures.append(f"{name} {mode} {planner}: loss {loss:.1e}, gradient {grad:.1e} ({where})")
    assert len(errors) == sum(len(p) for by_mode in plans.values() for p in by_mode.values())
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_the_plans_exercise_every_path(world):
    ranks, plans = world
    for name in MODELS:
        ran = [Plan.from_dict(p) for by_mode in plans[name].values() for p in by_mode.values()]
        made = [p for p in ran if p.planner in PLANNERS]
        # every degree, several waves, recomputation at several levels in the planners' own plans
        assert {d for p in made for d in p.degrees_used()} == {1, 2, 4}
        assert max(len(p.waves) for p in made) >= 2
        levels = {mb.recompute for p in made for _, _, mb in p.micro_batches() if mb.seq_ids}
        assert 1.0 in levels and 0.0 in levels and len(levels) >= 3
        # the long clip never on one rank
        assert all(g.degree >= 2 for p in made for _, g, mb in p.micro_batches() if 0 in mb.seq_ids)
        # mixed degrees within a wave, remap domains (the hand-made plan)
        assert any(len({g.degree for g in w.groups if any(mb.seq_ids for mb in g.micro_batches)}) > 1
                   for p in made for w in p.waves)
        assert any(w.remap for p in ran for w in p.waves)
    seen = set().union(*(rank["attention"] for rank in ranks))
    for degree in (2, 4):
        # STDiT: whole frames for spatial blocks, whole columns for temporal ones...
        assert ("stdit-tiny", "2d", "spatial", degree, "frames") in seen
        assert ("stdit-tiny", "2d", "temporal", degree, "columns") in seen
        # DiT: Ulysses on every degree
        assert ("dit-tiny", "ulysses", "full", degree, None) in seen
    # ...and Ulysses where frames do not balance (the huge frame at degree 4)
    assert ("stdit-tiny", "2d", "spatial", 4, "tokens") in seen
    # remap domains for both models and both block kinds, degree 1 and 2 groups inside them
    for pattern, model in (("spatial", "stdit-tiny"), ("temporal", "stdit-tiny"), ("full", "dit-tiny")):
        assert {(model, "remapped", pattern, d, None) for d in (1, 2)} <= seen
    # and single ranks
    assert {("stdit-tiny", "local", "spatial", 1, None), ("dit-tiny", "local", "full", 1, None)} <= seen


@pytest.mark.slow
def test_print_measured_errors(world):
    ranks, plans = world
    errors = ranks[0]["errors"]
    for name, by_mode in plans.items():
        for mode, by_planner in by_mode.items():
            found = [errors[name, mode, p] for p in by_planner]
            grad, where = max((e[1], e[2]) for e in found)
            print(f"{name:10} {mode:6} loss {max(e[0] for e in found):.1e} gradient {grad:.1e} ({where})")
