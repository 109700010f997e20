"""Video clip sources (`video`, `videos:PATH`): pixels to latent patches, clip lists, and
clips through the length stream (ballast/dataset/clip_sources.py, ballast/samples.py)."""
from __future__ import annotations

import numpy as np
import pytest

from ballast.dataset.clip_sources import VIDEO_FRAMES, VIDEO_RESOLUTIONS
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import get_length_source
from ballast.vocabulary.model_shape import OPEN_SORA_VIDEO, WAN_VIDEO, get_model_shape
from ballast.vocabulary.samples import split_sample, tokens


def test_open_sora_geometry():
    # 17 pixel frames -> 5 latent frames (Open-Sora 1.2's VAE), 8x space, 2x2 patches: 16 pixels
    assert OPEN_SORA_VIDEO.latent_patches(204, 1080, 1920) == (60, 68, 120)
    assert OPEN_SORA_VIDEO.latent_patches(17, 144, 256) == (5, 9, 16)
    assert OPEN_SORA_VIDEO.latent_patches(1, 100, 100) == (1, 7, 7)      # an image: one latent frame


def test_wan_geometry():
    # Wan 2.1's causal VAE: 1 + (F - 1) / 4 latent frames; 480p x 81 frames is its 32760 tokens
    assert WAN_VIDEO.latent_patches(81, 480, 832) == (21, 30, 52)
    assert tokens(WAN_VIDEO.latent_patches(81, 480, 832)) == 32760
    assert WAN_VIDEO.latent_patches(1, 480, 832)[0] == 1
    assert WAN_VIDEO.latent_patches(82, 480, 832)[0] == 22                 # a partial group of 4 rounds up
    assert get_model_shape("wan-14b").video_geometry == WAN_VIDEO
    assert get_model_shape("gpt-7b").video_geometry == OPEN_SORA_VIDEO      # text models: the default


def test_video_source_is_dcp_buckets_in_the_models_patches():
    source = get_length_source("video")
    n = len(VIDEO_RESOLUTIONS) * len(VIDEO_FRAMES)
    assert source.shapes.shape == (n, 3)
    counts = source.shapes.prod(axis=1)
    assert counts.max() == 60 * 68 * 120 and (np.diff(counts) >= 0).all() and (np.diff(source.p) < 0).all()
    wan = get_length_source("video", WAN_VIDEO)
    assert wan.shapes.prod(axis=1).max() == 52 * 68 * 120                 # 204 frames: 1 + 51 latent
    draws = source.sample(np.random.default_rng(0), 1000)
    assert draws.shape == (1000, 3) and draws.min() >= 1


def test_clip_list(tmp_path):
    path = tmp_path / "clips.txt"
    path.write_text("# frames height width\n81 480 832\n\n  17 720 1280 \n1 256 256\n")
    source = get_length_source(f"videos:{path}", WAN_VIDEO)
    assert source.shapes.tolist() == [[21, 30, 52], [5, 45, 80], [1, 16, 16]]
    assert source.name == f"videos:{path}"


@pytest.mark.parametrize("text,line", [("81 480\n", 1), ("81 480 832\n0 480 832\n", 2), ("81 480 832 3\n", 1),
                                       ("1 2 x\n", 1), ("8.5 480 832\n", 1), ("\n\n-1 2 3\n", 3)])
def test_clip_list_names_the_bad_line(tmp_path, text, line):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"videos:{path} line {line}: expected `frames height width`"):
        get_length_source(f"videos:{path}")


def test_clip_list_empty_or_missing(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="no clips in file"):
        get_length_source(f"videos:{path}")
    with pytest.raises(ValueError, match="cannot read clip list"):
        get_length_source(f"videos:{tmp_path / 'none.txt'}")


def test_split_clips_into_whole_frames():
    assert split_sample(1000, 300) == [300, 300, 300, 100]
    assert split_sample((10, 4, 5), 45) == [(2, 4, 5)] * 5                 # 45 tokens hold 2 frames of 20
    assert split_sample((7, 4, 5), 60) == [(3, 4, 5), (3, 4, 5), (1, 4, 5)]
    with pytest.raises(ValueError, match="4 x 5 patches per frame \\(20 tokens\\).*at least 20"):
        split_sample((3, 4, 5), 19)


def test_length_stream_cuts_clips_by_tokens():
    source = get_length_source("video")
    stream = LengthStream(source, BatchSpec(tokens_per_step=200_000, max_len=100_000), seed=0)
    for _ in range(5):
        batch = stream.next_batch()
        assert all(isinstance(x, tuple) and len(x) == 3 for x in batch)
        assert all(tokens(x) <= 100_000 for x in batch) and sum(map(tokens, batch)) <= 200_000
    assert stream.split_sequences > 0 and "split" in stream.report()
    # a budget in clips: 8 drawn clips per step, split ones kept together
    stream = LengthStream(source, BatchSpec(batch=8, max_len=100_000), seed=0)
    assert len(stream.next_batch()) >= 8
