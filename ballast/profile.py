"""`ballast profile`: measure the real model with the real runtime, fit the cost model, save it.

It runs the model with `Executor` on this machine's ranks (local gloo ranks on the CPU, or
torchrun's: NCCL on GPUs) over a grid of sequence lengths x SP degrees (powers of two up to the
world that divide the heads) x checkpoint levels (none, half the layers, all), with a warm-up
round and repeated rounds (reduced by their median, or their minimum with `--statistic min`:
see measure.STATISTICS), and fits DESIGN.md's coefficients (ballast.profiling.fit): a (s^2),
b (s), g (per micro-batch), r, the all-to-all bandwidth and per-call latency by degree,
activation bytes per token and k. The all-to-all bytes per token are those the runs sent:
4-byte values in fp32 on CPUs, 2-byte ones under the executor's bf16 autocast on GPUs
(`all_to_all_value_bytes`).

Fast profiling as DCP does it: the grid runs on reduced-depth copies of the model (1 and 2
blocks by default), which separates per-block terms from fixed ones, and the fit extrapolates
to the full depth; a few full-depth points then measure how far off the extrapolation is.

The JSON is CostModel's (source "profiled"), usable wherever a cost model is
(`ballast simulate --cost profile.json`); its `fit` holds residuals, the grid, every point
measured vs predicted, the extrapolation check, the machine (with the device and backend the
ranks measured on) and its load average. The device memory is a setting (`--device-memory`,
GB) so that a CPU run can stand in for a GPU's capacity; the report says how many tokens each
degree holds in it.

`ballast profile --check profile.json` runs random plans for real and compares them with the
profile's predictions (ballast.profiling.check).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
from datetime import timedelta
from typing import Sequence

import torch
from rich.console import Console
from rich.table import Table

from .cost import CostModel, InfeasibleError
from .profiling.fit import Coefficients, compare, error_summary, fit
from .profiling.grid import Measurement, Point, build_grid, checkpoint_levels, verification_points
from .profiling.machine import LoadMonitor, machine_info, physical_memory
from .profiling.measure import STATISTICS, combine, core_share, measure_on_ranks, rank_device
from .runtime import run_local, under_torchrun
from .shapes import ModelShape, get_model_shape

HELP = "measure the real model on this machine's ranks, fit and save the cost model (or --check one)"
STATE_BYTES_PER_PARAM = 16
"""What the runtime holds per parameter on every rank: fp32 weight and gradient, AdamW's two
fp32 moments (replicated: ZeRO-1 would shard the moments)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What to measure (`settings_from` reads it from the command line; --quick shrinks it)."""

    lengths: tuple[int, ...]
    depths: tuple[int, ...]
    verify: int
    warmup: int = 1
    repeats: int = 3
    seed: int = 0
    statistic: str = "median"
    """How repeats become one number: `median` or `min` (measure.STATISTICS)."""


def default_lengths(max_len: int, quick: bool) -> tuple[int, ...]:
    """Powers of two from 128 to max_len (max_len itself included); every other one when quick."""
    lengths, s = [], 128
    while s < max_len:
        lengths.append(s)
        s *= 2
    lengths = lengths[::-2][::-1] if quick else lengths
    return tuple(lengths + [max_len])


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
            f"two moments), which does not fit --device-memory {device_memory / 1e9:.3f} GB at any SP degree "
            f"(SP shards activations, not states); give more than {states / 1e9:.3f} GB, or a smaller model")


def sp_degrees(shape: ModelShape, world_size: int) -> list[int]:
    """Powers of two up to the world that divide the heads and kv heads."""
    return [1 << i for i in range(world_size.bit_length()) if (1 << i) <= world_size
            and shape.supports_degree(1 << i)]


def plan_grid(shape: ModelShape, world_size: int, settings: Settings) -> tuple[list[Point], list[Point]]:
    """(grid at the reduced depths, full-depth points that check the extrapolation)."""
    if world_size < 1 or world_size & (world_size - 1):
        raise ValueError(f"--world must be a power of two, got {world_size}")
    if not settings.lengths or min(settings.lengths) < 1:
        raise ValueError(f"grid lengths must be positive, got {settings.lengths}")
    if settings.repeats < 1 or settings.warmup < 0 or settings.verify < 0:
        raise ValueError("repeats must be >= 1, warm-up and verify >= 0")
    if settings.statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(STATISTICS)}, got {settings.statistic!r}")
    if min(settings.depths) < 1:
        raise ValueError(f"profiled depths must be >= 1 block, got {settings.depths}")
    degrees = sp_degrees(shape, world_size)
    depths = sorted({min(d, shape.layers) for d in settings.depths})
    grid = [p for depth in depths for p in build_grid(depth, settings.lengths, degrees)]
    checks = ([] if shape.layers in depths else
              verification_points(shape.layers, settings.lengths, degrees, settings.verify))
    return grid, checks


def profile(shape: ModelShape, world_size: int, device_memory: float, settings: Settings,
            progress: bool = False, timeout: float = 3600.0) -> CostModel | None:
    """Measure `shape` on `world_size` ranks and return its profiled CostModel.

    Spawns local gloo ranks, or under torchrun joins its job (NCCL on GPUs): then every
    process calls this and rank 0 alone gets the CostModel, the others None."""
    grid, checks = plan_grid(shape, world_size, settings)
    check_states_fit(shape, device_memory)
    start = time.perf_counter()
    with LoadMonitor() as load:
        args = (shape, grid + checks, settings.warmup, settings.repeats, settings.seed, progress)
        per_rank = (_measure_torchrun(world_size, args, timeout) if under_torchrun() else
                    run_local(world_size, _measure_on_rank, *args, timeout=timeout))
    if per_rank is None:
        return None
    measured = combine(grid + checks, per_rank, settings.statistic)
    fitted, verified = measured[:len(grid)], measured[len(grid):]
    value_bytes = all_to_all_value_bytes(measured, shape)
    # Without a degree above 1 nothing is exchanged, and no prediction prices an exchange.
    coefficients = fit(fitted, 0.0 if value_bytes is None else shape_bytes_per_token_layer(shape, value_bytes))
    at = {d: _cost(coefficients, shape, d, world_size, device_memory)
          for d in {shape.layers, *(m.point.layers for m in measured)}}
    cost, points, extrapolation = at[shape.layers], compare(fitted, at), compare(verified, at)
    report = dict(
        profiler="ballast profile", seconds=time.perf_counter() - start, load_average=load.summary(),
        machine=machine_info(world_size, per_rank[0]["device"], per_rank[0]["backend"]),
        all_to_all_value_bytes=value_bytes, shape=shape.to_dict(), settings=dataclasses.asdict(settings),
        degrees=sp_degrees(shape, world_size), depths=sorted({p.layers for p in grid}),
        grid=[p.label() for p in grid + checks], coefficients=coefficients.to_dict(),
        step_overhead_s=per_rank[0]["step_overhead"], states_measured=per_rank[0]["states"],
        core_share=core_share([r for rank in per_rank for point in rank["records"].values() for r in point]),
        points=points, extrapolation=extrapolation, residuals=_errors(points),
        extrapolation_error=_errors(extrapolation),
        max_tokens={d: {c / shape.layers: cost.max_tokens(d, c / shape.layers) for c in checkpoint_levels(shape.layers)}
                    for d in cost.degrees},
        measurements=[m.to_dict() for m in measured])
    return dataclasses.replace(cost, fit=report)


def _errors(rows: list[dict]) -> dict:
    return {key: error_summary([row[f"{key}_error"] for row in rows]) for key in ("time", "act")}


def _measure_torchrun(world_size: int, args: tuple, timeout: float) -> list[dict] | None:
    """Join torchrun's job, measure on this rank, gather every rank's records on rank 0."""
    import torch.distributed as dist

    from .runtime import init_distributed

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


def shape_bytes_per_token_layer(shape: ModelShape, value_bytes: int) -> float:
    """All-to-all send bytes per token and block: q+k+v then out in forward, both again in
    backward, `value_bytes` each (4 in fp32, 2 in bf16)."""
    return 2.0 * (2 * shape.hidden + 2 * shape.kv_dim) * value_bytes


def all_to_all_value_bytes(measurements: Sequence[Measurement], shape: ModelShape) -> int | None:
    """Bytes per value the measured all-to-alls sent; None when no point ran above degree 1.

    The executor picks the precision (bf16 autocast on CUDA, fp32 elsewhere), and the bytes the
    runs actually sent say which one it picked, so the profile cannot price values of another
    size than those its bandwidth was fitted from. A rank sends its padded shard (the largest
    one, `shard_tokens` rows) through every exchange: a plain block once per direction and pass,
    a checkpointed one's forward pair again when it is recomputed."""
    sent = {m.comm_bytes / (m.shard_tokens * (m.point.layers + m.point.checkpoint_layers / 2)
                            * shape_bytes_per_token_layer(shape, 1))
            for m in measurements if m.point.degree > 1}
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="model preset or JSON ModelShape")
    p.add_argument("--world", type=int, default=None, help="local gloo ranks, a power of two (default 2; "
                   "--check: the profile's)")
    p.add_argument("--lengths", default=None, help="profile: comma-separated grid lengths (default powers of "
                   "two from 128 to --max-len); --check: a length source (default stdlib)")
    p.add_argument("--max-len", type=int, default=4096, help="longest profiled / checked sequence")
    p.add_argument("--out", default="profile.json", help="where the profile JSON goes")
    p.add_argument("--quick", action="store_true", help="a smaller grid and fewer repeats (a first look)")
    p.add_argument("--device-memory", type=float, default=None,
                   help="usable GB per device (default: this machine's RAM / world)")
    p.add_argument("--depths", default="1,2", help="reduced depths (blocks) the grid runs at, then "
                   "extrapolated; the full depth, or a larger one, profiles the model as it is")
    p.add_argument("--verify", type=int, default=None, help="full-depth points that check the "
                   "extrapolation (default 4, quick 2)")
    p.add_argument("--repeats", type=int, default=None, help="measured rounds (default 3, quick 2)")
    p.add_argument("--statistic", choices=sorted(STATISTICS), default="median",
                   help="how repeats become one time: median (resists bursts of load) or min (what the "
                   "device does when no other job takes its cores; steadier on a shared, busy host); "
                   "--check reads it from the profile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the ranks are stopped")
    check = p.add_argument_group("--check: random plans for real against the profile's predictions")
    check.add_argument("--check", metavar="PROFILE", default=None, help="the profile JSON to check")
    check.add_argument("--plans", type=int, default=30, help="random plans to run")
    check.add_argument("--tokens-per-step", type=int, default=16384, help="tokens of each random batch")
    check.add_argument("--planners", default="all", help="planners the plans come from, in turn")
    check.add_argument("--png", default=None, help="scatter of predicted vs measured (default: next to "
                       "the profile, -check.png)")
    check.add_argument("--json", dest="json_out", default=None, help="write the comparison here")


