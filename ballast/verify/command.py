"""`ballast verify`: executing any planner's plans on N ranks trains exactly like one process.

It trains K steps of random variable-length batches under each planner's plans on N ranks, and
compares losses, gradients and final parameters with the same steps run in one process on the
whole batch (one packed stream, no runtime). The ranks are N local gloo ranks on 127.0.0.1,
started by this process, which runs the reference; or, launched by torchrun (`torchrun
--nproc-per-node 8 -m ballast.cli verify ...`), torchrun's processes (NCCL on GPUs, each on
LOCAL_RANK's; `runtime.job`), whose rank 0 plans, runs the reference on its own device and
compares, and sends every rank the verdict: a mismatch is a non-zero exit on every rank.

The loss of a step is summed per token and divided by the batch's tokens, so the gradient does
not depend on the plan: only float rounding differs (summation order of all-reduce, accumulation and
attention). Errors are relative to the largest reference magnitude of the same quantity
(max |a - b| / max |b|): element-wise ratios blow up where a gradient is near zero.

Two checks, with two tolerances:
  - loss and gradient of every step, against the single-process loss and gradient of the
    whole batch *at the same parameters* (the distributed run's parameters before that step).
    This is the plan-invariance claim itself; rounding leaves it near 1e-6 in fp32.
  - parameters after the K steps, against K single-process steps, as the drift
    ||p - p_ref|| / ||p_ref - p_0|| (L2, relative to how far training moved them). AdamW
    divides every update by sqrt(v) + eps, which turns the rounding of small gradient entries
    into visible update differences: after 5 steps of the tiny model the largest entry differs
    by 1% of the largest move, and the drift is 3e-5, exactly as between one process and
    itself with 2 threads instead of 1. The tolerance, 1e-3, leaves room for that; a lost or
    doubly counted micro-batch moves the drift to ~0.1. AdamW is blind to a wrong loss scale,
    which the gradient check catches.

Under bf16 (`--precision bf16`, or `auto` on GPUs) the ranks run under bf16 autocast against the
fp32 reference, and both tolerances are a multiple of the single-process model's own bf16 error
(`errors.BF16_GAP_MULTIPLE`, which says why), measured each run on the reference's device: on
GPUs the fp32 reference runs in fp32 on rank 0's GPU and the bf16 one under CUDA autocast there,
with the GPU's own bf16 kernels. On the CPU, `--precision bf16` checks the bf16 dtypes,
exchanges and tolerances, not the GPU's kernels, NCCL or CUDA placement, which only a run under
torchrun on GPUs reaches (bench/gpu.sh).

Why the reference on rank 0 alone: it needs one device that holds the whole model and its AdamW
state, as a replicated rank of the run does, and the whole batch's activations (verify's
batches: 16 sequences up to 256 tokens by default); on every rank it would take that memory on
every GPU and the same time again on each, to be compared on rank 0 anyway. The other ranks
wait for it (a few single-process steps per planner: seconds on a GPU). A model that fits only
sharded cannot be verified.
"""
from __future__ import annotations

import argparse
import dataclasses

from ..vocabulary.cluster import Cluster, get_cluster
from ..command_line.options import (parse_strategies, CP, DEGREE, DEVICE_MEMORY, MAX_LEN, MODEL, NODES, PP, PRECISION, ROUTING,
                                    SEED, STRATEGY, TIMEOUT, TP, WORLD)
from ..vocabulary.value_checks import at_least, positive
from ..pricing.cost import CostModel
from ..pricing.cost_sources import get_cost_model
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.model_shape import ModelShape, get_model_shape
from ..plans.plan import Plan, splits_used
from ..models import check_buildable
from ..vocabulary.layouts import ANY_SPLIT
from ..vocabulary.precision import Precision
from ..vocabulary.sharding import Sharding
from .errors import BF16_GAP_MULTIPLE, GRAD_TOLERANCE, PARAM_TOLERANCE, bf16_tolerances, errors_against
from .reference import VerifyBatch, random_batches, reference_at, train_reference
from ..planners import PlannerOptions, get_planner, parse_planner_names
from ..planners.fits import check_fits

