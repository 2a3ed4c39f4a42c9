"""The benchmarks behind `minixl bench`: training tokens/s and model FLOPs utilisation, and
the cost of one attention layer against its length (`--suite segtree`, Chapter 6).

Hand-written shared machinery (not generated). `bench` times the trainer's own `train_step`
on random bytes, with the state carried from step to step as in training, for any model
kind. runs Chapter 6's `attention_layer_cost` for every method and length, in a
fresh process each, so that the peak memory it reports is the layer's own.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from .device import resolve_device
from .models import ModelKind
from .segtree import LAYER_METHODS
from .trainer import next_byte_objective, train_step

__all__ = ["PEAKS", "peak_tflops", "bench", "segtree_suite"]

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


def segtree_suite(*, max_n: int = 4096, min_n: int = 256, csv_path: str | Path,
                  repeats: int = 3, device: str = "auto", methods=LAYER_METHODS) -> list[dict]:
    """Chapter 6's cost sweep: every method at n = min_n, 2 min_n, ..., max_n, each in a fresh
    process running `minixl.segtree.attention_layer_cost`; the rows are written to csv_path
    (atomically) and returned."""
    if min_n < 2 or max_n < min_n:
        raise ValueError(f"need 2 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    sizes = [min_n << i for i in range(int(math.log2(max_n // min_n)) + 1)]
    device = str(resolve_device(device))
    rows = []
    for n in sizes:
        for method in methods:
            code = ("import json; from minixl.segtree import attention_layer_cost; print(json.dumps("
                    f"attention_layer_cost({method!r}, {n}, repeats={repeats}, "
                    f"device={device!r})))")
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if r.returncode != 0:
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"{method} at n={n} failed: {last}")
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    path = Path(csv_path)
    part = path.with_name(path.name + ".part")
    with open(part, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(part, path)
    return rows