def settings_from(args: argparse.Namespace) -> Settings:
    try:
        lengths = (default_lengths(args.max_len, args.quick) if args.lengths is None else
                   tuple(int(x) for x in args.lengths.split(",") if x.strip()))
        depths = tuple(int(x) for x in args.depths.split(",") if x.strip())
    except ValueError as e:
        raise ValueError(f"--lengths and --depths take comma-separated integers: {e}") from e
    if not depths:
        raise ValueError("--depths needs at least one depth")
    return Settings(lengths, depths, verify=args.verify if args.verify is not None else 2 if args.quick else 4,
                    repeats=args.repeats if args.repeats is not None else 2 if args.quick else 3,
                    seed=args.seed, statistic=args.statistic)


def run(args: argparse.Namespace) -> int:
    if args.check:
        from .profiling.check import run_check
        return run_check(args)
    console = Console(quiet=under_torchrun() and os.environ["RANK"] != "0")  # one report per job
    shape = get_model_shape(args.model)
    world = args.world or (int(os.environ["WORLD_SIZE"]) if under_torchrun() else 2)
    memory = args.device_memory * 1e9 if args.device_memory is not None else physical_memory() / world
    settings = settings_from(args)
    ranks = "torchrun" if under_torchrun() else "local gloo"
    if not under_torchrun() and torch.cuda.is_available():
        console.print("[yellow]this machine has a GPU, but local gloo ranks measure the CPU (and the profile "
                      "says so): launch under torchrun, one process per GPU, to profile the GPUs[/yellow]")
    console.print(f"profiling {shape.name} ({shape.layers} blocks) on {world} {ranks} ranks at depths "
                  f"{','.join(map(str, settings.depths))}: lengths {','.join(map(str, settings.lengths))}, "
                  f"{settings.warmup} warm-up + {settings.repeats} rounds ({settings.statistic})")
    cost = profile(shape, world, memory, settings, progress=True, timeout=args.timeout)
    if cost is None:  # a torchrun rank other than 0
        return 0
    print_report(console, cost)
    cost.save(args.out)
    console.print(f"wrote {args.out}")
    return 0