HELP = "check that plans run on N ranks (local gloo, or torchrun's) train exactly like one process"
DEFAULT_WORLD = 2
"""--world without torchrun: the smallest world with sequence parallelism."""


AFTER_BACKWARD_MARGIN = 1.01
"""A budget set from what a step holds after backward leaves this much over it (the cost model
refuses a device that it fills exactly)."""


def budget(shape: ModelShape, world: int, max_len: int, device_memory_gb: float | None = None,
           nodes: int = 1, sharding: Sharding = Sharding.REPLICATED,
           precision: Precision = Precision.AUTO, tp: int = 1, pp: int = 1) -> tuple[Cluster, CostModel]:
    """The cluster plans are made for, the pool of the cpu cluster of `world` ranks (as `nodes`
    emulated nodes) under TP degree `tp` and PP degree `pp` (the cluster itself at 1, 1), and its
    analytic cost model (a TP rank's), its memory priced for the run's `sharding` and
    `precision`, at `device_memory_gb` per rank or, by default, at a budget that makes plans
    exercise sequence parallelism: 1.2x what half of a `max_len` sequence keeps under full recomputation, so the longest sequences fit
    degree 2 only when recomputed and never one rank (a whole one where the heads allow no degree
    above 1, else nothing could hold it). (A looser budget, the longest at degree 2
    without recomputation, let nearly every planner choose degree 1 with recomputation on CPU,
    where gloo's all-to-all latency is priced, and then no all-to-all ran.) The budget is no less
    than what a step holds after backward, which a short max_len's activations may not reach
    (replicated: AdamW's temporaries, 4 bytes a parameter); the statement above then does not
    hold and the longest sequences fit one rank."""
    def priced(cluster: Cluster) -> tuple[Cluster, CostModel]:
        mesh = JobMesh.of(cluster, tp=tp, pp=pp, shape=shape)
        return mesh.pool_cluster(cluster), get_cost_model("analytic", shape, cluster, sharding=sharding,
                                                         precision=precision, mesh=mesh)

    pool, cost = priced(get_cluster("cpu", world_size=world, device_memory_gb=device_memory_gb, nodes=nodes))
    if device_memory_gb is None:
        memory = max(cost.states + 1.2 * cost.act_per_token * cost.kept * max_len / min(2, cost.degrees[-1]),
                     AFTER_BACKWARD_MARGIN * cost.device.after_backward)
        pool, cost = priced(get_cluster("cpu", world_size=world, device_memory_gb=memory / 1e9, nodes=nodes))
    return pool, cost


