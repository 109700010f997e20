"""Length sources and batch sampling (ballast/dataset/lengths.py)."""
from __future__ import annotations

import importlib.resources
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import DiscreteSource, HistogramSource, ZipfSource, get_length_source

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(__file__).resolve().parents[3] / "shared"
WIKIPEDIA_TXT = SHARED / "data" / "lengths" / "wikipedia.txt"
QUANTILES = (0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 0.999, 0.9999)
BODY = [q for q in QUANTILES if q <= 0.99]
# Above 99% a sample's quantiles are too noisy to hold 2% (99.9% from 2M draws: ~1% sd), so
# the tail is checked on the exact quantile function of the distribution `sample` draws from.
TAIL = [q for q in QUANTILES if q > 0.99]


def shipped_histogram() -> dict:
    return json.loads((importlib.resources.files("ballast.dataset") / "wikipedia_hist.json")
                      .read_text())


def exact_quantile(source: HistogramSource, q: float) -> float:
    """Inverse CDF of HistogramSource's sampling law: bin by mass, log-uniform inside."""
    k = int(np.searchsorted(source.cdf, q))
    prev = source.cdf[k - 1] if k else 0.0
    lo, hi = source.lo[k], source.hi[k]
    return float(np.floor(lo * (hi / lo) ** ((q - prev) / (source.cdf[k] - prev))))


def assert_quantiles_close(got: dict[float, float], want: dict[float, float]) -> None:
    errors = {q: got[q] / want[q] - 1 for q in got}
    assert all(abs(e) <= 0.02 for e in errors.values()), errors


def check_histogram_against(want: dict[float, float], max_length: int) -> None:
    source = get_length_source("wikipedia")
    sample = source.sample(np.random.default_rng(0), 2_000_000)
    assert_quantiles_close(dict(zip(BODY, np.quantile(sample, BODY))), {q: want[q] for q in BODY})
    assert_quantiles_close({q: exact_quantile(source, q) for q in TAIL}, {q: want[q] for q in TAIL})
    assert_quantiles_close({1.0: float(source.hi[-1] - 1)}, {1.0: max_length})


def test_shipped_histogram_reproduces_its_recorded_quantiles():
    doc = shipped_histogram()
    check_histogram_against({float(q): v for q, v in doc["quantiles"].items()}, doc["max"])
    bins = np.array(doc["bins"])
    assert bins[:, 2].sum() == doc["count"] and (bins[:, 2] > 0).all()
    assert (bins[1:, 0] >= bins[:-1, 1]).all() and (bins[:, 1] > bins[:, 0]).all()
    assert (bins[:, 1] - bins[:, 0] <= np.maximum(1, np.round(bins[:, 0] * 0.01))).all()
    assert len(json.dumps(doc)) < 64_000


@pytest.mark.skipif(not WIKIPEDIA_TXT.exists(),
                    reason=f"raw lengths {WIKIPEDIA_TXT} not present (the project does not ship them)")
