"""What every rank of a training run derives from its config before the first step: the model
shape, cluster, mesh and cost model (`Setup`), the strategies a step may take (given, or proposed
from the training data under `--strategy auto`), the data stream, the planner (rank 0's) and what
runs the plans on each rank (`make_executor`)."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
from rich.console import Console

from ..command_line.options import AUTO_STRATEGIES, parse_strategies, strategies_text
from ..dataset import (BatchStream, ClipStream, build_corpus, check_data_kind, check_vocab, is_video_data,
                       open_clip_stream)
from ..models import build_model, check_buildable, part_load
from ..planners import Planner, PlannerOptions, get_planner
from ..planners.fits import check_fits
from ..planners.hydraulis_pool import HISTOGRAM, auto_strategies
from ..planners.strategy_choice import StrategyChoice, strategy_planner
from ..planners.strategy_prices import StrategyPrices
from ..pricing.cost import CostModel
from ..pricing.cost_sources import get_cost_model
from ..runtime import ModelBuild, parallelize
from ..runtime.executor import Executor
from ..runtime.strategy import StrategyExecutor
from ..vocabulary.cluster import Cluster, default_cluster, get_cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.layouts import ANY_SPLIT
from ..vocabulary.model_shape import ModelShape, get_model_shape
from ..vocabulary.sharding import Sharding
from .config import TrainConfig
from .hf_folder import check_tokenizer, resolve_tokenizer


@dataclass
class Setup:
    """What every rank derives from the config alone (so every rank agrees on it)."""

    shape: ModelShape
    cluster: Cluster
    """The job's devices."""
    mesh: JobMesh
    """Its TP degree, PP degree and the pool the plans are made over."""
    cost: CostModel
    """A rank's of the mesh (a TP shard's), over the pool."""
    tokenizer: str
    """The tokenizer the corpus is tokenised with: --tokenizer, else an hf:PATH model's own
    tokenizer.json, else "bytes" (hf_folder.resolve_tokenizer)."""
    strategies: StrategyPrices | None = None
    """Under --strategy: the strategies a step may take and their prices (`mesh` is then the one
    pool of every rank, which no step runs, and `cost` the first pipeline's of the first strategy)."""

    @classmethod
    def of(cls, config: TrainConfig, world: int, gpu_name: str | None = None) -> Setup:
        """The setup of `world` ranks on GPUs of model `gpu_name` (None: on the CPU), which
        names the cluster when the config does not (`cluster.default_cluster`)."""
        shape, cluster = job_of(config, world, gpu_name)
        mesh = JobMesh.of(cluster, tp=config.planner.tp, pp=config.planner.pp, shape=shape)
        tokenizer = resolve_tokenizer(config.data.tokenizer, shape)
        if config.planner.strategy is not None:
            prices = _strategy_prices(config, shape, cluster)
            return cls(shape, cluster, mesh, prices.costs[prices.strategies[0]][0], tokenizer, prices)
        sharding = Sharding.of_flags(config.optimizer.zero1, config.optimizer.fsdp)
        cost = get_cost_model(config.planner.cost, shape, cluster, config.planner.device_memory_gb, sharding,
                              config.run.precision, mesh)
        check_fits(cost.under(ANY_SPLIT), [config.data.max_len])  # a max_len no plan can hold fails here, not at step k
        return cls(shape, cluster, mesh, cost, tokenizer)

    @property
    def pool(self) -> Cluster:
        """The cluster the plans are made for: the mesh's pool (`JobMesh.pool_cluster`)."""
        return self.mesh.pool_cluster(self.cluster)

    def describe(self) -> str:
        where = "" if self.cost.source != "analytic" else " (`ballast profile` measures a real one)"
        mesh = f", {self.mesh.describe()}: plans over the pool" if self.mesh.tp * self.mesh.pp > 1 else ""
        if self.strategies is not None:
            mesh = f", a step under {' or '.join(map(str, self.strategies.strategies))}"
        return (f"cost model: {self.cost.source} for {self.shape.name} on {self.cluster.name} "
                f"({self.cluster.world_size} ranks{mesh}, {self.cost.device_memory / 1e9:.3g} GB each){where}")


def job_of(config: TrainConfig, world: int, gpu_name: str | None = None) -> tuple[ModelShape, Cluster]:
    """The run's model shape and cluster, once the model, its data and its layout can be trained."""
    shape = get_model_shape(config.model.model)
    check_buildable(shape)
    check_data_kind(config.data.source, shape)
    if config.planner.strategy is not None and shape.diffusers_folder is not None:
        raise ValueError(f"--strategy with model {shape.name!r}: a diffusers model is not trained under strategies "
                         f"(its clips are not priced per pipeline); train it without --strategy")
    spec = config.planner.cluster or default_cluster(world, gpu_name)
    return shape, get_cluster(spec, world, config.planner.device_memory_gb, config.planner.nodes)


