"""The configuration of a training run: typed sections, what no run can use refused.

One `TrainConfig` holds six sections (`[model]`, `[data]`, `[planner]`, `[optimizer]`, `[run]`,
`[checkpoint]` in TOML). Values come, later ones winning, from the defaults below, the
`--config FILE` TOML and the command line (`config_sources.py`). Every field is a flag:
`--field-name`, or the short name its metadata gives (`--model`, `--data`, `--planner`, ...),
so field names are unique across sections. The help text of every flag is the field's
docstring: one source.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..command_line.options import AUTO_STRATEGIES, SEED, SHARED, TIMEOUT, parse_strategies, refuse_with_strategy
from ..planners.base import SHORT_SOLVES
from ..vocabulary.precision import Precision
from ..vocabulary.value_checks import Numbers, at_least, positive


def _flag(name: str) -> Any:
    return {"flag": name}


def _in(numbers: Numbers) -> Any:
    """A numeric field's range (a shared flag's is its `options.SHARED` type)."""
    return {"range": numbers}


@dataclass
class ModelConfig:
    model: str = field(default="tiny", metadata=_flag("--model"))
    """The run's model (`options.MODEL`); tiny trains on this machine's CPU ranks in seconds per step."""


@dataclass
class DataConfig:
    source: str = field(default="stdlib", metadata=_flag("--data"))
    """Text corpus: stdlib | folder:PATH | jsonl:PATH | parquet:PATH | hf-dataset:PATH (a datasets
    save_to_disk folder, or parquet/jsonl files read with datasets) | tokens:PATH. Video clips
    (for video DiTs): video-synthetic[:SEED[:PATH]] (procedural latent clips, shaped like DCP's
    any-size buckets or a `videos:` clip list at PATH) | video-latents:PATH (a folder of
    .safetensors/.npy latents [C, F, H, W])."""
    tokenizer: str | None = None
    """`bytes` (one token per UTF-8 byte, vocab 256) or a Hugging Face tokenizer.json file;
    unset: an hf:PATH model's own tokenizer.json when its folder has one, else bytes."""
    text_field: str = "text"
    """JSON key, Parquet column or dataset field holding a document's text."""
    cache_dir: str | None = None
    """Where tokenised corpora are cached; default: the data pipeline's own."""
    skip_bad: bool = False
    """Skip (and count) unreadable documents instead of stopping at the first."""
    tokens_per_step: int = field(default=8192, metadata=_in(positive(int)))
    """Token budget of one optimizer step (the global batch)."""
    max_len: int = 1024
    """The longest sample (`options.MAX_LEN`): longer documents are cut into chunks of it; a longer
    clip is an error, clips are never cut."""


@dataclass
class PlannerConfig:
    """The [planner] section. Its degree, cp, routing and time_limit are `PlannerOptions`' with
    train's defaults (`SHORT_SOLVES`); the run's planner gets them with the data's max_len, the
    run's seed and FSDP's lockstep (`loop.make_planner`): a flat section, as a TOML file and the
    flags have it."""

    planner: str = field(default="ballast", metadata=_flag("--planner"))
    """Planner that lays out every step (static, ballast, dcp, flexsp, ...)."""
    cost: str = "analytic"
    """The planner's cost model (`options.COST`); analytic figures until `ballast profile` measures
    the machine."""
    cluster: str | None = None
    """The cluster (`options.CLUSTER`); cpu: one node of the run's ranks. Unset: cpu on gloo
    ranks; on GPU ranks (NCCL) the preset of the GPU's model at the world's size (h100-8,
    a100-4, ...), an error naming --cluster for a GPU no preset describes."""
    nodes: int | None = None
    """The nodes the ranks form (`options.NODES`); unset: the cluster's own (cpu: one node). A
    cpu run of 4 ranks as 2 nodes trains with routed waves where the planner routes."""
    routing: bool = field(default=SHORT_SOLVES.routing, metadata=_flag("--routing"))
    """The planner's routing of inter-node all-to-alls (`options.ROUTING`); a run of ranks on one
    node has none to route."""
    defer_outliers: bool = SHORT_SOLVES.defer_outliers
    """wlb-llm, and ballast under --pp, let outliers wait for later steps in WLB-LLM's queue
    (`PlannerOptions.defer_outliers`), so their batches are not the other planners'; off: every
    sample trains in the step that drew it."""
    device_memory_gb: float | None = None
    """The budget per rank plans must fit (`options.DEVICE_MEMORY`); unset: the cluster's own (cpu: 4)
    or the profile's."""
    plan_ahead: bool = True
    """Plan step k+1 in a background thread on rank 0 while step k trains."""
    degree: int | None = None
    """The SP degree of fixed-degree planners (`options.DEGREE`); unset: the least that holds --max-len."""
    cp: int | None = None
    """static's context-parallel part (`options.CP`), dividing --degree; unset: Ulysses alone."""
    time_limit: float = field(default=SHORT_SOLVES.time_limit, metadata=_in(positive(float)))
    """Seconds per MILP solve (flexsp)."""
    tp: int = field(default=1, metadata=_flag("--tp"))
    """The tensor-parallel degree (`options.TP`); 1: every rank holds whole layers."""
    pp: int = field(default=1, metadata=_flag("--pp"))
    """Pipeline stages (`options.PP`); 1: no pipeline, every rank holds all the model's layers."""
    strategy: str | None = field(default=None, metadata=_flag("--strategy"))
    """Heterogeneous strategies a step may take (`options.STRATEGY`): each step trains under the one
    its plan is fastest under (hydraulis: by its own rule), the log names it; unset: the one mesh of
    --tp and --pp."""


