"""Where models run: the device a run asks for, and mixed precision on it.

Hand-written shared machinery (not generated): the trainer, evaluation, sampling and the
benchmark all choose their device here.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["resolve_device", "autocast"]


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
