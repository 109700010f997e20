"""The GPU paths: varlen attention kernels and the executor under bf16 autocast on a CUDA rank.

Every test but the first needs a CUDA device and is skipped without one (they collect and
import everywhere). References are computed on the CPU in fp32: the per-sequence SDPA kernel
that `runtime/test_attention` checks against one process, and `ballast.verify`'s whole-batch
single-process gradient.

Tolerances are relative to the largest reference entry (max |got - want| / max |want|, as
`ballast.verify` measures): bf16 keeps 8 significant bits, so each rounding is off by up to
u = 2^-8 = 3.9e-3 of the value.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from runtime_cases import LENGTHS, SHAPE, make_batches

from ballast import verify
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.precision import Precision
from ballast.models import PackedStream, build_gpt
from ballast.models.kernels import KERNELS, attention_kernel, flash_attn_varlen, torch_varlen_attn, torch_varlen_supports
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ProcessGroups, init_distributed, parallelize

pytestmark = pytest.mark.cuda

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device: the varlen attention kernels, bf16 autocast and "
                                       "NCCL run only on GPUs")

# Sequences around flash attention's 128-row tiles (one across two of them, one across three),
# a single token and a few short ones.
STREAM = [1, 5, 130, 64, 257, 3]
HEADS, KV_HEADS, HEAD_DIM = 8, 4, 64
# Forward: the kernels multiply bf16 inputs exactly and accumulate and take the softmax in fp32,
# then round the probabilities to bf16 for P V and the output to bf16: two roundings, <= 2u =
# 7.8e-3 of the largest output. Backward rounds dO, dS and each gradient once more: ~4u = 1.6e-2.
# A mask that crosses a sequence boundary or sees the future moves outputs by O(1).
ATTENTION_FORWARD_TOL, ATTENTION_BACKWARD_TOL = 1e-2, 2e-2
# The executor under bf16 autocast (matmuls, attention and activations in bf16, parameters and
# gradients fp32) against one fp32 process: as `runtime/test_executor`'s bf16 run on the CPU,
# where 4 layers and the loss moved the gradient by 1.2e-2 of its largest entry and the loss
# (a mean over 218 tokens) by 9e-6. A lost or doubled micro-batch moves the gradient by O(1).
BF16_GRAD_TOL, BF16_LOSS_RTOL = 3e-2, 1e-3
# fp32 on the GPU (no TF32: torch's default for matmuls) differs from the CPU by summation order
# only, ~5e-7 of the largest gradient entry between CPU runs; GPU kernels block their sums
# differently and the attention backward accumulates in another order: 1e-4 leaves room.
FP32_GRAD_TOL = 1e-4


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float().cpu() - want).abs().max() / want.abs().max())


def _packed_inputs() -> tuple[torch.Tensor, ...]:
    """q, k, v and an output gradient, rounded to bf16 (then held in fp32)."""
    generator = torch.Generator().manual_seed(0)
    n = sum(STREAM)
    shapes = [(n, HEADS, HEAD_DIM), (n, KV_HEADS, HEAD_DIM), (n, KV_HEADS, HEAD_DIM), (n, HEADS, HEAD_DIM)]
    return tuple(torch.randn(s, generator=generator).bfloat16().float() for s in shapes)


def _check_attention_kernel(kernel) -> None:
    """`kernel` on CUDA bf16 tensors against per-sequence fp32 SDPA on the CPU of the same
    (bf16-rounded) values, forward and backward, causal (text) and bidirectional (video DiTs):
    the comparison measures the kernel alone."""
    bounds = PackedStream.from_lengths(STREAM).bounds
    q, k, v, grad_out = _packed_inputs()
    for causal in (True, False):
        reference = [t.clone().requires_grad_() for t in (q, k, v)]
        want = KERNELS["sdpa"](*reference, bounds, causal)
        want.backward(grad_out)
        on_gpu = [t.cuda().bfloat16().requires_grad_() for t in (q, k, v)]
        got = kernel(*on_gpu, bounds, causal)
        got.backward(grad_out.cuda().bfloat16())
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        # Measured with per-sequence SDPA in bf16 on the CPU: 2.2e-3 forward, 8e-3 backward.
        assert relative_error(got, want.detach()) <= ATTENTION_FORWARD_TOL, causal
        for name, g, r in zip("qkv", on_gpu, reference):
            assert relative_error(g.grad, r.grad) <= ATTENTION_BACKWARD_TOL, (name, causal)


def test_cpu_tensors_run_per_sequence_sdpa_whatever_their_precision():
    # The varlen kernels have no CPU implementation: selection must never hand them CPU tensors.
    q, k, v, _ = _packed_inputs()
    for dtype in (torch.float32, torch.bfloat16):
        assert attention_kernel(q.to(dtype), k.to(dtype), v.to(dtype)) == "sdpa"
        assert not torch_varlen_supports(q.to(dtype), k.to(dtype), v.to(dtype))


@needs_cuda
def test_cuda_attention_matches_per_sequence_fp32_sdpa():
    """The kernel the models use on a GPU: flash-attn's varlen if importable, else PyTorch's
    varlen kernel if it takes the tensors, else per-sequence SDPA."""
    q, k, v = (t.cuda().bfloat16() for t in _packed_inputs()[:3])
    kernel = attention_kernel(q, k, v)
    assert kernel == ("flash-attn" if flash_attn_varlen() is not None else
                      "torch-varlen" if torch_varlen_supports(q, k, v) else "sdpa")
    _check_attention_kernel(KERNELS[kernel])


@needs_cuda
def test_torch_varlen_attention_matches_per_sequence_fp32_sdpa():
    """PyTorch's varlen kernel, whether or not flash-attn would be preferred to it."""
    if torch_varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no varlen_attn with window_size and enable_gqa (torch >= 2.12)")
    q, k, v = (t.cuda().bfloat16() for t in _packed_inputs()[:3])
    if not torch_varlen_supports(q, k, v):
        pytest.skip(f"PyTorch's flash attention does not run on {torch.cuda.get_device_name()} in this build")
    _check_attention_kernel(KERNELS["torch-varlen"])