def routed(plan: Plan) -> Plan:
    """`plan` with every wave routed."""
    return dataclasses.replace(plan, waves=[dataclasses.replace(wave, routed=True) for wave in plan.waves])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    WORLD.add(parser, None, f"{DEFAULT_WORLD}, the smallest world with sequence parallelism; under torchrun its "
                            f"WORLD_SIZE, which a --world given must match")
    PP.add(parser, 1, "no pipeline; under --pp the planners lay out a stage's pool of --world / (P T) ranks and "
                      "every rank holds its stage's layers")
    NODES.add(parser, 1, "one node; 2 or more emulate nodes of --world / N ranks, whose inter-node exchanges "
                         "--routing and --route-every-wave send over every NIC")
    ROUTING.add(parser, True, "the planners route as they would in a run")
    parser.add_argument("--route-every-wave", action="store_true",
                        help="mark every wave of every planner's plans routed (Wave.routed: inter-node "
                             "all-to-alls over every NIC of the node), so they all run the routing layer; "
                             "needs --nodes 2 or more")
    parser.add_argument("--routed", dest="route_every_wave", action="store_true",
                        help=argparse.SUPPRESS)  # the older spelling of --route-every-wave
    parser.add_argument("--planners", default="all", help="`all` or a comma-separated list")
    MODEL.add(parser, "tiny", "verifies every planner on this machine's CPU ranks in seconds")
    parser.add_argument("--steps", type=positive(int), default=3, help="optimizer steps per planner")
    parser.add_argument("--batch", type=positive(int), default=16, help="sequences per step")
    MAX_LEN.add(parser, 256, "the random batches' longest sequence: short enough that one process "
                             "runs the reference of every step in a second")
    DEVICE_MEMORY.add(parser, None, "a budget at which the longest sequences need the largest SP degree "
                                    "the heads allow even with every layer recomputed, and shorter ones fit "
                                    "one rank with some recomputation, so plans exercise both")
    DEGREE.add(parser, None, "the least that holds --max-len")
    CP.add(parser, None, "Ulysses alone")
    TP.add(parser, 1, "no tensor parallelism; 2 on --world 2 leaves a pool of one rank, --world 4 a pool of two")
    STRATEGY.add(parser, None, "one job mesh (--tp, --pp); under a strategy every planner's plans are placed on "
                               "its pipelines and verified alike, the table saying how many pipelines held sequences")
    parser.add_argument("--lr", type=positive(float), default=1e-3, help="AdamW's learning rate (default: 0.001)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--zero1", action="store_true", help="shard optimizer state (ZeRO-1)")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard parameters, gradients and optimizer state with FSDP2 (the planners "
                             "then make lockstep plans)")
    PRECISION.add(parser, Precision.AUTO, "fp32 on CPU ranks, bf16 under torchrun on GPUs; bf16 runs are "
                                          "compared to the fp32 reference with the bf16 tolerances below")
    bf16 = (f"in bf16, {BF16_GAP_MULTIPLE:g}x the single-process model's own bf16-vs-fp32 error, measured each "
            f"run on the reference's device (rank 0's GPU under torchrun): bf16 keeps 8 significant bits, "
            f"distributed runs measured 1.0-1.2x that gap, and a lost or misplaced micro-batch, shard or head "
            f"moves the gradient by O(1) of its largest entry; see verify.errors.BF16_GAP_MULTIPLE")
    parser.add_argument("--grad-tolerance", type=at_least(float, 0), default=None,
                        help=f"largest relative error of a step's loss and gradient at the same parameters "
                             f"(default: {GRAD_TOLERANCE:g} in fp32; {bf16}; never below the fp32 default)")
    parser.add_argument("--param-tolerance", type=at_least(float, 0), default=None,
                        help=f"largest drift of the parameters after the steps, relative to how far the steps "
                             f"moved them (default: {PARAM_TOLERANCE:g} in fp32; {bf16}; never below the fp32 "
                             f"default)")
    parser.add_argument("--timeout", type=TIMEOUT, default=600.0,
                        help="seconds before the local ranks are stopped, or under torchrun before a collective "
                             "is given up (at least 30: they need seconds to start)")


def run(args: argparse.Namespace) -> int:
    from ..runtime import in_job, job_world

    world = job_world(args.world, DEFAULT_WORLD)  # before any rank joins: a mismatch is one line per node
    return in_job(lambda: verify(args, world), args.timeout)


