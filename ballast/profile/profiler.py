"""The profiler behind `ballast profile`: the grid measured on ranks, the fit, the report.

`profile(shape, world, memory, settings)` spawns local gloo ranks (or joins torchrun's job),
runs `measure.measure_on_ranks` at every grid point, fits the coefficients (`fit.py`) at the
reduced depths, checks the extrapolation to the full depth, and returns the profiled CostModel
with its report in `fit`.

Video models (`ModelShape.attention` `full` or `spatial-temporal`) profile on clips: the
settings' lengths are the grid's token counts, each turned into clips by `video_grid.video_clips`;
the all-to-all bytes per token are those the runs sent (`measured_bytes_per_token_layer`: the
2D sequence parallelism exchanges hidden states, not q, k, v and outputs).
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from datetime import timedelta
from typing import Sequence

from ..pricing.cost import CostModel, InfeasibleError
from ..vocabulary.model_shape import ModelShape
from ..runtime import run_local, under_torchrun
from .context import context_bytes_per_token_layer, context_splits, gathered_values_per_token_layer, residuals_by_kind
from .coefficients import Coefficients
from .fit import fit
from .residuals import prediction_errors, time_and_act_errors
from .grid import Measurement, Point, checkpoint_levels
from .machine import LoadMonitor, machine_info
from .noise import noise_exponent
from .measure import combine, core_share, measure_on_ranks, rank_device
from .settings import Settings, held_out, is_video, plan_grid, sp_degrees


STATE_BYTES_PER_PARAM = 16
"""What the runtime holds per parameter on every rank: fp32 weight and gradient, AdamW's two
fp32 moments (replicated: ZeRO-1 would shard the moments)."""


def state_bytes(shape: ModelShape) -> float:
    """Bytes of states every rank holds for this shape (see STATE_BYTES_PER_PARAM)."""
    return float(STATE_BYTES_PER_PARAM * shape.params)


def check_states_fit(shape: ModelShape, device_memory: float) -> None:
    """Fail before measuring anything when no degree can hold the model: SP shards activations,
    never the states, so every rank needs all of them."""
    states = state_bytes(shape)
    if states >= device_memory:
        raise InfeasibleError(
            f"model {shape.name!r} ({shape.params / 1e6:.1f}M parameters) needs {states / 1e9:.3f} GB of "
            f"states per rank ({STATE_BYTES_PER_PARAM} B per parameter: fp32 weights, gradients and AdamW's "
            f"two moments), which does not fit --device-memory-gb {device_memory / 1e9:.3f} GB at any SP degree "
            f"(SP shards activations, not states); give more than {states / 1e9:.3f} GB, or a smaller model")


def profile(shape: ModelShape, world_size: int, device_memory: float, settings: Settings,
            progress: bool = False, timeout: float = 3600.0) -> CostModel | None:
    """Measure `shape` on `world_size` ranks and return its profiled CostModel.

    Spawns local gloo ranks, or under torchrun joins its job (NCCL on GPUs): then every
    process calls this and rank 0 alone gets the CostModel, the others None."""
    grid, checks = plan_grid(shape, world_size, settings)
    unseen = held_out(shape, world_size, settings)
    check_states_fit(shape, device_memory)
    start = time.perf_counter()
    with LoadMonitor() as load:
        args = (shape, grid + unseen + checks, settings.warmup, settings.repeats, settings.seed, progress,
                settings.precision)
        per_rank = (_measure_torchrun(world_size, args, timeout) if under_torchrun() else
                    run_local(world_size, _measure_on_rank, *args, timeout=timeout))
    if per_rank is None:
        return None
    measured = combine(grid + unseen + checks, per_rank, settings.statistic)
    fitted, unseen_measured, verified = (measured[:len(grid)], measured[len(grid):len(grid) + len(unseen)],
                                         measured[len(grid) + len(unseen):])
    if is_video(shape):
        value_bytes, per_token = None, measured_bytes_per_token_layer(measured)
        exchanged = {d: per_token for d in sp_degrees(shape, world_size)}
    else:
        value_bytes = all_to_all_value_bytes(measured, shape)
        # Without a degree above 1 nothing is exchanged, and no prediction prices an exchange.
        exchanged = {d: 0.0 if value_bytes is None else shape_bytes_per_token_layer(shape, value_bytes, d)
                     for d in sp_degrees(shape, world_size)}
    gathered = {split: context_bytes_per_token_layer(shape, _context_value_bytes(measured, shape), *split)
                for split in context_splits(shape, world_size)}
    coefficients = fit(fitted, exchanged, shape.attention, gathered)
    at = {d: _cost(coefficients, shape, d, world_size, device_memory)
          for d in {shape.layers, *(m.point.layers for m in measured)}}
    cost, points, extrapolation = at[shape.layers], prediction_errors(fitted, at), prediction_errors(verified, at)
    held = prediction_errors(unseen_measured, at)
    report = dict(
        profiler="ballast profile", seconds=time.perf_counter() - start, load_average=load.summary(),
        machine=machine_info(world_size, per_rank[0]["device"], per_rank[0]["backend"]),
        all_to_all_value_bytes=value_bytes, shape=shape.to_dict(), settings=dataclasses.asdict(settings),
        degrees=sp_degrees(shape, world_size), depths=sorted({p.layers for p in grid}),
        # Labels of every measured point, in `measurements`' order: grid, held-out, full depth.
        grid=[p.label() for p in grid + unseen + checks], coefficients=coefficients.to_dict(),
        step_overhead_s=per_rank[0]["step_overhead"], states_measured=per_rank[0]["states"],
        core_share=core_share([r for rank in per_rank for point in rank["records"].values() for r in point]),
        noise_exponent=noise_exponent(fitted), points=points, extrapolation=extrapolation,
        residuals=time_and_act_errors(points),
        extrapolation_error=time_and_act_errors(extrapolation), held_out=held, held_out_error=time_and_act_errors(held),
        residuals_by_kind=residuals_by_kind(points + extrapolation),
        max_tokens={d: {c / shape.layers: cost.max_tokens(d, c / shape.layers) for c in checkpoint_levels(shape.layers)}
                    for d in cost.degrees},
        measurements=[m.to_dict() for m in measured])
    if is_video(shape):
        report["video"] = video_report(coefficients, shape, grid + checks, exchanged)
    return dataclasses.replace(cost, fit=report)


def video_report(coefficients: Coefficients, shape: ModelShape, points: Sequence[Point],
                 exchanged: dict[int, float]) -> dict:
    """What a video profile adds to the report: the pattern, the clips, the exchanged bytes per
    token and block the runs sent, and for spatial-temporal both attention coefficients (per
    attended pair of one spatial / temporal block) with the spatial share they measure next to
    the shape's."""
    clips = sorted({c for p in points for c in p.shapes}, key=lambda c: (math.prod(c), c))
    out = dict(attention=shape.attention, clips=[list(c) for c in clips],
               all_to_all_bytes_per_token_layer=exchanged)
    if shape.pattern.split_fit:
        a, share = coefficients.attention_at(shape.layers)
        spatial, temporal = shape.pattern.block_counts(shape.layers)
        out.update(spatial_s_per_pair=coefficients.spatial_layer, temporal_s_per_pair=coefficients.temporal_layer,
                   spatial_blocks=spatial, temporal_blocks=temporal, a=a, spatial_share=share,
                   shape_spatial_share=shape.spatial_share)
    return out


