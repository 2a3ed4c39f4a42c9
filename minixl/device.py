"""Where models run: the device a run asks for, and mixed precision on it.

Hand-written shared machinery (not generated): the trainer, evaluation, sampling and the
benchmarks all choose their device here, and read a process's peak memory on the CPU. A run launched by torchrun (one process per GPU)
reads its place from the environment torchrun sets: RANK, LOCAL_RANK and WORLD_SIZE.
"""

from __future__ import annotations

import contextlib
import os

import torch

__all__ = ["resolve_device", "autocast", "distributed_env", "training_device", "peak_rss_mb"]


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU; 'cuda' without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but PyTorch sees no CUDA GPU here; "
                         "use --device auto or --device cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"unknown device {name!r}: expected auto, cpu or cuda[:N]") from err
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA "
                         "GPU(s), numbered from 0")
    return device


def autocast(device: torch.device):
    """bf16 autocast on CUDA; nothing on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def distributed_env() -> tuple[int, int, int]:
    """(rank, local rank, world size) of this process as torchrun sets them; (0, 0, 1) when
    it was not launched by torchrun."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as err:
        raise ValueError(f"WORLD_SIZE, RANK and LOCAL_RANK must be integers (torchrun sets "
                         f"them): {err}") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"need 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0, got RANK={rank}, "
                         f"WORLD_SIZE={world}, LOCAL_RANK={local}")
    return rank, local, world


def training_device(name: str = "auto") -> torch.device:
    """The device this process trains on: resolve_device(name), except that a process of a
    distributed run on CUDA takes the GPU of its local rank (cuda:LOCAL_RANK)."""
    device = resolve_device(name)
    _, local, world = distributed_env()
    if world > 1 and device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local} has no GPU: this machine has "
                             f"{torch.cuda.device_count()}; start at most that many processes "
                             "per node (torchrun --nproc-per-node)")
        device = torch.device("cuda", local)
    return device


def peak_rss_mb(reset: bool = False) -> float | None:
    """This process's peak resident memory in MB (VmHWM, Linux), or None where /proc is
    missing. With reset=True the peak is first set back to the current size, so that a
    later reading minus this one is the growth of what ran in between.

    Not `resource.getrusage().ru_maxrss`: Linux carries that across fork and exec, so a fresh
    process started by one that had grown large starts at its parent's peak (and a
    measurement by difference in the child reads 0)."""
    if reset:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:  # an old kernel or a locked-down /proc: the peak since the start
            pass
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def memory_capacity(device: torch.device) -> tuple[int | None, str]:
    """(bytes a run on `device` may use, where that number comes from): a GPU's total memory,
    or on the CPU the memory Linux says is available now (MemAvailable in /proc/meminfo). None
    where it cannot be read (then nothing is refused on its account)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.total_memory, f"{props.name}'s memory"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "this machine's available memory"
    except OSError:
        pass
    return None, "unknown"
