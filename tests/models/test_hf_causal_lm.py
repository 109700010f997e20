"""Hugging Face causal LMs (`hf:PATH`) under every planner's plans train exactly like transformers.

Tiny Llama, Qwen2 and Mistral models (and variants: linear RoPE scaling, tied embeddings,
grouped-query attention) are saved with their weights into folders, loaded by path through
`get_model_shape("hf:" + folder)` + `build_model`, and run one step under the plans of
`plan_names` on 4 gloo ranks (degrees 1, 2 and 4), replicated, with ZeRO-1 and with FSDP2 (one
`run_local` spawn runs all of it): Llama under every planner's plan, every variant under
ballast's and the hand-made ones (ZeRO-1 under ballast's). The reference uses no ballast code: the same folder loaded with
`AutoModelForCausalLM.from_pretrained` (eager attention) in this process, every sequence run on
its own, the loss summed over all target tokens and divided by their count.

Tolerance. Both sides compute the same fp32 function; only the order of float sums differs
(attention over a packed stream vs one sequence, per-shard partial sums of the loss and of
every weight gradient, all-reduce or reduce-scatter of those partial sums, recomputation).
Each reordered sum of n terms moves its result by ~n * 2^-24 of its largest terms at worst,
~sqrt(n) * 6e-8 typically; through 2 layers that is ~1e-6 of the largest gradient entry, as
`tests/runtime_cases.py` measures for ballast's own GPT (~5e-7). So every parameter's gradient
must match to GRAD_RTOL = 1e-5 of the largest |entry| of that parameter's reference gradient
(and the loss to 1e-5 relative): several times the rounding (measured: gradient errors
5e-7 to 1.4e-6, loss errors <= 2.5e-7, over every variant, mode and planner),
while a lost or doubled micro-batch (each holds at least 1 of the 439 tokens), a wrong shard or
a missing gradient contribution (e.g. the head's share of a tied matrix) moves it by orders of
magnitude more. Positions restarting at every shard instead of every sequence moved the
gradient by 0.4 or more but the loss by only 1e-6 (a random
model's loss is ~ln(vocab) whatever attention does): the gradient is the check, not the loss.
The errors are printed by `test_print_measured_errors` (run with -s).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hf_folders import COMMON, save_model

from ballast import verify
from ballast.vocabulary.cluster import get_cluster
from ballast.dataset import check_vocab
from ballast.vocabulary.model_shape import ModelShape, get_model_shape
from ballast.models import PackedStream, build_model
from ballast.plans.plan import Group, MicroBatch, Plan, PlanError, Wave
from ballast.planners import PLANNERS, PlannerOptions, get_planner
from ballast.runtime import ProcessGroups, parallelize, run_local

GRAD_RTOL = 1e-5
LOSS_RTOL = 1e-5
MAX_LEN = 128
# 12 sequences, 439 tokens: the longest needs SP degree 2 or more under `verify.budget`; most
# lengths are not divisible by 2 or 4; the 1-token sequence leaves ranks with empty shards.
LENGTHS = [128, 97, 70, 51, 33, 24, 15, 9, 6, 3, 2, 1]
MODES = ("plain", "zero1", "fsdp")
# name: (config class, overrides). Llama and Mistral untied (their default), Qwen2 tied (as its
# small checkpoints are); Mistral's default window (4096) is longer than every sequence.
VARIANTS = {
    "llama": ("LlamaConfig", {}),
    "qwen2-tied": ("Qwen2Config", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {}),
    "llama-rope-linear": ("LlamaConfig", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                               "rope_theta": 10000.0}}),
    # grouped-query attention: 2 kv heads for 4 query heads (degree 4 replicates them), and
    # multi-query attention: 1 kv head (degrees 2 and 4 replicate it)
    "qwen2-gqa": ("Qwen2Config", {"num_key_value_heads": 2}),
    "llama-mqa": ("LlamaConfig", {"num_key_value_heads": 1}),
}
# Not trained: 2 heads, which SP degree 4 does not divide (the executor's error).
TWO_HEADS = ("LlamaConfig", {"num_attention_heads": 2, "num_key_value_heads": 2})


def quiet() -> None:
    """No progress bar per loaded recompute."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def make_samples() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, COMMON["vocab_size"], (s + 1,), generator=generator) for s in LENGTHS]


