"""`ballast train --model hf:PATH`: a tiny Hugging Face Llama trained on 2 gloo ranks.

What it checks: the tokenizer a run picks (the model folder's tokenizer.json, else bytes) and
the vocab errors, before any rank starts; `static` and `ballast` plans end at the same
parameters; the Hugging Face folder the run writes (`hf-model/`) loads with
`AutoModelForCausalLM.from_pretrained` and holds exactly the trained weights, replicated and
gathered from FSDP2 shards and from the canonical layout of a run under heterogeneous strategies;
resume is exact; `--data hf-dataset:PATH` trains.

Tolerances. Two planners' plans sum the same per-token losses in another order, so their
losses agree up to float rounding (LOSS_RTOL, as tests/train/test_run.py), and their final
parameters up to the rounding AdamW then turns into update differences: compared as the drift
||p_a - p_b|| / ||p_b - p_0|| relative to how far training moved them, with `ballast verify`'s
tolerance (PARAM_TOLERANCE = 1e-3; see ballast/verify/command.py: rounding gives ~3e-5 on the
tiny GPT, a lost or doubled micro-batch ~0.1); measured here: losses 9e-8 apart, drift 5e-7.
A resumed run and the exported folder are exact (DCP and safetensors store the raw tensors).
The exported model's logits equal the wrapper's up to the attention kernels' rounding
(transformers' sdpa on each sequence alone against ballast's varlen attention on the packed
stream): LOGITS_ATOL, measured 3e-7 on logits up to 1.2.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from corpora import jsonl_corpus
from train_runs import run_config, text_memory_gb

import ballast
import ballast.runtime
from ballast.cli import main
from ballast.vocabulary.model_shape import get_model_shape
from ballast.runtime import run_local
from ballast.train.config import TrainConfig
from ballast.train.hf_folder import HF_MODEL_DIR, resolve_tokenizer
from ballast.train.metrics import final_history
from ballast.verify import PARAM_TOLERANCE

MAX_LEN = 256
BUDGET = 1024
STEPS = 5
LOSS_RTOL = 1e-5
LOGITS_ATOL = 1e-5
STRATEGIES = "1x1,1x1;2x1"  # two one-rank pipelines, or TP 2 over both ranks


def llama_folder(path: Path, vocab: int = 256, tokenizer_words: list[str] | None = None) -> Path:
    """A tiny Llama's folder (config only: ballast initialises it from the seed), with a
    tokenizer.json trained on `tokenizer_words` when given."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                tie_word_embeddings=False, architectures=["LlamaForCausalLM"]).save_pretrained(path)
    if tokenizer_words is not None:
        word_tokenizer(path / "tokenizer.json", tokenizer_words)
    return path


