"""Video training data: video-synthetic clips, video-latents folders and ClipStream batching."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors.torch import save_file

from ballast.vocabulary.clip import Clip
from ballast.dataset import (VIDEO_DATA_SYNTAX, ClipStream, clip_key, is_video_data, open_clip_dataset,
                             open_clip_stream)
from ballast.dataset.clip_sources import video_source
from ballast.dataset.clip_sources import scale_shapes
from ballast.dataset.video_synthetic import EPOCH_CLIPS, KINDS, synthetic_clip
from ballast.vocabulary.model_shape import OPEN_SORA_VIDEO, WAN_VIDEO, VideoGeometry

from epochs import one_epoch

GEOMETRY = OPEN_SORA_VIDEO  # 4 channels, 1x2x2 patches (stdit-tiny, dit-tiny)


def clip_list(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "clips.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class FakeClips:
    """A dataset of given patch shapes and zero latents, for the batching rule alone."""

    def __init__(self, shapes: list[tuple[int, int, int]]) -> None:
        self.name, self.fingerprint = "fake", f"fake-{shapes}"
        self.shapes = np.array(shapes, dtype=np.int64).reshape(-1, 3)

    def clip_name(self, sample_id: int) -> str:
        return f"fake clip {sample_id}"

    def content(self, sample_id: int) -> tuple[torch.Tensor, int]:
        f, h, w = self.shapes[sample_id].tolist()
        return torch.zeros(4, f, 2 * h, 2 * w), 0

    def describe(self) -> str:
        return "fake"


# --- video-synthetic -------------------------------------------------------------------------

def test_synthetic_content_is_a_function_of_seed_and_id():
    a, label_a = synthetic_clip(3, 17, 4, 5, 12, 20)
    b, label_b = synthetic_clip(3, 17, 4, 5, 12, 20)
    assert a.dtype == np.float32 and a.shape == (4, 5, 12, 20)
    assert np.array_equal(a, b) and label_a == label_b and 0 <= label_a < len(KINDS) < 16
    assert not np.allclose(a, synthetic_clip(3, 18, 4, 5, 12, 20)[0])
    assert not np.allclose(a, synthetic_clip(4, 17, 4, 5, 12, 20)[0])
    assert np.isfinite(a).all() and 0.2 < a.std() < 3  # O(1), like scaled VAE latents
    assert not np.allclose(a[:, 0], a[:, -1])  # the shapes move
    # through the stream: the same id in two streams of other seeds and budgets, same content
    one = open_clip_stream("video-synthetic:3", GEOMETRY, 500, 256, seed=0)
    two = open_clip_stream("video-synthetic:3", GEOMETRY, 9000, 256, seed=1)
    x, y = one.sample_clip(42, epoch=0), two.sample_clip(42, epoch=5)
    assert torch.equal(x.latent, y.latent) and x.condition == y.condition and x.key != y.key


def test_labels_cover_the_kinds_and_fix_the_palette():
    labels = [synthetic_clip(0, i, 4, 1, 16, 16)[1] for i in range(200)]
    assert set(labels) == set(range(len(KINDS)))


@pytest.mark.parametrize("geometry", [OPEN_SORA_VIDEO, WAN_VIDEO])
@pytest.mark.parametrize("max_len", [1, 7, 100, 1000, 4096, 10**7])
def test_scaling_keeps_every_bucket_under_max_len(geometry, max_len):
    shapes = video_source(geometry).shapes
    scaled, factor = scale_shapes(shapes, max_len)
    tokens = scaled.prod(axis=1)
    assert scaled.min() >= 1 and tokens.max() <= max_len
    if tokens.max() == shapes.prod(axis=1).max():
        assert factor == 1.0 and np.array_equal(scaled, shapes)  # nothing to scale
    else:  # the factor is the largest that fits, and it is one factor for every side
        assert np.maximum(1, np.round(shapes * factor * 1.001)).prod(axis=1).max() > max_len
        assert np.array_equal(scaled, np.maximum(1, np.round(shapes * factor)))
    for i in range(len(shapes)):  # relative sizes kept: no bucket outgrows a larger one
        bigger = (shapes >= shapes[i]).all(axis=1)
        assert (scaled[bigger] >= scaled[i]).all()


def test_bucket_dataset_describes_its_scale():
    dataset = open_clip_dataset("video-synthetic:5", GEOMETRY, max_len=1024)
    assert len(dataset.shapes) == EPOCH_CLIPS and dataset.shapes.prod(axis=1).max() <= 1024
    assert f"x{dataset.factor:.4g} per side" in dataset.describe() and "100000" in dataset.describe()
    assert len({tuple(s) for s in dataset.shapes[:2000].tolist()}) > 5  # a mix of buckets
    again = open_clip_dataset("video-synthetic:5", GEOMETRY, max_len=1024)
    assert np.array_equal(dataset.shapes, again.shapes)


def test_batches_hold_clips_of_their_shapes():
    stream = open_clip_stream("video-synthetic", WAN_VIDEO, 2000, 512, seed=0)
    batch = stream.next_batch()
    assert batch.num_tokens <= 2000 and batch.planned == batch.shapes
    for clip, shape, tokens in zip(batch.samples, batch.shapes, batch.lengths):
        assert isinstance(clip, Clip) and clip.latent.dtype == torch.float32
        assert clip.latent.shape == (16, shape[0], 2 * shape[1], 2 * shape[2])  # Wan: 16 channels
        assert tokens == shape[0] * shape[1] * shape[2] <= 512


def test_clip_list_shapes_are_not_scaled(tmp_path):
    path = clip_list(tmp_path, ["# frames height width", "17 64 64", "", "34 128 96"])
    stream = open_clip_stream(f"video-synthetic:2:{path}", GEOMETRY, 100, 500, seed=0)
    assert stream.num_samples == 2
    assert stream.shapes.tolist() == [list(GEOMETRY.latent_patches(17, 64, 64)),
                                      list(GEOMETRY.latent_patches(34, 128, 96))]


def test_clip_list_with_a_clip_over_max_len_is_an_error_naming_it(tmp_path):
    path = clip_list(tmp_path, ["17 64 64", "# long", "102 1080 1920"])
    with pytest.raises(ValueError, match=rf"videos:{path} line 3 \(sample 1\): 30 x 68 x 120 latent "
                                         rf"patches = 244800 tokens, over max_len 4096"):
        open_clip_stream(f"video-synthetic:0:{path}", GEOMETRY, 8192, 4096, seed=0)


@pytest.mark.parametrize("spec,error", [
    ("video-synthetic:x", "SEED must be"), ("video-synthetic:-1", "SEED must be"),
    ("video-synthetic:1:", "empty clip list"), ("video-synthetic:1:/no/such/list", "cannot read"),
    ("video-latents:", "no folder"), ("video-latents:/no/such/folder", "no such folder"),
    ("stdlib", "not video data"),
])
def test_bad_specs(spec, error):
    with pytest.raises(ValueError, match=error):
        open_clip_stream(spec, GEOMETRY, 1000, 100, seed=0)


def test_is_video_data():
    assert all(is_video_data(s) for s in ("video-synthetic", "video-synthetic:3", "video-synthetic:3:a.txt",
                                          "video-latents:/data", "video-latents"))
    assert not any(is_video_data(s) for s in ("stdlib", "jsonl:x", "video", "videos:x", "tokens:video-latents"))
    assert "video-synthetic" in VIDEO_DATA_SYNTAX and "video-latents:PATH" in VIDEO_DATA_SYNTAX


# --- ClipStream: the batching rule, resumption and keys ------------------------------------------

@settings(max_examples=30)
@given(shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=20),
       budget=st.integers(1, 120), seed=st.integers(0, 2**32))
def test_epoch_properties(shapes, budget, seed):
    stream = ClipStream(FakeClips(shapes), GEOMETRY, budget, 64, seed)
    for epoch in range(2):
        batches = one_epoch(stream)
        ids = [i for b in batches for i in b.sample_ids]
        assert ids == stream.epoch_order(epoch).tolist()  # every id once, in the seeded order
        assert sorted(ids) == list(range(len(shapes)))
        for b, after in zip(batches, batches[1:] + [None]):
            assert b.num_tokens <= budget or len(b.sample_ids) == 1
            assert b.shapes == [shapes[i] for i in b.sample_ids]
            if after is not None:  # maximal: the next clip would not have fitted
                assert b.num_tokens + after.lengths[0] > budget


def test_resume_from_state_dict_gives_the_same_batches():
    stream = open_clip_stream("video-synthetic:1", GEOMETRY, 300, 64, seed=4)
    for _ in range(5):
        stream.next_batch()
    state = json.loads(json.dumps(stream.state_dict()))  # survives a JSON checkpoint
    expected = [stream.next_batch() for _ in range(6)]
    resumed = open_clip_stream("video-synthetic:1", GEOMETRY, 300, 64, seed=4)
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_batch()
        assert (got.sample_ids, got.lengths, got.shapes, got.epoch) == (
            want.sample_ids, want.lengths, want.shapes, want.epoch)
        for a, b in zip(got.samples, want.samples):
            assert torch.equal(a.latent, b.latent) and (a.condition, a.key) == (b.condition, b.key)


def test_resume_across_an_epoch_end_and_refusals(tmp_path):
    path = clip_list(tmp_path, ["17 32 32", "34 32 64", "17 64 64", "51 32 32", "17 16 16"])
    spec = f"video-synthetic:0:{path}"
    stream = open_clip_stream(spec, GEOMETRY, 100, 200, seed=2)
    stream.next_batch()
    state = stream.state_dict()
    expected = [stream.next_batch() for _ in range(8)]
    assert expected[0].epoch != expected[-1].epoch
    resumed = open_clip_stream(spec, GEOMETRY, 100, 200, seed=2)
    resumed.load_state_dict(state)
    assert [resumed.next_batch().sample_ids for _ in range(8)] == [b.sample_ids for b in expected]
    for other, error in ((open_clip_stream(spec, GEOMETRY, 200, 200, seed=3), "seed=2"),
                         (open_clip_stream("video-synthetic:1:" + path, GEOMETRY, 200, 200, seed=2), "data="),
                         (open_clip_stream(spec, GEOMETRY, 200, 300, seed=2), "max_len=200")):
        with pytest.raises(ValueError, match=error):
            other.load_state_dict(state)


def test_keys_depend_on_the_draw_not_the_plan(tmp_path):
    path = clip_list(tmp_path, ["17 64 64", "34 64 128", "17 128 128"])
    keys = {}
    for budget in (1, 10**6):  # other batches, same keys
        stream = open_clip_stream(f"video-synthetic:0:{path}", GEOMETRY, budget, 10**6, seed=7)
        seen = {}
        for _ in range(3):
            for b in one_epoch(stream):
                seen.update({(b.epoch, i): c.key for i, c in zip(b.sample_ids, b.samples)})
        keys[budget] = seen
    assert keys[1] == keys[10**6]
    for i in range(3):  # a clip seen in three epochs gets three keys
        assert len({keys[1][(e, i)] for e in range(3)}) == 3
    assert keys[1][(1, 2)] == clip_key(7, 1, 2) and 0 <= clip_key(7, 1, 2) < 2**63


# --- video-latents ------------------------------------------------------------------------------

def test_latent_folder_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.normal(size=(4, 2, 4, 6)).astype(np.float32))
    b = torch.from_numpy(rng.normal(size=(4, 1, 8, 2)).astype(np.float32))
    c = rng.normal(size=(4, 3, 2, 2))  # float64 .npy
    save_file({"latent": a.to(torch.bfloat16), "label": torch.tensor(5)}, tmp_path / "a.safetensors")
    save_file({"latent": b}, tmp_path / "b.safetensors")
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sub" / "c.npy", c)
    (tmp_path / "notes.txt").write_text("ignored")
    stream = open_clip_stream(f"video-latents:{tmp_path}", GEOMETRY, 10**4, 100, seed=0)
    assert stream.shapes.tolist() == [[2, 2, 3], [1, 4, 1], [3, 1, 1]]  # sorted paths = ids
    assert "3 clips (2 .safetensors, 1 .npy)" in stream.describe()
    clips = [stream.sample_clip(i, 0) for i in range(3)]
    assert torch.equal(clips[0].latent, a.to(torch.bfloat16).float()) and clips[0].condition == 5
    assert torch.equal(clips[1].latent, b) and clips[1].condition == 0
    assert clips[2].latent.dtype == torch.float32 and np.allclose(clips[2].latent.numpy(), c)
    batch = stream.next_batch()
    assert sorted(batch.sample_ids) == [0, 1, 2] and sorted(batch.lengths) == [3, 4, 12]


def test_latent_folder_with_captions(tmp_path):
    for i, tokens in enumerate((3, 7)):
        save_file({"latent": torch.ones(4, 1, 2, 2) * i, "caption": torch.full((tokens, 8), float(i))},
                  tmp_path / f"clip{i}.safetensors")
    dataset = open_clip_dataset(f"video-latents:{tmp_path}", GEOMETRY, 100)
    assert "caption embeddings of width 8" in dataset.describe()
    latent, caption = dataset.content(1)
    assert caption.shape == (7, 8) and caption.dtype == torch.float32 and float(caption[0, 0]) == 1.0


def test_a_caption_models_data_carries_captions_of_its_width(tmp_path):
    # Synthetic clips: the kind's caption, 2 + kind tokens, the same for every clip of a kind.
    labels = open_clip_dataset("video-synthetic:2", GEOMETRY, 100)
    captions = open_clip_dataset("video-synthetic:2", GEOMETRY, 100, caption_dim=16)
    assert "captions of width 16 per kind" in captions.describe() and captions.fingerprint != labels.fingerprint
    kinds = {}
    for i in range(12):
        latent, caption = captions.content(i)
        label = labels.content(i)[1]
        assert torch.equal(latent, labels.content(i)[0]) and caption.shape == (2 + label, 16)
        assert torch.equal(kinds.setdefault(label, caption), caption)
    assert len(kinds) > 1
    # A latent folder must carry the kind of condition the model reads.
    save_file({"latent": torch.zeros(4, 1, 2, 2), "caption": torch.zeros(3, 8)}, tmp_path / "a.safetensors")
    assert open_clip_dataset(f"video-latents:{tmp_path}", GEOMETRY, 100, caption_dim=8).caption_dim == 8
    for dim, error in ((16, "captions of width 8 .* conditioned on caption embeddings of width 16"),
                       (0, "captions of width 8 .* conditioned on class labels")):
        with pytest.raises(ValueError, match=error):
            open_clip_dataset(f"video-latents:{tmp_path}", GEOMETRY, 100, caption_dim=dim)


def test_clips_longer_than_the_models_positions_are_refused_up_front(tmp_path):
    np.save(tmp_path / "wide.npy", np.zeros((4, 1, 2, 70), dtype=np.float32))
    open_clip_stream(f"video-latents:{tmp_path}", GEOMETRY, 100, 40, seed=0)
    with pytest.raises(ValueError, match=r"wide.npy \(sample 0\): 1 x 1 x 35 latent patches, an axis over the "
                                         r"model's 32 \(the positions per axis of its RoPE table\)"):
        open_clip_stream(f"video-latents:{tmp_path}", GEOMETRY, 100, 40, seed=0, max_axis=32)


def malformed(tmp_path: Path, kind: str) -> Path:
    good = torch.zeros(4, 1, 2, 2)
    save_file({"latent": good}, tmp_path / "a_good.safetensors")
    path = tmp_path / ("b_bad.npy" if kind.startswith("npy") else "b_bad.safetensors")
    tensors = {
        "rank": {"latent": torch.zeros(4, 2, 2)}, "channels": {"latent": torch.zeros(3, 1, 2, 2)},
        "dtype": {"latent": torch.zeros(4, 1, 2, 2, dtype=torch.int32)},
        "odd": {"latent": torch.zeros(4, 1, 3, 2)}, "caption": {"latent": good, "caption": torch.zeros(8)},
        "label": {"latent": good, "label": torch.tensor([0.5])}, "name": {"x": good},
        "mixed": {"latent": good, "caption": torch.zeros(2, 8)},
    }
    if kind == "npy-dtype":
        np.save(path, np.zeros((4, 1, 2, 2), dtype=np.int64))
    elif kind == "npy-rank":
        np.save(path, np.zeros((4, 2, 2), dtype=np.float32))
    elif kind == "corrupt":
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    else:
        save_file(tensors[kind], path)
    return path


@pytest.mark.parametrize("kind,error", [
    ("rank", "not \\[channels, frames, height, width\\]"), ("channels", "3 channels, the model's VAE has 4"),
    ("dtype", "I32 is not floating"), ("odd", "not a whole number of 1 x 2 x 2 patches"),
    ("caption", "not a 2-D"), ("label", "label must be one integer"), ("name", "no tensor named `latent`"),
    ("mixed", "same kind of condition"), ("npy-dtype", "int64 is not floating"),
    ("npy-rank", "not \\[channels"), ("corrupt", "not a readable .safetensors"),
])
def test_malformed_latent_files_are_errors_naming_them(tmp_path, kind, error):
    path = malformed(tmp_path, kind)
    with pytest.raises(ValueError, match=error) as info:
        open_clip_stream(f"video-latents:{tmp_path}", GEOMETRY, 100, 100, seed=0)
    assert str(path) in str(info.value)


def test_latent_folder_errors_without_files_and_over_max_len(tmp_path):
    with pytest.raises(ValueError, match="no .safetensors or .npy files"):
        open_clip_stream(f"video-latents:{tmp_path}", GEOMETRY, 100, 100, seed=0)
    np.save(tmp_path / "big.npy", np.zeros((4, 3, 8, 8), dtype=np.float16))
    with pytest.raises(ValueError, match=rf"{tmp_path / 'big.npy'} \(sample 0\): 3 x 4 x 4 latent patches = "
                                         rf"48 tokens, over max_len 40"):
        open_clip_stream(f"video-latents:{tmp_path}", GEOMETRY, 100, 40, seed=0)


def test_a_geometry_with_a_temporal_patch(tmp_path):
    geometry = VideoGeometry(frames_in=4, frames_out=1, patch=(2, 2, 2), latent_channels=2)
    np.save(tmp_path / "a.npy", np.zeros((2, 3, 4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="not a whole number of 2 x 2 x 2 patches"):
        open_clip_dataset(f"video-latents:{tmp_path}", geometry, 100)
    stream = open_clip_stream("video-synthetic:0", geometry, 500, 100, seed=0)
    clip, shape = stream.sample_clip(0, 0), stream.shapes[0].tolist()
    assert clip.latent.shape == (2, 2 * shape[0], 2 * shape[1], 2 * shape[2])