def measured_bytes_per_token_layer(measurements: Sequence[Measurement]) -> float:
    """All-to-all send bytes per token (of the largest shard) and block that the runs without
    checkpointing sent above degree 1, pooled over degrees; 0 when none ran above degree 1.

    A video model's exchanges depend on its sequence parallelism (2D: the hidden states at every
    switch between the frames and columns layouts; Ulysses: q, k, v and outputs) and on how a
    micro-batch's clips split, so the profile prices the bytes its runs sent rather than a
    formula. CostModel charges no exchange to recomputation (the fit of r and r_attn holds it),
    so checkpointed points are left out, as `fit_time` leaves their extra bytes."""
    rows = [m for m in measurements if m.point.degree > 1 and m.point.checkpoint_layers == 0]
    tokens = sum(m.shard_tokens * m.point.layers for m in rows)
    return sum(m.comm_bytes for m in rows) / tokens if tokens else 0.0


def _measure_torchrun(world_size: int, args: tuple, timeout: float) -> list[dict] | None:
    """Join torchrun's job, measure on this rank, gather every rank's records on rank 0."""
    import torch.distributed as dist

    from ..runtime import init_distributed

    if int(os.environ["WORLD_SIZE"]) != world_size:
        raise ValueError(f"--world {world_size} does not match torchrun's WORLD_SIZE {os.environ['WORLD_SIZE']}")
    init_distributed(timeout=timedelta(seconds=timeout))
    try:
        mine = _measure_on_rank(*args)
        gathered = [None] * world_size if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        return gathered
    finally:
        dist.destroy_process_group()


