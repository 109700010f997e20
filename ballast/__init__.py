"""ballast: data-centric parallelism for training Transformers on variable-length sequences."""
from .cluster import Cluster, get_cluster
from .cost import CostModel
from .cost_sources import get_cost_model
from .plans import Group, MicroBatch, Plan, PlanError, Wave
from .planners import PlannerOptions, make_plan as plan
from .runtime import parallelize
from .model_shape import ModelShape, get_model_shape
from .train import TrainConfig, Trainer

__all__ = ["Cluster", "CostModel", "Group", "MicroBatch", "ModelShape", "Plan", "PlanError",
           "PlannerOptions", "TrainConfig", "Trainer", "Wave", "get_cluster", "get_cost_model",
           "get_model_shape", "parallelize", "plan"]
