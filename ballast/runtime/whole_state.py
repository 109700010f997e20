"""A rank's model state made whole: its trained parameters, their summed gradients and its part
of the state dict, gathered over FSDP2's shards, ZeRO-1's owners and TP's splits (collectives,
for checks and for writing a trained model out). The executor holds one (`Executor.whole`); the
pipeline's executor gathers every stage's from its stages' (`pipeline/executor.py`)."""
from __future__ import annotations

import torch.distributed as dist
from torch import Tensor, nn

from .fsdp import full_tensor
from .grad_sync import GradSync
from .tensor_parallel import TensorParallel


class WholeState:
    """The trained parameters `params` (named `names`, in that order) of `model` on this rank,
    whole on demand."""

    def __init__(self, model: nn.Module, names: list[str], params: list[Tensor], sync: GradSync | None,
                 pool: dist.ProcessGroup, tensor_parallel: TensorParallel | None):
        self.model, self.names, self.params = model, names, params
        self.sync = sync
        """The gradient sync of replicated weights (None under FSDP2, whose shards are DTensors)."""
        self.pool = pool
        """The process group the sync sums over: ZeRO-1's owners gather over it."""
        self.tensor_parallel = tensor_parallel

    def gradients(self) -> list[Tensor]:
        """The last step's summed gradient of every trained parameter, whole, on every rank of
        the stage (ZeRO-1 and FSDP2 leave each rank its share only, TP its shard)."""
        grads = [full_tensor(p.grad) for p in self.params] if self.sync is None else \
            self.sync.whole(self.params, self.pool)
        return self._over_tensor_parallel(grads)

    def parameters(self) -> list[Tensor]:
        """Every trained parameter, whole, on every rank of the stage, in the order of `names`."""
        return self._over_tensor_parallel([full_tensor(p.detach()) for p in self.params])

    def on_host(self, rank: int) -> dict[str, Tensor]:
        """The state dict whole on global rank `rank`'s host, by name, {} on the other
        ranks: `tensors` in order, one at a time, so a device holds its shards and one tensor
        whole at most (`parameters` gathers the trained ones on every device)."""
        here = dist.get_rank() == rank
        out = {}
        for name, tensor in self.tensors():
            whole = self.tensor(name, tensor)
            if here:
                out[name] = whole.cpu()
        return out

    def tensors(self) -> list[tuple[str, Tensor]]:
        """This rank's part of the state dict by name: the trained parameters, then the untrained
        tensors it holds (persistent buffers, frozen parameters; a tied weight once, under the
        name `named_parameters` gives)."""
        trained = {id(p) for p in self.params}
        rest = [(n, t) for n, t in self.model.state_dict(keep_vars=True).items() if id(t) not in trained]
        return list(zip(self.names, self.params)) + rest

    def tensor(self, name: str, p: Tensor) -> Tensor:
        """Tensor `name` of the state dict whole on this rank's device: FSDP2's shards gathered,
        then TP's (a collective of its shard groups); a buffer as it is."""
        whole = full_tensor(p.detach())
        return whole if self.tensor_parallel is None else self.tensor_parallel.whole([name], [whole])[0]

    def shape(self, name: str, p: Tensor) -> tuple[int, ...]:
        """Tensor `name`'s shape whole (FSDP2's parameters show theirs already; TP's shards not)."""
        return tuple(p.shape) if self.tensor_parallel is None else self.tensor_parallel.whole_shape(name, p.shape)

    def _over_tensor_parallel(self, tensors: list[Tensor]) -> list[Tensor]:
        return tensors if self.tensor_parallel is None else self.tensor_parallel.whole(self.names, tensors)
