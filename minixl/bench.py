"""The benchmark behind `minixl bench`: training tokens/s, and model FLOPs utilisation.

Hand-written shared machinery (not generated). It times the trainer's own `train_step` on
random bytes, with the state carried from step to step as in training, for any model kind.
"""

from __future__ import annotations

import re
import time

import torch

from .device import resolve_device
from .models import ModelKind
from .trainer import next_byte_objective, train_step

__all__ = ["PEAKS", "peak_tflops", "bench"]

# bf16 dense tensor-core peaks (TFLOP/s) from the vendors' data sheets.
PEAKS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0),
         ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("RTX 4090", 165.0)]


def peak_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of a GPU by its name, or None when we do not know it."""
    for key, tflops in PEAKS:
        if re.search(r"(^|\W)" + re.escape(key) + r"($|\W)", device_name, re.IGNORECASE):
            return tflops
    return None


def bench(kind: ModelKind, model_cfg, *, batch_size: int = 32, steps: int = 20, warmup: int = 5,
          device: str = "auto", compile: bool = False, peak: float | None = None) -> dict:
    """Training throughput (forward, backward, AdamW step) in tokens/s, and MFU on CUDA."""
    if batch_size < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"need batch_size >= 1, steps >= 1 and warmup >= 0, got {batch_size}, "
                         f"{steps} and {warmup}")
    dev = resolve_device(device)
    torch.manual_seed(0)
    model = kind.build(model_cfg).to(dev)
    objective = kind.objective(model_cfg, "positions", 1) or next_byte_objective
    own = objective.to(dev) if isinstance(objective, torch.nn.Module) else None
    if compile:
        model.compile()
    params = list(model.parameters()) + (list(own.parameters()) if own is not None else [])
    opt = torch.optim.AdamW(params, lr=1e-4)
    T = getattr(model_cfg, kind.length)
    tokens = torch.randint(0, model_cfg.vocab_size, (batch_size, T + 1), device=dev)
    x, y = tokens[:, :-1], tokens[:, 1:]  # inputs and their next-byte targets
    state = None

    def step():
        nonlocal state
        _, state, _ = train_step(model, objective, opt, params, x, y, state, device=dev)

    for _ in range(warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    tokens_per_s = steps * batch_size * T / (time.perf_counter() - t0)
    flops_per_token = kind.flops(model)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = peak if peak is not None else (peak_tflops(name) if dev.type == "cuda" else None)
    achieved = flops_per_token * tokens_per_s / 1e12
    return {"device": name, "model": kind.name, "params": sum(p.numel() for p in model.parameters()),
            "tokens_per_s": tokens_per_s, "tflops": achieved, "peak_tflops": peak,
            "mfu": achieved / peak if peak else None, "batch_size": batch_size, "seq_len": T,
            "steps": steps, "compile": compile}
