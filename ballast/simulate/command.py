"""Plan and simulate steps of a length source on a cluster and model, every planner side by side."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.measure import Measurement
from rich.progress import Progress

from ..pricing.bounds import longest_alone
from ..vocabulary.cluster import get_cluster
from .side_by_side import simulate_planners
from ..pricing.cost_sources import get_cost_model
from ..dataset.length_stream import BatchSpec, LengthStream
from ..dataset.lengths import LENGTH_SYNTAX, get_length_source
from ..planners import PlannerOptions, parse_planner_names
from ..planners.hydraulis_pool import HISTOGRAM, auto_strategies
from ..plans.strategy_gantt import strategy_gantt
from ..planners.strategy_prices import StrategyPrices
from ..plans.gantt import gantt
from .table import planner_table
from ..vocabulary.model_shape import get_model_shape
from ..command_line.options import (AUTO_STRATEGIES, parse_strategies, CLUSTER, COST, CP, DEGREE, DEVICE_MEMORY, MAX_LEN, MODEL, NODES, ROUTING, SEED,
                                    PP, STRATEGY, TP, WORLD, OnOff, positive)
from ..pricing.parameter_movement import Movement
from .strategies import simulate_strategy_planners, strategy_table
from ..vocabulary.job_mesh import JobMesh
from ..command_line.output_paths import check_output_file
from ..command_line.provenance import provenance
from ..vocabulary.samples import tokens
from ..vocabulary.sharding import Sharding

HELP = "plan and simulate steps under several planners; print a table, write JSON"

def add_arguments(p: argparse.ArgumentParser) -> None:
    d = PlannerOptions()
    p.add_argument("--lengths", default="wikipedia",
                   help=LENGTH_SYNTAX)
    CLUSTER.add(p, "a100-64", "FlexSP's 8 x 8 A100-40GB, the setting its published profile was measured on")
    WORLD.add(p, None, "the cluster's own size; it sizes the cpu preset")
    NODES.add(p, None, "the cluster's own; cpu: 1")
    DEVICE_MEMORY.add(p, None, "the cluster's own; cpu: 4")
    MODEL.add(p, "gpt-7b", "a model of the GPU clusters simulate prices, FlexSP's GPT-7B")
    COST.add(p, "auto")
    MAX_LEN.add(p, 393216, "FlexSP's longest wikipedia sequence; --overlong says what becomes of longer ones")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--batch", type=positive(int), default=None,
                      help="sequences per step (512 when neither this nor --tokens-per-step is given)")
    size.add_argument("--tokens-per-step", type=positive(int), default=None, help="token budget per step")
    p.add_argument("--overlong", choices=("split", "drop", "error"), default="split",
                   help=f"what to do with sequences longer than --max-len: split into chunks of it (a sequence "
                        f"of more than {LengthStream.MAX_SPLIT_CHUNKS} chunks is an error), drop, or stop with an error")
    p.add_argument("--steps", type=positive(int), default=20)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--planners", default="all", help="comma-separated planner names, or all")
    DEGREE.add(p, None, "the least that holds --max-len")
    CP.add(p, None, "Ulysses alone")
    TP.add(p, 1, "no tensor parallelism: every device one rank of the plans")
    PP.add(p, 1, "no pipeline: every rank holds every layer")
    STRATEGY.add(p, None, "one job mesh (--tp, --pp)")
    p.add_argument("--movement", type=Movement, choices=list(Movement), default=Movement.SLICED,
                   help="under --strategy, how the canonical layout's parameters and gradients move: sliced (each "
                        "rank receives and returns only the ranges it holds, what train runs) or full (every rank "
                        "gathers and reduces every whole tensor, the simple version) (default: sliced)")
    p.add_argument("--time-limit", type=positive(float), default=d.time_limit, help="seconds per MILP solve (flexsp)")
    p.add_argument("--buckets", type=positive(int), default=d.buckets, help="length buckets of flexsp's DP bucketing")
    p.add_argument("--dcp-mode", choices=("inter", "intra", "both"), default=d.dcp_mode)
    p.add_argument("--zeppelin-remap", action=OnOff, default=d.remap,
                   help="zeppelin: model its remapping layer (default), or plan without it (--no-zeppelin-remap)")
    ROUTING.add(p, d.routing)
    p.add_argument("--defer-outliers", action=OnOff, default=d.defer_outliers,
                   help="wlb-llm and ballast: let outliers wait for later steps in WLB-LLM's queue, every sample "
                        "trained by the last step (default), or train each in the step that drew it "
                        "(--no-defer-outliers)")
    p.add_argument("--sharding", type=Sharding.parse, default=None, metavar="MODE",
                   help="how ranks hold the model's state, which the memory model prices: replicated, zero1 or fsdp "
                        "(default: fsdp on GPU clusters, zero1 there under --pp, replicated on cpu: "
                        "vocabulary/sharding.default_sharding says why)")
    p.add_argument("--lockstep", action="store_true",
                   help="plans for FSDP/ZeRO-3: equal micro-batch counts per group in every wave")
    p.add_argument("--as-lengths", action="store_true",
                   help="plan as if every sample were a causal text sequence of its tokens (shape-blind), "
                        "then simulate the plans under the model's real attention pattern")
    p.add_argument("--json", dest="json_out", default=None, help="write the results here")
    p.add_argument("--gantt", default=None, help="write a Gantt chart (PNG) of the first step")


def planner_options(args: argparse.Namespace) -> PlannerOptions:
    """The planners' options `add_arguments`' flags give (bench scripts that take simulate's
    flags read them here too)."""
    return PlannerOptions(max_len=args.max_len, degree=args.degree, cp=args.cp, seed=args.seed,
                          time_limit=args.time_limit, buckets=args.buckets, dcp_mode=args.dcp_mode,
                          remap=args.zeppelin_remap, routing=args.routing, defer_outliers=args.defer_outliers,
                          lockstep=args.lockstep)


def run(args: argparse.Namespace) -> int:
    console = Console(soft_wrap=True)
    origin = provenance()
    check_output_file(args.json_out, "--json")
    check_output_file(args.gantt, "--gantt")
    cluster = get_cluster(args.cluster, args.world, args.device_memory_gb, args.nodes)
    shape = get_model_shape(args.model)
    names = parse_planner_names(args.planners)
    options = planner_options(args)
    options.check_read(names, unset=PlannerOptions())
    if args.batch is None and args.tokens_per_step is None:
        args.batch = 512
    spec = BatchSpec(batch=args.batch, tokens_per_step=args.tokens_per_step, max_len=args.max_len,
                     overlong=args.overlong)
    lengths_stream = LengthStream(get_length_source(args.lengths, shape.video_geometry), spec, seed=args.seed)
    batches = [lengths_stream.next_batch() for _ in range(args.steps)]
    if args.strategy is not None:
        histogram = None
        if args.strategy == AUTO_STRATEGIES:  # Hydraulis' whole-dataset histogram: another draw of the source
            whole = dataclasses.replace(spec, batch=HISTOGRAM, tokens_per_step=None)
            histogram = LengthStream(lengths_stream.source, whole, seed=args.seed + 1).next_batch()
        return run_strategies(args, console, cluster, shape, names, options, batches, lengths_stream.report(), origin,
                              histogram)
    mesh = JobMesh.of(cluster, tp=args.tp, pp=args.pp, shape=shape)
    cost = get_cost_model(args.cost, shape, cluster, args.device_memory_gb, args.sharding, mesh=mesh)
    pool = mesh.pool_cluster(cluster)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(names) * len(batches))
        lower, results = simulate_planners(batches, names, pool, cost, options,
                                           on_step=lambda name, k: progress.update(task, advance=1,
                                                                                   description=f"planning: {name}"),
                                           as_lengths=args.as_lengths)
    lower_mean = sum(lower) / len(lower)
    longest = sum(longest_alone(cost, b) for b in batches) / len(batches)
    summaries = {name: r.summary() for name, r in results.items()}
    setting = {"lengths": args.lengths, "cluster": cluster.name, "world_size": cluster.world_size,
               **({"tp": mesh.tp, "pool": mesh.pool} if mesh.tp > 1 else {}),
               **({"pp": mesh.pp, "pool": mesh.pool} if mesh.pp > 1 else {}),
               "model": shape.name, "attention": shape.attention, "as_lengths": args.as_lengths,
               "cost": cost.source, "sharding": cost.device.sharding.value, "max_len": args.max_len, "batch": args.batch,
               "tokens_per_step": args.tokens_per_step, "overlong": args.overlong, "seed": args.seed,
               "dcp_mode": args.dcp_mode, "zeppelin_remap": _on_off(args.zeppelin_remap), "routing": _on_off(args.routing),
               "defer_outliers": _on_off(args.defer_outliers),
               "lockstep": args.lockstep, "data_parallel": _data_parallel(cost),
               "data": lengths_stream.report(),
               "mean_tokens_per_step": sum(tokens(x) for b in batches for x in b) / len(batches)}
    title = (f"{args.lengths} on {cluster.name} ({cluster.world_size} devices"
             f"{f', {_mesh_label(mesh)}: plans over a pool of {mesh.pool}' if (mesh.tp, mesh.pp) != (1, 1) else ''}"
             f"), {shape.name} "
             f"({shape.attention} attention), {cost.source} cost, {args.steps} steps"
             f"{', planned as lengths' if args.as_lengths else ''}")
    table = planner_table(title, summaries, lower_mean)
    if pool.memory_bandwidth is None:
        table.caption += f"; optimizer step not priced: cluster {cluster.name!r} gives no memory_bandwidth"
    print_whole(console, table)
    console.print(f"data: {lengths_stream.report()}")
    if args.json_out:
        out = {"setting": setting, "steps": args.steps, "lower_bound_s": lower_mean, "longest_alone_s": longest,
               "planners": summaries, "provenance": origin}
        Path(args.json_out).write_text(json.dumps(out, indent=2))
        console.print(f"wrote {args.json_out}")
    if args.gantt:
        gantt({n: r.first_plan for n, r in results.items()}, cost, pool.world_size, args.gantt)
        console.print(f"wrote {args.gantt}")
    return 0


def run_strategies(args: argparse.Namespace, console: Console, cluster, shape, names: list[str],
                   options: PlannerOptions, batches: list, data: str, origin: dict, histogram: list | None) -> int:
    """`run` under --strategy: every planner placed on the strategies, each step under the one its
    plan is fastest under (hydraulis: its own rule); `histogram`: the samples `auto` proposes
    them from."""
    if histogram is None:
        strategies = parse_strategies(args.strategy)
    else:
        strategies = auto_strategies(args.cost, shape, cluster, args.device_memory_gb, histogram)
        console.print(f"strategies proposed from {len(histogram):,} sequences of {args.lengths} (Hydraulis' dynamic "
                      f"program): {'; '.join(map(str, strategies))}")
    for flag, given in (("--tp", args.tp > 1), ("--pp", args.pp > 1), ("--sharding", args.sharding is not None),
                        ("--lockstep", args.lockstep), ("--as-lengths", args.as_lengths)):
        if given:
            raise ValueError(f"--strategy and {flag} do not combine: a strategy's pipelines bring their own TP and PP "
                             f"degrees and its state lives in the canonical layout")
    prices = StrategyPrices(strategies, args.cost, shape, cluster, args.device_memory_gb, args.movement)
    prices.check_max_len(args.max_len)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(names) * len(batches))
        results = simulate_strategy_planners(
            batches, names, prices, options, on_step=lambda name, k: progress.update(task, advance=1, description=f"planning: {name}"))
    summaries = {name: r.summary() for name, r in results.items()}
    print_whole(console, strategy_table(f"{args.lengths} on {cluster.name} ({cluster.world_size} devices) under "
                                        f"{' or '.join(map(str, strategies))}, {shape.name}, {args.cost} cost, "
                                        f"{args.movement.value} movement, {args.steps} steps", summaries))
    console.print(f"data: {data}")
    if args.gantt:
        strategy_gantt({name: (r.first_plan, prices.costs[r.first_plan.strategy], prices.moves[r.first_plan.strategy])
                        for name, r in results.items()}, cluster, args.gantt)
        console.print(f"wrote {args.gantt} (the first step of each planner)")
    if args.json_out:
        setting = {"lengths": args.lengths, "cluster": cluster.name, "world_size": cluster.world_size,
                   "strategies": [s.to_list() for s in strategies], "movement": args.movement.value,
                   "model": shape.name, "cost": args.cost, "max_len": args.max_len, "batch": args.batch,
                   "tokens_per_step": args.tokens_per_step, "seed": args.seed, "data": data}
        out = {"setting": setting, "steps": args.steps, "planners": summaries, "provenance": origin}
        Path(args.json_out).write_text(json.dumps(out, indent=2))
        console.print(f"wrote {args.json_out}")
    return 0


def print_whole(console: Console, table) -> None:
    """Print `table`; to a pipe or a file as wide as it needs, no column cut."""
    if not console.is_terminal:
        needed = Measurement.get(console, console.options.update_width(10_000), table).maximum
        console.width = max(console.width, needed)
    console.print(table)


def _data_parallel(cost) -> dict | list[dict]:
    """What the step pays besides its passes' work, per rank (per stage under PP), for the record."""
    prices = cost.stages.data_parallel if cost.stages is not None else (cost.data_parallel,)
    rows = [dict(buckets=p.buckets, reduction_s=p.reduction, last_bucket_s=p.last_bucket, optimizer_s=p.optimizer,
                 after_optimizer_s=p.after_optimizer, forward_gathers_s=p.forward_gathers,
                 backward_collectives_s=p.backward_collectives, first_gathers_s=p.first_gathers) for p in prices]
    return rows if cost.stages is not None else rows[0]


def _on_off(switch: bool) -> str:
    """A switch as the JSON's setting has always said it."""
    return "on" if switch else "off"


def _mesh_label(mesh: JobMesh) -> str:
    """The model-parallel degrees a title names: "TP 8 x PP 4", "TP 4", "PP 2"."""
    return " x ".join(f"{name} {degree}" for name, degree in (("TP", mesh.tp), ("PP", mesh.pp)) if degree > 1)
