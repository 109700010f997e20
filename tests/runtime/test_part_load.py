"""A rank reads only its part of a Hugging Face folder (`models.part_load`, `ModelBuild.part`):
the model built without weights (parameters on the meta device, RoPE's buffers made), cut to the
rank's stage, split to its TP shard, and only those tensors read from the safetensors files, each
TP shard as its block of the stored tensor. No rank builds the whole model (the test's whole
build raises), and what the ranks hold is the folder's model as transformers loads it, exactly
(the reads copy stored values; fp32 files, fp32 model).

On 4 gloo ranks: a tiny Llama (grouped-query attention, 4 layers) under TP 2 x PP 2, and one
with tied embedding and output weights under TP 2 over a pool of 2 (one shard read for both);
each also as a strategy executor's model of record, read a unit at a time into its canonical
shards (`StrategyExecutor(part=)`).
The exact gradients of models loaded so are `test_pipeline_runtime.py`'s and
`test_tensor_parallel.py`'s, whose `verify.train_distributed` gives `parallelize` the part load.
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from hf_folders import save_model

from ballast.models import build_model, part_load
from ballast.models.hf_weights import StoredWeights
from ballast.runtime import ModelBuild, parallelize, run_local
from ballast.runtime.strategy import StrategyExecutor
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import get_model_shape


def _never_whole(shape=None, weights: bool = True):
    """A build that may make the structure (what a strategy executor asks for its compute
    models, on the meta device) but never the whole model."""
    if weights:
        raise AssertionError("a rank built the whole model")
    return build_model(shape, weights=False)


CASES = {"gqa-tp-pp": ("gqa", 2, 2, False), "tied-tp": ("tied", 2, 1, False), "gqa-fsdp": ("gqa", 1, 1, True),
         "tied-tp-fsdp": ("tied", 2, 1, True)}
"""Case -> (folder, TP, PP, FSDP2 over the pool)."""


def _worker(sources: dict[str, str]) -> dict | None:
    torch.set_num_threads(1)
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    reads: list[tuple[str, tuple[int, ...]]] = []
    read = StoredWeights.read

    def recorded(self, key, dtype, block=None):
        value = read(self, key, dtype, block)
        reads.append((key, tuple(value.shape)))
        return value

    StoredWeights.read = recorded
    out = {}
    for case, (folder, tp, pp, fsdp) in CASES.items():
        shape = get_model_shape(sources[folder])
        reads.clear()
        build = ModelBuild(shape, _never_whole, part_load(shape))
        executor = parallelize(build, cluster, mesh=JobMesh.of(cluster, tp=tp, pp=pp, shape=shape), fsdp=fsdp, lr=1e-3)
        out[f"{case}-reads"] = list(reads)
        out[case] = executor.state_on_host()
        out[f"{case}-buffers"] = {n: b.clone() for n, b in executor.model.named_buffers()}
    for folder, source in sources.items():
        # A strategy executor's model of record, read a unit at a time into the canonical shards.
        shape = get_model_shape(source)
        record = StrategyExecutor(functools.partial(_never_whole, shape), cluster, part=part_load(shape), lr=1e-3)
        out[f"{folder}-strategy"] = record.state_on_host()
    return out if dist.get_rank() == 0 else None


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("hf")
    return {"gqa": "hf:" + str(save_model(root / "gqa", "LlamaConfig", num_key_value_heads=2, num_hidden_layers=4)),
            "tied": "hf:" + str(save_model(root / "tied", "LlamaConfig", tie_word_embeddings=True))}


@pytest.mark.slow
def test_ranks_read_their_parts_and_hold_the_folders_model(folders):
    got = run_local(4, _worker, folders, timeout=300)[0]
    wanted = {}
    for folder, source in folders.items():
        loaded = build_model(get_model_shape(source))
        wanted[folder] = (loaded.state_dict(), dict(loaded.named_buffers()))
        if folder == "tied":  # one tensor under two names: the export names it once
            assert loaded.hf.lm_head.weight is loaded.hf.model.embed_tokens.weight
            wanted[folder][0].pop("hf.lm_head.weight")
    for case, (folder, tp, _, fsdp) in CASES.items():
        want, buffers = wanted[folder]
        assert set(got[case]) == set(want), (case, set(got[case]) ^ set(want))
        assert all(torch.equal(got[case][k], want[k]) for k in want), case
        # RoPE's buffers, made on the host and kept through the move to the device.
        assert got[f"{case}-buffers"] and all(torch.equal(b, buffers[n]) for n, b in got[f"{case}-buffers"].items())
        # Rank 0 read only its block of the embedding: a 1 / t share of its rows under TP (the
        # vocabulary split), and of that its pool's share under FSDP2 (dim 0 over the pool).
        pool = 4 // tp
        rows = [shape[0] for key, shape in got[f"{case}-reads"] if key == "model.embed_tokens.weight"]
        assert rows == [256 // tp // (pool if fsdp else 1)], (case, rows)
    for folder, (want, _) in wanted.items():
        state = got[f"{folder}-strategy"]
        assert set(state) == set(want) and all(torch.equal(state[k], want[k]) for k in want), folder


def test_a_folder_without_weights_or_a_part_it_cannot_fill_is_told(tmp_path):
    folder = save_model(tmp_path / "llama", "LlamaConfig")
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text((folder / "config.json").read_text())
    assert part_load(get_model_shape(f"hf:{tmp_path / 'config-only'}")) is None  # a random init: built whole
    assert part_load(get_model_shape("tiny")) is None
    part = part_load(get_model_shape(f"hf:{folder}"))
    model = part.skeleton()
    assert all(p.is_meta for p in model.parameters()) and not any(b.is_meta for b in model.buffers())
    model.to_empty(device="cpu")
    # A shard named along the wrong dimension reads a block of another shape than the part's.
    with pytest.raises(ValueError, match=r"q_proj.weight holds \[64, 32\] where this part of the model has \[64, 64\]"):
        part.fill(model, lambda name, _: (slice(None), slice(0, 32)) if name.endswith("q_proj.weight") else None)
    model.hf.lm_head.register_parameter("extra", torch.nn.Parameter(torch.zeros(2)))
    with pytest.raises(ValueError, match="its weights hold no 'lm_head.extra'"):
        part.fill(model, lambda name, _: None)


def _offsets_worker() -> list[tuple[int, int, int]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from ballast.runtime.placement import shard_offset
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = []
    for rows in (1, 2, 5, 6, 7):  # fewer rows than ranks (empty shards), uneven, even
        whole = torch.arange(rows * 3, dtype=torch.float32).view(rows, 3)
        shard = distribute_tensor(whole, mesh, [Shard(0)])
        start = shard_offset(shard)[0]
        local = shard.to_local()
        # Where the rank's rows sit in the whole: its offset, and the rows there are its own.
        assert torch.equal(whole[start:start + local.shape[0]], local), (rows, start, local)
        out.append((rows, start, local.shape[0]))
    return out


@pytest.mark.slow
def test_a_shards_offset_is_where_fsdp2s_chunk_starts():
    # FSDP2's Shard(0) over 3 ranks: torch.chunk's blocks of ceil(rows / 3), the last ones shorter
    # or empty (an empty shard starts at the end).
    offsets = run_local(3, _offsets_worker, timeout=120)
    assert [row[1:] for row in offsets[2]] == [(1, 0), (2, 0), (4, 1), (4, 2), (6, 1)]
    assert [row[1:] for row in offsets[0]] == [(0, 1), (0, 1), (0, 2), (0, 2), (0, 3)]
