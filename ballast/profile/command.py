"""`ballast profile`: measure the real model with the real runtime, fit the cost model, save it.

It runs the model with `Executor` on this machine's ranks (local gloo ranks on the CPU, or,
launched by torchrun, its processes: NCCL on GPUs, rank 0 running the command and the others
serving it, `runtime.job`) over a grid of sequence lengths x SP degrees (powers of two up to the
world that divide the heads) x recompute levels (none, half the layers, all), with a warm-up
round and repeated rounds (reduced by their median, or their minimum with `--statistic min`:
see measure.STATISTICS), and fits docs/design.md's coefficients (ballast.profile.fit): a (s^2),
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
ranks measured on) and its load average. The device memory is a setting (`--device-memory-gb`,
GB) so that a CPU run can stand in for a GPU's capacity; the report says how many tokens each
degree holds in it.

`ballast profile --check profile.json` runs random plans for real, on ranks of the device the
profile measured (local gloo ranks for a CPU profile, torchrun's on GPUs for a GPU one), and
compares them with the profile's predictions (ballast.profile.check).

Video models (`stdit-tiny`, `dit-tiny`, any shape whose attention is `full` or
`spatial-temporal`) profile on clips: --lengths / --max-len give the grid's token counts
(default --max-len 2048; `settings.default_video_sizes`), each made into clips that separate the
pattern's attention terms (`video_grid.video_clips`): a small grid, a few minutes on 2 CPU ranks. Their
`--check` runs plans of clips from the `video` source scaled down to the profile's largest clip.
"""
from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from ..pricing.cost import CostModel
from ..command_line.options import DEVICE_MEMORY, MAX_LEN, MODEL, PP, PRECISION, SEED, TIMEOUT, TP, WORLD
from ..vocabulary.value_checks import at_least, positive
from ..vocabulary.precision import Precision
from ..vocabulary.patterns import attention_pattern
from ..vocabulary.model_shape import ModelShape, get_model_shape
from ..command_line.output_paths import check_output_file
from ..command_line.provenance import provenance
from .grid import recompute_levels
from .machine import default_device_memory
from .measure import STATISTICS
from ..models import check_buildable
from .profiler import profile
from .settings import VIDEO_MAX_TOKENS, Settings, default_depths, default_lengths, default_video_sizes, is_video

HELP = "measure the real model on this machine's ranks, fit and save the cost model (or --check one)"
DEFAULT_WORLD = 2
"""--world of a profile without torchrun."""

def add_arguments(p: argparse.ArgumentParser) -> None:
    MODEL.add(p, "tiny", "profiles on this machine's CPU ranks in minutes")
    WORLD.add(p, None, f"{DEFAULT_WORLD}; --check: the profile's; under torchrun its WORLD_SIZE, which a --world "
                       f"given must match")
    p.add_argument("--lengths", default=None, help="profile: comma-separated grid lengths (default powers of "
                   "two from 128 to --max-len; a video model: token counts of its grid's clips, default --max-len "
                   "and a quarter of it for spatial-temporal attention, powers of two from 256 for full); --check: a length source (default stdlib; a video model: video, scaled "
                   "down to --max-len tokens)")
    MAX_LEN.add(p, None, f"4096, the longest profiled sequence; a video model: {VIDEO_MAX_TOKENS}-token "
                         f"clips, a small grid that profiles in a few minutes on 2 CPU ranks; --check: the "
                         f"profile's largest clip")
    p.add_argument("--out", default="profile.json", help="where the profile JSON goes")
    p.add_argument("--quick", action="store_true", help="a smaller grid and fewer repeats (a first look)")
    DEVICE_MEMORY.add(p, None, "under torchrun on GPUs the GPU's memory less the presets' 12 GB reserve; "
                               "else this machine's RAM / world, standing in for a GPU's; it decides which "
                               "lengths each degree is profiled at; --check: the profile's (a smaller one "
                               "makes the planners shard more, e.g. megatron-dynamic-cp run CP)")
    p.add_argument("--depths", default=None, help="reduced depths (blocks) the grid runs at, then "
                   "extrapolated; the full depth, or a larger one, profiles the model as it is (default 1,2; "
                   "2,4 for a spatial-temporal model, whose blocks come in spatial + temporal pairs)")
    p.add_argument("--verify", type=at_least(int, 0), default=None, help="full-depth points that check the "
                   "extrapolation (default 4, quick 2)")
    p.add_argument("--held-out", type=at_least(int, 0), default=None, help="micro-batches of real lengths or clips "
                   "(stdlib code files; a video model: DCP's video buckets scaled to --max-len) measured with "
                   "the grid but never fitted, their error reported apart (default 8, quick 4)")
    p.add_argument("--repeats", type=positive(int), default=None, help="measured rounds (default 3, quick 2)")
    p.add_argument("--statistic", choices=sorted(STATISTICS), default="median",
                   help="how repeats become one time: median (resists bursts of load) or min (what the "
                   "device does when no other job takes its cores; steadier on a shared, busy host); "
                   "--check reads it from the profile")
    PRECISION.add(p, Precision.AUTO, "what the cost model's presets price: fp32 on CPU ranks, bf16 under "
                                     "torchrun on GPUs; bf16 on CPU ranks profiles 2-byte exchanges on them")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--timeout", type=TIMEOUT, default=3600.0,
                   help="seconds before the local ranks are stopped, or under torchrun before a collective is "
                        "given up (at least 30: they need seconds to start)")
    check = p.add_argument_group("--check: random plans for real against the profile's predictions")
    check.add_argument("--check", metavar="PROFILE", default=None, help="the profile JSON to check")
    check.add_argument("--plans", type=positive(int), default=30, help="random plans to run")
    check.add_argument("--tokens-per-step", type=positive(int), default=None, help="tokens of each random batch "
                       "(default 16384; a video model: 4 x --max-len)")
    check.add_argument("--planners", default="all", help="planners the plans come from, in turn")
    check.add_argument("--png", default=None, help="scatter of predicted vs measured (default: next to "
                       "the profile, -check.png)")
    check.add_argument("--json", dest="json_out", default=None, help="write the comparison here")
    TP.add(check, 1, "plans over the profile's ranks as one pool; a TP check prices a TP rank from the profile's "
                     "measured TP link")
    PP.add(check, 1, "no pipeline; under --pp the plans run through the stages and the measurement is the step "
                     "as is")


