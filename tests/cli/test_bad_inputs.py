"""The bad-input sweep: every command meets wrong data, configs, clusters, models, planners,
degrees, memory, damaged checkpoints and conflicting flags with one clear error.

Each case runs `ballast ...` in this process (`cli.main`) and asserts: the exit code (2 for a
user error, 1 for a defect on a rank), that the message names the offending thing, that it is
one error line and not a traceback, and that nothing hangs (a timeout per case). Multi-process
cases spawn 2 gloo ranks: a degree no plan can use, checkpoints damaged in the ways a long run
meets them, and a rank that raises in the middle of a step.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from corpora import jsonl_corpus
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from hf_folders import save_model
from wan_cases import TINY_WAN

from ballast.cli import main
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import MODEL_PRESETS, get_model_shape
from ballast.models import build_model
from ballast.train import checkpoint_files, checksums
from ballast.train.metrics import final_history

TRAIN = ["--model", "tiny", "--max-len", "256", "--tokens-per-step", "1024", "--steps", "2", "--timeout", "60",
         "--no-report"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Bad (and a few good) input files, by name."""
    root = tmp_path_factory.mktemp("bad-inputs")
    write = {
        "lengths.txt": "12\n40\nabc\n",
        "not.json": "{\"nodes\": 2,\n  oops}\n",
        "odd-model.json": json.dumps({"layers": 1, "hidden": 100, "heads": 3, "kv_heads": 1, "ffn": 64,
                                      "vocab": 256}),
        "wide-model.json": json.dumps({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 96,
                                       "vocab": 256}),
        "bad.jsonl": "{\"text\": \"fine\"}\n{\"text\": 3}\n",
        "bad.toml": "[run]\nsteps = \"many\"\n",
        "huge.txt": "100000000\n",
        "huger.txt": "99999999999\n",
        "bad-clips.txt": "81 480 832\n81 480\n",
        "long-clips.txt": "17 144 256\n# a long clip at 720p\n68 720 1280\n",
        "short-clips.txt": "17 64 64\n17 64 128\n",
        "six-head-dit.json": json.dumps({"name": "six-head-dit", "layers": 2, "hidden": 96, "heads": 6,
                                          "kv_heads": 6, "ffn": 192, "vocab": 16, "gated_mlp": False,
                                          "attention": "full", "cross_attention": True}),
        "odd-stdit.json": json.dumps({"name": "odd-stdit", "layers": 3, "hidden": 64, "heads": 4, "kv_heads": 4,
                                      "ffn": 128, "vocab": 16, "gated_mlp": False, "attention": "spatial-temporal",
                                      "cross_attention": True}),
        "three-heads.json": json.dumps({"layers": 2, "hidden": 96, "heads": 3, "kv_heads": 3, "ffn": 192,
                                        "vocab": 256}),
        "sparse-model.json": json.dumps({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 128,
                                         "vocab": 256, "attention": "sparse"}),
        # a profile of tiny on 2 CPU ranks that measured no TP terms (one from before they were)
        "no-tp-profile.json": json.dumps(analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict()),
        # a profile of tiny on 2 CPU ranks whose CP attention factor is no factor at all
        "bad-cp-profile.json": json.dumps({**analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict(),
                                           "context_attention": 0.0}),
        # a profile whose cost per attended span is negative (issue 31's span term)
        "bad-span-profile.json": json.dumps({**analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict(),
                                             "span_seconds": -1e-6}),
        # a profile whose cost per kernel call, per sample on every rank of a group (w) or the
        # remap layer's per token is negative
        "bad-call-profile.json": json.dumps({**analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict(),
                                             "call_seconds": -1e-4}),
        "bad-rank-sample-profile.json": json.dumps({**analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict(),
                                                    "rank_sample_seconds": -1e-5}),
        "bad-remap-profile.json": json.dumps({**analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict(),
                                              "remap_per_token": -1e-6}),
        # a profile whose recomputation's fixed part (g_r) is negative
        "bad-recompute-profile.json": json.dumps({**analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict(),
                                                  "recompute_fixed": -1e-3}),
        # a profile whose fit names a statistic no measurement reduces by
        "bad-statistic-profile.json": json.dumps({
            **analytic_cost(get_model_shape("tiny"), get_cluster("cpu", 2)).to_dict(),
            "fit": {"settings": {"statistic": "mean"}}}),
        "two-gpus.json": json.dumps({"nodes": 1, "devices_per_node": 2, "device_memory": 40e9,
                                     "peak_flops": 312e12, "bandwidth": {"2": 1e11}}),
    }
    for name, text in write.items():
        (root / name).write_text(text)
    mistral = root / "mistral"
    mistral.mkdir()
    (mistral / "config.json").write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "num_hidden_layers": 1, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 256,
        "sliding_window": 16}))
    bert = root / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    (root / "gpt2").mkdir()
    (root / "gpt2" / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
        "n_inner": None, "n_positions": 128, "vocab_size": 256}))
    (root / "wan-tiny").mkdir()  # a diffusers Wan's config alone: built from it with a random init
    (root / "wan-tiny" / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel", **TINY_WAN}))
    corpus, cache = jsonl_corpus(root, documents=60, longest=800, seed=1)
    return {**{name: str(root / name) for name in write}, "corpus": corpus, "cache": cache, "root": str(root),
            "mistral": str(mistral), "bert": str(bert), "gpt2": str(root / "gpt2"), "wan-tiny": str(root / "wan-tiny"),
            **hf_folders(root)}


def hf_folders(root: Path) -> dict[str, str]:
    """Tiny Llama folders whose weights do not fit their config or are damaged, and one whose
    positions end before --max-len."""
    from safetensors.torch import load_file, save_file
    from transformers.utils import logging

    logging.disable_progress_bar()
    good = save_model(root / "hf-good", "LlamaConfig")
    weights = load_file(good / "model.safetensors")
    out = {}

    def copy(name: str) -> Path:
        out[name] = str(shutil.copytree(good, root / name))
        return root / name

    config = json.loads((good / "config.json").read_text())
    wide = copy("hf-wide")  # config hidden 128 over weights of hidden 64
    (wide / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "intermediate_size": 256,
                                                  "head_dim": 32}))
    save_file({k: v for k, v in weights.items() if ".layers.1." not in k},
              copy("hf-missing") / "model.safetensors", metadata={"format": "pt"})
    save_file({**weights, "model.layers.9.mlp.up_proj.weight": weights["model.layers.1.mlp.up_proj.weight"].clone()},
              copy("hf-extra") / "model.safetensors", metadata={"format": "pt"})
    data = (good / "model.safetensors").read_bytes()
    (copy("hf-truncated") / "model.safetensors").write_bytes(data[:len(data) // 2])
    sharded = copy("hf-sharded")  # an index naming two shards, of which one is there
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        key: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, key in enumerate(sorted(weights))}}))
    legacy = copy("hf-bin")
    (legacy / "model.safetensors").rename(legacy / "pytorch_model.bin")
    short = copy("hf-short-positions")
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    nan = {**weights, "model.layers.0.self_attn.q_proj.weight": weights["model.layers.0.self_attn.q_proj.weight"].clone()}
    nan["model.layers.0.self_attn.q_proj.weight"][3, 5] = float("nan")
    save_file(nan, copy("hf-nan") / "model.safetensors", metadata={"format": "pt"})
    header = 8 + int.from_bytes(data[:8], "little")  # the body, overwritten with seeded bytes, header intact
    body = torch.randint(0, 256, (len(data) - header,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    (copy("hf-body") / "model.safetensors").write_bytes(data[:header] + body.numpy().tobytes())
    huge = {key: tensor * 1e30 if "proj" in key else tensor for key, tensor in weights.items()}  # finite, overflowing
    save_file(huge, copy("hf-huge") / "model.safetensors", metadata={"format": "pt"})
    from transformers import BertConfig, T5Config

    # Saved by transformers itself, with no architectures: its causal-LM auto class would build
    # BertLMHeadModel, an encoder; T5 is an encoder-decoder.
    BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
               vocab_size=256).save_pretrained(root / "bert-lm")
    T5Config(num_layers=2, d_model=64, num_heads=4, d_ff=128, vocab_size=256).save_pretrained(root / "t5")
    return {**out, "bert-lm": str(root / "bert-lm"), "t5": str(root / "t5")}


@pytest.fixture(scope="module")
def trained(files) -> Path:
    """A run folder with two committed checkpoints (after steps 1 and 2) of `tiny`."""
    out = Path(files["root"]) / "trained"
    assert main(["train", *TRAIN, "--data", files["corpus"], "--cache-dir", files["cache"],
                 "--checkpoint-interval", "1", "--out-dir", str(out)]) == 0
    return out


def damaged(trained: Path, tmp_path: Path, how: str) -> Path:
    """A copy of the trained run with its checkpoints damaged `how`."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    checkpoints = sorted((out / "checkpoints").iterdir())
    newest = checkpoints[-1]
    if how == "truncated shard":
        shard = next(newest.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
    elif how == "meta not JSON":
        (newest / "meta.json").write_text("{\"step\": 2,\n  nope")
    elif how == "metadata missing":
        (newest / ".metadata").unlink()
    elif how == "all damaged":
        for path in checkpoints:
            (path / ".metadata").unlink()
    elif how == "empty folder":
        for path in checkpoints:
            shutil.rmtree(path)
    elif how == "overwritten middle":  # the size the metadata says, other bytes
        shard = next(newest.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])  # surely other bytes
        shard.write_bytes(bytes(data))
    elif how == "no manifests":  # as a ballast before checksums wrote them
        for path in checkpoints:
            (path / checksums.MANIFEST).unlink()
    elif how == "meta missing":
        (newest / "meta.json").unlink()
    elif how == "every meta missing":
        for path in checkpoints:
            (path / "meta.json").unlink()
    return out


# (command line, exit code, what the message must say). {name} is a path from `files`.
CASES = [
    # simulate: length sources, clusters, models, planners, degrees, memory, flags
    ("simulate --lengths nonsense", 2, "unknown length source 'nonsense'"),
    ("simulate --lengths file:/no/such/file", 2, "/no/such/file"),
    ("simulate --lengths file:{lengths.txt}", 2, r"lengths.txt.*line 3"),
    ("simulate --lengths lognormal:1", 2, "lognormal:1"),
    ("simulate --cluster nosuch", 2, "nosuch"),
    ("simulate --cluster {not.json}", 2, r"not.json: cannot parse JSON.*line 2"),
    ("simulate --cluster cpu --world 3", 2, "3"),
    ("simulate --cluster cpu --world 4 --nodes 3", 2, "cpu cluster: 4 ranks do not form 3 nodes of equal size"),
    ("simulate --cluster h100-32 --nodes 2", 2, "cluster 'h100-32' has 4 nodes of 8 devices but the job asks for 2 nodes"),
    ("verify --world 4 --route-every-wave", 2, "--route-every-wave routes exchanges between nodes, but --nodes is 1: "
                                               "give --nodes 2 or more"),
    ("train --world 4 --nodes 3 --steps 1", 2, "cpu cluster: 4 ranks do not form 3 nodes of equal size"),
    ("simulate --model nosuch", 2, "unknown model 'nosuch'"),
    ("simulate --model {not.json}", 2, r"model file .*not.json.*line 2"),
    ("simulate --model {odd-model.json}", 2, "hidden 100 is not divisible by heads 3"),
    ("simulate --planners nosuch", 2, "unknown planner"),
    ("simulate --planners static --degree 3", 2, "SP degree 3 is not usable"),
    ("simulate --steps 0", 2, "--steps"),
    ("simulate --batch 4 --tokens-per-step 100", 2, "--tokens-per-step"),
    ("simulate --cost {not.json}", 2, r"cost model file .*not.json"),
    ("simulate --cluster h100-32 --model llama3-8b --pp 2 --sharding fsdp --steps 1", 2,
     r"FSDP2 does not run under pipeline parallelism \(PP 2\): use zero1 or replicated"),
    ("simulate --cluster cpu --world 2 --model tiny --device-memory-gb 0.00001", 2, "--device-memory-gb"),
    ("simulate --cluster cpu --world 2 --model tiny --lengths file:{huge.txt} --max-len 100000000 --steps 1",
     2, r"more than any plan can hold.*--max-len.*--device-memory-gb"),
    # strategies: malformed, not covering the cluster, a block no node holds, TP across a node, the model's
    # limits, a flag they do not combine with, a profile, a sequence no pipeline holds
    ("simulate --strategy 2x2,2y1", 2, r"argument --strategy: strategy '2x2,2y1': '2y1' is not a pipeline"),
    ("simulate --cluster h100-16 --strategy 4x2,1x4 --steps 1", 2,
     r"strategy \[\(4,2\),\(1,4\)\] holds 12 ranks, but cluster 'h100-16' has 16"),
    ("simulate --cluster h100-16 --strategy 1x2,1x8,1x2,1x4 --steps 1", 2,
     r"pipeline 1 \(1,8\) \(ranks 2..9\) neither lies inside one node of 8 devices nor holds whole nodes"),
    ("simulate --cluster h100-16 --strategy 16x1 --steps 1", 2, r"pipeline 0 \(16,1\).*TP degree 16 crosses a node"),
    ("simulate --cluster cpu --world 8 --model tiny --strategy 1x8 --steps 1", 2,
     r"pipeline 0 \(1,8\).*PP degree 8 does not divide model 'tiny''s 4 layers"),
    ("simulate --cluster h100-16 --strategy 4x2,4x2 --tp 2", 2, r"--strategy and --tp do not combine"),
    ("simulate --cluster cpu --world 8 --model tiny --strategy 2x2,2x2 --cost {not.json} --steps 1", 2,
     r"a strategy's pipelines are priced from --cost analytic or published"),
    ("simulate --cluster cpu --world 8 --model tiny --strategy 1x1x8 --lengths file:{huge.txt} --max-len 100000000 "
     "--steps 1", 2, r"--max-len 100000000: a sequence of that length fits no pipeline of strategy \[\(1,1\)x8\]"),
    ("verify --world 8 --strategy 2x2,2x2 --tp 2", 2, r"--strategy and --tp do not combine"),
    ("train --world 2 --strategy 1x1,1x1 --zero1", 2, r"--strategy and --zero1 do not combine"),
    ("train --world 2 --strategy 1x1,1x1x2", 2, r"strategy \[\(1,1\),\(1,1\)x2\] holds 3 ranks.*cluster 'cpu' has 2"),
    ("train --world 2 --strategy 1x1,1x1 --max-len 4096 --tokens-per-step 4096 --device-memory-gb 0.015", 2,
     r"--max-len 4096: a sequence of that length fits no pipeline of strategy \[\(1,1\),\(1,1\)\]"),
    ("train --world 2 --strategy 1x1;2y1", 2, r"strategy '2y1': '2y1' is not a pipeline"),
    ("train --world 2 --strategy auto --model stdit-tiny --data video-synthetic", 2,
     r"--strategy auto with video data: the proposal prices token lengths, not clip shapes"),
    ("verify --world 8 --strategy auto", 2, r"--strategy auto proposes strategies from a length histogram, in "
                                            r"`ballast simulate` \(of --lengths\) and `ballast train`"),
    ("simulate --cluster h100-16 --model gpt-7b --strategy 4x2,1x4,1x4 --planners hydraulis --steps 1 "
     "--max-len 32768 --lengths lognormal:10.2,0.2", 2,
     r"planner hydraulis: the batch's longest sequence \(32768 tokens\) fits no pipeline of strategy "
     r"\[\(4,2\),\(1,4\),\(1,4\)\] without recomputation"),
    ("simulate --cluster h100-16 --model gpt-30b --strategy auto --steps 1 --max-len 65536", 2,
     r"no strategy of 16 ranks holds the longest length \(65536 tokens\) without recomputation"),
    ("simulate --cluster cpu --world 8 --model tiny --strategy 1x1x4,2x2 --planners hydraulis --steps 1", 2,
     r"strategy \[\(1,1\)x4,\(2,2\)\] has a pipeline of several replicas; Hydraulis' pipelines are one replica"),
    ("train --world 2 --strategy 1x1,1x1 --model diffusers:{wan-tiny} --data video-synthetic", 2,
     r"--strategy with model .*a diffusers model is not trained under strategies"),
    ("verify --world 4 --strategy 2x2,2x2", 2, r"holds 8 ranks, but cluster 'cpu' has 4"),
    # Hugging Face models: a missing folder, not a causal LM, a sliding window shorter than --max-len
    ("simulate --model hf:/no/such/folder", 2, r"hf:/no/such/folder: no config.json"),
    ("simulate --model hf:{bert}", 2, r"model type 'bert' is BertModel, not a causal LM"),
    ("verify --model hf:{mistral} --max-len 32", 2, r"'mistral'.s sliding-window attention covers \(16\).*--max-len"),
    ("train --model hf:{mistral} --max-len 32", 2, r"sliding-window attention covers \(16\).*--max-len to 16"),
    # verify
    ("verify --world 3", 2, "power of two"),
    ("verify --zero1 --fsdp", 2, "--zero1 and --fsdp"),
    ("verify --model nosuch", 2, "unknown model 'nosuch'"),
    ("verify --planners nosuch", 2, "unknown planner"),
    ("verify --grad-tolerance -1", 2, "--grad-tolerance"),
    ("verify --pp 3", 2, r"TP degree 1 x PP degree 3 = 3 does not divide the world of 2 ranks"),
    ("verify --world 8 --pp 8", 2, r"PP degree 8 does not divide model 'tiny''s 4 layers"),
    ("verify --pp 2 --fsdp", 2, r"--pp 2 runs with replicated weights or --zero1: drop --fsdp"),
    ("verify --world 4 --tp 2 --pp 2 --nodes 2", 2, r"--tp 2 --pp 2 with --nodes 2: .* give --no-routing"),
    ("verify --pp 2 --model dit-tiny", 2, r"'dit-tiny' cannot be cut into pipeline stages \(text models can\)"),
    ("verify --tp 2 --model dit-tiny", 2, r"'dit-tiny' cannot be split by tensor parallelism \(text models can\)"),
    ("verify --pp 2 --model diffusers:{wan-tiny}", 2,
     r"^ballast verify: error: model 'wan-tiny' cannot be cut into pipeline stages \(text models can\): run it "
     r"without --pp$"),
    ("verify --tp 2 --model diffusers:{wan-tiny}", 2,
     r"^ballast verify: error: model 'wan-tiny' cannot be split by tensor parallelism \(text models can\): run it "
     r"without --tp$"),
    # train: data, config, planner, degree, memory, flags in conflict
    ("train --planner static --degree 3", 2, "SP degree 3 is not usable"),
    ("train --planner static --degree 4 --world 2", 2, r"SP degree 4 is not usable by planner .static.: degrees are \[1, 2\]"),
    ("train --data nosuch:x", 2, "nosuch:x"),
    ("train --data jsonl:{bad.jsonl}", 2, r"bad.jsonl.*line 2"),
    ("train --data folder:/no/such/dir", 2, "/no/such/dir"),
    ("train --min-lr 1e-2 --lr 1e-4", 2, r"--min-lr 0.01 is above --lr 0.0001: the cosine decay would raise the rate"),
    ("train --lr nan", 2, r"--lr: must be a finite number > 0, got nan"),
    ("train --beta1 1.5", 2, r"--beta1: must be a finite number in \[0, 1\) \(AdamW's moment decay\), got 1.5"),
    ("train --weight-decay -0.1", 2, r"--weight-decay: must be a finite number >= 0"),
    ("train --checkpoint-dir {lengths.txt}", 2, r"checkpoint folder .*lengths.txt \(--checkpoint-dir.*\) is a file"),
    ("train --world 3", 2, "world size must be a power of two, got 3"),
    ("train --zero1 --fsdp", 2, "zero1"),
    ("train --pp 3", 2, r"TP degree 1 x PP degree 3 = 3 does not divide the world of 2 ranks"),
    ("train --pp 2 --fsdp", 2, r"--fsdp does not run under pipeline parallelism \(--pp 2\)"),
    ("train --pp 2 --model diffusers:{wan-tiny} --data video-synthetic", 2,
     r"model 'wan-tiny' cannot be cut into pipeline stages \(text models can\): run it without --pp"),
    ("train --tp 2 --model diffusers:{wan-tiny} --data video-synthetic", 2,
     r"model 'wan-tiny' cannot be split by tensor parallelism \(text models can\): run it without --tp"),
    ("train --config {bad.toml}", 2, "steps"),
    ("train --model tiny --data stdlib --max-len 100000000 --tokens-per-step 100000000 --device-memory-gb 0.042", 2,
     r"more than any plan can hold.*--max-len"),
    # profile
    ("profile --world 3", 2, "power of two"),
    ("profile --model nosuch", 2, "unknown model 'nosuch'"),
    ("profile --check /no/such/profile.json", 2, "/no/such/profile.json"),
    ("profile --tp 2", 2, r"--tp 2 --pp 1 are for --check: a profile measures whole layers"),
    ("simulate --cost {no-tp-profile.json} --model tiny --cluster cpu --world 2 --tp 2 --steps 1", 2,
     r"no-tp-profile.json measured no TP terms of degree 2 \(it has: none\)"),
    ("profile --device-memory-gb 0.000001", 2, "--device-memory-gb"),
    # the shared options take one type in every command; a pattern is resolved where its name enters
    ("verify --max-len 0", 2, r"--max-len: must be an integer >= 2 \(.*\), got 0"),
    ("profile --device-memory-gb 0", 2, r"--device-memory-gb: must be a finite number > 0, got 0"),
    ("bench --world 0", 2, r"--world: must be an integer > 0, got 0"),
    ("simulate --model {sparse-model.json}", 2,
     r"model 'sparse-model': attention pattern 'sparse': expected one of causal, full, spatial-temporal"),
    # bench
    ("bench --planners nosuch", 2, "unknown planner"),
    ("bench --data nosuch:x", 2, "nosuch:x"),
    # every command that starts ranks: a --timeout they cannot start in
    *[(f"{command} --timeout 0.01", 2, r"--timeout: must be a finite number >= 30 \(seconds: the ranks need seconds "
                                       r"to start \(importing torch\).*\), got 0.01")
      for command in ("train", "verify", "profile", "bench")],
    # video: clip lists, shapes that no --max-len holds, data that does not suit the model
    ("simulate --lengths videos:{bad-clips.txt} --model wan-1.3b", 2, r"bad-clips.txt line 2: expected `frames height width`"),
    ("simulate --lengths videos:/no/such/clips.txt --model wan-1.3b", 2, r"/no/such/clips.txt: cannot read clip list"),
    ("simulate --lengths video --model stdit3-1b --cluster h200-32 --max-len 4000 --steps 1", 2,
     r"68 x 120 patches per frame \(8160 tokens\).*at least 8160"),
    ("train --model stdit-tiny", 2, r"'stdit-tiny' is a video DiT but --data .* is text"),
    ("train --model tiny --data video-synthetic", 2, r"'tiny' is a language model but --data 'video-synthetic' is video"),
    ("train --model stdit-tiny --data video-latents:/no/such/dir", 2, "/no/such/dir"),
    ("train --model stdit-tiny --data video-synthetic:0:{long-clips.txt} --max-len 2048", 2,
     r"long-clips.txt line 3 .*20 x 45 x 80 latent patches = 72000 tokens, over max_len 2048"),
    ("verify --model {odd-stdit.json}", 2, "layers must be even, got 3"),
    ("train --model {six-head-dit.json} --data video-synthetic --planner static --degree 4 --world 4", 2,
     r"SP degree 4 is not usable"),
    ("bench --model dit-tiny --data stdlib", 2, r"'dit-tiny' is a video DiT but --data 'stdlib' is text"),
    # Hugging Face folders: weights that do not fit the config, damaged files, another layout,
    # positions that end before --max-len (all before any rank starts)
    ("verify --model hf:{hf-wide}", 2, r"hf-wide: its weights \(model.safetensors\) do not match the model its "
     r"config.json describes.*mis-shaped: model.embed_tokens.weight \[256, 64\] \(config: \[256, 128\], in "
     r"model.safetensors\), .* and 18 more: fix config.json or the weights"),
    ("train --model hf:{hf-missing}", 2, r"hf-missing: .*missing from the files: model.layers.1.self_attn.q_proj.weight, "
     r".* and 6 more"),
    ("profile --model hf:{hf-extra}", 2, r"hf-extra: .*not in the model: model.layers.9.mlp.up_proj.weight \(in "
     r"model.safetensors\)"),
    ("verify --model hf:{hf-truncated}", 2, r"hf-truncated: model.safetensors is not a readable safetensors file "
     r"\(.*incomplete metadata, file not fully covered\): a copy cut short or damaged; \d+ bytes"),
    ("bench --model hf:{hf-sharded}", 2, r"hf-sharded: model.safetensors.index.json names "
     r"model-00002-of-00002.safetensors \(1 of its 2 shard files\), which are not in the folder"),
    ("verify --model hf:{hf-bin}", 2, r"hf-bin: its weights are pytorch_model.bin, and ballast loads safetensors "
     r"only .*it would train from a random init instead"),
    ("simulate --model hf:{gpt2}", 2, r"model type 'gpt2' \(GPT2LMHeadModel\) is not a Llama-style decoder.*lacks "
     r"num_hidden_layers, hidden_size, num_attention_heads, intermediate_size$"),
    ("train --model hf:{hf-short-positions} --max-len 128", 2, r"128 tokens, more than model 'hf-short-positions'.s "
     r"positions cover \(max_position_embeddings 64\).*lower --max-len to 64, or raise max_position_embeddings"),
    ("verify --model hf:{hf-short-positions} --max-len 128", 2, r"max_position_embeddings 64"),
    # --device-memory-gb applies to every cluster, and the states error names both levers. FSDP
    # under bf16 (a100-64's defaults): gpt-7b's 16 B x 6.85e9 / 64 = 1.71 GB and its root and two
    # blocks gathered in bf16, 2 x (4.12e8 + 2 x 2.01e8) = 1.63 GB
    ("simulate --cluster a100-64 --device-memory-gb 1 --steps 1", 2,
     r"states \(3.34 GB per device on 64 devices\) do not fit the device memory \(1 GB\)"),
    ("train --cluster {two-gpus.json} --device-memory-gb 0.001", 2, r"do not fit the device memory \(0.001 GB\)"),
    # 16 B x 3.26e10 / 8 = 65.1 GB, and 2 x (6.70e8 + 2 x 5.32e8) = 3.47 GB gathered
    ("simulate --model gpt-30b --cluster a100-8 --steps 1", 2, r"\(68.6 GB per device on 8 devices\) do not "
     r"fit the device memory \(28 GB\) at any degree: give the job more devices, or each device more memory "
     r"\(--device-memory-gb\)"),
    # the levers of a sequence no plan holds: context parallelism lifts the head cap, so more ranks help.
    # three-heads on 2 replicated fp32 ranks: 16 B x 233,952 = 3.74 MB of states (4.68 MB after
    # backward), 3,840 B a fully recomputed token (768 of block inputs, the loss's 12 B x 256):
    # 5.5 MB hold 457 tokens a rank, 914 at degree 2
    ("verify --model {three-heads.json} --device-memory-gb 0.0055 --max-len 1024", 2,
     r"1024 tokens, more than any plan can hold: "
     r"at most \d+ tokens fit one micro-batch \(SP degree 2, .*--device-memory-gb\) or the job more ranks"),
    # ... a planner of Ulysses alone is told which lever it lacks
    # (0.05 GB: 12,046 tokens a rank at full recomputation)
    ("simulate --cluster cpu --world 4 --planners dcp --model {three-heads.json} --device-memory-gb 0.05 "
     "--max-len 40000", 2, r"\(SP degree 1,.* SP degree 2 needs context parallelism \(SP degree 2 does not divide "
     r"the attention heads \(3\).*use a planner that runs it .* or static with --cp"),
    # static USP's CP part (--cp): checked where it enters, naming the value and its limit
    ("simulate --planners static --cp 3", 2, r"--cp: CP degree 3 is not a power of two"),
    ("simulate --planners static --degree 2 --cp 4", 2, r"--cp 4 does not divide --degree 2"),
    ("simulate --planners static --cp 128", 2, r"--cp 128 is more ranks than the cluster's 64"),
    ("simulate --cluster cpu --world 8 --planners static --model {three-heads.json} --degree 8 --cp 2", 2,
     r"--degree 8 with --cp 2 leaves Ulysses over 4 ranks: SP degree 4 does not divide the attention heads \(3\)"),
    ("simulate --cluster cpu --world 4 --planners static --model {three-heads.json} --degree 2 --cp 2 "
     "--device-memory-gb 0.05 --max-len 40000", 2, r"a 40000-token sequence \(--max-len\) does not fit SP degree 2 "
     r"\(Ulysses 1 x CP 2\) even with full recomputation \(at most \d+ tokens"),
    ("train --planner static --degree 1 --cp 2", 2, r"--cp 2 does not divide --degree 1"),
    ("train --planner static --cp 4", 2, r"--cp 4 is more ranks than the cluster's 2"),
    ("bench --planners static --cp 3", 2, r"--cp: CP degree 3 is not a power of two"),
    ("train --planner static --cp 0", 2, r"--cp: must be an integer > 0, got 0"),
    # no planner asked for can hold --max-len: one line naming each one's limit, before any rank
    # (5.5 MB: 457 tokens at degree 1, the most 3 heads allow Ulysses alone; 914 with CP)
    ("verify --model {three-heads.json} --world 2 --planners dcp,static --device-memory-gb 0.0055 --max-len 512", 2,
     r"no planner of --planners dcp,static can hold --max-len 512: dcp holds at most 457 tokens \(ulysses-only "
     r"splits, degrees up to 1\), not --max-len 512; static holds at most 457 tokens"),
    ("simulate --cluster cpu --world 2 --model tiny --cost {bad-cp-profile.json}", 2,
     r"cost model file .*bad-cp-profile.json: cost model 'tiny': context_attention must be > 0, got 0.0"),
    ("simulate --cluster cpu --world 2 --model tiny --cost {bad-span-profile.json}", 2,
     r"cost model file .*bad-span-profile.json: cost model 'tiny': span_seconds -1e-06 must be >= 0, and 0 unless "
     r"a > 0"),
    ("simulate --cluster cpu --world 2 --model tiny --cost {bad-call-profile.json}", 2,
     r"cost model file .*bad-call-profile.json: cost model 'tiny': call_seconds -0.0001 must be >= 0"),
    ("simulate --cluster cpu --world 2 --model tiny --cost {bad-rank-sample-profile.json}", 2,
     r"cost model file .*bad-rank-sample-profile.json: cost model 'tiny': rank_sample_seconds -1e-05 must be >= 0"),
    ("simulate --cluster cpu --world 2 --model tiny --cost {bad-remap-profile.json}", 2,
     r"cost model file .*bad-remap-profile.json: cost model 'tiny': remap_per_token -1e-06 must be >= 0"),
    ("simulate --cluster cpu --world 2 --model tiny --cost {bad-recompute-profile.json}", 2,
     r"cost model file .*bad-recompute-profile.json: cost model 'tiny': recompute_fixed -0.001 must be >= 0"),
    ("profile --held-out -1", 2, r"--held-out: must be an integer >= 0, got -1"),
    # output paths no command could write, found before the work
    ("simulate --json {lengths.txt}/out.json", 2, r"--json .*lengths.txt/out.json: .*lengths.txt is not a folder"),
    ("simulate --gantt /no/such/dir/gantt.png", 2, r"--gantt /no/such/dir/gantt.png: /no/such/dir does not exist"),
    ("simulate --json {root}", 2, r"--json .*: is a folder; give a file name"),
    ("train --out-dir {lengths.txt}/run", 2, r"--out-dir .*lengths.txt/run: cannot write in .*\(Not a directory\)"),
    ("train --out-dir {lengths.txt}", 2, r"--out-dir .*lengths.txt: is a file, not a folder"),
    ("bench --model tiny --world 2 --cost {bad-statistic-profile.json}", 2,
     r"cost model 'tiny': its profile's statistic must be one of \['median', 'min'\], got 'mean'"),
    ("bench --json {lengths.txt}/bench.json", 2, r"--json .*lengths.txt/bench.json: .*is not a folder"),
    ("bench --png /no/such/dir/bench.png", 2, r"--png /no/such/dir/bench.png: /no/such/dir does not exist"),
    ("profile --out {lengths.txt}/profile.json", 2, r"--out .*lengths.txt/profile.json: .*is not a folder"),
    # the README's profile example as it was: --lengths takes integers when profiling
    ("profile --lengths stdlib", 2, r"--lengths and --depths take comma-separated integers when profiling \(a length "
     r"source such as stdlib is for --check\)"),
    # issue 56: an option a planner ignores, where it is parsed, naming the planners it applies to
    ("train --planner ballast --cp 2", 2, r"--cp 2 applies to static only: the planner ballast would ignore it"),
    ("simulate --planners ballast --cp 2", 2, r"--cp 2 applies to static only: the planner ballast would ignore it"),
    ("simulate --planners ballast,dcp --degree 2", 2,
     r"--degree 2 applies to static, bucket, wlb-llm only: the planners ballast, dcp would ignore it"),
    ("simulate --planners static --no-routing", 2, r"--no-routing applies to zeppelin, ballast only"),
    ("simulate --planners static --no-defer-outliers", 2, r"--no-defer-outliers applies to wlb-llm, ballast only"),
    ("train --planner dcp --no-defer-outliers", 2, r"--no-defer-outliers applies to wlb-llm, ballast only"),
    ("verify --planners dcp --cp 2", 2, r"--cp 2 applies to static only: the planner dcp would ignore it"),
    ("bench --planners ballast --cp 2", 2, r"--cp 2 applies to static only: the planner ballast would ignore it"),
    # a schedule that cannot do what its options say
    ("train --steps 3 --decay-steps 1", 2, r"--decay-steps 1 is not after the warm-up's end \(--warmup-steps 10\): "
     r"the rate would warm up and then drop to --min-lr 0.0003 at once"),
    # only causal decoders, by what their config says they are, in every command
    ("simulate --model hf:{bert-lm} --max-len 256", 2, r"model type 'bert' is an encoder, with attention both ways "
     r"\(is_decoder false\): ballast trains causal decoders"),
    ("simulate --model hf:{bert-lm} --max-len 100000", 2, r"model type 'bert' is an encoder"),
    ("train --model hf:{bert-lm}", 2, r"model type 'bert' is an encoder"),
    ("verify --model hf:{t5}", 2, r"model type 't5' is an encoder-decoder \(is_encoder_decoder\)"),
    # the shortest sample with context to attend to
    ("train --max-len 1", 2, r"--max-len: must be an integer >= 2 \(a 1-token sample has no context to attend to\), "
     r"got 1"),
    # every numeric option finite and in range where it is parsed
    ("simulate --device-memory-gb 1e309", 2, r"--device-memory-gb: must be a finite number > 0, got 1e309"),
    ("train --device-memory-gb inf", 2, r"--device-memory-gb: must be a finite number > 0, got inf"),
    ("verify --lr nan", 2, r"--lr: must be a finite number > 0, got nan"),
    ("bench --time-limit nan", 2, r"--time-limit: must be a finite number > 0, got nan"),
    ("simulate --seed -1", 2, r"--seed: must be an integer >= 0 \(numpy's generators take no negative seed\)"),
    ("verify --param-tolerance inf", 2, r"--param-tolerance: must be a finite number >= 0, got inf"),
    # weights, not documents, named when they are the cause
    ("verify --model hf:{hf-nan}", 2, r"hf-nan: its weights hold non-finite values \(NaN or infinity\) in "
     r"model.layers.0.self_attn.q_proj.weight \(1 of 4096 values\)"),
    ("verify --model hf:{hf-body}", 2, r"hf-body: its weights hold non-finite values .*: a damaged file"),
    # a length that splits into millions of chunks: refused before any is made
    ("simulate --lengths file:{huger.txt}", 2, r"huger.txt: a sequence of 99999999999 tokens would split into 254314 "
     r"or more chunks of max_len=393216, more than the 4096 one sequence may become"),
    # argparse's own errors: one line, as every other error
    ("simulate --nosuch 3", 2, r"^ballast simulate: error: unrecognized arguments: --nosuch 3 \(`ballast simulate "
     r"--help` lists the options\)$"),
    ("verify --routing maybe", 2, r"--routing: expected no value \(or on / off\), got 'maybe'"),
]


def _run(argv: list[str], capture) -> tuple[int, str, str]:
    """Exit code, stderr and stdout of `ballast argv` (`capture`: capsys, or capfd to see the
    spawned ranks' output too)."""
    code = main(argv)
    out, err = capture.readouterr()
    return code, err, out


def _assert_one_error(err: str, command: str, pattern: str) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert re.search(pattern, err, re.S | re.M), f"{pattern!r} not in:\n{err}"
    assert f"ballast {command}" in lines[0] or lines[0].startswith("ballast: error"), err
    assert "usage:" not in err, err  # argparse's errors are one line too


@pytest.mark.timeout(120)
@pytest.mark.parametrize("line, code, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input(line, code, pattern, files, capsys, tmp_path):
    argv = [re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], part) for part in line.split()]
    if argv[0] == "train" and "--data" not in argv:
        argv += ["--data", files["corpus"], "--cache-dir", files["cache"]]
    if argv[0] == "train" and "--out-dir" not in argv:
        argv += ["--out-dir", str(tmp_path / "out")]
    got, err, _ = _run(argv, capsys)
    assert got == code, err
    _assert_one_error(err, argv[0], pattern)


# (how the checkpoints are damaged, the checkpoint `resumable` picks, what it warns or raises)
CHECKPOINT_CASES = [
    ("truncated shard", "step-00000001", r"step-00000002: shard __\d_0.distcp is truncated \(100 of \d+ bytes\); "
                                         r"resuming from the older step-00000001"),
    ("meta not JSON", "step-00000001", r"step-00000002/meta.json: cannot parse JSON: .* at line 2, column 3; "
                                       r"resuming from the older step-00000001"),
    ("metadata missing", "step-00000001", r"step-00000002: .metadata is missing.*resuming from the older "
                                          r"step-00000001"),
    ("all damaged", None, r"checkpoints holds no usable checkpoint: checkpoint .*step-00000002: .metadata is "
                          r"missing .*\(and 1 older damaged one\(s\)\)"),
    ("empty folder", None, None),
    ("overwritten middle", "step-00000001", r"step-00000002: __\d_0.distcp does not match its SHA-256 in "
                                            r"sha256.json \(its bytes changed after it was written\); resuming "
                                            r"from the older step-00000001"),
    ("no manifests", "step-00000002", r"step-00000002 has no sha256.json \(written by a ballast before "
                                      r"checksums\): its files are checked by size only"),
    # a committed checkpoint without its meta.json is damaged, never "no checkpoint"
    ("meta missing", "step-00000001", r"step-00000002: meta.json is missing .*; resuming from the older "
                                      r"step-00000001"),
    ("every meta missing", None, r"checkpoints holds no usable checkpoint: checkpoint .*step-00000002: meta.json is "
                                 r"missing .*\(and 1 older damaged one\(s\)\)"),
]
SAID = {how: pattern for how, _, pattern in CHECKPOINT_CASES}


@pytest.mark.slow
@pytest.mark.parametrize("how, picked, pattern", CHECKPOINT_CASES, ids=[c[0] for c in CHECKPOINT_CASES])
def test_damaged_checkpoint(how, picked, pattern, trained, tmp_path):
    """A damaged newest checkpoint: a warning naming it and the older one picked; none usable:
    one error naming the folder; none at all: nothing picked (a fresh start). What `train` makes
    of the pick runs for real below: a resume from the older one, and the error."""
    root = damaged(trained, tmp_path, how) / "checkpoints"
    warnings: list[str] = []
    if picked is None and pattern is not None:
        with pytest.raises(checkpoint_files.Damaged) as raised:
            checkpoint_files.resumable(root, warnings.append)
        assert re.search(pattern, str(raised.value), re.S), raised.value
        return
    found = checkpoint_files.resumable(root, warnings.append)
    assert (found and found.name) == picked
    assert len(warnings) == (pattern is not None), warnings
    assert pattern is None or re.search(pattern, warnings[0], re.S), warnings


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["all damaged", "every meta missing"])
def test_no_usable_checkpoint_stops_the_run_with_one_error(how, files, trained, tmp_path, capfd):
    run = damaged(trained, tmp_path, how)
    got, err, _ = _run(["train", *TRAIN, "--steps", "3", "--data", files["corpus"], "--cache-dir", files["cache"],
                        "--out-dir", str(run)], capfd)
    assert got == 2, err
    _assert_one_error(err, "train", SAID[how])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_newest_checkpoint_without_meta_is_skipped_with_a_warning(files, trained, tmp_path, capfd):
    run = damaged(trained, tmp_path, "meta missing")
    got, err, out = _run(["train", *TRAIN, "--data", files["corpus"], "--cache-dir", files["cache"],
                          "--out-dir", str(run)], capfd)
    assert got == 0, err
    assert re.search(r"warning: checkpoint .*" + SAID["meta missing"], out, re.S), out
    assert "resumed from" in out and "step-00000001 at step 1" in out and "starting fresh" not in out


