"""The profiler behind `ballast profile`: the grid measured on ranks, the fit, the report.

`profile(shape, world, memory, settings)` runs `measure.measure_on_ranks` at every grid point
on the command's ranks (`runtime.on_ranks`: local gloo ranks, or torchrun's job: NCCL on GPUs),
fits the coefficients (`fit.py`) at the reduced depths, checks the extrapolation to the full
depth, and returns the profiled CostModel with its report in `fit`.

Video models (`ModelShape.attention` `full` or `spatial-temporal`) profile on clips: the
settings' lengths are the grid's token counts, each turned into clips by `video_grid.video_clips`;
the all-to-all bytes per token are those the runs sent (`measured_bytes_per_token_layer`: the
2D sequence parallelism exchanges hidden states, not q, k, v and outputs).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

from ..pricing.coefficients import InfeasibleError
from ..pricing.cost import CostModel
from ..vocabulary.model_shape import ModelShape
from ..runtime import on_ranks, rank_device
from .context import context_bytes_per_token_layer, context_splits, residuals_by_kind
from .exchange import shape_bytes_per_token_layer
from .coefficients import Coefficients
from .fit import fit
from .residuals import prediction_errors, time_and_act_errors
from .grid import Measurement, Point, recompute_levels
from .machine import LoadMonitor, machine_info
from .noise import noise_exponent
from .tensor_terms import fit_tensor_terms, measure_tensor_points, tensor_degrees, tensor_points, time_all_reduces
from .measure import STATISTICS, combine, core_share, measure_on_ranks
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
            progress: bool = False, timeout: float = 3600.0) -> CostModel:
    """Measure `shape` on `world_size` ranks (`on_ranks`: local gloo ranks stopped after
    `timeout` seconds, or torchrun's) and return its profiled CostModel. The executor's
    precision is `settings.precision`."""
    grid, checks = plan_grid(shape, world_size, settings)
    unseen = held_out(shape, world_size, settings)
    check_states_fit(shape, device_memory)
    start = time.perf_counter()
    with LoadMonitor() as load:
        args = (shape, grid + unseen + checks, settings.warmup, settings.repeats, settings.seed, progress,
                settings.precision)
        tensor = (tensor_degrees(shape, world_size), tensor_points(shape, settings.lengths, settings.depths))
        per_rank = on_ranks(world_size, _measure_on_rank, tensor, *args, timeout=timeout)
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
    tensor_seconds = tensor_point_seconds(per_rank, settings.statistic)  # at the grid's depths, which `at` prices
    cost, points, extrapolation = at[shape.layers], prediction_errors(fitted, at), prediction_errors(verified, at)
    held = prediction_errors(unseen_measured, at)
    tensor_terms, factors_fitted = fit_tensor_terms(per_rank[0]["all_reduces"], tensor[1], tensor_seconds, at, shape)
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
        tensor_parallel={str(t): dataclasses.asdict(terms) for t, terms in tensor_terms.items()},
        compute_factors_fitted={str(t): factor for t, factor in factors_fitted.items()},
        all_reduces=per_rank[0]["all_reduces"], tensor_points=[dict(point=p.label(), **{
            f"{layout}{t}": seconds[layout][i] for t, seconds in tensor_seconds.items() for layout in seconds})
            for i, p in enumerate(tensor[1])],
        max_tokens={d: {c / shape.layers: cost.max_tokens(d, c / shape.layers) for c in recompute_levels(shape.layers)}
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
    recomputation sent above degree 1, pooled over degrees; 0 when none ran above degree 1.

    A video model's exchanges depend on its sequence parallelism (2D: the hidden states at every
    switch between the frames and columns layouts; Ulysses: q, k, v and outputs) and on how a
    micro-batch's clips split, so the profile prices the bytes its runs sent rather than a
    formula. CostModel charges no exchange to recomputation (the fit of r and r_attn holds it),
    so recomputed points are left out, as `fit_time` leaves their extra bytes."""
    rows = [m for m in measurements if m.point.degree > 1 and m.point.recompute_layers == 0]
    tokens = sum(m.shard_tokens * m.point.layers for m in rows)
    return sum(m.comm_bytes for m in rows) / tokens if tokens else 0.0


def _measure_on_rank(tensor: tuple[list[int], list[Point]], *args) -> dict:
    """`measure_on_ranks`; the TP terms of `tensor`'s degrees: all-reduces timed in the dtype
    the executor's precision (args' last) computes in and `tensor`'s points on the TP-split model
    (`tensor_terms.py`); and the device and backend this rank measured on (the profile records
    what the ranks used, not what the machine has)."""
    import torch
    import torch.distributed as dist

    measured = measure_on_ranks(*args)
    shape, _, warmup, repeats, seed, _, precision = args
    device = rank_device()
    dtype = torch.bfloat16 if precision.autocast(device.type) else torch.float32
    degrees, points = tensor
    return dict(measured, all_reduces=time_all_reduces(shape, degrees, repeats, dtype),
                tensor_points=measure_tensor_points(shape, points, degrees, warmup, repeats, seed, precision),
                device=device.type, backend=dist.get_backend())


def tensor_point_seconds(per_rank: Sequence[dict], statistic: str) -> dict[int, dict[str, list[float]]]:
    """Each TP degree's point seconds in each layout ("tp", "whole"): per round the slowest
    rank's (`measure.slowest_rank`, as the grid's points), reduced over rounds by the profile's
    statistic."""
    reduce, degrees = STATISTICS[statistic], per_rank[0]["tensor_points"]
    return {t: {layout: [reduce([max(rank["tensor_points"][t][layout][i][r] for rank in per_rank)
                                 for r in range(len(rounds))]) for i, rounds in enumerate(points)]
                for layout, points in degrees[t].items()} for t in degrees}


def _context_value_bytes(measurements: Sequence[Measurement], shape: ModelShape) -> float:
    """Bytes per value the runs computed in: what their Ulysses all-to-alls sent, or where none
    ran, their CP collectives (4 where neither ran)."""
    sent = all_to_all_value_bytes(measurements, shape)
    if sent is not None:
        return sent
    rows = [m for m in measurements if m.point.cp > 1]
    values = sum(m.context_values for m in rows)
    return sum(m.context_bytes for m in rows) / values if values else 4.0


def all_to_all_value_bytes(measurements: Sequence[Measurement], shape: ModelShape) -> float | None:
    """Bytes per value the Ulysses all-to-alls sent, their send bytes over their send values;
    None when no point ran above degree 1 without CP.

    The executor picks the precision (bf16 autocast on CUDA by default, fp32 elsewhere), and a
    tensor may reach an exchange in another dtype than its neighbours (an fp32 RoPE or norm
    weight promotes q and k under autocast while v stays bf16): the runs' own buffers say what
    a value cost, 4 in fp32, 2 in bf16, in between where they mixed, so the profile prices
    values of the size its bandwidth was fitted from. How many values a block exchanges is the
    formula's (`exchange.shape_bytes_per_token_layer`), checked on the ranks in the first round
    (`exchange.check_exchanged_values`), before the grid is measured."""
    rows = [m for m in measurements if m.point.degree > 1 and m.point.cp == 1]
    if not rows:
        return None
    values = sum(m.comm_values for m in rows)
    assert values > 0, f"{len(rows)} points exchanged bytes but recorded no values"
    return sum(m.comm_bytes for m in rows) / values


def _cost(coefficients: Coefficients, shape: ModelShape, depth: int, world_size: int,
          device_memory: float) -> CostModel:
    at_depth = dataclasses.replace(shape, layers=depth)
    return coefficients.cost_model(at_depth, world_size, device_memory, state_bytes(at_depth))
