"""Several processes: the process group of a torchrun launch, and the messages the loop sends.

Hand-written shared machinery (not generated); a reader of the loop can skip it. With one
process (no torchrun) every method here is the identity and no collective is ever called.

Launched by torchrun (WORLD_SIZE > 1), every process runs the same loop on its own
contiguous rows of each step's batch under DistributedDataParallel: gloo on the CPU, NCCL on
CUDA with process r on cuda:LOCAL_RANK. Control messages (the stop flag, rank 0's decisions)
go over gloo, on the CPU, so they never wait for the GPU; the window sums and the memory go
over the device's own group. The group is opened once per command (`process_group`, which
`minixl train` holds for the whole command, so that rank 0 says why a run was refused
before any process leaves, and hands to the trainer) and closed by all processes together.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect

import torch
import torch.distributed as dist
import torch.nn as nn

from ..device import autocast, distributed_env, training_device
from . import state as states

__all__ = ["ProcessGroup", "process_group", "wrap_ddp", "CLOSE_WAIT_S"]

CLOSE_WAIT_S = datetime.timedelta(seconds=30)  # how long the end waits for a missing process


class ProcessGroup:
    """This process's place in a run: the only process (world 1), or one of the `world`
    processes torchrun started (WORLD_SIZE, RANK, LOCAL_RANK in the environment). Starts the
    process group when nobody has; an unusable device is reported when `device` is read, so
    that the group exists to end the run together."""

    def __init__(self, device_name: str):
        self.rank, self.local, self.world = distributed_env()
        self.on, self.created, self.control = self.world > 1, False, None
        try:
            self._device, self._error = training_device(device_name), None
        except ValueError as err:
            self._device, self._error = torch.device("cpu"), err
        if not self.on:
            return
        if not dist.is_available():
            raise ValueError("WORLD_SIZE > 1 (a torchrun launch), but this PyTorch has no "
                             "torch.distributed")
        if not dist.is_initialized():
            cuda = self._device.type == "cuda"
            if cuda:
                torch.cuda.set_device(self._device)
            dist.init_process_group("nccl" if cuda else "gloo",
                                    **({"device_id": self._device} if cuda else {}))
            self.created = True
        self.control = (dist.new_group(backend="gloo") if dist.get_backend() != "gloo"
                        else dist.group.WORLD)

    @property
    def device(self) -> torch.device:
        """The device this process trains on (cuda:LOCAL_RANK under torchrun on CUDA)."""
        if self._error is not None:
            raise self._error
        return self._device

    def close(self) -> None:
        """End the process group, all processes together: one that tore its group down while
        another was still tearing down aborted that other (gloo's SIGABRT, seen when every
        process ended on the same refusal). A process that never arrives (it crashed) costs
        the others CLOSE_WAIT_S, then they end alone."""
        if self.created and dist.is_initialized():
            with contextlib.suppress(RuntimeError):
                dist.monitored_barrier(group=self.control, timeout=CLOSE_WAIT_S,
                                       wait_all_ranks=True)
            dist.destroy_process_group()

    def broadcast(self, obj):
        """Rank 0's obj, on every process."""
        if not self.on:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def barrier(self) -> None:
        if self.on:
            dist.barrier(group=self.control)

    def max_int(self, value: int) -> int:
        if not self.on:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return int(t)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of t over the processes (t itself in a one-process run)."""
        if not self.on:
            return t
        t = t.clone()
        dist.all_reduce(t)
        return t / self.world

    def first_bad(self, bad: torch.Tensor) -> int:
        """The earliest positive value of bad (a step) over the processes; 0 if none is."""
        if not self.on:
            return int(bad)
        never = torch.iinfo(torch.int64).max
        t = torch.where(bad > 0, bad, never).to(torch.int64).reshape(1)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return 0 if int(t) == never else int(t)

    def gather_rows(self, state):
        """Every process's rows of a state, put together along dim 0 (rank 0's rows first)."""
        if not self.on or state is None:
            return state

        def gather(t: torch.Tensor) -> torch.Tensor:
            t = t.contiguous()
            parts = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(parts, t)
            return torch.cat(parts, dim=0)

        return states.map_tensors(gather, state)


@contextlib.contextmanager
def process_group(device_name: str):
    """The process group for a command or a run, closed (all processes together) when the
    block ends. Its owner hands it down (`train(..., ranks=...)`): nothing looks it up."""
    group = ProcessGroup(device_name)
    try:
        yield group
    finally:
        group.close()


# Buffers are not synchronised before each forward (newer PyTorch names the switch anew).
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                   inspect.signature(nn.parallel.DistributedDataParallel).parameters
                   else {"broadcast_buffers": False})


def _unused(net: nn.Module, x: torch.Tensor, y: torch.Tensor, state, device) -> bool:
    """Whether some trainable weight gets no gradient from the loss of one micro-batch: then
    DistributedDataParallel must look for such weights in every step (find_unused_parameters,
    a walk over the graph); else it need not. The probe leaves the random state as it was."""
    params = [p for p in net.parameters() if p.requires_grad]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with autocast(device):
            parts, _ = net(x, y, state, 0.0)
        grads = torch.autograd.grad(parts["loss"], params, allow_unused=True)
    return any(g is None for g in grads)


def wrap_ddp(net: nn.Module, x: torch.Tensor, y: torch.Tensor, state,
             device: torch.device) -> nn.Module:
    """net under DistributedDataParallel; x, y (and state) are one micro-batch to probe which
    weights get no gradient (a model's weights for a second segment, when it reads one)."""
    return nn.parallel.DistributedDataParallel(
        net, device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=_unused(net, x, y, state, device),
        **_NO_BUFFER_SYNC)  # buffers are constants here (masks, sinusoids)
