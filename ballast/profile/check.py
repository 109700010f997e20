"""`ballast profile --check`: random plans run for real, against the profile's predictions.

Random batches come from a length source (`stdlib` by default: real code files, split at
--max-len). A video model's come from a clip source (`video` by default: DCP's any-size video
buckets in the model's latent patches) scaled down so that its largest clip has --max-len
tokens (`scaled_clips`: every clip's frames, height and width times the same factor, as
video-synthetic scales them, the Zipf weights kept), --max-len defaulting to the profile's largest grid clip: the real clips
(up to ~490k tokens) do not run on a CPU, and a frame longer than --max-len could not be split.
Each is planned by the next planner in turn, validated, simulated under the
profile (predicted step time of the plan as the runtime executes it, see `as_executed`, and
peak activation bytes per device), then executed by the runtime on the command's ranks: local
gloo ranks on the CPU, or launched by torchrun its processes (on GPUs under NCCL, rank 0
planning and comparing, `runtime.job`). A profile measured on another device than the ranks
run on is refused, since its predictions are for that device. Measured
step time is what the simulator models: the sum over waves of the wave's time (its busiest
rank's micro-batches); the gradient all-reduce and optimizer step, a constant per step that no
planner can change, are reported apart. Measured activation memory is the largest
saved-for-backward size of any micro-batch on any rank.

Each plan runs once per round after one warm-up step; rounds shuffle the plans, so the load
of other jobs spreads over all of them. Rounds are reduced by the profile's own statistic
(median or min, so that prediction and measurement mean the same thing), micro-batch by
micro-batch as the profile reduced its points, and composed into the step (`rounds.py`); the
errors under the other statistic, and against the whole step's rounds reduced (the step as is:
its fastest round still carries the bursts that hit any of its micro-batches), are reported
too. The profile's full-depth points run again in the same rounds, and the check reports how
much faster or slower the machine ran than during the profile, and the error with that drift
divided out beside the error as is (`drift.py`).

Under `--tp` and `--pp` the plans are over the job mesh's pool and run on executors built for
it (`check_mesh`): a TP rank priced from the profile's measured TP terms, a pipeline's step the
1F1B timeline, measured as the step as is (a schedule's bubble is no sum of micro-batches). The
comparison itself, its summary, table and plot are `comparison.py`'s.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from ..vocabulary.cluster import Cluster, get_cluster
from ..pricing.cost import CostModel
from ..pricing.cost_sources import get_cost_model
from ..dataset.length_stream import BatchSpec, LengthStream
from ..dataset.lengths import LengthSource, get_length_source
from .sources import check_source, default_source
from ..models import build_model
from ..plans.plan import Plan
from ..planners import SHORT_SOLVES, get_planner, parse_planner_names
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.model_shape import ModelShape
from ..command_line.output_paths import check_output_file
from ..command_line.provenance import provenance
from ..vocabulary.precision import Precision
from .comparison import compare_plans, plan_table, scatter, summarise
from .context import CheckedPlanner, checked_planners
from .residuals import error_summary
from .machine import LoadMonitor, machine_info, measured_device
from .drift import drift_errors, how_much, machine_drift, reference_points
from .measure import LEARNING_RATE, STATISTICS, fitted_statistic, plan_samples, point_plan
from .rounds import micro_batch_seconds, rank_waves

DEFAULT_MAX_LEN = 4096
"""--max-len of a text model's check."""
DEFAULT_TOKENS_PER_STEP = 16384
"""--tokens-per-step of a text model's check."""
VIDEO_BATCHES = 4
"""A video model's check steps hold VIDEO_BATCHES x --max-len tokens (by default)."""