MOMENT_DECAY = Numbers(float, 0, high=1, high_open=True, why="AdamW's moment decay")


@dataclass
class OptimizerConfig:
    lr: float = field(default=3e-3, metadata=_in(positive(float)))
    """Peak learning rate of AdamW."""
    min_lr: float | None = field(default=None, metadata=_in(at_least(float, 0)))
    """Learning rate the cosine decay after warm-up ends at, at most --lr; default --lr / 10."""
    warmup_steps: int = field(default=10, metadata=_in(at_least(int, 0)))
    """Steps of linear warm-up from 0 to --lr."""
    decay_steps: int | None = field(default=None, metadata=_in(positive(int)))
    """Step at which the cosine decay reaches --min-lr; default --steps. Fix it to lengthen a
    run (a larger --steps on resume) without changing its schedule."""
    weight_decay: float = field(default=0.1, metadata=_in(at_least(float, 0)))
    """AdamW's decoupled weight decay."""
    beta1: float = field(default=0.9, metadata=_in(MOMENT_DECAY))
    """AdamW's first-moment decay."""
    beta2: float = field(default=0.95, metadata=_in(MOMENT_DECAY))
    """AdamW's second-moment decay."""
    skip_nonfinite: bool = False
    """Skip a step whose loss or gradient norm is not finite (the weights and AdamW's state stay as
    they were; counted in metrics.jsonl and the log) instead of stopping the run with an error
    naming the step and its samples."""
    zero1: bool = False
    """Shard AdamW's state over the ranks (ZeRO-1); a checkpoint then resumes on the same world size."""
    fsdp: bool = False
    """Shard parameters, gradients and AdamW's state over the ranks with FSDP2 (ZeRO-3); the
    planner then makes lockstep plans (every group of a wave runs as many micro-batches)."""
    bucket_mb: float = field(default=25.0, metadata=_in(at_least(float, 2**-20, "a bucket holds at least a byte")))
    """Size in MiB of the gradient buckets summed over the ranks while backward runs (PyTorch
    DDP's default; not under --fsdp, which reduces per block): smaller ones start earlier in
    backward, larger ones pay the collectives' latency less often."""

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * 2**20)

    @property
    def final_lr(self) -> float:
        """The rate the decay ends at: --min-lr, or --lr / 10 (a --lr alone keeps its schedule's shape)."""
        return self.lr / 10 if self.min_lr is None else self.min_lr


@dataclass
class RunConfig:
    steps: int = field(default=100, metadata=_in(positive(int)))
    """Optimizer steps of the whole run (a resumed run continues up to this many)."""
    seed: int = field(default=0, metadata=_in(SEED))
    """Seeds the model's initial weights and the data order."""
    world: int | None = None
    """The run's ranks (`options.WORLD`): spawned locally (2 when unset), or under torchrun its
    WORLD_SIZE, which this must match if set."""
    out_dir: str = "runs/train"
    """Run folder: config.toml, metrics.jsonl, checkpoints/, report/, and for an hf:PATH model
    hf-model/ (the trained model as a Hugging Face folder), for a diffusers:PATH model
    diffusers-model/ (as a diffusers folder)."""
    report: bool = True
    """Draw the run's report at the end (report/: loss, throughput, lengths and a showcase
    plan's Gantt as PNG); off (`--no-report`), report/ holds summary.json alone: for sweeps of
    many short runs, where the plots cost more than the steps."""
    log_interval: int = field(default=10, metadata=_in(positive(int)))
    """Steps between log lines when the output is not a terminal (a progress bar otherwise)."""
    precision: Precision = field(default=Precision.AUTO, metadata=_flag("--precision"))
    """The forward's precision (`options.PRECISION`): auto is what the cost model's presets price
    (bf16 on GPUs, fp32 on the cpu cluster)."""
    timeout: float = field(default=300.0, metadata=_in(TIMEOUT))
    """Seconds a collective may wait for a peer before the job fails (a dead rank ends in an error);
    at least 30: the ranks meet in the store with it while they start (importing torch takes
    seconds, more on a busy machine), and a step's collectives wait for its slowest group."""