def settings_from(args: argparse.Namespace, shape: ModelShape | None = None) -> Settings:
    """The profile's settings; a video model's lengths are its grid clips' token counts."""
    video = shape is not None and is_video(shape)
    depths_spec = args.depths if args.depths is not None else ",".join(
        map(str, default_depths(shape) if shape is not None else (1, 2)))
    max_len = args.max_len if args.max_len is not None else VIDEO_MAX_TOKENS if video else 4096
    try:
        lengths = (tuple(int(x) for x in args.lengths.split(",") if x.strip()) if args.lengths is not None
                   else default_video_sizes(max_len, args.quick, shape.attention) if video
                   else default_lengths(max_len, args.quick))
        depths = tuple(int(x) for x in depths_spec.split(",") if x.strip())
    except ValueError as e:
        raise ValueError(f"--lengths and --depths take comma-separated integers when profiling (a length "
                         f"source such as stdlib is for --check): {e}") from e
    if not depths:
        raise ValueError("--depths needs at least one depth")
    return Settings(lengths, depths, verify=args.verify if args.verify is not None else 2 if args.quick else 4,
                    repeats=args.repeats if args.repeats is not None else 2 if args.quick else 3,
                    seed=args.seed, statistic=args.statistic, precision=args.precision,
                    held_out=args.held_out if args.held_out is not None else 4 if args.quick else 8)


def run(args: argparse.Namespace) -> int:
    from ..runtime import in_job, job_world

    # Before any rank joins: a --world that torchrun's contradicts is one line per node.
    world = job_world(args.world, None if args.check else DEFAULT_WORLD)
    if not args.check and (args.tp, args.pp) != (1, 1):
        raise ValueError(f"--tp {args.tp} --pp {args.pp} are for --check: a profile measures whole layers on every "
                         f"rank and the TP link of every degree its ranks allow")
    if args.check:
        from .check import run_check
        return in_job(lambda: run_check(args, world), args.timeout)
    return in_job(lambda: measure_and_fit(args, world), args.timeout)


def measure_and_fit(args: argparse.Namespace, world: int) -> int:
    """`ballast profile` on `world` ranks (started here, or the torchrun job's with this process
    its rank 0): the grid measured, the fit reported and saved."""
    from ..runtime import describe_ranks, rank_device, under_torchrun

    console = Console()
    origin = provenance()
    check_output_file(args.out, "--out")
    shape = get_model_shape(args.model)
    check_buildable(shape)
    memory = (args.device_memory_gb * 1e9 if args.device_memory_gb is not None
              else default_device_memory(world, rank_device().type == "cuda"))
    settings = settings_from(args, shape)
    if not under_torchrun() and torch.cuda.is_available():
        console.print("[yellow]this machine has a GPU, but local gloo ranks measure the CPU (and the profile "
                      "says so): launch under torchrun, one process per GPU, to profile the GPUs[/yellow]")
    sizes = ",".join(map(str, settings.lengths))
    what = f"{shape.attention} attention, clips of {sizes} tokens" if is_video(shape) else f"lengths {sizes}"
    console.print(f"profiling {shape.name} ({shape.layers} blocks) on {describe_ranks(world)} at depths "
                  f"{','.join(map(str, settings.depths))}: {what}, "
                  f"{settings.warmup} warm-up + {settings.repeats} rounds ({settings.statistic})")
    cost = profile(shape, world, memory, settings, progress=True, timeout=args.timeout)
    print_report(console, cost)
    cost.save(args.out, origin)
    console.print(f"wrote {args.out}")
    return 0


