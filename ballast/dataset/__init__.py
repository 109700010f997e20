"""Every batch ballast plans comes from here: corpora for training, length sources for planning.

Training (`ballast train`, `bench`): text corpora to token files to seeded global batches.

    corpus = build_corpus("jsonl:data/", tokenizer="tokenizer.json")   # tokenised once, cached
    check_vocab(corpus.vocab_size, shape.vocab, shape.name)
    stream = BatchStream(corpus, tokens_per_step=65536, max_len=8192, seed=0)
    batch = stream.next_batch()        # batch.lengths -> planner, batch.samples -> runtime
    checkpoint["data"] = stream.state_dict()

sources.py says which files a source spec reads and how malformed input is reported
(hf_datasets.py: the `hf-dataset:PATH` source, read through Hugging Face `datasets`), cache.py how the token cache is keyed and written, stream.py how documents become samples,
sample ids and batches.

Planning without training (`ballast simulate`, the benchmarks): lengths only.

    stream = LengthStream(get_length_source("wikipedia"), BatchSpec(batch=512), seed=0)
    lengths = stream.next_batch()      # -> planner

lengths.py holds the sources (the shipped wikipedia histogram among them), length_stream.py
how their draws become batches.

Video diffusion training (`--data video-synthetic[:SEED[:PATH]]` or `video-latents:PATH`): whole
latent clips, batched like text (video.py; the content in video_synthetic.py, video_latents.py).

    if is_video_data(spec):
        stream = open_clip_stream(spec, shape.video_geometry, tokens_per_step=8192, max_len=2048, seed=0)
        batch = stream.next_batch()    # batch.planned (clip shapes) -> planner, batch.samples (Clips) -> model
"""
from .build import build_corpus
from .corpus import TokenCorpus
from .length_stream import BatchSpec, LengthStream
from .length_source import LengthSource
from .lengths import LENGTH_SYNTAX, get_length_source
from .sources import SYNTAX
from .stream import BatchStream, EpochStream, GlobalBatch
from .tokenizer import ByteTokenizer, HFTokenizer, check_vocab, load_tokenizer
from .video import (VIDEO_DATA_SYNTAX, ClipStream, check_data_kind, clip_key, is_video_data, open_clip_dataset,
                    open_clip_stream)

__all__ = ["LENGTH_SYNTAX", "SYNTAX", "VIDEO_DATA_SYNTAX", "BatchSpec", "BatchStream", "ByteTokenizer",
           "ClipStream", "EpochStream", "GlobalBatch", "HFTokenizer", "LengthSource", "LengthStream", "TokenCorpus",
           "build_corpus",
           "check_data_kind", "check_vocab", "clip_key", "get_length_source", "is_video_data", "load_tokenizer", "open_clip_dataset",
           "open_clip_stream"]
