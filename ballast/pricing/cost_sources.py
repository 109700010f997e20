"""Where a CostModel's coefficients come from besides a profile: the `analytic` model (FLOP
counts of a model shape on a cluster's peak and bandwidth) and FlexSP's `published` A100
profile; `get_cost_model` picks one of them, or loads a profile JSON (`ballast profile`), for
a shape and cluster. docs/design.md, section 4, gives every formula and its reason."""
from __future__ import annotations

import dataclasses

from ..vocabulary.cluster import Cluster
from ..vocabulary.precision import Precision
from ..vocabulary.sharding import Sharding, check_pipeline_sharding, default_sharding
from .cost import CostModel
from .device_memory import CanonicalLayout, DeviceMemory, ParameterCounts
from .pipeline import planning_counts, stage_prices
from .whole_step import data_parallel_prices
from .tensor_parallel import TensorTerms, activation_share, parameter_counts, sharded
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.strategy import Strategy
from .coefficients import KEPT_UNDER_RECOMPUTE

# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"):
# a block saves 34 h bytes per token in bf16 (17 h values) once flash attention drops the s^2
# term (full recomputation keeps only the block input: coefficients.KEPT_UNDER_RECOMPUTE).
ACT_VALUES_PER_HIDDEN = 17
# A layer's all-to-alls in forward and backward: q, k, v together and the output, each way.
ALL_TO_ALLS_PER_LAYER = 4
# A layer's CP collectives: the K, V all-gather forward and the dK, dV reduce-scatter backward.
CONTEXT_COLLECTIVES_PER_LAYER = 2

# FlexSP's profile of GPT on 64 A100-40GB (docs/design.md): ms per token^2, ms per token, ms, MB/token.
_PUBLISHED = {
    "gpt-7b": (5.128e-6, 0.18396, 629.0, 4.48),
    "gpt-13b": (9.285e-6, 0.30602, 1133.0, 4.22),
    "gpt-30b": (1.5426e-5, 0.80357, 2789.0, 3.42),
}