@dataclass
class CheckpointConfig:
    checkpoint_dir: str | None = None
    """Checkpoint folder (shared by all nodes); default: OUT_DIR/checkpoints."""
    checkpoint_interval: int = field(default=50, metadata=_in(at_least(int, 0)))
    """Steps between checkpoints; the last step is always saved. 0: only the last."""
    keep_checkpoints: int = field(default=2, metadata=_in(positive(int)))
    """How many of the newest checkpoints to keep."""
    resume: bool = True
    """Continue from the newest checkpoint in the checkpoint folder if there is one."""


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self) -> None:
        """ValueError for values no run can use (checked before any rank starts)."""
        for section in dataclasses.fields(self):
            values = getattr(self, section.name)
            for f in dataclasses.fields(values):
                value, numbers = getattr(values, f.name), field_range(f)
                if numbers is not None and value is not None:
                    numbers.check(flag_of(f), value)
        opt = self.optimizer
        if opt.final_lr > opt.lr:
            raise ValueError(f"--min-lr {opt.final_lr:g} is above --lr {opt.lr:g}: the cosine decay would raise "
                             f"the rate; give a --min-lr of at most --lr")
        if opt.decay_steps is not None and 0 < opt.warmup_steps >= opt.decay_steps:
            raise ValueError(f"--decay-steps {opt.decay_steps} is not after the warm-up's end (--warmup-steps "
                             f"{opt.warmup_steps}): the rate would warm up and then drop to --min-lr "
                             f"{opt.final_lr:g} at once, with no decay; give a --decay-steps above "
                             f"{opt.warmup_steps}, or fewer --warmup-steps")
        path = self.checkpoint_path
        if path.exists() and not path.is_dir():
            raise ValueError(f"the checkpoint folder {path} (--checkpoint-dir, default OUT_DIR/checkpoints) is a "
                             f"file, not a folder")
        if opt.zero1 and opt.fsdp:
            raise ValueError("--zero1 and --fsdp both shard the optimizer state: choose one")
        if opt.fsdp and self.planner.pp > 1:
            raise ValueError(f"--fsdp does not run under pipeline parallelism (--pp {self.planner.pp}): use --zero1 or "
                             f"replicated weights")
        if self.planner.strategy is not None:
            if self.planner.strategy != AUTO_STRATEGIES:  # auto: proposed from the data (`setup.py`)
                parse_strategies(self.planner.strategy)  # a config file's malformed value: before any rank starts
            plan = self.planner
            refuse_with_strategy((("--tp", plan.tp > 1), ("--pp", plan.pp > 1), ("--zero1", opt.zero1),
                                  ("--fsdp", opt.fsdp), ("--nodes", (plan.nodes or 1) > 1),
                                  ("--degree", plan.degree is not None), ("--cp", plan.cp is not None)))
        if self.data.max_len > self.data.tokens_per_step:
            raise ValueError(f"--max-len {self.data.max_len} exceeds --tokens-per-step "
                             f"{self.data.tokens_per_step}: a step could not hold its longest sequence")

    def warnings(self) -> list[str]:
        """What the run will do that its settings may not mean it to (it still runs)."""
        opt, steps = self.optimizer, self.run.steps
        if opt.warmup_steps < steps:
            return []
        peak = steps / opt.warmup_steps
        return [f"the run's {steps} step(s) end inside the {opt.warmup_steps}-step warm-up (--warmup-steps): the "
                f"rate rises to {peak:.0%} of --lr {opt.lr:g} and never decays (to --min-lr {opt.final_lr:g}"
                f"{'' if opt.decay_steps is None else f' at --decay-steps {opt.decay_steps}'}); give fewer "
                f"--warmup-steps or more --steps"]

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint.checkpoint_dir or Path(self.run.out_dir) / "checkpoints")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The config as TOML that `--config` reads back (None values are left out)."""
        lines = []
        for section, values in self.to_dict().items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in values.items() if value is not None]
            lines.append("")
        return "\n".join(lines)


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def field_range(f: dataclasses.Field) -> Numbers | None:
    """The values a numeric field takes (its own, or its shared flag's); None for the others."""
    shared = SHARED.get(flag_of(f))
    return f.metadata.get("range") or (shared.type if isinstance(shared and shared.type, Numbers) else None)
