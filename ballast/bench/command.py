"""`ballast bench`: every planner trains the same model on the same batches on this machine's
ranks, interleaved step by step; measured tokens/s, idle fraction, planning time and the cost
model's prediction, side by side, as a table, a JSON file and a PNG bar chart.

One job runs the whole benchmark (ballast.bench.ranks): local gloo ranks, or launched by
torchrun its processes (NCCL on GPUs; rank 0 draws the batches, plans and reports, the others
serve it, `runtime.job`). The batches are drawn once from one BatchStream
(ballast.bench.setting); summary.py says what every number means.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from rich.console import Console

from ..dataset import SYNTAX, VIDEO_DATA_SYNTAX
from ..command_line.options import COST, CP, DEGREE, DEVICE_MEMORY, MAX_LEN, MODEL, PRECISION, ROUTING, TIMEOUT, WORLD
from ..command_line.output_paths import check_output_file
from ..command_line.provenance import provenance
from ..planners import parse_planner_names
from ..profile.drift import how_much, machine_drift
from ..profile.measure import fitted_statistic
from .output import bar_chart, bench_table
from .setting import ALL_PLANNERS, RANGES, BenchInputs, BenchSetting, prepare
from .summary import summarise, targets

TABLE_WIDTH = 190
HELP = "train every planner side by side on this machine's ranks; measured tokens/s vs the cost model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchSetting()
    MODEL.add(p, d.model, "trains every planner on this machine's CPU ranks in minutes")
    p.add_argument("--data", default=d.data, help=f"corpus: {SYNTAX}; clips for video DiTs: {VIDEO_DATA_SYNTAX}")
    p.add_argument("--cache-dir", default=None, help="token cache folder (default: the data pipeline's)")
    WORLD.add(p, None, f"{d.world}, the smallest world with sequence parallelism; under torchrun its WORLD_SIZE, "
                       f"which a --world given must match")
    p.add_argument("--planners", default=",".join(ALL_PLANNERS), help="comma-separated planner names, or all")
    p.add_argument("--steps", type=RANGES["steps"], default=d.steps, help=f"measured steps (batches) per round (default {d.steps})")
    p.add_argument("--warmup", type=RANGES["warmup"], default=d.warmup, help=f"unmeasured steps every planner runs first (default {d.warmup})")
    p.add_argument("--repeats", type=RANGES["repeats"], default=d.repeats,
                   help=f"rounds over the measured batches (same plans): their spread is the run-to-run noise "
                        f"(default {d.repeats})")
    p.add_argument("--tokens-per-step", type=RANGES["tokens_per_step"], default=d.tokens_per_step, help=f"token budget of a step (default {d.tokens_per_step})")
    MAX_LEN.add(p, d.max_len, "longer documents are cut into chunks of it")
    DEVICE_MEMORY.add(p, None, "a budget at which a max-len sequence runs without recomputation only at SP "
                               "degree 2")
    COST.add(p, d.cost, "the planners' cost model and the predictions the measurements are held against; "
                        "`ballast profile` measures this machine's")
    p.add_argument("--time-limit", type=RANGES["time_limit"], default=d.planner.time_limit,
                   help=f"seconds per MILP solve, flexsp (default {d.planner.time_limit:g})")
    DEGREE.add(p, d.planner.degree, "the least that holds --max-len")
    CP.add(p, d.planner.cp, "Ulysses alone")
    ROUTING.add(p, d.planner.routing)
    PRECISION.add(p, d.precision, "what the cost model's presets price: fp32 on CPU ranks, bf16 under torchrun "
                                  "on GPUs")
    p.add_argument("--seed", type=RANGES["seed"], default=d.seed)
    p.add_argument("--json", dest="json_out", default=None, help="write the results here")
    p.add_argument("--png", default=None, help="bar chart (default: next to --json)")
    p.add_argument("--timeout", type=TIMEOUT, default=3600.0,
                   help="seconds before the local ranks are stopped, or under torchrun before a collective is "
                        "given up (at least 30: they need seconds to start)")


def setting_from(args: argparse.Namespace, world: int) -> BenchSetting:
    planner = dataclasses.replace(BenchSetting().planner, max_len=args.max_len, degree=args.degree, cp=args.cp,
                                  time_limit=args.time_limit, seed=args.seed, routing=args.routing)
    return BenchSetting(model=args.model, data=args.data, cache_dir=args.cache_dir, world=world,
                        planners=tuple(parse_planner_names(args.planners)), steps=args.steps,
                        warmup=args.warmup, repeats=args.repeats, tokens_per_step=args.tokens_per_step,
                        device_memory_gb=args.device_memory_gb, cost=args.cost, precision=args.precision,
                        planner=planner)


def describe(inputs: BenchInputs, setting: BenchSetting) -> str:
    from ..runtime import describe_ranks

    cost, lengths = inputs.cost, [s for b in inputs.batches for s in b.lengths]
    where = "" if cost.source != "analytic" else " (placeholder CPU figures: `ballast profile` measures real ones)"
    return (f"{inputs.data}\n{len(setting.planners)} planners x ({setting.warmup} warm-up + {setting.repeats} x "
            f"{setting.steps} measured) steps of ~{setting.tokens_per_step} tokens (max_len {setting.max_len}; "
            f"{len(lengths)} sequences, {sum(s == setting.max_len for s in lengths)} at max_len) on "
            f"{describe_ranks(setting.world)}; cost model: {cost.source}{where}; {cost.device_memory / 1e6:.1f} MB per "
            f"rank (states {cost.states / 1e6:.1f} MB; a max_len sequence fits degree 1 at recompute "
            f"{cost.min_recompute(setting.max_len, 1)})")


def bench(setting: BenchSetting, inputs: BenchInputs, timeout: float) -> tuple[list[dict], list, dict]:
    """Run the benchmark's one job; rank 0's records, its reference points' seconds
    (`ranks.References`) and the load average seen meanwhile."""
    from ..profile.machine import LoadMonitor
    from ..runtime import on_ranks
    from .ranks import make_planners, run_on_rank

    make_planners(inputs, setting)  # a planner option no plan can meet fails here, before any rank starts
    with LoadMonitor() as load:
        records, references = on_ranks(setting.world, run_on_rank, inputs, setting, timeout=timeout)[0]
    return records, references, load.summary()


def result_json(setting: BenchSetting, inputs: BenchInputs, records: list[dict], references: list, load: dict,
                seconds: float, statistic: str) -> dict:
    """Everything the run measured, summarised (predictions against rounds reduced by
    `statistic`; the machine's drift since the profile from the reference points' seconds), and
    the raw records."""
    from ..profile.machine import machine_info
    from ..runtime import job_backend, rank_device

    cost = inputs.cost
    drift = machine_drift(inputs.references, references, statistic)
    summary = summarise(records, setting.planners, statistic=statistic, drift=drift and drift["ratio"])
    return dict(
        setting=setting.to_json(), data=inputs.data,
        cost_model=dict(source=cost.source, spec=setting.cost, device_memory_gb=cost.device_memory / 1e9,
                        states_gb=cost.states / 1e9, a=cost.a, b=cost.b, g=cost.g,
                        max_len_recompute_at_degree_1=cost.min_recompute(setting.max_len, 1)),
        batches=[dict(sample_ids=b.sample_ids, lengths=b.lengths, measured=i >= setting.warmup)
                 for i, b in enumerate(inputs.batches)],
        machine=machine_info(setting.world, rank_device().type, job_backend()), load_average=load, seconds=seconds, drift=drift,
        **summary, targets=targets(summary, seconds), records=records)


def chart_title(result: dict) -> str:
    s = result["setting"]
    return (f"ballast bench: {s['model']} on {s['world']} {result['machine']['backend']} ranks, {s['data']} (~{s['tokens_per_step']} "
            f"tokens/step, max_len {s['max_len']}), {result['cost_model']['source']} cost model")


def print_drift(console: Console, result: dict) -> None:
    """How much the machine's speed moved since the profile, and each planner's error without it."""
    drift = result["drift"]
    if drift is None:
        console.print("no drift measured: the cost model is no profile of this machine's CPU at the model's depth")
        return
    ratio, planners = drift["ratio"], result["planners"]
    errors = ", ".join(f"{name} {s['prediction_error_drift_corrected']:+.1%}" for name, s in planners.items())
    console.print(f"the machine ran {how_much(ratio)} than during the profile "
                  f"(its {len(drift['points'])} full-depth points run again through every round); prediction error "
                  f"with that drift divided out (reported, not the targets'): {errors}", highlight=False)


def print_targets(console: Console, result: dict) -> None:
    for name, t in result["targets"].items():
        mark = "[green]met[/green]" if t["met"] else "[red]not met[/red]"
        facts = {k: v for k, v in t.items() if k not in ("met", "ratios", "abs_errors")}
        if "abs_errors" in t:
            facts["worst"] = max(t["abs_errors"], key=t["abs_errors"].get)
            facts["worst_abs_error"] = t["abs_errors"][facts["worst"]]
        text = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in facts.items())
        console.print(f"target {name}: {mark} ({text})", highlight=False)


def run(args: argparse.Namespace) -> int:
    from ..runtime import in_job, job_world

    world = job_world(args.world, BenchSetting().world)  # before any rank joins: a mismatch is one line per node
    return in_job(lambda: run_bench(args, world), args.timeout)


def run_bench(args: argparse.Namespace, world: int) -> int:
    """`ballast bench` on `world` ranks, started here or the torchrun job's with this process its
    rank 0."""
    console = Console()
    if not console.is_terminal:  # a log file: the table's 14 columns need more than 80
        console.width = TABLE_WIDTH
    png = args.png or (str(Path(args.json_out).with_suffix(".png")) if args.json_out else None)
    check_output_file(args.json_out, "--json")
    check_output_file(png, "--png" if args.png else "--png (next to --json)")
    start, origin = time.perf_counter(), provenance()
    setting = setting_from(args, world)
    inputs = prepare(setting)
    statistic = fitted_statistic(inputs.cost)  # a damaged profile fails here, before any rank starts
    console.print(describe(inputs, setting), highlight=False)
    records, references, load = bench(setting, inputs, args.timeout)
    result = result_json(setting, inputs, records, references, load, time.perf_counter() - start, statistic)
    title = chart_title(result)
    console.print(bench_table(title, result))
    console.print(f"{result['seconds']:.0f} s; load average {load['min']:.1f}..{load['max']:.1f} (median "
                  f"{load['median']:.1f}) on {load['cpus']} CPUs; ranks' CPU share during steps "
                  f"{result['noise']['cpu_share']:.0%}; same batches for every planner and rank: "
                  f"{result['same_batches']}; largest loss difference between planners "
                  f"{result['loss_spread']:.1e}", highlight=False)
    print_drift(console, result)
    print_targets(console, result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({**result, "provenance": origin}, indent=1))
        console.print(f"wrote {args.json_out}")
    if png:
        bar_chart(result, title, png)
        console.print(f"wrote {png}")
    return 0
