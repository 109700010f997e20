"""DeepSpeed-Ulysses, run with DeepSpeed's own code, against ballast on the same model and batches.

The peer trains the tiny Hugging Face Llama of bench/hf.sh (a transformers LlamaForCausalLM,
random weights from the seed) on the batches `ballast bench` draws (ballast's own data pipeline,
`ballast.bench.setting.prepare`: stdlib corpus, same seed, token budget and max-len), the way a
DeepSpeed-Ulysses user trains it:

  - `deepspeed.init_distributed(dist_backend="gloo")` (DS_ACCELERATOR=cpu);
  - attention: `deepspeed.sequence.layer.DistributedAttention` at one fixed SP degree over every
    rank (2 here), registered with transformers' `AttentionInterface` and selected with
    `set_attn_implementation`, so q, k and v come from the model's own projections and RoPE;
  - packing: the step's sequences are concatenated into one stream (one micro-batch per step,
    no gradient accumulation), padded at the end to a multiple of the SP degree, and rank r
    holds the r-th contiguous 1/sp of it; `position_ids` restart at 0 for every packed sequence;
  - the DeepSpeed engine (`deepspeed.initialize`) with ZeRO stage 2 (the stage accelerate's
    DeepSpeed plugin defaults to), fp32, torch's AdamW passed in as the client optimizer
    (what the HF Trainer does when the DeepSpeed config names no optimizer); same lr as ballast.
    ZeRO-3 runs on CPU/gloo too (`--zero-stage 3`, the same losses), but measured ~1.5x slower on
    these steps: it all-gathers every layer's parameters in forward and again in backward, which
    a 1M-parameter model on 2 ranks of one host does not need; ZeRO-2 is the stronger peer here.

The loss is ballast's normalisation: summed token loss of the step / the step's tokens. Each
rank computes the summed loss of its shard over the step's tokens; DeepSpeed averages gradients
over its data-parallel group (here all ranks, as no mpu is given), so the rank backpropagates
that times the world size, and the mean over ranks is exactly d(sum over ranks)/dθ: the
single-process gradient of the whole step, as ballast's SUM all-reduce computes it.

Measurement is `ballast bench`'s: one gloo job (ballast's `run_local`) in which every rank holds
ballast's `static` (SP degree 2) and `ballast` executors and the DeepSpeed engine, each its own
copy of the model from the same seed; the schedule is ballast's (`setting.schedule`: warm-up,
then rounds over the measured batches, systems interleaved per step with the order rotated);
a barrier before each step, the step's wall time is the slowest rank's. tokens/s as in
`ballast.bench.summary`: per batch the median over rounds of the step time, then total tokens
over the sum of those medians. Peak memory: a separate job per system (same batches, one round)
so that one process's peak is one system's, read as the ranks' peak RSS (`ru_maxrss`).

Usage (in the peers virtualenv, see bench/peers/requirements.txt):
    python bench/peers/deepspeed_ulysses.py --json bench/results/peers-deepspeed.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
PEER = "deepspeed-ulysses"
BALLAST = ("static", "ballast")
ATTENTION = "deepspeed_ulysses"
ZERO_STAGE = 2
IGNORE = -100
"""Target of the padding tokens at the end of the packed stream (cross_entropy's ignore_index)."""
LLAMA = dict(vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=8192, tie_word_embeddings=False,
             architectures=["LlamaForCausalLM"])
"""bench/hf.sh's tiny Llama (the `tiny` preset's shape)."""


def ensure_model(folder: Path) -> Path:
    """bench/hf.sh's model folder (config only: random weights from the seed), written if missing."""
    if not (folder / "config.json").is_file():
        from transformers import LlamaConfig

        LlamaConfig(**LLAMA).save_pretrained(folder)
    return folder


# --- the peer: DeepSpeed-Ulysses on a transformers model ---------------------------------------

def _local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bounds: list[int],
                     scaling: float | None) -> torch.Tensor:
    """DistributedAttention's local attention: [1, S, H/sp, hd] q (k, v [1, S, KV/sp, hd]) over the
    gathered *whole* packed stream of S tokens, out [1, S, H/sp, hd].

    Causality must not cross a packed sequence's boundary: after Ulysses' all-to-all every rank
    holds all S tokens of its heads, so `bounds` (the packed stream's cu_seqlens, the same on
    every rank) cut it into its sequences and each runs its own causal SDPA (4-D inputs: PyTorch's
    CPU flash kernel, no S x S mask; grouped-query heads through enable_gqa). This is the
    per-sequence equivalent of a varlen kernel's block-diagonal causal mask; the padding at the
    stream's end is a sequence of its own, so real tokens never attend to it.
    """
    out = [F.scaled_dot_product_attention(q[:, a:b].transpose(1, 2), k[:, a:b].transpose(1, 2),
                                          v[:, a:b].transpose(1, 2), is_causal=True, scale=scaling,
                                          enable_gqa=True).transpose(1, 2)
           for a, b in zip(bounds, bounds[1:]) if b > a]
    return torch.cat(out, dim=1)


