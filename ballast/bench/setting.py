"""What `ballast bench` runs: its setting, the batches drawn once, and the order of the runs.

Every planner must see the same data, so the batches come from one `BatchStream` drawn once,
here, before any rank starts; the ranks receive them as they are. The runs are interleaved:
for every step, every planner runs that step's batch before any planner moves on, and the
order rotates by one each step, so a slow drift of the machine's load (other jobs on a shared
host) hits all planners alike and no planner always runs first or last.

A profiled cost model's prediction error mixes the model's error with the machine's drift
since the profile (on the shared 2-vCPU host, 5-15% within minutes). So the benchmark runs the
profile's full-depth points again, as `ballast profile --check` does (`profile/drift.py`), spread
over every round (`reference_steps`), and reports the drift and the errors with it divided out.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..vocabulary.cluster import Cluster, get_cluster
from ..pricing.cost import CostModel
from ..pricing.cost_sources import get_cost_model
from ..dataset import (BatchStream, EpochStream, GlobalBatch, build_corpus, check_data_kind, check_vocab,
                       is_video_data, open_clip_stream)
from ..command_line.options import CP, DEGREE, DEVICE_MEMORY, MAX_LEN, SEED, WORLD
from ..vocabulary.value_checks import at_least, positive
from ..planners import SHORT_SOLVES, PlannerOptions, parse_planner_names
from ..vocabulary.model_shape import ModelShape, get_model_shape
from ..models import check_buildable
from ..vocabulary.layouts import ANY_SPLIT
from ..profile.drift import reference_points
from ..profile.grid import Measurement
from ..profile.machine import measured_device
from ..planners.fits import check_fits
from ..vocabulary.precision import Precision

ALL_PLANNERS = ("static", "batch-adaptive", "bucket", "megatron-dynamic-cp", "wlb-llm", "dcp", "flexsp", "hydraulis",
                "zeppelin", "ballast")
"""The default line-up: every planner, baselines first."""
MEMORY_SLACK = 1.01
"""The default memory budget holds half a max_len sequence without recomputation, 1% to spare."""


RANGES = {"world": WORLD.type, "steps": positive(int), "warmup": at_least(int, 0), "repeats": positive(int),
          "tokens_per_step": positive(int), "max_len": MAX_LEN.type, "device_memory_gb": DEVICE_MEMORY.type,
          "degree": DEGREE.type, "cp": CP.type, "time_limit": positive(float), "seed": SEED}
"""The values every numeric knob takes, for the flags and for a setting made in Python alike."""


@dataclass(frozen=True)
class BenchSetting:
    """One benchmark's knobs (the command line's flags). The defaults are bench/measured.sh's
    setting: with its nine planners (every one but wlb-llm), about 8 minutes on 2 quiet CPU cores."""

    model: str = "tiny"
    data: str = "stdlib"
    cache_dir: str | None = None
    world: int = 2
    planners: tuple[str, ...] = ALL_PLANNERS
    steps: int = 4
    """Measured steps (batches) per round."""
    warmup: int = 1
    """Unmeasured steps every planner runs first, on batches of their own."""
    repeats: int = 3
    """Rounds over the measured batches (the same plans again): their spread is the noise."""
    tokens_per_step: int = 16384
    device_memory_gb: float | None = None
    """Memory budget per rank the planners plan for; None: `auto_device_memory`."""
    cost: str = "analytic"
    """`analytic` or a `ballast profile` JSON: the planners' cost model and the predictions'."""
    precision: Precision = Precision.AUTO
    """The ranks' forward precision (`options.PRECISION`)."""
    planner: PlannerOptions = dataclasses.replace(SHORT_SOLVES, max_len=8192)
    """Every planner's options. Its `max_len` is the data's longest sample too and its `seed`
    the batches' and the models' (`max_len`, `seed`); a forced `degree` is set as a user of a
    fixed-layout framework sets it (e.g. transformers/accelerate's `sp_size`)."""

    @property
    def max_len(self) -> int:
        return self.planner.max_len

    @property
    def seed(self) -> int:
        return self.planner.seed

    def to_json(self) -> dict:
        """The setting as a result records it: the planner's options beside the other knobs."""
        knobs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "planner"}
        return {**knobs, **dataclasses.asdict(self.planner)}

    def validate(self) -> None:
        """ValueError for settings no benchmark can run."""
        parse_planner_names(",".join(self.planners))
        if self.max_len is None:
            raise ValueError("a bench setting's planner options need a max_len: the longest sample it draws")
        if len(set(self.planners)) != len(self.planners):
            raise ValueError(f"--planners names a planner twice: {','.join(self.planners)}")
        for name, numbers in RANGES.items():
            value = getattr(self.planner if hasattr(self.planner, name) else self, name)
            if value is not None:
                numbers.check("--" + name.replace("_", "-"), value)
        if self.max_len > self.tokens_per_step:
            raise ValueError(f"--max-len {self.max_len} exceeds --tokens-per-step {self.tokens_per_step}: "
                             f"a step could not hold its longest sequence")
        self.planner.check_read(self.planners, unset=BenchSetting().planner)