# (the run's flags on an hf: folder whose weights are at fault, what the one error must say):
# errors the ranks meet when they load the weights or run the first step
WEIGHT_CASES = [
    ("--model hf:{hf-nan} --skip-nonfinite", r"hf-nan: its weights hold non-finite values \(NaN or infinity\) in "
                                             r"model.layers.0.self_attn.q_proj.weight"),
    ("--model hf:{hf-huge}", r"step 1/2: loss nan, .*a non-finite loss in every one of the step's \d+ micro-batches: "
                             r"the weights, more likely than the data, are the cause"),
    ("--model hf:{hf-huge} --skip-nonfinite", r"every one of the run's 2 step\(s\) was skipped for a non-finite loss "
                                              r"or gradient norm \(--skip-nonfinite\): the weights never changed, so no "
                                              r"trained model is written"),
]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("flags, pattern", WEIGHT_CASES, ids=[c[0] for c in WEIGHT_CASES])
def test_weights_at_fault_are_named(flags, pattern, files, tmp_path, capfd):
    argv = [re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], part) for part in flags.split()]
    out_dir = tmp_path / "out"
    got, err, _ = _run(["train", *TRAIN, *argv, "--max-len", "64", "--tokens-per-step", "512", "--data",
                        files["corpus"], "--cache-dir", files["cache"], "--out-dir", str(out_dir)], capfd)
    assert got == 2, err
    _assert_one_error(err, "train", pattern)
    assert not (out_dir / "hf-model").exists()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_resuming_with_another_planner_and_world_says_so(files, trained, tmp_path, capfd):
    """The resume line says how to start fresh; a note names the settings that change the
    plans; the summary counts the steps of each planner."""
    run = damaged(trained, tmp_path, "none")
    got, err, out = _run(["train", *TRAIN, "--steps", "3", "--planner", "static", "--world", "4", "--data",
                          files["corpus"], "--cache-dir", files["cache"], "--out-dir", str(run)], capfd)
    assert got == 0, err
    assert re.search(r"resuming from .*step-00000002 \(to start fresh instead, give another --out-dir or "
                     r"--checkpoint-dir; --no-resume refuses a folder that holds checkpoints\)", out), out
    assert ("note: resuming step-00000002 with settings that change the plans from step 2 on: --world 4 (was 2), "
            "--planner static (was ballast)") in out, out
    assert "trained 3 steps with planners ballast (2), static (1) on 4 ranks" in out, out


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP reads in this one process
def test_same_size_damage_resumes_from_the_older_exactly(files, trained, tmp_path, capfd):
    """The newest checkpoint's shard overwritten in the middle (its size intact): found by its
    checksum, and the run redoes step 2 from step 1's checkpoint to the same loss and weights."""
    run = damaged(trained, tmp_path, "overwritten middle")
    got, err, out = _run(["train", *TRAIN, "--data", files["corpus"], "--cache-dir", files["cache"],
                          "--out-dir", str(run)], capfd)
    assert got == 0, err
    assert re.search(SAID["overwritten middle"], out + err, re.S), out + err
    assert "resumed from" in out and "step-00000001 at step 1" in out
    assert [r["loss"] for r in final_history(run / "metrics.jsonl")] == \
        [r["loss"] for r in final_history(trained / "metrics.jsonl")]
    assert checkpoint_parameters(run).equal(checkpoint_parameters(trained))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_resume_with_another_tokens_per_step_warns(files, trained, tmp_path, capfd):
    run = damaged(trained, tmp_path, "none")
    got, err, out = _run(["train", *TRAIN, "--steps", "3", "--tokens-per-step", "2048", "--data", files["corpus"],
                          "--cache-dir", files["cache"], "--out-dir", str(run)], capfd)
    assert got == 0, err
    assert re.search(r"warning: resuming .*step-00000002 with --tokens-per-step 2048; it was saved with 1024: the "
                     r"steps from 2 on draw batches of the new size", out + err), out + err
    assert final_history(run / "metrics.jsonl")[-1]["tokens"] > 1024