def make_plans(cost: CostModel, lengths: str | LengthSource, count: int, tokens_per_step: int, max_len: int,
               planners: list[CheckedPlanner], seed: int, pool: Cluster | None = None) -> list[Plan]:
    """`count` random batches, planned by `planners` in turn over the `pool` a rank of `cost`
    plans (None: the profile's ranks, one pool) and validated against `cost`."""
    cluster = pool or get_cluster("cpu", world_size=cost.world_size, device_memory_gb=cost.device_memory / 1e9)
    source = get_length_source(lengths) if isinstance(lengths, str) else lengths
    stream = LengthStream(source, BatchSpec(tokens_per_step=tokens_per_step, max_len=max_len), seed)
    made = [get_planner(p.name, cluster, cost, dataclasses.replace(SHORT_SOLVES, max_len=max_len, seed=seed,
                                                                   degree=p.degree, cp=p.cp)) for p in planners]
    plans = []
    for i in range(count):
        plan = made[i % len(planners)].plan(stream.next_batch())
        plan.validate(cluster, cost)
        plan.planner = planners[i % len(planners)].label  # static USP apart from static Ulysses
        plans.append(plan)
    return plans


def execute_on_ranks(shape: ModelShape, plans: list[dict], warmup: int, repeats: int, seed: int,
                     progress: bool, precision: Precision = Precision.AUTO, tp: int = 1, pp: int = 1
                     ) -> list[list[dict]]:
    """Run on every rank: per plan, one record per round (after `warmup` steps of plan 0), the
    ranks a job mesh of TP degree `tp` and `pp` pipeline stages; a plan made for no mesh (the
    profile's drift points under a mesh) on a model of its own over the ranks as one pool."""
    import torch.distributed as dist

    from ..runtime import parallelize

    world, rank = dist.get_world_size(), dist.get_rank()
    cluster = get_cluster("cpu", world_size=world)
    parsed = [Plan.from_dict(p) for p in plans]
    executors = {degrees: parallelize(build_model(shape, seed), cluster,
                                      mesh=JobMesh.of(cluster, *degrees, shape=shape), measure_activations=True,
                                      precision=precision, lr=LEARNING_RATE)
                 for degrees in dict.fromkeys([(tp, pp)] + [(p.tp, p.pp) for p in parsed])}
    samples = [plan_samples(p, shape, seed + i) for i, p in enumerate(parsed)]
    firsts: dict[tuple[int, int], int] = {}  # every executor's first plan warms it up
    for i, p in enumerate(parsed):
        firsts.setdefault((p.tp, p.pp), i)
    for _ in range(warmup):
        for i in firsts.values():
            executors[parsed[i].tp, parsed[i].pp].step(parsed[i], samples[i])
    records: list[list[dict]] = [[] for _ in parsed]
    with Progress(disable=not (progress and rank == 0), transient=True) as bar:
        task = bar.add_task("running plans", total=len(parsed) * repeats)
        for r in range(repeats):
            order = list(range(len(parsed)))
            random.Random(seed + r).shuffle(order)
            for i in order:
                bar.update(task, advance=1, description=f"running plans: {parsed[i].planner}")
                start, cpu = time.perf_counter(), time.thread_time()
                result = executors[parsed[i].tp, parsed[i].pp].step(parsed[i], samples[i])
                records[i].append(dict(
                    step_seconds=time.perf_counter() - start, step_cpu_seconds=time.thread_time() - cpu,
                    waves=sum(w.busy + w.wait for w in result.waves),
                    micro_batch_s=micro_batch_seconds(result),
                    overhead=result.sync_seconds + result.optimizer_seconds, rank_waves=rank_waves(result),
                    activation=max((mb.activation_bytes for mb in result.micro_batches), default=0)))
    return records


def check_mesh(args: argparse.Namespace, profiled: CostModel, shape: ModelShape
               ) -> tuple[JobMesh, CostModel, Cluster]:
    """The job mesh of `--tp` and `--pp` over the profile's ranks, the profile as a rank of it
    prices plans, and the pool the plans are over: as it was fitted without them; under TP or
    PP through `get_cost_model`, as simulate and train price it (a TP rank's coefficients from
    the profile's measured TP link, the stages' states and boundary), with the device memory
    the check runs with."""
    cluster = get_cluster("cpu", world_size=profiled.world_size, device_memory_gb=profiled.device_memory / 1e9)
    mesh = JobMesh.of(cluster, tp=args.tp, pp=args.pp, shape=shape)
    if (mesh.tp, mesh.pp) == (1, 1):
        return mesh, profiled, cluster
    cost = get_cost_model(args.check, shape, cluster, profiled.device_memory / 1e9, mesh=mesh)
    return mesh, cost, mesh.pool_cluster(cluster)


