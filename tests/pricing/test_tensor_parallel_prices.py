"""A TP rank's cost model (pricing/tensor_parallel.py), its plans over the pool, and `simulate --tp`,
with the figures worked by hand for the tiny model on 2 CPU ranks."""
from __future__ import annotations

import json

import pytest

from ballast.cli import main
from ballast.planners import get_planner
from ballast.plans.plan import Plan, PlanError
from ballast.pricing.cost_sources import get_cost_model
from ballast.pricing.tensor_parallel import activation_share, parameter_counts
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import MODEL_PRESETS

TINY = MODEL_PRESETS["tiny"]  # 4 layers, hidden 128, 8 heads, 4 kv heads (kv_dim 64), ffn 352, vocab 256


def costs(world: int = 4, tp: int = 2):
    cluster = get_cluster("cpu", world_size=world)
    mesh = JobMesh.of(cluster, tp=tp, shape=TINY)
    return cluster, mesh, get_cost_model("analytic", TINY, cluster), get_cost_model("analytic", TINY, cluster, mesh=mesh)


def test_a_tp_rank_holds_its_shard_of_the_matrices_and_the_norms_whole():
    # A block's matrices: q, out 128 x 128, k, v 128 x 64, SwiGLU 3 x 128 x 352 = 184,320.
    counts = parameter_counts(TINY, 2)
    assert counts.block == 184_320 // 2 + 2 * 128
    assert counts.root == 2 * 256 * 128 // 2 + 128                  # embedding and output layer by vocabulary
    assert counts.total == 4 * counts.block + counts.root == 402_560  # of 803,968
    assert parameter_counts(TINY, 1).total == TINY.params


def test_one_tp_rank_of_two_prices_half_the_work_plus_the_all_reduces():
    cluster, mesh, whole, rank = costs()
    # 4 all-reduces per block and 2 at the ends, each 2 (t - 1) / t x 128 values x 4 bytes at 0.7 GB/s.
    per_token = (4 * 4 + 2) * (128 * 4) / 0.7e9
    assert rank.a == pytest.approx(whole.a / 2)
    assert rank.b == pytest.approx(whole.b / 2 + per_token)
    # A recomputed block repeats its 2 forward all-reduces of the 18: r b stays the matmuls' r plus those.
    assert rank.recompute * rank.b == pytest.approx(whole.recompute * whole.b / 2 + per_token * 8 / 18)
    assert rank.recompute_attention == whole.recompute_attention
    assert rank.g == pytest.approx(whole.g + 18 * 1.5e-3) and rank.recompute_fixed == pytest.approx(8 * 1.5e-3)
    assert (rank.heads, rank.kv_heads, rank.world_size) == (4, 2, 2)
    assert rank.bytes_per_token == pytest.approx(whole.bytes_per_token / 2)
    assert rank.mesh == mesh and rank.network.world_size == 2


def test_a_tp_rank_keeps_five_whole_and_twelve_split_values_per_hidden():
    _, _, whole, rank = costs()
    assert activation_share(2) == pytest.approx(11 / 17)
    loss = 12 * 256  # 3 fp32 [tokens, vocab] tensors at the loss's backward
    assert whole.loss_per_token == loss and rank.loss_per_token == loss / 2
    assert rank.act_per_token - rank.loss_per_token == pytest.approx((whole.act_per_token - loss) * 11 / 17)
    # Full recomputation keeps a block's input, whole on every TP rank: as many bytes kept.
    kept = lambda c: c.kept * c.act_per_token - c.loss_per_token  # noqa: E731
    assert kept(rank) == pytest.approx(kept(whole))
    assert rank.states == pytest.approx(16 * 402_560)  # replicated over the pool: 4 + 4 + 8 bytes a parameter


def test_planners_stamp_the_mesh_and_validation_refuses_another():
    cluster, mesh, whole, rank = costs()
    pool = mesh.pool_cluster(cluster)
    plan = get_planner("ballast", pool, rank).plan([300, 40, 7, 120])
    assert (plan.tp, plan.pp) == (2, 1)
    assert plan.to_dict()["tp"] == 2 and "pp" not in plan.to_dict() and Plan.from_json(plan.to_json()).tp == 2
    assert max(g.degree for _, g, _ in plan.micro_batches()) <= 2
    plan.validate(pool, rank)
    with pytest.raises(PlanError, match="plan made for TP degree 2 and PP degree 1, but the cost model prices a "
                                        "rank of TP degree 1"):
        plan.validate(pool, get_cost_model("analytic", TINY, pool))
    assert get_planner("ballast", cluster, whole).plan([300, 40]).tp == 1


def test_a_profile_prices_tp_only_from_terms_it_measured(tmp_path):
    cluster, mesh, whole, _ = costs()
    whole.save(tmp_path / "profile.json")  # no `ballast profile` report: no measured TP terms
    with pytest.raises(ValueError, match="measured no TP terms of degree 2"):
        get_cost_model(str(tmp_path / "profile.json"), TINY, cluster, mesh=mesh)


def test_simulate_plans_over_the_pool(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert main(["simulate", "--lengths", "lognormal:7,1.2", "--cluster", "a100-16", "--model", "gpt-7b",
                 "--max-len", "32768", "--steps", "1", "--batch", "32", "--planners", "static,ballast", "--tp", "4",
                 "--json", str(out)]) == 0
    assert "TP 4: plans over a pool of 4" in capsys.readouterr().out
    setting = json.loads(out.read_text())["setting"]
    assert (setting["world_size"], setting["tp"], setting["pool"]) == (16, 4, 4)


@pytest.mark.parametrize("argv, message", [
    (["--tp", "16"], "TP degree 16 crosses a node: it must divide the node's 8 devices"),
    (["--tp", "2", "--model", "tiny"], None),
    (["--tp", "8", "--model", "tiny"], "TP degree 8 does not divide model 'tiny''s 4 kv heads"),
])
def test_simulate_names_a_tp_degree_it_cannot_run(argv, message, capsys):
    code = main(["simulate", "--lengths", "lognormal:5,1", "--cluster", "a100-16", "--max-len", "4096", "--steps", "1",
                 "--batch", "8", "--planners", "static", *argv])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
    else:
        assert code == 2 and message in err and "Traceback" not in err
