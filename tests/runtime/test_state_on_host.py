"""Writing a trained model out takes its whole state dict, not its trained parameters only
(`Executor.state_on_host`, `PipelineExecutor.state_on_host`, `StrategyExecutor.state_on_host`):
a user's model may hold persistent buffers and frozen parameters, and a folder without them
loads with those tensors initialised afresh. The tiny GPT is given a persistent buffer on its
first stage, a non-persistent one (which a state dict leaves out) on its last, and two frozen
parameters: a TP-split weight (layer 1's query projection, column-parallel) and the final norm.

On 4 gloo ranks: TP 2 x PP 2 under ZeRO-1 after one step (frozen tensors as built, trained ones
moved), TP 2 under FSDP2 over a pool of 2, and a strategy executor's TP 2 x PP 2 pipeline (its
compute model gets the frozen weight's TP shard, not the whole). Values compare exactly: the
gathers copy values, and nothing frozen is stepped.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from runtime_cases import LENGTHS, SHAPE, make_batches

import pytest
from ballast.models import build_model
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ModelBuild, parallelize, run_local
from ballast.runtime.strategy import StrategyExecutor
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.strategy import Strategy

FROZEN = ("layers.1.attention.wq.weight", "norm.weight")
PERSISTENT = "layers.0.kept"


def build(weights: bool = True) -> torch.nn.Module:
    """The tiny GPT with buffers and frozen parameters (module docstring), alike on every rank."""
    model = build_model(SHAPE, 0, weights=weights)
    device = model.norm.weight.device
    model.layers[0].register_buffer("kept", torch.arange(5.0, device=device))
    model.layers[3].register_buffer("scratch", torch.ones(3, device=device), persistent=False)
    for name in FROZEN:
        model.get_parameter(name).requires_grad_(False)
    return model


def _worker() -> dict | None:
    torch.set_num_threads(1)
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    out = {}
    staged = parallelize(ModelBuild(SHAPE, build), cluster, mesh=JobMesh.of(cluster, tp=2, pp=2, shape=SHAPE),
                         zero1=True, lr=1e-2)
    plan = Plan(LENGTHS, [Wave([Group(0, 1, [MicroBatch([0, 1, 2, 3, 4]), MicroBatch([5, 6, 7, 8, 9])])])],
                planner="hand", tp=2, pp=2)
    staged.step(plan, make_batches()[0].samples)
    out["tp-pp-zero1"] = staged.state_on_host()
    split = parallelize(ModelBuild(SHAPE, build), cluster, mesh=JobMesh.of(cluster, tp=2, shape=SHAPE), fsdp=True)
    out["tp-fsdp"] = split.state_on_host()
    strategies = StrategyExecutor(build, cluster, lr=1e-2)
    _, compute, _ = strategies.executor(Strategy.parse("2x2"))
    if compute.stage == 0:
        shard = compute.model.get_parameter(FROZEN[0])
        out["strategy-shard"] = (compute.tensor_parallel.index, shard.detach().clone())
    out["strategy"] = strategies.state_on_host()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out.pop("strategy-shard", None))
    out["strategy-shards"] = [g for g in gathered if g is not None]
    return out if dist.get_rank() == 0 else None


@pytest.mark.slow
def test_the_whole_state_dict_comes_to_rank_0_under_tp_pp_fsdp_and_strategies():
    result = run_local(4, _worker, timeout=240)[0]
    built = build().state_dict()
    assert "layers.3.scratch" not in built  # non-persistent: no state dict holds it
    untrained = (*FROZEN, PERSISTENT)
    for case in ("tp-pp-zero1", "tp-fsdp", "strategy"):
        state = result[case]
        assert set(state) == set(built), (case, set(built) ^ set(state))
        for name in untrained:
            assert torch.equal(state[name], built[name]), (case, name)
        trained = [n for n in built if n not in untrained]
        if case == "tp-pp-zero1":  # one step moved every trained parameter, none of the rest
            assert all(not torch.equal(state[n], built[n]) for n in trained)
        else:
            assert all(torch.equal(state[n], built[n]) for n in trained), case
    whole = built[FROZEN[0]]
    shards = sorted(result["strategy-shards"], key=lambda item: item[0])
    assert [i for i, _ in shards] == [0, 1]
    assert all(torch.equal(shard, whole.chunk(2, 0)[i]) for i, shard in shards)