def verify(args: argparse.Namespace, world: int) -> int:
    """The command on `world` ranks (started here, or the torchrun job's with this process its
    rank 0); its exit status: 1 when a planner exceeds a tolerance."""
    from rich.console import Console
    from rich.table import Table

    from ..runtime import describe_ranks, on_ranks, rank_device
    from .distributed import train_all_planners
    from .strategies import check_strategy_flags, pipelines_used, plan_strategies, train_all_strategy_planners

    if args.zero1 and args.fsdp:
        raise ValueError("--zero1 and --fsdp both shard the optimizer state: choose one")
    if args.route_every_wave and args.nodes < 2:
        raise ValueError(f"--route-every-wave routes exchanges between nodes, but --nodes is {args.nodes}: give "
                         f"--nodes 2 or more")
    if args.route_every_wave and not args.routing:
        raise ValueError("--route-every-wave and --no-routing contradict each other: choose one")
    if (args.tp > 1 or args.pp > 1) and args.nodes > 1 and args.routing:
        raise ValueError(f"--tp {args.tp} --pp {args.pp} with --nodes {args.nodes}: a job with tensor or pipeline "
                         f"parallelism runs no routing layer; give --no-routing")
    if args.pp > 1 and args.fsdp:
        raise ValueError(f"--pp {args.pp} runs with replicated weights or --zero1: drop --fsdp")
    strategies = None if args.strategy is None else parse_strategies(args.strategy)
    if strategies is not None:
        check_strategy_flags(args)
    shape = get_model_shape(args.model)
    check_buildable(shape)
    names = parse_planner_names(args.planners)
    options = PlannerOptions(max_len=args.max_len, degree=args.degree, cp=args.cp, seed=args.seed,
                             routing=args.routing, lockstep=args.fsdp)
    options.check_read(names, unset=PlannerOptions())
    device = rank_device()  # the ranks' and the reference's: rank 0's GPU under torchrun on NCCL
    precision = Precision.BF16 if args.precision.autocast(device.type) else Precision.FP32
    cluster, cost = budget(shape, world, args.max_len, args.device_memory_gb, args.nodes,
                           Sharding.of_flags(args.zero1, args.fsdp), precision, args.tp, args.pp)
    check_fits(cost.under(ANY_SPLIT), [args.max_len])  # a --device-memory-gb that cannot hold --max-len: before planning
    batches = random_batches(shape, args.steps, args.batch, args.max_len, args.seed)
    if args.strategy is None:
        plans, cannot = plan_all(names, cluster, cost, options, batches, args)
    else:
        strategic = plan_strategies(names, strategies, shape, world, cost.device_memory, options, batches)
        plans, cannot = {n: [part for p in ps for part in p.parts] for n, ps in strategic.items()}, {}
    names = [n for n in names if n in plans]
    bf16 = precision is Precision.BF16
    console = Console(width=max(Console().width, 140 if bf16 else 120))  # bf16 adds a tolerances column
    sharding = " under FSDP2" if args.fsdp else " with ZeRO-1" if args.zero1 else ""
    whose = "--device-memory-gb" if args.device_memory_gb is not None else "verify's default; --device-memory-gb sets one"
    nodes = f" as {args.nodes} nodes{', every wave routed' if args.route_every_wave else ''}" if args.nodes > 1 else ""
    tp = f", TP {args.tp}" if args.tp > 1 else ""
    stages = f" as {args.pp} pipeline stages" if args.pp > 1 else ""
    pool = f" (plans over a pool of {cluster.world_size})" if args.tp * args.pp > 1 else ""
    if args.strategy is not None:
        pool = f" under strateg{'ies' if len(strategies) > 1 else 'y'} {' then '.join(map(str, strategies))}"
    console.print(f"verify: {describe_ranks(world)}{stages}{nodes}{tp}{pool}{sharding}{' in bf16' if bf16 else ''}, "
                  f"model {shape.name}, "
                  f"{args.steps} step(s) of "
                  f"{args.batch} sequences up to {args.max_len} tokens, {len(names)} planner(s), "
                  f"{cost.device_memory / 1e6:.3g} MB per rank ({whose})")
    reference = train_reference(shape, batches, args.seed, args.lr, device=device)
    bf16_reference = train_reference(shape, batches, args.seed, args.lr, bf16=True, device=device) if bf16 else None
    if args.strategy is None:
        results = on_ranks(world, train_all_planners, shape,
                           {n: [p.to_dict() for p in ps] for n, ps in plans.items()},
                           batches, args.seed, args.lr, args.zero1, args.fsdp, args.nodes, precision, args.tp,
                           args.pp, timeout=args.timeout)[0]
    else:
        results = on_ranks(world, train_all_strategy_planners, shape,
                           {n: [p.to_dict() for p in ps] for n, ps in strategic.items()},
                           batches, args.seed, args.lr, precision, timeout=args.timeout)[0]
    given = (args.grad_tolerance, args.param_tolerance)
    fp32 = tuple(t if t is not None else default for t, default in zip(given, (GRAD_TOLERANCE, PARAM_TOLERANCE)))
    # In bf16 each planner's tolerances are measured (its own parameters): a column, not the title.
    against = (f"the fp32 reference; tolerances {BF16_GAP_MULTIPLE:g}x the single-process bf16 error unless given"
               if bf16 else f"tolerance {fp32[0]:g}; drift tolerance {fp32[1]:g}")
    table = Table(title=f"{world} ranks vs one process: step loss and gradient at the same parameters; "
                        f"drift of the parameters after {args.steps} step(s) ({against})")
    for column in ("planner", *(("pipelines",) if args.strategy else ()), "waves", "degrees", "recomp", "loss rel",
                   "grad abs", "grad rel",
                   "param abs", "param drift", *(("tolerances",) if bf16 else ()), ""):
        table.add_column(column, justify="left" if column == "planner" else "right")
    failed = []
    for name in names:
        at_same = reference_at(shape, results[name], batches, device=device)
        errors = errors_against(results[name], at_same, reference)
        measured = (bf16_tolerances(at_same, reference_at(shape, results[name], batches, bf16=True, device=device),
                                    reference, bf16_reference) if bf16 else fp32)
        grad_tolerance, param_tolerance = (t if t is not None else m for t, m in zip(given, measured))
        ok = errors.within(grad_tolerance, param_tolerance)
        if not ok:
            failed.append(name)
        mbs = [mb for p in plans[name] for _, _, mb in p.micro_batches() if mb.seq_ids]
        table.add_row(name, *((pipelines_used(strategic[name]),) if args.strategy else ()),
                      str(max(len(p.waves) for p in plans[name])), ",".join(splits_used(plans[name])),
                      f"{sum(mb.recompute for mb in mbs) / len(mbs):.2f}",
                      f"{errors.loss:.1e}", f"{errors.grad_abs:.1e}", f"{errors.grad_rel:.1e}",
                      f"{errors.param_abs:.1e}", f"{errors.param_drift:.1e}",
                      *((f"{grad_tolerance:.1e}, {param_tolerance:.1e}",) if bf16 else ()),
                      "[green]ok[/green]" if ok else "[red]FAIL[/red]")
    console.print(table)
    for name, why in cannot.items():
        console.print(f"{name}: not run: it {why}")
    if failed:
        console.print(f"[red]{len(failed)} planner(s) exceed the tolerance: {', '.join(failed)}[/red]")
        return 1
    return 0