def device_memory(shape: ModelShape, cluster: Cluster, sharding: Sharding | None = None,
                  precision: Precision = Precision.AUTO, counts: ParameterCounts | None = None,
                  tp: int = 1, canonical: CanonicalLayout | None = None) -> DeviceMemory:
    """What a rank of `cluster` holds besides activations for `shape` in a sharding mode (None:
    `default_sharding`) and precision (auto: bf16 autocast on a cluster of 2-byte values, the
    GPUs'), with the model's parameter counts (None: the shape's formulas, a TP shard's of `tp`:
    `tensor_parallel.parameter_counts`). Under TP `cluster` is the pool's (`JobMesh.pool_cluster`),
    whose ranks the sharding modes shard over; under a strategy's `canonical` mode, `canonical` is
    the job's layout of record."""
    if precision not in tuple(Precision):
        raise ValueError(f"precision must be one of {', '.join(p.value for p in Precision)}, got {precision!r}")
    # Text models (causal attention) score next tokens over the vocabulary (a TP rank over its
    # share of it); a video model's "vocabulary" is a patch's latent values, regressed without logits.
    return DeviceMemory(counts or parameter_counts(shape, tp), sharding or default_sharding(cluster),
                        precision == Precision.BF16 or (precision == Precision.AUTO and cluster.value_bytes == 2),
                        cluster.world_size, shape.vocab // tp if shape.attention == "causal" else 0, canonical)


def with_device_memory(memory: DeviceMemory, act_per_token: float, kept: float, head: float = 0.0) -> dict:
    """The CostModel fields that price `memory`: `states`, and the loss's bytes per token folded
    into the activations. The loss is not recomputed, so with activations A (kept k under full
    recomputation) and loss bytes l, A' = A + l and k' = (k A + l) / A' give
    A' (c k' + 1 - c) = A (c k + 1 - c) + l at every level c: every formula of the cost model,
    the planners and the bound prices the loss as a term of its own. l is the loss's bytes at its
    backward (`DeviceMemory.loss_per_token`), plus, where a profile measured it, what the rest of
    the head saves (`head`: the final norm's input and output, the targets; the meter counts the
    loss's [tokens, vocab] tensors apart, so they are not in it)."""
    loss = head + memory.loss_per_token
    return dict(states=memory.states, act_per_token=act_per_token + loss, loss_per_token=loss,
                kept=(kept * act_per_token + loss) / (act_per_token + loss), device=memory)


def tensor_parallel_activations(act_per_token: float, kept: float, tp: int) -> tuple[float, float]:
    """(act_per_token, kept) of a TP rank of `tp`: its share of the activations
    (`tensor_parallel.activation_share`); full recomputation keeps a block's input, whole on
    every TP rank, so the bytes it keeps stay and their share grows."""
    share = activation_share(tp)
    return act_per_token * share, kept / share


def activations_alone(cost: CostModel) -> tuple[float, float]:
    """(act_per_token, kept) of `cost`'s blocks: without the head's bytes folded in (the loss's,
    `with_device_memory`, or a profile's measured `act_fixed`)."""
    act = cost.act_per_token - cost.loss_per_token
    return act, (cost.kept * cost.act_per_token - cost.loss_per_token) / act


def analytic_cost(shape: ModelShape, cluster: Cluster, memory: DeviceMemory | None = None, tp: int = 1) -> CostModel:
    """Coefficients from FLOP counts of the shape and the cluster's peak and bandwidth; the
    activations a TP rank of `tp` keeps (`tensor_parallel.activation_share`), with `memory` its
    shard's, on the pool's cluster (`get_cost_model` then shards the rest)."""
    memory = memory or device_memory(shape, cluster, tp=tp)
    flops = cluster.peak_flops * cluster.efficiency
    linear = shape.layers * shape.layer_token_params + shape.vocab * shape.hidden
    return CostModel(
        source="analytic", model=shape.name,
        # Per attention unit: causal attention over s tokens (s^2 units) does QK^T and AV in
        # 2 s^2 h FLOPs forward per layer and twice that backward; other patterns have their
        # FLOPs in their units (`samples.attention_units`).
        a=6.0 * shape.layers * shape.hidden / flops,
        b=6.0 * linear / flops,
        g=cluster.micro_batch_overhead,
        bandwidth={d: cluster.bandwidth[d] for d in cluster.degrees if d > 1},
        bytes_per_token=_all_to_all_bytes_per_token(shape, cluster.value_bytes),
        **with_device_memory(memory, *tensor_parallel_activations(
            float(ACT_VALUES_PER_HIDDEN * cluster.value_bytes * shape.hidden * shape.layers), KEPT_UNDER_RECOMPUTE, tp)),
        comm_latency={d: ALL_TO_ALLS_PER_LAYER * shape.layers * cluster.all_to_all_latency
                      for d in cluster.degrees if d > 1 and cluster.all_to_all_latency > 0},
        context_latency={d: CONTEXT_COLLECTIVES_PER_LAYER * shape.layers * cluster.all_to_all_latency
                         for d in cluster.degrees if d > 1 and cluster.all_to_all_latency > 0},
        device_memory=cluster.device_memory, layers=shape.layers, heads=shape.heads,
        kv_heads=shape.kv_heads, world_size=cluster.world_size, attention_window=shape.attention_window,
        max_positions=shape.max_positions,
        attention=shape.attention, spatial_share=shape.spatial_share, network=cluster)

def published_cost(shape: ModelShape, cluster: Cluster, memory: DeviceMemory | None = None, tp: int = 1
                   ) -> CostModel:
    """FlexSP's measured GPT-7B/13B/30B coefficients on A100-40GB (docs/design.md); measured
    without TP, whose rank keeps `tensor_parallel.activation_share` of the activations."""
    memory = memory or device_memory(shape, cluster, tp=tp)
    if shape.name not in _PUBLISHED:
        raise ValueError(f"no published profile for model {shape.name!r}; have {sorted(_PUBLISHED)}")
    a_ms, b_ms, fixed_ms, act_mb = _PUBLISHED[shape.name]
    return CostModel(
        source="published", model=shape.name, a=a_ms * 1e-3, b=b_ms * 1e-3, g=fixed_ms * 1e-3,
        bandwidth={d: cluster.bandwidth[d] for d in cluster.degrees if d > 1},
        bytes_per_token=_all_to_all_bytes_per_token(shape, 2),
        **with_device_memory(memory, *tensor_parallel_activations(act_mb * 1e6, KEPT_UNDER_RECOMPUTE, tp)),
        device_memory=cluster.device_memory, layers=shape.layers, heads=shape.heads,
        kv_heads=shape.kv_heads, world_size=cluster.world_size, network=cluster)


def _all_to_all_bytes_per_token(shape: ModelShape, value_bytes: int) -> float:
    # q and out carry `hidden` values per token, k and v `kv_dim`; each crosses an all-to-all
    # in forward and again in backward. With kv_heads == heads and bf16 (2 bytes) this is
    # docs/design.md's 4 tensors x 2 x layers x hidden x 2 bytes.
    return 2.0 * shape.layers * (2 * shape.hidden + 2 * shape.kv_dim) * value_bytes


def get_cost_model(spec: str, shape: ModelShape, cluster: Cluster, device_memory_gb: float | None = None,
                   sharding: Sharding | None = None, precision: Precision = Precision.AUTO,
                   mesh: JobMesh | None = None, canonical: CanonicalLayout | None = None) -> CostModel:
    """`analytic`, `published`, `auto` (published where FlexSP measured it) or a profile JSON path,
    its memory priced for the sharding mode (None: `default_sharding` for the mesh's PP degree;
    FSDP2 under PP refused; `canonical` for a strategy's pipeline, with its job's layout of record:
    `strategy_cost_models`) and precision (`device_memory`), for a rank of the job's `mesh`
    (None: the cluster's ranks one pool): its plans are over the pool's cluster
    (`JobMesh.pool_cluster`), and under TP the coefficients are a TP rank's
    (`tensor_parallel.sharded`). Under PP its states are the fullest stage's
    (`pipeline.planning_counts`), so a micro-batch that fits them with its whole activations
    fits every stage (`Plan.validate` checks each stage exactly).

    A profile must describe `shape` and `cluster`'s size: every caller (simulate, train, bench)
    relies on this one check. It brings the device memory it was made for unless
    `device_memory_gb` (the flag, which `get_cluster` gave the cluster too) replaces it, and its
    measured activations; its states are priced like the others', from the shape's parameters."""
    mesh = mesh or JobMesh.of(cluster)
    mesh.check_cluster(cluster)
    mesh.check_model(shape)
    sharding = sharding or default_sharding(cluster, mesh.pp)
    check_pipeline_sharding(sharding, mesh.pp)
    assert (sharding is Sharding.CANONICAL) == (canonical is not None), (sharding, canonical)
    if spec == "auto":
        spec = "published" if shape.name in _PUBLISHED and cluster.name == "a100-64" else "analytic"
    if spec in ("analytic", "published"):
        pool = mesh.pool_cluster(cluster)
        memory = device_memory(shape, pool, sharding, precision, planning_counts(shape, mesh), mesh.tp, canonical)
        cost = (analytic_cost if spec == "analytic" else published_cost)(shape, pool, memory, mesh.tp)
        terms = TensorTerms.of_cluster(cluster, mesh.tp) if mesh.tp > 1 else None
        return with_job_prices(sharded(cost, shape, terms, mesh), shape, cluster, mesh)
    cost = CostModel.load(spec)
    if cost.model != shape.name:
        raise ValueError(f"cost model {spec} describes model {cost.model!r}, not {shape.name!r} "
                         f"(the model asked for)")
    if cost.world_size != cluster.world_size:
        raise ValueError(f"cost model {spec} was made for {cost.world_size} devices, "
                         f"the cluster has {cluster.world_size}")
    # Plans are over the mesh's pool, as the analytic coefficients' are (the profile's ranks
    # themselves without TP or PP); under TP a rank keeps its shard's states and share of the
    # activations, and its coefficients are sharded by the profile's measured TP terms.
    terms = profiled_tensor_terms(cost, spec, mesh.tp)
    pool = mesh.pool_cluster(cluster)
    memory = device_memory(shape, pool, sharding, precision, planning_counts(shape, mesh), mesh.tp, canonical)
    blocks = tensor_parallel_activations(*activations_alone(cost), mesh.tp)
    # The head's hidden states are whole on every TP rank (only its vocabulary is split, and the
    # loss's tensors over it are priced per rank in `memory`).
    head = measured_head(cost)
    cost = dataclasses.replace(cost, world_size=pool.world_size, network=pool,
                               **with_device_memory(memory, *blocks, head=head),
                               **({} if device_memory_gb is None else dict(device_memory=device_memory_gb * 1e9)))
    return with_job_prices(sharded(cost, shape, terms, mesh), shape, cluster, mesh)


def strategy_cost_models(spec: str, shape: ModelShape, cluster: Cluster, strategy: Strategy,
                         device_memory_gb: float | None = None, precision: Precision = Precision.AUTO
                         ) -> list[CostModel]:
    """A cost model for each pipeline of `strategy` on `cluster`: a rank's of its (t, p) mesh over
    its block's cluster (`Strategy.block_cluster`), its states in the job's canonical layout
    (`Sharding.CANONICAL`: the whole model's state of record shared by every rank, the pipeline's
    stage shards whole). `analytic` and `published` only: a profile was measured on one mesh of
    its own ranks, not on a block of them."""
    strategy.check(cluster, shape)
    if spec not in ("analytic", "published", "auto"):
        raise ValueError(f"cost model {spec}: a strategy's pipelines are priced from --cost analytic or published; "
                         f"a profile measured one mesh of {cluster.world_size} ranks, not each pipeline's block")
    canonical = CanonicalLayout(ParameterCounts.of_shape(shape), cluster.world_size)
    return [get_cost_model("analytic" if spec == "auto" else spec, shape, strategy.block_cluster(i, cluster),
                           device_memory_gb, Sharding.CANONICAL, precision, strategy.mesh(i, cluster), canonical)
            for i in range(len(strategy.pipelines))]


def measured_head(cost: CostModel) -> float:
    """Bytes per token a profile's own fit measured the head to save, its `loss_per_token`
    (`Coefficients.act_fixed`: the final norm's input and output and the targets, without the
    log-probabilities, which the meter counts apart); 0 for any other file, whose
    `loss_per_token` is the loss's whole bytes, priced again from the shape."""
    fitted = cost.fit.get("coefficients", {}).get("act_fixed")
    return cost.loss_per_token if fitted is not None and fitted == cost.loss_per_token else 0.0


def profiled_tensor_terms(cost: CostModel, spec: str, tp: int) -> TensorTerms | None:
    """The TP terms of degree `tp` that profile `spec` measured (`profile/tensor_terms.py`);
    None without TP. ValueError where the profile measured none of that degree."""
    if tp == 1:
        return None
    measured = cost.fit.get("tensor_parallel", {})
    if str(tp) not in measured:
        degrees = ", ".join(sorted(measured, key=int)) or "none"
        raise ValueError(f"cost model {spec} measured no TP terms of degree {tp} (it has: {degrees}): profile on "
                         f"at least {tp} ranks with this version of ballast, or price TP from --cost analytic")
    return TensorTerms(**measured[str(tp)])


def with_job_prices(cost: CostModel, shape: ModelShape, cluster: Cluster, mesh: JobMesh) -> CostModel:
    """`cost` with its data-parallel prices (`CostModel.data_parallel`; FSDP2's first gathers, a
    fixed cost of every micro-batch, in its g) and, under PP, its pipeline's stages, each with its
    own (`CostModel.stages`)."""
    device = cost.device
    prices = data_parallel_prices(device.counts, device.sharding, device.bf16, mesh.pool, mesh.pool_cluster(cluster),
                                  cost.source)
    cost = dataclasses.replace(cost, g=cost.g + prices.first_gathers, data_parallel=prices)
    return dataclasses.replace(cost, stages=stage_prices(cost, shape, cluster, mesh)) if mesh.pp > 1 else cost