def transformers_reference(folder: Path, samples: list[torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the batch with transformers alone: the folder's weights, eager
    attention, each sequence on its own, sum of token losses over all targets."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    model.train()
    total = sum(s.numel() - 1 for s in samples)
    loss = sum(F.cross_entropy(model(input_ids=s[None, :-1]).logits[0], s[1:], reduction="sum") for s in samples)
    loss = loss / total
    loss.backward()
    return loss.item(), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def empty_shards_plan() -> Plan:
    """For 4 ranks, lockstep: the 1-token sequence alone at degree 4 (three ranks hold an empty
    shard and run the wrapper's stand-in token), then degrees 2 and 1 side by side with
    recomputation and an empty micro-batch."""
    return Plan(LENGTHS, [
        Wave([Group(0, 4, [MicroBatch([11]), MicroBatch([0, 10], 0.5)])]),
        Wave([Group(0, 2, [MicroBatch([1, 9], 1.0), MicroBatch([2])]),
              Group(2, 1, [MicroBatch([3, 8]), MicroBatch([4, 7], 0.5)]),
              Group(3, 1, [MicroBatch([5, 6]), MicroBatch([])])]),
    ], lockstep=True, planner="empty-shards")


def remapped_plan() -> Plan:
    """For 4 ranks, lockstep: Zeppelin's remapping layer (no planner remaps at this budget).
    Wave 0 balances over all 4 ranks, an idle rank included; its second slot has 3 tokens, so
    one rank holds none. Wave 1 has two domains of 2 ranks."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0], 0.5), MicroBatch([10])]),
              Group(2, 1, [MicroBatch([1], 1.0), MicroBatch([11])]),
              Group(3, 1, [MicroBatch([]), MicroBatch([])])], remap=[(0, 4)]),
        Wave([Group(0, 1, [MicroBatch([2, 3]), MicroBatch([5])]), Group(1, 1, [MicroBatch([4, 6]), MicroBatch([7])]),
              Group(2, 2, [MicroBatch([8, 9], 0.75), MicroBatch([])])], remap=[(0, 2), (2, 2)]),
    ], lockstep=True, planner="remapped")


HAND_PLANS = {"empty-shards": empty_shards_plan, "remapped": remapped_plan}
WORLD = 4
"""The job's ranks: degrees 1, 2 and 4."""


def plan_names(variant: str, mode: str) -> list[str]:
    """The plans `variant` runs under sharding `mode`. The planners' plans differ in their shapes
    (degrees, waves, slots, recomputation), which reach the executor, not in the model code they
    reach, so one variant runs them all, replicated; the other variants, and FSDP2 (which
    changes how parameters are held, not what a plan runs: `tests/runtime/test_fsdp.py` runs
    every planner's lockstep plan sharded), run ballast's plan and the hand-made ones, which
    between them have degrees 1, 2 and 4 (so GQA/MQA replication at 2 and 4), empty shards,
    recomputation at several levels and remap domains. ZeRO-1 changes only how the step's
    gradients are summed (a reduce-scatter per bucket to their owners, the replicated
    all-reduce's twin): ballast's plan."""
    if mode == "zero1":
        return ["ballast"]
    return [*PLANNERS, *HAND_PLANS] if variant == "llama" and mode == "plain" else ["ballast", *HAND_PLANS]


def planner_plans(shape: ModelShape, lockstep: bool, names: list[str]) -> dict[str, dict]:
    """The named plans of LENGTHS, as dicts: a planner's at `verify.budget` (degrees 1/2/4,
    several waves, recomputation) or a hand-made one."""
    cluster, cost = verify.budget(shape, WORLD, MAX_LEN)
    options = PlannerOptions(max_len=MAX_LEN, lockstep=lockstep, time_limit=2.0)
    out = {}
    for name in names:
        if name in HAND_PLANS:
            plan = HAND_PLANS[name]()
            plan.validate(get_cluster("cpu", world_size=WORLD))
        else:
            plan = get_planner(name, cluster, cost, options).plan(LENGTHS)
            plan.validate(cluster, cost)
        out[name] = plan.to_dict()
    return out


def _step(shape: ModelShape, plan: dict, samples: list[torch.Tensor], groups: ProcessGroups,
          mode: str) -> tuple[float, dict[str, torch.Tensor]]:
    """One step of `plan` on a model freshly loaded from the folder; the step's loss and every
    parameter's full gradient (collective: every rank calls it)."""
    model = build_model(shape, seed=1)  # weights from model.safetensors: the seed must not matter
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    executor = parallelize(model, cluster, groups=groups, fsdp=mode == "fsdp", zero1=mode == "zero1", lr=1e-3)
    result = executor.step(Plan.from_dict(plan), samples)
    grads = {name: g for (name, _), g in zip(model.named_parameters(), executor.gradients(), strict=True)}
    return result.loss, grads


def _degree_error(folder: str, samples: list[torch.Tensor], groups: ProcessGroups) -> str:
    """The executor's error for a degree-4 plan on a model with 2 heads (before any collective)."""
    shape = get_model_shape("hf:" + folder)
    executor = parallelize(build_model(shape), get_cluster("cpu", world_size=4), groups=groups, lr=1e-3)
    plan = Plan(LENGTHS, [Wave([Group(0, 4, [MicroBatch(list(range(len(LENGTHS))))])])])
    try:
        executor.step(plan, samples)
    except ValueError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _world_worker(folders: dict[str, str], plans: dict[str, dict[str, dict[str, dict]]],
                  samples: list[torch.Tensor]) -> dict | None:
    """Every variant x sharding mode x planner: one step each; rank 0 returns losses and gradients."""
    quiet()
    groups = ProcessGroups()
    out: dict = {"degree-error": _degree_error(folders["two-heads"], samples, groups)}
    for variant, by_mode in plans.items():
        shape = get_model_shape("hf:" + folders[variant])
        for mode, by_planner in by_mode.items():
            for planner, plan in by_planner.items():
                out[variant, mode, planner] = _step(shape, plan, samples, groups, mode)
    return out if dist.get_rank() == 0 else None


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-models")
    # a seed per variant: Llama and Mistral of one config and seed would have equal weights
    out = {name: save_model(root / name, cls, seed, **overrides)
           for seed, (name, (cls, overrides)) in enumerate(VARIANTS.items())}
    return {**out, "two-heads": save_model(root / "two-heads", TWO_HEADS[0], **TWO_HEADS[1])}


@pytest.fixture(scope="module")
def samples() -> list[torch.Tensor]:
    return make_samples()


@pytest.fixture(scope="module")
def references(folders, samples) -> dict[str, tuple[float, dict[str, torch.Tensor]]]:
    quiet()
    return {name: transformers_reference(folders[name], samples) for name in VARIANTS}


@pytest.fixture(scope="module")
def world4(folders, samples) -> tuple[dict, dict]:
    """Rank 0's results and the plans they ran."""
    plans = {}
    for variant in VARIANTS:
        shape = get_model_shape(f"hf:{folders[variant]}")
        plans[variant] = {mode: planner_plans(shape, mode == "fsdp", plan_names(variant, mode)) for mode in MODES}
    result = run_local(WORLD, _world_worker, {k: str(v) for k, v in folders.items()}, plans, samples,
                       timeout=600)[0]
    return result, plans


pytestmark = pytest.mark.usefixtures("single_thread")


def errors_of(result: tuple[float, dict[str, torch.Tensor]], reference: tuple[float, dict[str, torch.Tensor]]
              ) -> tuple[float, float, str]:
    """Relative loss error, the largest per-parameter gradient error (relative to that
    parameter's largest reference entry), and the parameter where it occurs."""
    loss, grads = result
    want_loss, want = reference
    # The wrapper's parameters are "hf." + transformers' names, under FSDP too (same FQNs).
    assert sorted(grads) == sorted("hf." + name for name in want)
    worst, where = 0.0, ""
    for name, expected in want.items():
        got = grads["hf." + name]
        assert got.shape == expected.shape, name
        error = float((got - expected).abs().max() / expected.abs().max())
        if error >= worst:
            worst, where = error, name
    return abs(loss - want_loss) / abs(want_loss), worst, where


def check_world(result: dict, plans: dict, references: dict) -> None:
    failures = []
    for variant, by_mode in plans.items():
        for mode, by_planner in by_mode.items():
            assert list(by_planner) == plan_names(variant, mode)
            assert mode != "fsdp" or all(plan["lockstep"] for plan in by_planner.values())
            for planner in by_planner:
                loss, grad, where = errors_of(result[variant, mode, planner], references[variant])
                if loss > LOSS_RTOL or grad > GRAD_RTOL:
                    failures.append(f"{variant} {mode} {planner}: loss {loss:.1e}, "
                                    f"gradient {grad:.1e} ({where})")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------------------------
# every planner (on Llama), every family, every sharding mode


@pytest.mark.slow
def test_plans_give_transformers_gradient_on_4_ranks(world4, references):
    result, plans = world4
    check_world(result, plans, references)
    # the plans ran sequence parallelism at every degree, several waves and recomputation
    plain = [Plan.from_dict(p) for by_mode in plans.values() for p in by_mode["plain"].values()]
    assert {d for p in plain for d in p.degrees_used()} == {1, 2, 4}
    assert max(len(p.waves) for p in plain) >= 2
    levels = {mb.recompute for p in plain for _, _, mb in p.micro_batches() if mb.seq_ids}
    assert 1.0 in levels and 0.0 in levels


@pytest.mark.slow
def test_tied_matrix_gets_embedding_and_head_gradient(world4, references):
    # The tied matrix is one parameter (no lm_head entry), and its gradient, which the test
    # above compares, holds the head's share: rows of tokens never input still get one.
    _, want = references["qwen2-tied"]
    assert "lm_head.weight" not in want and "lm_head.weight" in references["llama"][1]
    inputs = torch.cat([s[:-1] for s in make_samples()]).unique()
    unseen = torch.ones(COMMON["vocab_size"], dtype=torch.bool)
    unseen[inputs] = False
    assert unseen.any()
    result, _ = world4
    for mode in MODES:
        tied = result["qwen2-tied", mode, "ballast"][1]["hf.model.embed_tokens.weight"]
        assert float(tied[unseen].abs().max()) > 0.01 * float(tied.abs().max())
        untied = result["llama", mode, "ballast"][1]["hf.model.embed_tokens.weight"]
        assert float(untied[unseen].abs().max()) == 0.0


@pytest.mark.slow
def test_degree_the_heads_do_not_divide_is_a_value_error_before_any_collective(world4):
    message = world4[0]["degree-error"]
    assert message.startswith("ValueError") and "SP degree 4" in message and "heads (2)" in message


@pytest.mark.slow
def test_print_measured_errors(world4, references):
    result, plans = world4
    for variant, by_mode in plans.items():
        for mode, by_planner in by_mode.items():
            errors = [errors_of(result[variant, mode, p], references[variant]) for p in by_planner]
            loss = max(e[0] for e in errors)
            grad, where = max((e[1], e[2]) for e in errors)
            print(f"{variant:18} {mode:6} loss {loss:.1e} gradient {grad:.1e} ({where})")


# --------------------------------------------------------------------------------------------
# in this process: loading, the wrapper alone, and user errors


def test_shape_and_wrapper_from_a_saved_folder(tmp_path):
    folder = save_model(tmp_path / "llama", "LlamaConfig", tie_word_embeddings=True)
    shape = get_model_shape(f"hf:{folder}")
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.ffn, shape.vocab) == (2, 64, 4, 4, 128, 256)
    assert shape.tied_embeddings and shape.gated_mlp and shape.source == f"hf:{folder}"
    model = build_model(shape)
    hf = model.hf
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    assert [n for n, _ in model.named_parameters()] == ["hf." + n for n, _ in hf.named_parameters()]
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_wrapper_alone_matches_transformers(tmp_path):
    # The wrapper's own forward (local attention over the packed stream, no ranks): the same
    # logits as transformers' eager attention run per sequence, rope scaling included.
    folder = save_model(tmp_path / "rope", "LlamaConfig",
                        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    samples = make_samples()[:5]
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    model = build_model(get_model_shape(f"hf:{folder}"))
    lengths = [s.numel() - 1 for s in samples]
    with torch.no_grad():
        got = model(torch.cat([s[:-1] for s in samples]), PackedStream.from_lengths(lengths))
        want = torch.cat([reference(input_ids=s[None, :-1]).logits[0] for s in samples])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    # and the comparison sees positions: the same weights without the scaling differ by far more
    unscaled = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with torch.no_grad():
        other = torch.cat([unscaled(input_ids=s[None, :-1]).logits[0] for s in samples])
    assert float((other - want).abs().max()) > 1e-2 * float(want.abs().max())


def test_missing_folder():
    with pytest.raises(ValueError, match="hf:/no/such: no config.json"):
        get_model_shape("hf:/no/such")


def test_not_a_causal_lm(tmp_path):
    from transformers import BertConfig, BertModel

    def config() -> BertConfig:
        return BertConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4)

    BertModel(config()).save_pretrained(tmp_path / "bert-model")
    with pytest.raises(ValueError, match=r"model type 'bert' is BertModel, not a causal LM"):
        get_model_shape(f"hf:{tmp_path / 'bert-model'}")
    # A config alone names no architecture (transformers' causal-LM class would be BertLMHeadModel):
    # it is refused for what it is, an encoder, where its shape is read (simulate too).
    config().save_pretrained(tmp_path / "bert-config")
    with pytest.raises(ValueError, match=r"model type 'bert' is an encoder, with attention both ways"):
        get_model_shape(f"hf:{tmp_path / 'bert-config'}")


def test_degree_the_heads_do_not_divide(tmp_path):
    folder = save_model(tmp_path / "two-heads", TWO_HEADS[0], **TWO_HEADS[1])
    shape = get_model_shape(f"hf:{folder}")
    assert shape.heads == 2
    with pytest.raises(ValueError, match=r"SP degree 4 does not divide the attention heads \(2\)"):
        shape.check_degree(4)
    cluster, cost = verify.budget(shape, 4, MAX_LEN)
    assert cost.degrees == [1, 2]
    for name in PLANNERS:  # no planner uses degree 4
        assert max(get_planner(name, cluster, cost, PlannerOptions(max_len=MAX_LEN)).plan(LENGTHS)
                   .degrees_used()) <= 2
    plan = Plan(LENGTHS, [Wave([Group(0, 4, [MicroBatch(list(range(len(LENGTHS))))])])])
    with pytest.raises(PlanError, match="heads"):
        plan.validate(cluster, cost)


def test_kv_heads_a_degree_does_not_divide_are_replicated_and_priced(tmp_path):
    folder = save_model(tmp_path / "mqa", *VARIANTS["llama-mqa"][:1], **VARIANTS["llama-mqa"][1])
    shape = get_model_shape(f"hf:{folder}")
    assert (shape.heads, shape.kv_heads) == (4, 1)
    shape.check_degree(4)
    cluster, cost = verify.budget(shape, 4, MAX_LEN)
    assert cost.degrees == [1, 2, 4]
    # q and out 4 heads each; k and v 1, 2 and 4 heads at degrees 1, 2 and 4
    assert [cost.exchange_bytes(d) / cost.bytes_per_token for d in (2, 4)] == pytest.approx([6 / 5, 8 / 5])


def test_attention_dropout_is_refused_at_build(tmp_path):
    folder = save_model(tmp_path / "dropout", "LlamaConfig", attention_dropout=0.1)
    with pytest.raises(ValueError, match="attention_dropout 0.1 is not supported"):
        build_model(get_model_shape(f"hf:{folder}"))


def test_sliding_window_shorter_than_a_sequence(tmp_path):
    folder = save_model(tmp_path / "mistral", "MistralConfig", sliding_window=16)
    model = build_model(get_model_shape(f"hf:{folder}"))
    model(torch.zeros(16 + 3, dtype=torch.long), PackedStream.from_lengths([16, 3]))  # within the window
    with pytest.raises(ValueError, match="sliding-window attention \\(window 16\\) over a sequence of 17 tokens"):
        model(torch.zeros(17 + 3, dtype=torch.long), PackedStream.from_lengths([3, 17]))


@pytest.mark.parametrize("config_class, overrides, feature", [
    ("Gemma2Config", {"attn_logit_softcapping": 50.0, "head_dim": 16, "query_pre_attn_scalar": 16},
     "attention logit softcapping"),
    ("GptOssConfig", {"num_local_experts": 2, "num_experts_per_tok": 1, "head_dim": 16,
                      "layer_types": ["full_attention"] * 2}, "attention sinks"),
])
def test_attention_features_ballast_does_not_compute_are_refused(tmp_path, config_class, overrides, feature):
    # Their attention functions get `softcap` / `s_aux`: ignoring them would train another model.
    folder = save_model(tmp_path / config_class, config_class, **overrides)
    model = build_model(get_model_shape(f"hf:{folder}"))
    with pytest.raises(ValueError, match=f"uses {feature}"):
        model(torch.zeros(5, dtype=torch.long), PackedStream.from_lengths([5]))


def test_tokenizer_vocab_larger_than_the_model(tmp_path):
    shape = get_model_shape(f"hf:{save_model(tmp_path / 'llama', 'LlamaConfig')}")
    check_vocab(256, shape.vocab, shape.name)
    with pytest.raises(ValueError, match="tokenizer vocab 50257 exceeds llama's vocab 256"):
        check_vocab(50257, shape.vocab, shape.name)