def plan_all(names: list[str], cluster: Cluster, cost: CostModel, options: PlannerOptions,
             batches: list[VerifyBatch], args: argparse.Namespace) -> tuple[dict[str, list[Plan]], dict[str, str]]:
    """Every planner's validated plans of the batches, and why those that cannot hold --max-len
    were not run: a budget that needs context parallelism for the longest sequences (a model
    whose heads cap Ulysses) is beyond the Ulysses-only planners."""
    plans: dict[str, list[Plan]] = {}
    cannot: dict[str, str] = {}
    for name in names:
        planner = get_planner(name, cluster, cost, options)
        limit = planner.cost.max_tokens(planner.cost.degrees[-1], 1.0)
        if limit < args.max_len:
            cannot[name] = (f"holds at most {limit} tokens ({planner.cost.splits.name} splits, degrees up to "
                            f"{planner.cost.degrees[-1]}), not --max-len {args.max_len}")
            continue
        plans[name] = [planner.plan(b.planned) for b in batches]
        if args.route_every_wave:
            plans[name] = [routed(plan) for plan in plans[name]]
        for plan in plans[name]:
            plan.validate(cluster, cost)
    if not plans:
        raise ValueError(f"no planner of --planners {args.planners} can hold --max-len {args.max_len}: "
                         + "; ".join(f"{n} {why}" for n, why in cannot.items()))
    return plans, cannot