def run_check(args: argparse.Namespace, world: int | None) -> int:
    """`ballast profile --check` on `world` ranks (None: the profile's), started here or the
    torchrun job's with this process its rank 0."""
    from ..runtime import describe_ranks, job_backend, on_ranks, rank_device, under_torchrun

    console = Console()
    origin = provenance()
    cost = CostModel.load(args.check)
    if args.device_memory_gb is not None:  # as everywhere a profile is a cost model (`get_cost_model`)
        cost = dataclasses.replace(cost, device_memory=args.device_memory_gb * 1e9)
    png = args.png or str(Path(args.check).with_name(Path(args.check).stem + "-check.png"))
    check_output_file(png, "--png" if args.png else "--png (next to the profile)")
    check_output_file(args.json_out, "--json")
    if "shape" not in cost.fit:
        raise ValueError(f"{args.check} is not a profile written by `ballast profile` (its fit has no model shape)")
    shape = ModelShape.from_dict(cost.fit["shape"])
    machine, device = cost.fit["machine"], rank_device().type
    if world is not None and world != cost.world_size:
        given = "torchrun's WORLD_SIZE" if under_torchrun() else "--world"
        raise ValueError(f"{args.check} was profiled on {cost.world_size} ranks, not {given} {world}")
    if measured_device(machine) != device:
        raise ValueError(f"{args.check} was measured on {measured_device(machine)} ({machine['backend']} ranks), "
                         f"but --check runs plans on {describe_ranks(cost.world_size)} on the {device}: its "
                         f"predictions are for another device than the one the check would measure")
    statistic = fitted_statistic(cost)
    world_size = cost.world_size
    mesh, cost, pool = check_mesh(args, cost, shape)
    video = shape.pattern.clips
    lengths = args.lengths or default_source(shape)
    names = parse_planner_names(args.planners)
    planners = checked_planners(names, shape, pool.world_size)
    repeats = args.repeats if args.repeats is not None else 3
    longest = max(cost.fit["settings"]["lengths"])
    max_len = args.max_len if args.max_len is not None else longest if video else DEFAULT_MAX_LEN
    tokens_per_step = (args.tokens_per_step if args.tokens_per_step is not None else
                       VIDEO_BATCHES * max_len if video else DEFAULT_TOKENS_PER_STEP)
    if max_len > longest:
        console.print(f"[yellow]--max-len {max_len} is longer than the profile's longest length {longest}: "
                      f"its predictions extrapolate[/yellow]")
    source = check_source(lengths, shape, max_len)
    plans = make_plans(cost, source, args.plans, tokens_per_step, max_len, planners, args.seed, pool)
    # The profile's points run on its ranks as one pool, under a mesh on an executor of their own.
    references = reference_points(cost, shape)
    console.print(f"check: {len(plans)} plans of {tokens_per_step} tokens from {source.name} (max {max_len}) "
                  f"by {', '.join(p.label for p in planners)}; {world_size} ranks{_mesh_label(mesh)}, {repeats} rounds ({statistic}); "
                  f"{len(references)} of the profile's full-depth points again, for the machine's drift")
    start = time.perf_counter()
    with LoadMonitor() as load:
        run = [p.to_dict() for p in plans] + [point_plan(m.point, world_size).to_dict() for m in references]
        per_rank = on_ranks(world_size, execute_on_ranks, shape, run, 1, repeats, args.seed, True,
                            args.precision, mesh.tp, mesh.pp, timeout=args.timeout)
    seconds = time.perf_counter() - start
    drift = machine_drift(references, [[[records[len(plans) + i][r]["micro_batch_s"] for records in per_rank]
                                        for r in range(repeats)] for i in range(len(references))], statistic)
    per_rank = [records[:len(plans)] for records in per_rank]
    rows = compare_plans(plans, cost, per_rank, statistic, pool.world_size)
    summary, loads = summarise(rows), load.summary()
    console.print(plan_table(rows))
    t, a, whole = summary["time"], summary["act"], summary["time_step"]
    other = ", ".join(f"{name}: median {s['median']:.1%}, p90 {s['p90']:.1%}"
                      for name, s in ((name, summary[f"time_{name}"]) for name in STATISTICS) if name != statistic)
    console.print(f"step time |error| ({statistic} of rounds per micro-batch): median {t['median']:.1%}, p90 "
                  f"{t['p90']:.1%}, max {t['max']:.1%} ({other}; the whole step's {statistic} as is: median "
                  f"{whole['median']:.1%}, p90 {whole['p90']:.1%}); activation memory |error|: median {a['median']:.1%}, "
                  f"max {a['max']:.1%}; {len(rows)} plans in {seconds:.0f} s, load average "
                  f"{loads['min']:.1f}..{loads['max']:.1f} on {loads['cpus']} CPUs, the ranks had "
                  f"{statistics.median(r['core_share'] for r in rows):.0%} of a core (the profile: load "
                  f"{cost.fit['load_average']['median']:.1f}, {cost.fit['core_share']:.0%})")
    beyond, noise = summary["time_beyond_noise"], summary["noise"]
    console.print(f"step time |error| beyond each plan's repeat spread: median {beyond['median']:.1%}, p90 "
                  f"{beyond['p90']:.1%}, max {beyond['max']:.1%}; the spread of a plan's rounds (slowest - fastest): "
                  f"median {noise['median']:.1%}, max {noise['max']:.1%}")
    if drift is not None:
        summary["time_drift_corrected"] = error_summary(drift_errors(rows, drift["ratio"]))
        corrected = summary["time_drift_corrected"]
        console.print(f"the machine ran {how_much(drift['ratio'])} "
                      f"than during the profile (its {len(references)} full-depth points measured again in these "
                      f"rounds); step time |error| with that drift divided out (reported, not the check's "
                      f"error): median {corrected['median']:.1%}, p90 {corrected['p90']:.1%}")
    for name, key in (("with a CP part", "time_context"), ("without", "time_without_context")):
        if summary[key]["count"]:
            console.print(f"step time |error| of the {summary[key]['count']} plans {name}: median "
                          f"{summary[key]['median']:.1%}, p90 {summary[key]['p90']:.1%}, max {summary[key]['max']:.1%}")
    scatter(rows, png, f"{shape.name}, {world_size} ranks{_mesh_label(mesh)}, {len(rows)} plans from {lengths} (max {max_len}): "
                       f"step time |error| median {t['median']:.1%}, p90 {t['p90']:.1%} ({statistic} of {repeats})")
    console.print(f"wrote {png}")
    if args.json_out:
        setting = dict(profile=args.check, lengths=lengths, **(dict(source=source.name) if video else {}),
                       max_len=max_len, tokens_per_step=tokens_per_step,
                       planners=[p.label for p in planners], tp=mesh.tp, pp=mesh.pp, plans=len(rows), repeats=repeats, statistic=statistic, seed=args.seed)
        Path(args.json_out).write_text(json.dumps(dict(
            setting=setting, summary=summary, drift=drift, seconds=seconds, load_average=loads,
            core_share=statistics.median(r["core_share"] for r in rows),
            machine=machine_info(world_size, device, job_backend()), plans=rows, provenance=origin), indent=2))
        console.print(f"wrote {args.json_out}")
    return 0


def _mesh_label(mesh: JobMesh) -> str:
    """", TP 2 x PP 2 (plans over a pool of 1)" under a mesh; "" without one."""
    degrees = [f"{name} {d}" for name, d in (("TP", mesh.tp), ("PP", mesh.pp)) if d > 1]
    return f" as {' x '.join(degrees)} (plans over a pool of {mesh.pool})" if degrees else ""
