"""Data pipeline: samples, ids, seeded order, token budget and resumption of BatchStream."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ballast.dataset import BatchStream, TokenCorpus, build_corpus

from epochs import one_epoch


def token_corpus(lengths: list[int], seed: int = 0) -> TokenCorpus:
    """Documents of the given lengths with random ids, as the `tokens:` source would open."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.random.default_rng(seed).integers(0, 256, int(offsets[-1])).astype(np.uint16)
    return TokenCorpus("test", tokens, offsets, 256, "bytes", "bytes", f"test-{lengths}", "", False)


LENGTHS = [1, 2, 3, 10, 50, 0, 7, 130, 5, 64, 65, 33, 2, 200, 9, 17]  # 0 and 1: no sample


def test_chunks_cover_every_document_exactly():
    corpus = token_corpus(LENGTHS)
    stream = BatchStream(corpus, tokens_per_step=100, max_len=32, seed=0)
    ids = np.arange(stream.num_samples)
    docs, chunks = stream.locate(ids)
    lengths = stream.sample_lengths(ids)
    assert lengths.min() >= 1 and lengths.max() <= 32
    for d, n in enumerate(LENGTHS):
        mine = ids[docs == d]
        assert mine.size == max(0, -(-(n - 1) // 32))  # ceil((n - 1) / max_len) samples
        assert lengths[mine].sum() == max(n - 1, 0)  # every next-token prediction, once
        assert chunks[mine].tolist() == list(range(mine.size))
        if mine.size:  # chunks overlap by one token: dropping it rebuilds the document
            parts = [stream.sample_tokens(int(i)) for i in mine]
            rebuilt = np.concatenate([parts[0]] + [p[1:] for p in parts[1:]])
            assert np.array_equal(rebuilt, corpus.document(d))


def test_batches_fit_the_budget_and_are_maximal():
    stream = BatchStream(token_corpus(LENGTHS), tokens_per_step=70, max_len=64, seed=1)
    batches = one_epoch(stream)
    for b, after in zip(batches, batches[1:] + [None]):
        assert b.num_tokens <= 70 or len(b.lengths) == 1
        assert [t.numel() for t in b.samples] == [s + 1 for s in b.lengths]
        assert all(t.dtype == torch.int64 for t in b.samples)
        assert b.lengths == stream.sample_lengths(b.sample_ids).tolist()
        if after is not None:  # the next sample would not have fitted
            assert b.num_tokens + after.lengths[0] > 70


def test_a_sample_longer_than_the_budget_is_a_batch_alone():
    stream = BatchStream(token_corpus([500, 3]), tokens_per_step=10, max_len=400, seed=0)
    sizes = sorted(b.lengths for b in one_epoch(stream))
    assert sizes == [[2], [99], [400]]


def test_every_sample_once_per_epoch_new_order_each_epoch():
    stream = BatchStream(token_corpus(LENGTHS), tokens_per_step=90, max_len=16, seed=3)
    orders = []
    for epoch in range(3):
        ids = [i for b in one_epoch(stream) for i in b.sample_ids]
        assert sorted(ids) == list(range(stream.num_samples))
        assert ids == stream.epoch_order(epoch).tolist()
        orders.append(ids)
        docs = stream.locate(ids)[0]  # chunks of documents are mixed, not back to back
        assert sum(d != e for d, e in zip(docs, docs[1:])) > len(set(docs.tolist())) - 1
    assert orders[0] != orders[1] != orders[2]


def test_same_seed_same_batches_other_seed_other_order():
    corpus = token_corpus(LENGTHS)
    def ids(seed: int) -> list[list[int]]:
        stream = BatchStream(corpus, tokens_per_step=60, max_len=32, seed=seed)
        return [stream.next_batch().sample_ids for _ in range(12)]
    assert ids(7) == ids(7)
    assert ids(7) != ids(8)


def test_resume_from_state_dict_gives_the_same_batches():
    corpus = token_corpus(LENGTHS)
    stream = BatchStream(corpus, tokens_per_step=80, max_len=32, seed=5)
    for _ in range(7):
        stream.next_batch()
    state = json.loads(json.dumps(stream.state_dict()))  # survives a JSON checkpoint
    expected = [stream.next_batch() for _ in range(15)]  # crosses an epoch boundary
    assert expected[0].epoch != expected[-1].epoch
    resumed = BatchStream(corpus, tokens_per_step=80, max_len=32, seed=5)
    resumed.load_state_dict(state)
    for want, got in zip(expected, (resumed.next_batch() for _ in range(15))):
        assert (got.sample_ids, got.lengths, got.epoch) == (want.sample_ids, want.lengths,
                                                             want.epoch)
        assert all(torch.equal(a, b) for a, b in zip(got.samples, want.samples))


@pytest.mark.parametrize("change,error", [
    ({"seed": 6}, "seed=6"), ({"max_len": 16}, "max_len=16"), ({"corpus": "other"}, "corpus"),
    ({"position": 10**6}, "invalid position"), ({"epoch": -1}, "invalid position"),
])
def test_state_from_another_stream_is_refused(change, error):
    stream = BatchStream(token_corpus(LENGTHS), tokens_per_step=80, max_len=32, seed=5)
    with pytest.raises(ValueError, match=error):
        stream.load_state_dict(stream.state_dict() | change)


@pytest.mark.parametrize("kwargs", [{"tokens_per_step": 0}, {"max_len": -1}, {"seed": -1},
                                    {"max_len": 2.5}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        args = {"tokens_per_step": 8, "max_len": 4, "seed": 0} | kwargs
        BatchStream(token_corpus(LENGTHS), **args)
    with pytest.raises(ValueError, match="no document has the 2 tokens"):
        BatchStream(token_corpus([1, 0, 1]), tokens_per_step=8, max_len=4, seed=0)


@settings(max_examples=40)
@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=12).filter(lambda x: max(x) > 1),
       budget=st.integers(1, 400), max_len=st.integers(1, 128), seed=st.integers(0, 2**32))
def test_epoch_properties(lengths, budget, max_len, seed):
    stream = BatchStream(token_corpus(lengths), tokens_per_step=budget, max_len=max_len, seed=seed)
    batches = one_epoch(stream)
    ids = [i for b in batches for i in b.sample_ids]
    assert sorted(ids) == list(range(stream.num_samples))
    assert sum(b.num_tokens for b in batches) == sum(max(n - 1, 0) for n in lengths)
    assert all(b.num_tokens <= budget or len(b.lengths) == 1 for b in batches)
    assert max(max(b.lengths) for b in batches) <= max_len


def test_stdlib_end_to_end(tmp_path: Path):
    corpus = build_corpus("stdlib", cache_dir=str(tmp_path), progress=False)
    stream = BatchStream(corpus, tokens_per_step=65536, max_len=8192, seed=0)
    batch = next(iter(stream))
    assert 65536 - 8192 < batch.num_tokens <= 65536
    assert max(batch.lengths) <= 8192
    text = bytes(batch.samples[0].to(torch.uint8).tolist()).decode("utf-8", errors="replace")
    assert text  # real source code, one token per byte