def word_tokenizer(path: Path, words: list[str]) -> Path:
    """A WordLevel tokenizer trained on `words` (its vocab: [UNK] and each distinct word)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(path))
    return path


def config(model: str, corpus: tuple[str, str], out: Path, steps: int, planner: str = "ballast",
           **optimizer) -> TrainConfig:
    return run_config(out, steps, model=model, source=corpus[0], cache_dir=corpus[1], max_len=MAX_LEN,
                      tokens_per_step=BUDGET, device_memory_gb=text_memory_gb(model, MAX_LEN), planner=planner,
                      decay_steps=STEPS, **optimizer)


# --- the tokenizer, checked before any rank starts (no ranks: not slow) ---

@pytest.fixture
def no_spawn(monkeypatch):
    """The checks must fail before `Trainer` spawns ranks: spawning fails the test."""
    def spawn(*args, **kwargs):
        raise AssertionError("ranks were spawned")
    monkeypatch.setattr(ballast.runtime, "run_local", spawn)


def test_tokenizer_is_the_model_folders_else_bytes(tmp_path):
    with_tok = llama_folder(tmp_path / "with", tokenizer_words=["a", "b"])
    without = llama_folder(tmp_path / "without")
    assert resolve_tokenizer(None, get_model_shape(f"hf:{with_tok}")) == str(with_tok / "tokenizer.json")
    assert resolve_tokenizer(None, get_model_shape(f"hf:{without}")) == "bytes"
    assert resolve_tokenizer("bytes", get_model_shape(f"hf:{with_tok}")) == "bytes"  # --tokenizer wins
    assert resolve_tokenizer(None, get_model_shape("tiny")) == "bytes"


def test_tokenizer_larger_than_the_model_is_an_error_before_ranks_start(tmp_path, no_spawn):
    words = [f"w{i}" for i in range(299)]  # vocab 300 with [UNK]
    folder = llama_folder(tmp_path / "m", vocab=256, tokenizer_words=words)
    corpus = jsonl_corpus(tmp_path, documents=5, longest=100, seed=0)
    c = config(f"hf:{folder}", corpus, tmp_path / "out", 2)
    with pytest.raises(ValueError, match=rf"tokenizer {folder}/tokenizer.json \(the model folder's own\) has "
                                         rf"a vocab of 300 .*more than the model's vocab_size 256"):
        ballast.Trainer(c).fit()
    other = word_tokenizer(tmp_path / "other.json", words)
    c.data.tokenizer = str(other)
    with pytest.raises(ValueError, match=rf"tokenizer {other} has a vocab of 300 .*vocab_size 256"):
        ballast.Trainer(c).fit()


def test_byte_tokenizer_needs_a_vocab_of_256(tmp_path, no_spawn):
    folder = llama_folder(tmp_path / "m", vocab=100)
    c = config(f"hf:{folder}", jsonl_corpus(tmp_path, documents=5, longest=100, seed=0), tmp_path / "out", 2)
    with pytest.raises(ValueError, match=r"has no tokenizer.json, so it would train with ballast's byte-level "
                                         r"tokenizer \(vocab 256\).*vocab_size 100"):
        ballast.Trainer(c).fit()


# --- training on 2 ranks ---

def _train_all(configs: list[TrainConfig]) -> list[dict | None]:
    from ballast.train.loop import train

    return [train(c) for c in configs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One spawn of 2 ranks, the tiny Llama on a byte-level JSONL corpus: STEPS steps under
    static (SP degree 2) and under ballast; ballast for 3 steps then resumed to STEPS; FSDP2 for
    STEPS; ballast under STRATEGIES for STEPS; ballast under TP 2 and as 2 pipeline stages."""
    from ballast.dataset import build_corpus

    root = tmp_path_factory.mktemp("hf-runs")
    model = f"hf:{llama_folder(root / 'llama')}"
    corpus = jsonl_corpus(root, documents=60, longest=600, seed=0)
    build_corpus(corpus[0], cache_dir=corpus[1], progress=False)  # tokenise once, before the ranks
    outs = {name: root / name for name in ("static", "ballast", "split", "fsdp", "strategy", "tp", "pp")}
    static = config(model, corpus, outs["static"], STEPS, planner="static")
    static.planner.degree = 2  # as a Ulysses user fixes it; ballast plans degree 1 with recomputation here
    configs = [static, config(model, corpus, outs["ballast"], STEPS),
               config(model, corpus, outs["split"], 3), config(model, corpus, outs["split"], STEPS),
               config(model, corpus, outs["fsdp"], STEPS, fsdp=True),
               config(model, corpus, outs["strategy"], STEPS, strategy=STRATEGIES),
               config(model, corpus, outs["tp"], STEPS, tp=2), config(model, corpus, outs["pp"], STEPS, pp=2)]
    configs[-1].planner.defer_outliers = False  # the batches as drawn, as the runs it is compared with
    run_local(2, _train_all, configs, timeout=600)
    return {"model": model, **outs}


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in final_history(out / "metrics.jsonl")]


def exported(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / HF_MODEL_DIR / "model.safetensors")


def initial_weights(model: str) -> dict[str, torch.Tensor]:
    from ballast.models import build_model

    return {k.removeprefix("hf."): v for k, v in build_model(get_model_shape(model), 0).state_dict().items()}


