"""Shared fixtures: a small CPU cluster and the tiny model's cost on it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import settings

from ballast.runtime.world import preload
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import get_model_shape

# No per-example deadline: it would make every property test a timed test, and on a shared
# 2-core host a first call that loads a kernel (~1 s for the CPU flash kernel) or another job's
# burst exceeds Hypothesis's 200 ms with nothing wrong. Speed is measured in bench/.
settings.register_profile("ballast", deadline=None)
settings.load_profile("ballast")

# The suite's jobs of Hugging Face and diffusers models would each import the library on every
# rank (transformers' modeling_utils ~4 s of CPU, diffusers' Wan ~3 s more): its fork server,
# started by its first job, imports them once.
preload("ballast.models.hf", "transformers.modeling_utils", "transformers.models.llama.modeling_llama",
        "transformers.models.qwen2.modeling_qwen2", "transformers.models.mistral.modeling_mistral",
        "ballast.models.diffusers_wan", "diffusers.models.transformers.transformer_wan")


@pytest.fixture
def cpu4():
    """4 gloo ranks in one node, 1 GB per device."""
    return get_cluster("cpu", world_size=4, device_memory_gb=1.0)


@pytest.fixture
def tiny4(cpu4):
    """The tiny model (8 heads, 4 kv heads) on `cpu4`: degrees 1, 2, 4; ~26.1K tokens per device
    without recomputation (replicated: 12.9 MB of states, 37,888 B a token with the loss's)."""
    return analytic_cost(get_model_shape("tiny"), cpu4)


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for a module: single-process references share two cores with the
    ranks and other tests, and OpenMP threads spin-waiting for a busy core made tiny ops 50x
    slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