@dataclass
class BenchInputs:
    """What every rank needs: the model, the cluster and cost model, and every batch."""

    shape: ModelShape
    cluster: Cluster
    cost: CostModel
    batches: list[GlobalBatch]
    """The warm-up batches first, then the measured ones."""
    data: str
    """The corpus, described."""
    references: list[Measurement] = dataclasses.field(default_factory=list)
    """The profile's points run again for the machine's drift (`drift_references`; none for a
    cost model no profile on this device measured)."""


@dataclass(frozen=True)
class Slot:
    """One planner running one batch once."""

    round: int
    """Round of the measured batches; -1 for warm-up."""
    step: int
    """Index of the batch among the warm-up or the measured ones."""
    batch: int
    """Index into `BenchInputs.batches`."""
    planner: str
    position: int
    """Place among the step's planners (0: ran first)."""

    @property
    def measured(self) -> bool:
        return self.round >= 0


def schedule(planners: tuple[str, ...], steps: int, warmup: int, repeats: int) -> list[Slot]:
    """Every (round, step) in turn, every planner within it, the order rotated by one each time."""
    turns = [(-1, k, k) for k in range(warmup)]
    turns += [(r, k, warmup + k) for r in range(repeats) for k in range(steps)]
    out = []
    for turn, (round_, step, batch) in enumerate(turns):
        shift = turn % len(planners)
        order = planners[shift:] + planners[:shift]
        out += [Slot(round_, step, batch, name, i) for i, name in enumerate(order)]
    return out


def reference_steps(steps: int, references: int) -> list[int]:
    """After which measured step of every round each reference point runs: spread evenly over
    the round, so that the drift is measured over the same minutes as the planners' steps."""
    return [i * steps // references for i in range(references)]


def drift_references(cost: CostModel, shape: ModelShape, device: str) -> list[Measurement]:
    """The profile's reference points (`profile.drift.reference_points`) if it was measured on
    the device type the benchmark's ranks run on (`device`: "cpu" for gloo ranks, "cuda" for
    torchrun's on GPUs); else none (one device's seconds are no reference for another's speed)."""
    machine = cost.fit.get("machine")
    return reference_points(cost, shape) if machine and measured_device(machine) == device else []


def auto_device_memory(cost: CostModel, max_len: int) -> float:
    """Bytes per rank in which a max_len sequence runs without recomputation only at SP degree 2.

    On one rank it then needs most layers recomputed, which is what `static` sets for the
    whole run; shorter sequences need less or no recomputation, and the longest can trade it
    for SP's all-to-alls: every choice the planners make matters, and they differ in them.
    """
    # No less than the step holds after backward (AdamW's temporaries, FSDP2's root and reduction buffer).
    return max(cost.states + MEMORY_SLACK * cost.act_per_token * max_len / 2, MEMORY_SLACK * cost.device.after_backward)


def make_cost(setting: BenchSetting, shape: ModelShape) -> tuple[Cluster, CostModel]:
    """The cpu cluster of `world` ranks and the cost model, both at the benchmark's memory budget."""
    base = get_cluster("cpu", setting.world)
    cost = get_cost_model(setting.cost, shape, base, precision=setting.precision)
    memory = (setting.device_memory_gb * 1e9 if setting.device_memory_gb is not None
              else auto_device_memory(cost, setting.max_len))
    cost = dataclasses.replace(cost, device_memory=memory)
    check_fits(cost.under(ANY_SPLIT), [setting.max_len])
    return get_cluster("cpu", setting.world, memory / 1e9), cost


def prepare(setting: BenchSetting, progress: bool = True) -> BenchInputs:
    """Cost model, cluster and the benchmark's batches (warm-up + measured), drawn once; in the
    process that runs the command (under torchrun rank 0, on the job's device)."""
    from ..runtime import rank_device

    setting.validate()
    shape = get_model_shape(setting.model)
    check_buildable(shape)
    cluster, cost = make_cost(setting, shape)
    stream, described = open_stream(setting, shape, progress)
    batches = [stream.next_batch() for _ in range(setting.warmup + setting.steps)]
    return BenchInputs(shape, cluster, cost, batches, described, drift_references(cost, shape, rank_device().type))


def open_stream(setting: BenchSetting, shape: ModelShape, progress: bool) -> tuple[EpochStream, str]:
    """The benchmark's batches, described: clips for a video DiT, else the tokenised corpus."""
    check_data_kind(setting.data, shape)
    if is_video_data(setting.data):
        clips = open_clip_stream(setting.data, shape.video_geometry, setting.tokens_per_step, setting.max_len,
                                 setting.seed, shape.caption_dim, shape.max_axis_patches)
        return clips, clips.describe()
    corpus = build_corpus(setting.data, cache_dir=setting.cache_dir, progress=progress)
    check_vocab(corpus.vocab_size, shape.vocab, shape.name)
    return BatchStream(corpus, setting.tokens_per_step, setting.max_len, setting.seed), corpus.describe()