def drift(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b - start|| over all parameters."""
    def flat(weights):
        return torch.cat([weights[k].reshape(-1) for k in sorted(start)])
    return float((flat(a) - flat(b)).norm() / (flat(b) - flat(start)).norm())


def from_checkpoint(model: str, out: Path) -> torch.nn.Module:
    """The wrapper (`HFCausalLM`) with the weights of the run's newest checkpoint, in this process."""
    import torch.distributed.checkpoint as dcp

    from ballast.models import build_model
    from ballast.train import checkpoint_files

    wrapper = build_model(get_model_shape(model), seed=1)  # other initial weights: all are loaded
    state = {"model": wrapper.state_dict()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        dcp.load(state, checkpoint_id=checkpoint_files.latest(out / "checkpoints"))
    wrapper.load_state_dict(state["model"])
    return wrapper


@pytest.mark.slow
def test_static_and_ballast_end_with_the_same_parameters(runs):
    static, ours = (final_history(runs[p] / "metrics.jsonl") for p in ("static", "ballast"))
    assert [r["sample_ids"] for r in static] == [r["sample_ids"] for r in ours] and len(ours) == STEPS
    layouts = [[(r["waves"], r["degrees"], r["micro_batches"], r["recomputed"]) for r in history]
               for history in (static, ours)]
    assert layouts[0] != layouts[1], "the planners made the same plans: the test would prove nothing"
    worst = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(static, ours))
    moved = drift(exported(runs["static"]), exported(runs["ballast"]), initial_weights(runs["model"]))
    print(f"static vs ballast, {STEPS} steps: loss {worst:.1e} relative, parameter drift {moved:.1e}")
    assert worst <= LOSS_RTOL and moved <= PARAM_TOLERANCE


@pytest.mark.slow
def test_exported_folder_loads_with_the_trained_weights_and_logits(runs):
    from transformers import AutoModelForCausalLM

    from ballast.models import PackedStream

    out = runs["ballast"]
    folder = out / HF_MODEL_DIR
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["hf_model"] == str(folder)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2
    note = json.loads((folder / "ballast.json").read_text())
    assert note["tokenizer"] == "bytes" and "UTF-8 bytes" in note["tokenizer_files"] and note["steps"] == STEPS
    assert not (folder / "tokenizer.json").exists()
    hf = AutoModelForCausalLM.from_pretrained(folder)
    trained = from_checkpoint(runs["model"], out)
    weights = {k.removeprefix("hf."): v for k, v in trained.state_dict().items()}
    loaded = hf.state_dict()
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], weights[k]) for k in weights), "the folder holds other weights"
    lengths = [40, 90]
    tokens = torch.randint(0, 256, (sum(lengths),), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        packed = trained(tokens, PackedStream.from_lengths(lengths))  # ballast's forward, one packed stream
        alone = torch.cat([hf(input_ids=seq[None]).logits[0] for seq in tokens.split(lengths)])
    error = float((packed - alone).abs().max())
    print(f"exported model's logits against the trained wrapper's: {error:.1e} "
          f"(logits up to {float(alone.abs().max()):.2g})")
    assert error <= LOGITS_ATOL


@pytest.mark.slow
def test_resume_of_an_hf_run_is_exact(runs):
    assert losses(runs["split"]) == losses(runs["ballast"])  # bit for bit
    assert len((runs["split"] / "metrics.jsonl").read_text().splitlines()) == STEPS
    whole, split = exported(runs["ballast"]), exported(runs["split"])
    assert all(torch.equal(split[k], whole[k]) for k in whole)


@pytest.mark.slow
def test_fsdp_gathers_the_whole_model_into_the_folder(runs):
    from transformers import AutoModelForCausalLM

    out = runs["fsdp"]
    trained = from_checkpoint(runs["model"], out)
    loaded = AutoModelForCausalLM.from_pretrained(out / HF_MODEL_DIR).state_dict()
    assert all(torch.equal(loaded[k.removeprefix("hf.")], v) for k, v in trained.state_dict().items())
    assert losses(out) == pytest.approx(losses(runs["ballast"]), rel=LOSS_RTOL)
    assert drift(exported(out), exported(runs["ballast"]), initial_weights(runs["model"])) <= PARAM_TOLERANCE


@pytest.mark.slow
def test_cli_trains_on_an_hf_dataset_with_the_models_tokenizer(tmp_path, capfd):
    """`--data hf-dataset:PATH` (a save_to_disk folder), the model folder's tokenizer.json picked
    without --tokenizer and copied into the exported folder."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    words = "the of and to data model rank plan wave group token sequence step loss".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(10 + 13 * i)) for i in range(40)]
    folder = llama_folder(tmp_path / "llama", tokenizer_words=words)
    Dataset.from_dict({"body": texts, "id": list(range(len(texts)))}).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "out"
    assert main(["train", "--model", f"hf:{folder}", "--data", f"hf-dataset:{tmp_path / 'ds'}",
                 "--text-field", "body", "--cache-dir", str(tmp_path / "cache"), "--world", "2",
                 "--steps", "3", "--max-len", "128", "--tokens-per-step", "512", "--out-dir", str(out),
                 "--warmup-steps", "1", "--timeout", "60", "--no-report"]) == 0
    printed = capfd.readouterr().out
    assert f"hf-dataset:{(tmp_path / 'ds').resolve()}: 40 documents" in printed
    assert f"vocab {len(words) + 1}" in printed and "trained 3 steps" in printed
    assert f"hf model    {out / HF_MODEL_DIR}" in printed
    export = out / HF_MODEL_DIR
    assert (export / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    from tokenizers import Tokenizer

    expected = Tokenizer.from_file(str(folder / "tokenizer.json")).encode("the data model").ids
    assert AutoTokenizer.from_pretrained(export)("the data model")["input_ids"] == expected
    history = final_history(out / "metrics.jsonl")
    assert len(history) == 3 and history[-1]["loss"] < history[0]["loss"]


def assert_trained_like_ballast(runs: dict[str, Path], out: Path) -> None:
    """The run in `out` had the losses and ends with the parameters of ballast's run over the one
    pool, up to rounding, and its folder loads with every parameter it wrote."""
    from transformers import AutoModelForCausalLM

    assert losses(out) == pytest.approx(losses(runs["ballast"]), rel=LOSS_RTOL)
    start = initial_weights(runs["model"])
    assert drift(exported(out), exported(runs["ballast"]), start) <= PARAM_TOLERANCE
    loaded = AutoModelForCausalLM.from_pretrained(out / HF_MODEL_DIR).state_dict()
    written = exported(out)
    assert loaded.keys() == start.keys() and all(torch.equal(loaded[k], written[k]) for k in written)


@pytest.mark.slow
def test_a_run_under_strategies_writes_its_trained_model(runs):
    out = runs["strategy"]
    history = final_history(out / "metrics.jsonl")
    # ballast's rule may also run the two replicas' pooled form, one pipeline over a pool of both
    assert {r["strategy"] for r in history} <= {"[(1,1),(1,1)]", "[(1,1)x2]", "[(2,1)]"} and len(history) == STEPS
    # The same batches as ballast's run on the one mesh, so the same losses and parameters up to
    # rounding; the folder is written from the canonical shards, a unit at a time, to rank 0.
    assert_trained_like_ballast(runs, out)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["tp", "pp"])
def test_a_run_under_tp_or_pp_writes_its_trained_model(runs, run):
    """Under TP the folder is written from both ranks' shards, under PP from both stages, a
    tensor at a time to rank 0's host (`Executor.state_on_host`); the same batches as
    ballast's run over a pool of 2, so the same losses and parameters up to rounding."""
    from ballast.train import checkpoint_files

    out = runs[run]
    if run == "tp":
        assert json.loads((checkpoint_files.latest(out / "checkpoints") / "meta.json").read_text())["tp"] == 2
    else:
        assert all(r["layout"].startswith("pp2[") for r in final_history(out / "metrics.jsonl"))
    assert_trained_like_ballast(runs, out)