def _measure_on_rank(*args) -> dict:
    """`measure_on_ranks`, and the device and backend this rank measured on (the profile records
    what the ranks used, not what the machine has)."""
    import torch.distributed as dist

    return dict(measure_on_ranks(*args), device=rank_device().type, backend=dist.get_backend())


def shape_bytes_per_token_layer(shape: ModelShape, value_bytes: int, degree: int = 1) -> float:
    """All-to-all send bytes per token and block at SP degree `degree`: q+k+v then out in
    forward, both again in backward, `value_bytes` each (4 in fp32, 2 in bf16); k and v with
    the kv heads the degree exchanges (`layouts.HeadLayout.exchanged_kv_heads`; degree 1: the model's own)."""
    kv_dim = shape.pattern.layout.exchanged_kv_heads(shape.kv_heads, degree) * shape.head_dim
    return 2.0 * (2 * shape.hidden + 2 * kv_dim) * value_bytes


def _context_value_bytes(measurements: Sequence[Measurement], shape: ModelShape) -> int:
    """Bytes per value the runs computed in: what their Ulysses all-to-alls sent, or where none
    ran, their CP collectives (a block without checkpointing sends about every token's K, V
    once each way: the gather its rows to every CP rank, the reduce-scatter every rank's)."""
    sent = all_to_all_value_bytes(measurements, shape)
    if sent is not None:
        return sent
    rows = [m for m in measurements if m.point.cp > 1 and m.point.checkpoint_layers == 0]
    if not rows:
        return 4
    values = sum(2 * m.point.layers * m.point.tokens * gathered_values_per_token_layer(shape, m.point.degree, m.point.cp)
                 for m in rows)
    return min((2, 4), key=lambda size: abs(sum(m.context_bytes for m in rows) / values - size))


def even_single(point: Point) -> bool:
    """One sequence whose tokens every rank of the degree shares equally: its ranks' send buffers
    are exactly `shard_tokens` rows (a packed stream's or an uneven split's largest shard is not
    every rank's), so its bytes per value can be read exactly."""
    return len(point.lengths) == 1 and point.tokens % point.degree == 0


def all_to_all_value_bytes(measurements: Sequence[Measurement], shape: ModelShape) -> int | None:
    """Bytes per value the measured all-to-alls sent; None when no point ran above degree 1.

    The executor picks the precision (bf16 autocast on CUDA, fp32 elsewhere), and the bytes the
    runs actually sent say which one it picked, so the profile cannot price values of another
    size than those its bandwidth was fitted from. A rank sends its padded shard (the largest
    one, `shard_tokens` rows) through every exchange: a plain block once per direction and pass,
    a checkpointed one's forward pair again when it is recomputed."""
    sent = {m.comm_bytes / (m.shard_tokens * (m.point.layers + m.point.checkpoint_layers / 2)
                            * shape_bytes_per_token_layer(shape, 1, m.point.degree))
            for m in measurements if m.point.degree > 1 and m.point.cp == 1 and even_single(m.point)}
    if not sent:
        return None
    if len(sent) > 1 or not sent <= {2.0, 4.0}:
        raise ValueError(f"the all-to-alls sent {sorted(sent)} bytes per value of {shape.name!r}'s q, k, v and "
                         f"output, not one of 2 (bf16) or 4 (fp32): the runtime no longer exchanges what "
                         f"shape_bytes_per_token_layer counts")
    return int(sent.pop())


def _cost(coefficients: Coefficients, shape: ModelShape, depth: int, world_size: int,
          device_memory: float) -> CostModel:
    at_depth = dataclasses.replace(shape, layers=depth)
    return coefficients.cost_model(at_depth, world_size, device_memory, state_bytes(at_depth))