def checkpoint_parameters(out: Path) -> torch.Tensor:
    """The tiny model's parameters in the run's newest checkpoint, read in this process."""
    model = build_model(MODEL_PRESETS["tiny"])
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=checkpoint_files.latest(out / "checkpoints"))
    return torch.cat([t.reshape(-1) for t in state["model"].values()])


# (the resuming run's flags, what the error must say)
ANOTHER_MODEL = [
    ("--model {wide-model.json}",
     r"step-00000002 holds another model: 'tiny' \(ballast's own\), not this run's 'wide-model' \(ballast's own\) "
     r"\(layers 4 there, 2 here; .*\): resume it with its own model, or give this run another --checkpoint-dir"),
    # another family: the data stream's state is never reached
    ("--model stdit-tiny --data video-synthetic:0:{short-clips.txt}",
     r"step-00000002 holds another model: 'tiny' .*not this run's 'stdit-tiny'"),
]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("flags, pattern", ANOTHER_MODEL, ids=[c[0] for c in ANOTHER_MODEL])
def test_checkpoint_of_another_model(flags, pattern, files, trained, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    argv = [re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], part) for part in flags.split()]
    data = [] if "--data" in argv else ["--data", files["corpus"], "--cache-dir", files["cache"]]
    got, err, _ = _run(["train", *TRAIN, "--steps", "3", *argv, *data, "--out-dir", str(folder)], capsys)
    assert got == 2, err
    _assert_one_error(err, "train", pattern)