def with_proposed_strategies(config: TrainConfig, world: int, gpu_name: str | None = None,
                             console: Console | None = None) -> TrainConfig:
    """The config with `--strategy auto` replaced by the strategies Hydraulis' offline dynamic
    program proposes (`planners/hydraulis_pool.py`) from the training data's own sample lengths:
    every sample's, or HISTOGRAM of them drawn with the run's seed. Any other config as it is.
    Deterministic, so a resumed run proposes the same; the run's config.toml records them."""
    if config.planner.strategy != AUTO_STRATEGIES:
        return config
    shape, cluster = job_of(config, world, gpu_name)
    if is_video_data(config.data.source):
        raise ValueError("--strategy auto with video data: the proposal prices token lengths, not clip shapes; "
                         "give the strategies themselves")
    stream, _ = open_data(config, shape, resolve_tokenizer(config.data.tokenizer, shape), progress=console is not None)
    ids = np.arange(stream.num_samples)
    if ids.size > HISTOGRAM:
        ids = np.sort(np.random.default_rng([config.run.seed, 1]).choice(ids, HISTOGRAM, replace=False))
    strategies = auto_strategies(config.planner.cost, shape, cluster, config.planner.device_memory_gb,
                                 [int(n) for n in stream.sample_lengths(ids)])
    if console is not None:
        console.print(f"--strategy auto: {'; '.join(map(str, strategies))}, proposed from {ids.size:,} sample "
                      f"lengths of the training data", highlight=False)
    return dataclasses.replace(config, planner=dataclasses.replace(config.planner, strategy=strategies_text(strategies)))


def _strategy_prices(config: TrainConfig, shape: ModelShape, cluster: Cluster) -> StrategyPrices:
    """The prices of --strategy's strategies."""
    prices = StrategyPrices(parse_strategies(config.planner.strategy), config.planner.cost, shape, cluster,
                            config.planner.device_memory_gb)
    prices.check_max_len(config.data.max_len)
    return prices


def open_data(config: TrainConfig, shape: ModelShape, tokenizer: str, progress: bool
              ) -> tuple[BatchStream | ClipStream, str]:
    """The run's batches and what they are, said in the log. Text: the corpus (tokenised once,
    then from the cache), checked against the model's vocab: the tokenizer's before tokenising,
    the corpus's after (a `tokens:` source brings its own). Video: the clips, every one checked
    against max_len up front."""
    data, seed = config.data, config.run.seed
    if is_video_data(data.source):
        clips = open_clip_stream(data.source, shape.video_geometry, data.tokens_per_step, data.max_len, seed,
                                 shape.caption_dim, shape.max_axis_patches)
        return clips, clips.describe()
    check_tokenizer(tokenizer, data.tokenizer, shape)
    corpus = build_corpus(data.source, tokenizer=tokenizer, cache_dir=data.cache_dir,
                          text_field=data.text_field, skip_bad=data.skip_bad, progress=progress)
    check_vocab(corpus.vocab_size, shape.vocab, shape.name)
    return BatchStream(corpus, data.tokens_per_step, data.max_len, seed), corpus.describe()


def planner_options(config: TrainConfig) -> PlannerOptions:
    return PlannerOptions(max_len=config.data.max_len, degree=config.planner.degree, cp=config.planner.cp,
                          seed=config.run.seed, time_limit=config.planner.time_limit,
                          routing=config.planner.routing, defer_outliers=config.planner.defer_outliers,
                          lockstep=config.optimizer.fsdp)


def make_planner(config: TrainConfig, setup: Setup) -> Planner | StrategyChoice:
    """The run's planner (under --strategy, placed on the strategies); an option it would ignore
    (--cp with ballast) is refused."""
    options = planner_options(config)
    options.check_read([config.planner.planner], unset=planner_options(TrainConfig()))
    if setup.strategies is not None:
        return strategy_planner(config.planner.planner, setup.strategies, options)
    return get_planner(config.planner.planner, setup.pool, setup.cost, options)


def make_executor(config: TrainConfig, setup: Setup) -> Executor | StrategyExecutor:
    """What runs the run's plans on this rank: its part of the one mesh, or of each step's strategy."""
    opt = config.optimizer
    adamw = {"lr": opt.lr, "betas": (opt.beta1, opt.beta2), "weight_decay": opt.weight_decay}
    build, part = functools.partial(build_model, setup.shape, config.run.seed), part_load(setup.shape)
    if setup.strategies is not None:
        return StrategyExecutor(build, setup.cluster, precision=config.run.precision, part=part, **adamw)
    # Built on the host, by its ranks in turns: parallelize keeps this rank's stage and TP shard,
    # on its device, before the next turn builds; a Hugging Face folder's part read alone.
    return parallelize(ModelBuild(setup.shape, build, part), setup.cluster, mesh=setup.mesh,
                       fsdp=opt.fsdp, zero1=opt.zero1, precision=config.run.precision, bucket_bytes=opt.bucket_bytes,
                       **adamw)