def print_report(console: Console, cost: CostModel) -> None:
    """Coefficients, residuals, the extrapolation check and each degree's capacity."""
    report = cost.fit
    load, res, ext = report["load_average"], report["residuals"], report["extrapolation_error"]
    console.print(f"measured {len(report['points']) + len(report['extrapolation'])} points in "
                  f"{report['seconds']:.0f} s; load average {load['min']:.1f}..{load['max']:.1f} "
                  f"(median {load['median']:.1f}) on {load['cpus']} CPUs; the ranks had "
                  f"{report['core_share']:.0%} of a core (CPU / wall time of a step)")
    console.print(f"a={cost.a:.3e} s/token^2  b={cost.b:.3e} s/token  g={cost.g * 1e3:.2f} ms  r={cost.recompute:.3f}  "
                  f"r_attn={cost.recompute_attention:.3f}  "
                  f"k={cost.kept:.3f}  act={cost.act_per_token / 1e3:.1f} KB/token  states={cost.states / 1e6:.1f} MB")
    for d, bw in sorted(cost.bandwidth.items()):
        console.print(f"degree {d}: all-to-all {bw / 1e9:.3f} GB/s, fixed {cost.comm_latency.get(d, 0) * 1e3:.2f} ms "
                      f"per micro-batch ({report['coefficients']['call_latency'][d] * 1e3:.2f} ms per call)")
    table = Table(title="relative error of the fit |predicted / measured - 1|")
    for column in ("", "points", "time median", "time p90", "time max", "act median", "act max"):
        table.add_column(column, justify="right")
    for name, summary in (("grid (reduced depth)", res), ("full depth (extrapolated)", ext)):
        t, a = summary["time"], summary["act"]
        if t["count"]:
            table.add_row(name, str(t["count"]), f"{t['median']:.1%}", f"{t['p90']:.1%}", f"{t['max']:.1%}",
                          f"{a['median']:.1%}", f"{a['max']:.1%}")
    console.print(table)
    if res["act"]["count"] and res["act"]["max"] > 0.1:
        console.print("[yellow]activation bytes are not linear in tokens (worst point off by "
                      f"{res['act']['max']:.0%}): the attention kernel may keep s^2 scores[/yellow]")
    capacity = Table(title=f"tokens per micro-batch that fit {cost.device_memory / 1e9:.3f} GB (max_tokens)")
    capacity.add_column("degree", justify="right")
    levels = [c / cost.layers for c in checkpoint_levels(cost.layers)]
    for c in levels:
        capacity.add_column(f"checkpoint {c:.2f}", justify="right")
    for d, row in report["max_tokens"].items():
        capacity.add_row(str(d), *(str(row[c]) for c in levels))
    console.print(capacity)