_DIST_ATTENTION = None


def _ulysses_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature (q [1, H, s, hd], k, v [1, KV, s, hd] of this
    rank's s = S/sp tokens) over DeepSpeed's DistributedAttention; out [1, s, H, hd]."""
    if dropout:
        raise ValueError("attention dropout is not supported")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [b, s/sp, heads, hd]: batch_dim_idx 0
    out = _DIST_ATTENTION(q, k, v, 0, None, bounds=kwargs["ulysses_bounds"], scaling=scaling)
    return out, None


def install_ulysses(group) -> None:
    """Register DistributedAttention with transformers: scatter heads (dim 2), gather sequence (dim 1)."""
    global _DIST_ATTENTION
    from deepspeed.sequence.layer import DistributedAttention
    from transformers import AttentionInterface

    _DIST_ATTENTION = DistributedAttention(_local_attention, group, scatter_idx=2, gather_idx=1)
    AttentionInterface.register(ATTENTION, _ulysses_attention)


def build_peer_model(folder: Path, seed: int):
    """The transformers model as ballast's `build_hf` makes it (same seed, so the same weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.set_attn_implementation(ATTENTION)
    model.train()
    return model


def build_engine(folder: Path, seed: int, lr: float, zero_stage: int = ZERO_STAGE):
    import deepspeed

    model = build_peer_model(folder, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  # ballast's optimizer and defaults
    config = dict(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, gradient_clipping=0.0,
                  zero_optimization=dict(stage=zero_stage), fp16=dict(enabled=False), bf16=dict(enabled=False),
                  steps_per_print=10**9, wall_clock_breakdown=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def pack(samples: list[torch.Tensor], sp: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], int]:
    """The step's sequences as one packed stream padded to a multiple of sp: inputs, targets,
    position_ids (restarting per sequence), cu_seqlens bounds (padding as its own sequence), tokens."""
    lengths = [len(s) - 1 for s in samples]
    tokens = sum(lengths)
    pad = -tokens % sp
    inputs = torch.cat([s[:-1] for s in samples] + [samples[0].new_zeros(pad)])
    targets = torch.cat([s[1:] for s in samples] + [samples[0].new_full((pad,), IGNORE)])
    positions = torch.cat([torch.arange(n) for n in lengths + [pad]])
    bounds = [0]
    for n in lengths + ([pad] if pad else []):
        bounds.append(bounds[-1] + n)
    return inputs, targets, positions, bounds, tokens


def peer_step(engine, samples: list[torch.Tensor]) -> float:
    """One DeepSpeed optimizer step on the packed batch; the step's loss (summed / tokens)."""
    sp, rank = dist.get_world_size(), dist.get_rank()
    inputs, targets, positions, bounds, tokens = pack(samples, sp)
    shard = slice(rank * len(inputs) // sp, (rank + 1) * len(inputs) // sp)
    logits = engine(input_ids=inputs[shard][None], position_ids=positions[shard][None], use_cache=False,
                    ulysses_bounds=bounds).logits[0]
    loss = F.cross_entropy(logits, targets[shard], ignore_index=IGNORE, reduction="sum") / tokens
    engine.backward(loss * engine.dp_world_size)  # DeepSpeed averages over dp ranks: see the docstring
    engine.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return float(total)


# --- the rank loop: ballast's executors and the peer, interleaved --------------------------------

def run_on_rank(inputs, setting, folder: str, systems: tuple[str, ...], repeats: int | None = None,
                zero_stage: int = ZERO_STAGE):
    """Every slot of ballast's schedule over `systems` on this rank; rank 0 returns the records,
    with the ranks' peak RSS (bytes) at the end."""
    import deepspeed
    from ballast.bench.ranks import LEARNING_RATE, _executor, _plan, batch_digest, make_planners
    from ballast.bench.setting import schedule
    from ballast.runtime import ProcessGroups, broadcast_plan

    rank = dist.get_rank()
    # What torchrun (or the deepspeed launcher) would set; the engine asserts LOCAL_RANK.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(dist.get_world_size()))
    deepspeed.init_distributed(dist_backend="gloo")  # joins the gloo group run_local made
    groups = ProcessGroups()
    ours = [s for s in systems if s != PEER]
    executors = {name: _executor(inputs, groups, setting.seed) for name in ours}
    planners = make_planners(inputs, setting) if rank == 0 and ours else {}
    engine = None
    if PEER in systems:
        install_ulysses(dist.group.WORLD)
        engine = build_engine(Path(folder), setting.seed, LEARNING_RATE, zero_stage)
    plans, records = {}, []
    for slot in schedule(systems, setting.steps, setting.warmup, repeats or setting.repeats):
        samples = inputs.batches[slot.batch].samples
        if slot.planner != PEER:
            plan = None
            if rank == 0:
                plan, _ = _plan(planners[slot.planner], plans, slot, inputs.batches[slot.batch])
            plan, _ = broadcast_plan(plan)
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        if slot.planner == PEER:
            loss, layout = peer_step(engine, samples), dict(micro_batches=1, degrees=[dist.get_world_size()])
        else:
            loss = executors[slot.planner].step(plan, samples).loss
            layout = dict(micro_batches=plan.busy_micro_batches(), degrees=plan.degrees_used())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows = torch.zeros(dist.get_world_size(), 3, dtype=torch.float64)
        rows[rank] = torch.tensor([wall, cpu, batch_digest(samples)], dtype=torch.float64)
        dist.all_reduce(rows)
        records.append(dict(round=slot.round, step=slot.step, batch=slot.batch, planner=slot.planner,
                            position=slot.position, tokens=inputs.batches[slot.batch].num_tokens, loss=loss,
                            step_s=float(rows[:, 0].max()), cpu_share=float(rows[:, 1].sum() / rows[:, 0].sum()),
                            digests=rows[:, 2].tolist(), **layout))
    peak = torch.zeros(dist.get_world_size(), dtype=torch.float64)
    peak[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    dist.all_reduce(peak)
    described = None if engine is None else dict(  # what the engine actually runs
        zero_stage=engine.zero_optimization_stage(), optimizer=type(engine.optimizer).__name__,
        dp_world_size=engine.dp_world_size, attention=engine.module.config._attn_implementation)
    return dict(records=records, peak_rss=peak.tolist(), engine=described) if rank == 0 else None


# --- summary -----------------------------------------------------------------------------------

def loss_agreement(records: list[dict], system: str, reference: str = "static") -> dict:
    """Per (round, step) in schedule order, `system`'s loss against `reference`'s on the same batch."""
    by = {(r["round"], r["step"], r["planner"]): r["loss"] for r in records}
    rows = []
    for (rd, k, p), loss in by.items():
        if p == system and (rd, k, reference) in by:
            ref = by[(rd, k, reference)]
            rows.append(dict(round=rd, step=k, loss=loss, reference=ref, abs=abs(loss - ref),
                             rel=abs(loss - ref) / abs(ref)))
    return dict(reference=reference, max_abs=max(r["abs"] for r in rows), max_rel=max(r["rel"] for r in rows),
                steps=rows)


def summarise(records: list[dict], systems: tuple[str, ...], peak_rss: dict[str, list[float]]) -> dict:
    from ballast.bench.summary import paired_speedups, same_batches, timing_summary

    measured = [r for r in records if r["round"] >= 0]
    out = {name: timing_summary([r for r in measured if r["planner"] == name]) for name in systems}
    paired = paired_speedups(measured, PEER)
    for name, s in out.items():
        s["vs_deepspeed"] = s["tokens_per_s"] / out[PEER]["tokens_per_s"]
        s["vs_deepspeed_paired"] = paired.get(name)
        s["vs_deepspeed_rounds"] = [x / b for x, b in zip(s["tokens_per_s_rounds"], out[PEER]["tokens_per_s_rounds"])]
        s["peak_rss_mb"] = [x / 1e6 for x in peak_rss.get(name, [])]
        if name != "static":
            s["loss_vs_static"] = loss_agreement(records, name)
    noise = statistics.median(
        (max(v) - min(v)) / statistics.median(v) for n, s in out.items() if n != PEER
        for v in [s["vs_deepspeed_rounds"]])
    return dict(systems=out, relative_noise=noise, same_batches=same_batches(records))


def targets(summary: dict) -> dict:
    s, noise = summary["systems"], summary["relative_noise"]
    return dict(
        ballast_vs_deepspeed=dict(value=s["ballast"]["vs_deepspeed"], target=1.3, met=s["ballast"]["vs_deepspeed"] >= 1.3),
        static_vs_deepspeed=dict(value=s["static"]["vs_deepspeed"], noise=noise,
                                 met=s["static"]["vs_deepspeed"] >= 1.0 - noise))


# --- the command -------------------------------------------------------------------------------

def bench_setting(args):
    from ballast.bench.setting import BenchSetting

    planner = dataclasses.replace(BenchSetting().planner, max_len=args.max_len, degree=args.world, seed=args.seed)
    return BenchSetting(model=f"hf:{args.model}", data=args.data, world=args.world, planners=BALLAST,
                        steps=args.steps, warmup=args.warmup, repeats=args.repeats,
                        tokens_per_step=args.tokens_per_step, cost=args.cost,
                        device_memory_gb=args.device_memory_gb, planner=planner)


def run(args) -> dict:
    """The interleaved job, then one memory job per system; the result JSON."""
    import deepspeed
    from ballast.bench.setting import prepare
    from ballast.profile.machine import LoadMonitor, machine_info
    from ballast.runtime import run_local

    start = time.perf_counter()
    folder = ensure_model(Path(args.model))
    setting = bench_setting(args)
    inputs = prepare(setting, progress=False)
    systems = BALLAST + (PEER,)
    with LoadMonitor() as load:
        main = run_local(setting.world, run_on_rank, inputs, setting, str(folder), systems, None,
                         args.zero_stage, timeout=args.timeout)[0]
    peak = {}
    if not args.skip_memory:
        with LoadMonitor() as memory_load:
            for name in systems:
                peak[name] = run_local(setting.world, run_on_rank, inputs, setting, str(folder), (name,), 1,
                                       args.zero_stage, timeout=args.timeout)[0]["peak_rss"]
    summary = summarise(main["records"], systems, peak)
    return dict(
        setting=dict(vars(args)), ballast_setting=dict(setting.__dict__), data=inputs.data,
        batches=[dict(lengths=b.lengths, measured=i >= setting.warmup) for i, b in enumerate(inputs.batches)],
        peer=dict(name=PEER, deepspeed=deepspeed.__version__, torch=torch.__version__, engine=main["engine"],
                  attention="deepspeed.sequence.layer.DistributedAttention, per-sequence causal SDPA local attention",
                  sp_degree=setting.world, packing="one packed stream per step, contiguous 1/sp shard per rank"),
        memory=dict(how="peak RSS (ru_maxrss) of each rank in a job training that system alone: warm-up + "
                        "1 round of the measured batches",
                    load_average=memory_load.summary() if peak else None),
        machine=machine_info(setting.world), load_average=load.summary(),
        seconds=time.perf_counter() - start, **summary, targets=targets(summary),
        interleaved_job_peak_rss_mb=[x / 1e6 for x in main["peak_rss"]], records=main["records"])


def print_table(result: dict) -> None:
    load = result["load_average"]
    print(f"{result['data']}; {result['seconds']:.0f} s; load average {load['min']:.1f}..{load['max']:.1f} "
          f"(median {load['median']:.1f}) on {load['cpus']} CPUs; same batches: {result['same_batches']}")
    print(f"{'system':<18}{'tokens/s':>10}{'vs DS':>8}{'paired':>8}{'spread':>8}{'step s':>8}"
          f"{'loss max abs':>14}{'max rel':>10}{'peak RSS MB/rank':>20}")
    for name, s in result["systems"].items():
        agree = s.get("loss_vs_static")
        print(f"{name:<18}{s['tokens_per_s']:>10,.0f}{s['vs_deepspeed']:>7.2f}x{s['vs_deepspeed_paired']:>7.2f}x"
              f"{s['round_spread']:>8.1%}{s['step_s']:>8.3f}"
              f"{(agree['max_abs'] if agree else 0):>14.2e}{(agree['max_rel'] if agree else 0):>10.2e}"
              f"{' / '.join(f'{x:.0f}' for x in s['peak_rss_mb']):>20}")
    for name, t in result["targets"].items():
        print(f"target {name}: {'met' if t['met'] else 'not met'} ({t})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="runs/hf-tiny-llama", help="HF folder (written like bench/hf.sh's if missing)")
    p.add_argument("--data", default="stdlib")
    p.add_argument("--world", type=int, default=2, help="gloo ranks = the SP degree of both static and the peer")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokens-per-step", type=int, default=16384)
    p.add_argument("--max-len", type=int, default=8192)
    p.add_argument("--cost", default="bench/results/hf-llama-profile.json", help="ballast's cost model (bench/hf.sh's profile)")
    p.add_argument("--device-memory-gb", type=float, default=None,
                   help="ballast's memory budget per rank (default: `ballast bench`'s, where a max-len sequence "
                        "fits without recomputation only at SP degree 2); the peer is given none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zero-stage", type=int, default=ZERO_STAGE, choices=(0, 1, 2, 3),
                   help=f"the peer's ZeRO stage (default {ZERO_STAGE})")
    p.add_argument("--skip-memory", action="store_true", help="no per-system memory jobs")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    from ballast.command_line.provenance import provenance

    origin = provenance()
    result = run(args)
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "provenance": origin}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    # The ranks are spawned processes that import this module by name: run it from its folder's name.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import deepspeed_ulysses

    sys.exit(deepspeed_ulysses.main())