@pytest.fixture
def one_cuda_rank(monkeypatch):
    """A world of one rank joined as under torchrun, on the backend `init_distributed` selects
    (NCCL with CUDA)."""
    for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="0").items():  # port 0: the store takes a free one
        monkeypatch.setenv(name, value)
    init_distributed()
    yield dist.get_backend()
    dist.destroy_process_group()


@needs_cuda
def test_executor_on_one_cuda_rank_gives_the_cpu_fp32_gradient(one_cuda_rank):
    assert one_cuda_rank == "nccl"
    batch = make_batches()[0]
    # Two micro-batches, one of them with half its blocks recomputed.
    plan = Plan(LENGTHS, [Wave([Group(0, 1, [MicroBatch([0, 1, 2, 3, 4], 0.5), MicroBatch([5, 6, 7, 8, 9])])])])
    groups = ProcessGroups()
    for precision, tolerance in ((Precision.AUTO, BF16_GRAD_TOL), (Precision.FP32, FP32_GRAD_TOL)):
        model = build_gpt(SHAPE).cuda()
        executor = parallelize(model, get_cluster("cpu", world_size=1), groups=groups, precision=precision, lr=1e-3)
        assert executor.bf16 == (precision is Precision.AUTO)  # auto is bf16 on CUDA
        start = verify.flatten(model.parameters()).cpu()
        result = executor.step(plan, batch.samples)
        grads = verify.flatten(p.grad for p in model.parameters()).cpu()
        assert grads.dtype == torch.float32
        expected = verify.reference_at(SHAPE, verify.Trajectory([result.loss], [grads], [start], start), [batch])
        assert relative_error(grads, expected.grads[0]) <= tolerance, precision
        assert result.loss == pytest.approx(expected.losses[0], rel=BF16_LOSS_RTOL if executor.bf16 else tolerance)
