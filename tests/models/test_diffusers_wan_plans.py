"""A diffusers Wan (`diffusers:PATH`, diffusers' own tiny test config) under ballast's plans on 2
gloo ranks trains exactly like diffusers' own forward run clip by clip in one process.

One `run_local` spawn runs one step of one batch of captioned clips under each plan below, with
replicated parameters and with FSDP2 (the plans are lockstep, so every sharding runs them):
Ulysses at degree 2 with recomputation, the one-token clip alone at degree 2 (a rank with an
empty shard); context parallelism 1x2 (clips cut in contiguous chunks, an empty chunk); a remap
domain over two degree-1 groups, then a second wave; a remap domain over a CP group; and the
`ballast` planner's plan at verify's budget (degree 1 with recomputation: these clips are
short). ZeRO-1 and bf16 autocast (with FSDP2's bf16 gathers) change what runs around a plan's
layout (the gradient's reduction to its owners; the dtype of the forward and of the gathers),
so ZeRO-1 runs the two-wave remap plan and bf16 the plans of recomputation and of CP
(`PLANS_OF`). The reference is the folder
loaded with `WanTransformer3DModel.from_pretrained` in this process, every clip through its own
forward (`wan_cases.diffusers_loss`).

Tolerances: fp32, GRAD_RTOL per parameter (`wan_cases.gradient_errors`; only the order of float
sums differs: measured 0.9e-6 to 2.1e-6, as in one process, `test_diffusers_wan.py`) and on the loss. bf16:
verify's, `BF16_GAP_MULTIPLE` x the single-process model's own bf16-vs-fp32 gap at the same
parameters (measured: 0.8-1.0x the gap of 3.4e-3; before FSDP2 left the root's inputs uncast,
a clip's timestep rounded to bf16 made it 11x on verify's batch).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from wan_cases import captioned, diffusers_loss, gradient_errors, save_wan

from ballast import verify
from ballast.models import build_model
from ballast.planners import PlannerOptions, get_planner
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ProcessGroups, parallelize, run_local
from ballast.verify.errors import BF16_GAP_MULTIPLE
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.precision import Precision

GRAD_RTOL = 1e-5
GRIDS = [(3, 4, 6), (1, 5, 5), (2, 3, 1), (1, 1, 1), (4, 2, 2), (1, 2, 7)]
LENGTHS = [f * h * w for f, h, w in GRIDS]
MODES = ("plain", "zero1", "fsdp", "fsdp-bf16")
PLANS_OF = {"zero1": ("remap",), "fsdp-bf16": ("ulysses", "context")}
"""The plans a mode runs where not every one (module docstring)."""

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def hand_made_plans() -> dict[str, Plan]:
    def plan(*waves: Wave) -> Plan:
        return Plan(LENGTHS, list(waves), lockstep=True, shapes=GRIDS)

    return {
        "ulysses": plan(Wave([Group(0, 2, [MicroBatch([0, 2], 1.0), MicroBatch([3]), MicroBatch([1, 4, 5], 0.5)])])),
        "context": plan(Wave([Group(0, 2, [MicroBatch([0, 1]), MicroBatch([3]), MicroBatch([2, 4, 5], 1.0)], cp=2)])),
        "remap": plan(Wave([Group(0, 1, [MicroBatch([0]), MicroBatch([3])]),
                            Group(1, 1, [MicroBatch([1, 2], 0.5), MicroBatch([])])], remap=[(0, 2)]),
                      Wave([Group(0, 1, [MicroBatch([4])]), Group(1, 1, [MicroBatch([5])])])),
        "context-remap": plan(Wave([Group(0, 2, [MicroBatch([0, 3]), MicroBatch([1, 2, 4, 5])], cp=2)],
                                   remap=[(0, 2)])),
    }


def _steps(folder: str, plans: dict[str, dict], clips: list) -> dict | None:
    """One step of every plan under every mode, each on a model freshly loaded from the folder;
    rank 0 returns (loss, {parameter: whole gradient})."""
    shape = get_model_shape(f"diffusers:{folder}")
    groups, out = ProcessGroups(), {}
    for mode in MODES:
        for name in PLANS_OF.get(mode, plans):
            plan = plans[name]
            model = build_model(shape, seed=1)  # weights from the folder: the seed must not matter
            executor = parallelize(model, get_cluster("cpu", world_size=2), groups=groups, lr=1e-3,
                                   zero1=mode == "zero1", fsdp=mode.startswith("fsdp"),
                                   precision=Precision.BF16 if mode.endswith("bf16") else Precision.FP32)
            result = executor.step(Plan.from_dict(plan), clips)
            grads = dict(zip((n.removeprefix("wan.") for n, _ in model.named_parameters()), executor.gradients()))
            out[mode, name] = result.loss, grads
    return out if dist.get_rank() == 0 else None


def single_process(folder, clips, bf16: bool) -> tuple[float, dict[str, torch.Tensor]]:
    """diffusers' forward clip by clip: loss and gradient of the batch (per token, as a step's)."""
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(folder)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = diffusers_loss(model, clips, (1, 2, 2)) / sum(LENGTHS)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_wan(tmp_path_factory.mktemp("wan") / "tiny")


@pytest.fixture(scope="module")
def job(folder):
    shape = get_model_shape(f"diffusers:{folder}")
    clips = captioned(shape, GRIDS, seed=3)
    plans = {name: plan.to_dict() for name, plan in hand_made_plans().items()}
    cluster, cost = verify.budget(shape, 2, max(LENGTHS))
    plans["ballast"] = get_planner("ballast", cluster, cost, PlannerOptions(lockstep=True)).plan(GRIDS).to_dict()
    results = run_local(2, _steps, str(folder), plans, clips, timeout=600)[0]
    return results, plans, {bf16: single_process(folder, clips, bf16) for bf16 in (False, True)}


def test_every_plan_and_sharding_gives_diffusers_gradient(job):
    results, plans, references = job
    want_loss, want = references[False]
    failures = []
    for (mode, name), (loss, grads) in results.items():
        if mode.endswith("bf16"):
            continue
        errors = gradient_errors(grads, want)
        worst = max(errors, key=errors.get)
        loss_error = abs(loss / want_loss - 1)
        print(f"{mode:6} {name:14} loss {loss_error:.1e} gradient {errors[worst]:.1e} ({worst})")
        if loss_error > GRAD_RTOL or errors[worst] > GRAD_RTOL:
            failures.append(f"{mode} {name}: loss {loss_error:.1e}, gradient {errors[worst]:.1e} ({worst})")
    assert not failures, "\n".join(failures)
    assert {mode for mode, _ in results} == set(MODES)
    assert all((mode, name) in results for mode in ("plain", "fsdp") for name in plans)


def test_bf16_with_fsdp_is_within_the_single_process_bf16_gap(job):
    results, _, references = job
    (fp32_loss, fp32), (bf16_loss, bf16) = references[False], references[True]
    whole = max(float(g.abs().max()) for g in fp32.values())
    gap = max(float((bf16[n] - fp32[n]).abs().max()) for n in fp32) / whole
    assert gap > 1e-4  # bf16 really ran in the reference
    for name in PLANS_OF["fsdp-bf16"]:
        loss, grads = results["fsdp-bf16", name]
        error = max(float((grads[n] - fp32[n]).abs().max()) for n in fp32) / whole
        print(f"bf16 FSDP2 {name:14} gradient {error:.1e}, single-process gap {gap:.1e} ({error / gap:.1f}x)")
        assert error <= BF16_GAP_MULTIPLE * gap
        assert abs(loss / fp32_loss - 1) <= BF16_GAP_MULTIPLE * max(abs(bf16_loss / fp32_loss - 1), GRAD_RTOL)


def test_the_plans_run_what_they_say(job):
    _, plans, _ = job
    run = [(g.degree, g.cp, bool(w.remap)) for p in map(Plan.from_dict, plans.values()) for w in p.waves
           for g in w.groups if any(mb.seq_ids for mb in g.micro_batches)]
    assert {(2, 1, False), (2, 2, False), (1, 1, True), (2, 2, True)} <= set(run)