def test_histogram_matches_raw_wikipedia_file():
    raw = get_length_source(f"file:{WIKIPEDIA_TXT}").values
    check_histogram_against(dict(zip(QUANTILES, np.quantile(raw, QUANTILES))), int(raw.max()))
    spec = importlib.util.spec_from_file_location("make_hist", REPO / "tools" / "make_wikipedia_hist.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.histogram(raw) == shipped_histogram(), "rerun tools/make_wikipedia_hist.py"


@pytest.mark.parametrize("spec", ["wikipedia", "stdlib", "video", "lognormal:6,1.5",
                                  "lognormal:-3,0.1", "zipf:1.2,64,32768", "zipf:0,5,5"])
def test_sources_give_positive_int64_lengths_deterministically(spec):
    source = get_length_source(spec)
    a = source.sample(np.random.default_rng(7), 1000)
    # text sources draw lengths, clip sources (frames, height, width) rows
    assert a.dtype == np.int64 and a.shape == ((1000, 3) if spec == "video" else (1000,)) and (a >= 1).all()
    assert np.array_equal(a, source.sample(np.random.default_rng(7), 1000))


def test_lognormal_parameters():
    a = get_length_source("lognormal:8,0.5").sample(np.random.default_rng(0), 100_000)
    assert abs(np.log(a).mean() - 8) < 0.01 and abs(np.log(a).std() - 0.5) < 0.01


@pytest.mark.parametrize("alpha,lo,hi", [(2.0, 1, 10), (1.0, 3, 6), (0.5, 100, 110), (3.0, 1, 2)])
def test_zipf_is_exact(alpha, lo, hi):
    n = 400_000
    counts = np.bincount(ZipfSource(alpha, lo, hi).sample(np.random.default_rng(1), n) - lo)
    p = np.arange(lo, hi + 1) ** -alpha
    expected = n * p / p.sum()
    assert counts.size == hi - lo + 1
    assert (np.abs(counts - expected) < 5 * np.sqrt(expected) + 1).all()  # 5 sigma per value


@given(alpha=st.floats(0, 4), lo=st.integers(1, 10**6), width=st.integers(0, 10**6))
@settings(max_examples=50)
def test_zipf_stays_in_range(alpha, lo, width):
    a = ZipfSource(alpha, lo, lo + width).sample(np.random.default_rng(0), 200)
    assert (a >= lo).all() and (a <= lo + width).all()


def test_stdlib_is_cached_real_code():
    source = get_length_source("stdlib")
    assert source is get_length_source("stdlib")
    assert source.values.size > 100 and source.values.min() >= 1
    assert np.median(source.values) > 1000  # whole modules, in bytes


def test_file_source(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("5\n\n 12 \n7\n\n")
    source = get_length_source(f"file:{path}")
    assert source.values.tolist() == [5, 12, 7] and source.name == f"file:{path}"
    assert set(source.sample(np.random.default_rng(0), 100).tolist()) == {5, 7, 12}


@pytest.mark.parametrize("text,line", [("5\nabc\n", 2), ("1\n2\n0\n", 3), ("-4\n", 1),
                                       ("1.5\n", 1), ("3\n\n4 5\n", 3), ("7\n\u00b2\n", 2)])
def test_file_source_names_the_bad_line(tmp_path, text, line):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{path} line {line}: expected a positive integer"):
        get_length_source(f"file:{path}")


@pytest.mark.parametrize("text", ["", "\n \n"])
def test_file_source_empty(tmp_path, text):
    path = tmp_path / "empty.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match="no lengths in file"):
        get_length_source(f"file:{path}")


def test_file_source_missing(tmp_path):
    with pytest.raises(ValueError, match="cannot read length file"):
        get_length_source(f"file:{tmp_path / 'nope.txt'}")
    with pytest.raises(ValueError, match="cannot read length file"):
        get_length_source(f"file:{tmp_path}")


@pytest.mark.parametrize("spec,syntax", [
    ("lognormal:abc", "lognormal:MU,SIGMA"), ("lognormal:1", "lognormal:MU,SIGMA"),
    ("lognormal:1,2,3", "lognormal:MU,SIGMA"), ("lognormal:1,-1", "lognormal:MU,SIGMA"),
    ("lognormal:nan,1", "lognormal:MU,SIGMA"), ("lognormal", "lognormal:MU,SIGMA"),
    ("zipf:0.5", "zipf:ALPHA,MIN,MAX"), ("zipf:1,0,10", "zipf:ALPHA,MIN,MAX"),
    ("zipf:1,10,5", "zipf:ALPHA,MIN,MAX"), ("zipf:1,1.5,10", "zipf:ALPHA,MIN,MAX"),
    ("zipf:-1,1,10", "zipf:ALPHA,MIN,MAX"), ("zipf:a,b,c", "zipf:ALPHA,MIN,MAX"),
    ("zipf:1,,10", "zipf:ALPHA,MIN,MAX"), ("imagenet", "file:PATH"), ("", "file:PATH"),
    ("wikipedia:2", "file:PATH"), ("video:", "file:PATH"), ("file:", "file:PATH"),
])
def test_malformed_specs_state_the_syntax(spec, syntax):
    with pytest.raises(ValueError, match=syntax):
        get_length_source(spec)


@pytest.mark.parametrize("kwargs,match", [
    ({}, "exactly one"), ({"batch": 4, "tokens_per_step": 100}, "exactly one"),
    ({"batch": 0}, "batch must be a positive integer"),
    ({"tokens_per_step": -5}, "tokens_per_step must be"), ({"batch": 2.5}, "batch must be"),
    ({"batch": 4, "max_len": 0}, "max_len must be"),
    ({"batch": True}, "batch must be"),
    ({"batch": 4, "overlong": "truncate"}, "overlong must be"),
])
def test_batch_spec_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BatchSpec(**kwargs)


FIXED = DiscreteSource("fixed", np.array([10, 25]))  # 25 is overlong at max_len=10


def test_batch_counts_documents_and_split_chunks_stay_in_step():
    sampler = LengthStream(FIXED, BatchSpec(batch=8, max_len=10), seed=3)
    for batch in (next(sampler) for _ in range(20)):
        documents = len(batch) - 2 * batch.count(5)  # a 25 becomes [10, 10, 5]
        assert documents == 8 and max(batch) <= 10
    assert sampler.drawn_sequences == 160
    assert sampler.split_chunks == 3 * sampler.split_sequences > 0
    assert sampler.split_tokens == 25 * sampler.split_sequences
    assert sampler.report() == (
        f"split {sampler.split_sequences} sequences longer than 10 tokens into "
        f"{sampler.split_chunks} chunks ({sampler.split_tokens} tokens, "
        f"{100 * sampler.split_tokens / sampler.drawn_tokens:.2f}% of {sampler.drawn_tokens} drawn)")


def test_drop_filters_and_counts():
    sampler = LengthStream(FIXED, BatchSpec(batch=8, max_len=10, overlong="drop"), seed=3)
    batches = [sampler.next_batch() for _ in range(20)]
    assert all(b == [10] * 8 for b in batches)
    assert sampler.dropped_sequences == sampler.drawn_sequences - 160 > 0
    assert sampler.dropped_tokens == 25 * sampler.dropped_sequences
    assert sampler.report().startswith(f"dropped {sampler.dropped_sequences} sequences longer than 10")


def test_drop_everything_is_an_error():
    sampler = LengthStream(FIXED, BatchSpec(batch=1, max_len=9, overlong="drop"), seed=0)
    with pytest.raises(ValueError, match="draws in a row were longer than max_len=9"):
        sampler.next_batch()


def test_error_names_length_and_limit():
    sampler = LengthStream(FIXED, BatchSpec(batch=64, max_len=10, overlong="error"), seed=0)
    with pytest.raises(ValueError, match="sequence of 25 tokens is longer than max_len=10"):
        sampler.next_batch()
    fine = LengthStream(FIXED, BatchSpec(batch=4, max_len=25, overlong="error"), seed=0)
    fine.next_batch()
    assert fine.report() == "no sequence longer than 25 tokens among 4 sequences drawn"


def test_same_seed_same_batches():
    source = get_length_source("wikipedia")
    for spec in (BatchSpec(batch=64, max_len=8192), BatchSpec(tokens_per_step=65536, max_len=8192)):
        runs = [[LengthStream(source, spec, seed).next_batch() for _ in range(30)]
                for seed in (11, 11, 12)]
        assert runs[0] == runs[1] != runs[2]


def test_token_budget_takes_longest_prefix():
    budget = 100_000
    sampler = LengthStream(get_length_source("wikipedia"),
                           BatchSpec(tokens_per_step=budget, max_len=32768), seed=5)
    batches = [sampler.next_batch() for _ in range(200)]
    for batch, following in zip(batches, batches[1:]):
        assert sum(batch) <= budget < sum(batch) + following[0]
    assert sampler.split_sequences > 0  # the budget held across split documents too


def test_budget_below_max_len_still_makes_progress():
    sampler = LengthStream(FIXED, BatchSpec(tokens_per_step=5, max_len=100), seed=0)
    assert all(len(sampler.next_batch()) == 1 for _ in range(10))


@st.composite
def sampler_setups(draw):
    values = draw(st.lists(st.integers(1, 5000), min_size=1, max_size=8))
    # at least 2, as every command's --max-len: 5000 tokens then split into fewer chunks than
    # LengthStream.MAX_SPLIT_CHUNKS allows
    max_len = draw(st.integers(2, 3000))
    by_tokens = draw(st.booleans())
    size = draw(st.integers(1, 6000) if by_tokens else st.integers(1, 20))
    spec = BatchSpec(tokens_per_step=size, max_len=max_len) if by_tokens else \
        BatchSpec(batch=size, max_len=max_len)
    return DiscreteSource("h", np.array(values)), spec, draw(st.integers(0, 2**32))


@given(sampler_setups())
@settings(max_examples=100)
def test_split_keeps_lengths_in_range_and_conserves_tokens(setup):
    source, spec, seed = setup
    sampler = LengthStream(source, spec, seed)
    batches = [sampler.next_batch() for _ in range(5)]
    flat = [s for b in batches for s in b]
    assert flat and all(1 <= s <= spec.max_len for s in flat)
    if spec.batch is not None:
        assert sampler.drawn_sequences == 5 * spec.batch
        assert sum(flat) == sampler.drawn_tokens  # split loses nothing
    else:
        # Only chunks of the last document drawn may wait for the next step.
        assert 0 <= sampler.drawn_tokens - sum(flat) <= source.values.max()
        assert all(sum(b) <= spec.tokens_per_step or len(b) == 1 for b in batches)