def test_checkpoint_of_a_model_with_the_same_numbers_and_another_architecture(files):
    """Every tensor of the Gemma is in the Qwen3's checkpoint: the record's architecture tells
    them apart (`train` checks the record as above, before anything of the checkpoint is used)."""
    from transformers import GemmaConfig, Qwen3Config

    root = Path(files["root"])
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=4, head_dim=16, tie_word_embeddings=True)
    Qwen3Config(**common, architectures=["Qwen3ForCausalLM"]).save_pretrained(root / "qwen3")
    GemmaConfig(**common, architectures=["GemmaForCausalLM"]).save_pretrained(root / "gemma")
    meta = {"model": checkpoint_files.model_record(get_model_shape(f"hf:{root / 'qwen3'}"))}
    with pytest.raises(ValueError, match=r"step-00000001 holds another model: 'qwen3' \(hf:.*qwen3, Qwen3ForCausalLM\), "
                                         r"not this run's 'gemma' \(hf:.*gemma, GemmaForCausalLM\) \(.*architecture "
                                         r"Qwen3ForCausalLM there, GemmaForCausalLM here"):
        checkpoint_files.check_same_model(root / "step-00000001", meta, get_model_shape(f"hf:{root / 'gemma'}"))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_rank_raising_mid_step(files, tmp_path, capsys, monkeypatch):
    """Rank 1 raises after its first forward pass of step 1: the job ends with rank 1's error,
    once (its traceback: a defect, exit 1), not with rank 0's broken connection."""
    monkeypatch.setenv("BALLAST_FAULT_AT_STEP", "1")
    monkeypatch.setenv("BALLAST_FAULT_KIND", "raise")
    got, err, _ = _run(["train", *TRAIN, "--data", files["corpus"], "--cache-dir", files["cache"],
                     "--out-dir", str(tmp_path / "out")], capsys)
    assert got == 1, err
    assert err.startswith("ballast train: rank 1 failed:"), err
    assert err.count("Traceback") == 1, err
    assert "BALLAST_FAULT_AT_STEP=1: rank 1 raised" in err
    assert "Connection closed" not in err
