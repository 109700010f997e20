"""ballast: data-centric parallelism for training Transformers on variable-length sequences."""
from .vocabulary.cluster import Cluster, get_cluster
from .pricing.cost import CostModel
from .pricing.cost_sources import get_cost_model
from .plans.plan import Group, MicroBatch, Plan, PlanError, Wave
from .planners import PlannerOptions, make_plan as plan
from .runtime import ModelBuild, parallelize
from .vocabulary.model_shape import ModelShape, get_model_shape
from .train import TrainConfig, Trainer

__all__ = ["Cluster", "CostModel", "Group", "MicroBatch", "ModelBuild", "ModelShape", "Plan", "PlanError",
           "PlannerOptions", "TrainConfig", "Trainer", "Wave", "get_cluster", "get_cost_model",
           "get_model_shape", "parallelize", "plan"]
