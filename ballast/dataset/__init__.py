"""The data pipeline of `ballast train`: text corpora to token files to seeded global batches.

    corpus = build_corpus("jsonl:data/", tokenizer="tokenizer.json")   # tokenised once, cached
    check_vocab(corpus.vocab_size, shape.vocab, shape.name)
    stream = BatchStream(corpus, tokens_per_step=65536, max_len=8192, seed=0)
    batch = stream.next_batch()        # batch.lengths -> planner, batch.tokens -> runtime
    checkpoint["data"] = stream.state_dict()

sources.py says which files a source spec reads and how malformed input is reported,
cache.py how the token cache is keyed and written, stream.py how documents become samples,
sample ids and batches.
"""
from .build import build_corpus
from .corpus import TokenCorpus
from .sources import SYNTAX
from .stream import Batch, BatchStream
from .tokenizer import ByteTokenizer, HFTokenizer, check_vocab, load_tokenizer

__all__ = ["SYNTAX", "Batch", "BatchStream", "ByteTokenizer", "HFTokenizer", "TokenCorpus",
           "build_corpus", "check_vocab", "load_tokenizer"]