def print_report(console: Console, cost: CostModel) -> None:
    """Coefficients, residuals, the extrapolation check and each degree's capacity."""
    report = cost.fit
    load, res, ext = report["load_average"], report["residuals"], report["extrapolation_error"]
    held = report.get("held_out_error")
    points = len(report["points"]) + len(report["extrapolation"]) + len(report.get("held_out", []))
    console.print(f"measured {points} points in "
                  f"{report['seconds']:.0f} s; load average {load['min']:.1f}..{load['max']:.1f} "
                  f"(median {load['median']:.1f}) on {load['cpus']} CPUs; the ranks had "
                  f"{report['core_share']:.0%} of a core (CPU / wall time of a step)")
    if "noise_exponent" in report:  # profiles made before it was measured were fitted with 1
        console.print(f"repeats spread as seconds^{report['noise_exponent']:.2f}: the time fit weights each point "
                      f"by seconds^-{report['noise_exponent']:.2f}")
    per = f"s/{cost.pattern.unit_label}"
    sample = f"  f={cost.sample_seconds * 1e6:.2f} us/sample" if not cost.pattern.spans_are_samples else ""
    sample += f"  h={cost.call_seconds * 1e6:.2f} us/call" if cost.call_seconds else ""
    sample += f"  w={cost.rank_sample_seconds * 1e6:.2f} us/sample/rank" if cost.rank_sample_seconds else ""
    if cost.remap_per_token or cost.remap_latency:
        sample += (f"  remap={cost.remap_per_token * 1e6:.2f} us/token+"
                   f"{cost.remap_latency * 1e3:.2f} ms/slot")
    console.print(f"a={cost.a:.3e} {per}  e={cost.span_seconds * 1e6:.2f} us/span{sample}  b={cost.b:.3e} s/token  "
                  f"g={cost.g * 1e3:.2f} ms  r={cost.recompute:.3f}  "
                  f"r_attn={cost.recompute_attention:.3f}  g_r={cost.recompute_fixed * 1e3:.2f} ms  "
                  f"k={cost.kept:.3f}  act={cost.act_per_token / 1e3:.1f} KB/token  states={cost.states / 1e6:.1f} MB")
    video = report.get("video")
    if video is not None:
        console.print(f"{video['attention']} attention on clips {', '.join('x'.join(map(str, c)) for c in video['clips'])}")
        if attention_pattern(video["attention"]).split_fit:
            console.print(f"c_s={video['spatial_s_per_pair']:.3e} s per pair of a spatial block, "
                          f"c_t={video['temporal_s_per_pair']:.3e} of a temporal one: at {cost.layers} blocks "
                          f"({video['spatial_blocks']} spatial, {video['temporal_blocks']} temporal) a={cost.a:.3e} s/unit "
                          f"and a measured spatial_share {cost.spatial_share:.3f} (the shape's: "
                          f"{video['shape_spatial_share']:.3f})")
    for d, bw in sorted(cost.bandwidth.items()):
        console.print(f"degree {d}: all-to-all {bw / 1e9:.3f} GB/s, fixed {cost.comm_latency.get(d, 0) * 1e3:.2f} ms "
                      f"per micro-batch ({report['coefficients']['call_latency'][d] * 1e3:.2f} ms per call)")
    coefficients = report["coefficients"]
    for d, latency in sorted(cost.context_latency.items()):
        console.print(f"degree {d} with a CP part: attention x{cost.context_attention:.3f}, CP collectives "
                      f"{coefficients['context_bandwidth'][d] / 1e9:.3f} GB/s as priced, fixed {latency * 1e3:.2f} ms "
                      f"per micro-batch ({coefficients['context_call_latency'][d] * 1e3:.2f} ms per call)")
    table = Table(title="relative error of the fit |predicted / measured - 1|")
    for column in ("", "points", "time median", "time p90", "time max", "act median", "act max"):
        table.add_column(column, justify="right")
    for name, summary in (("grid (reduced depth)", res), ("held out (real batches, never fitted)", held),
                          ("full depth (extrapolated)", ext)):
        t, a = (summary or {}).get("time", {"count": 0}), (summary or {}).get("act")
        if t["count"]:
            table.add_row(name, str(t["count"]), f"{t['median']:.1%}", f"{t['p90']:.1%}", f"{t['max']:.1%}",
                          f"{a['median']:.1%}", f"{a['max']:.1%}")
    console.print(table)
    kinds = {kind: errors["time"] for kind, errors in report.get("residuals_by_kind", {}).items() if "time" in errors}
    console.print("time |error| by kind of point (median / p90, n): " + "; ".join(
        f"{kind} {t['median']:.1%} / {t['p90']:.1%} ({t['count']})" for kind, t in kinds.items() if t["count"]))
    if res["act"]["count"] and res["act"]["max"] > 0.1:
        console.print("[yellow]activation bytes are not linear in tokens (worst point off by "
                      f"{res['act']['max']:.0%}): the attention kernel may keep s^2 scores[/yellow]")
    capacity = Table(title=f"tokens per micro-batch that fit {cost.device_memory / 1e9:.3f} GB (max_tokens)")
    capacity.add_column("degree", justify="right")
    levels = [c / cost.layers for c in recompute_levels(cost.layers)]
    for c in levels:
        capacity.add_column(f"recompute {c:.2f}", justify="right")
    for d, row in report["max_tokens"].items():
        capacity.add_row(str(d), *(str(row[c]) for c in levels))
    console.print(capacity)

