"""The benchmark of `minixl bench`: training tokens/s and model FLOPs utilisation of any model.

Hand-written shared machinery (not generated). `bench` builds a run the way `minixl train`
does (`minixl.launch.build_model`: the preset, the objective, the optimiser with its
weight-decay groups, fused on CUDA) and times the trainer's own `train_step` on random
bytes, with the state carried from step to step as in training. `models_suite` (the entry
``models`` of the registry of runs, `minixl bench --suite models`) does it for every model
kind, each in a fresh process so that the peak memory is the model's own. `profile` (the
entry ``profile``) says where a step's time goes: its top operators or GPU kernels.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

from .device import PEAKS, peak_rss_mb, peak_tflops, resolve_device
from .kinds import KINDS, paper_presets, resolve_preset
from .launch import build_model
from .plugins import kind_named
from .training import ModelWithLoss, compile_run, make_optimizer, train_step

__all__ = ["PEAKS", "peak_tflops", "bench", "profile", "step_events", "model_point",
           "models_suite"]

def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _training_step(model: str | None, preset: str | None, *, model_settings: dict | None,
                   objective_options: dict | None, batch_size: int | None, device: str,
                   compile: bool):
    """(the built run, its device, step): a run built the way `minixl train` builds it
    (`minixl.launch.build_model`: the preset, the objective, the optimiser with its
    weight-decay groups, fused on CUDA; compiled as `--compile` compiles it), and step(), one
    `train_step` on the same random bytes, the state carried from step to step."""
    dev = resolve_device(device)
    built = build_model(model, preset, model_settings=model_settings,
                        train_settings={"batch_size": batch_size, "device": str(dev),
                                        "compile": compile},
                        objective_options=objective_options)
    kind, cfg = built.kind, built.config
    net = ModelWithLoss(built.model, built.objective).to(dev)
    opt = make_optimizer([built.model, net.objective_weights], cfg, dev,
                         no_decay=kind.no_decay)
    if compile:
        compile_run(built.model, built.objective)
    T, B = built.length, cfg.batch_size
    tokens = torch.randint(0, 256, (B, T + 1), device=dev)
    x, y = tokens[:, :-1], tokens[:, 1:]  # inputs and their next-byte targets
    state = None

    def step():
        nonlocal state
        _, state, _ = train_step(net, opt, x, y, state, grad_clip=cfg.grad_clip, device=dev)

    return built, dev, step


def bench(model: str | None = None, preset: str | None = None, *,
          model_settings: dict | None = None, objective_options: dict | None = None,
          batch_size: int | None = None, steps: int = 20, warmup: int = 5,
          device: str = "auto", compile: bool = False, peak: float | None = None) -> dict:
    """Training throughput (forward, backward, AdamW step: `minixl.training.train_step`, with
    the optimiser `minixl train` makes) in tokens/s, and MFU on CUDA, of a model kind at a
    preset (config fields overridden by model_settings; batch_size None: the preset's);
    warmup_s is the untimed steps' time, a compiled model's compiling included."""
    if (batch_size is not None and batch_size < 1) or steps < 1 or warmup < 0:
        raise ValueError(f"need batch_size >= 1, steps >= 1 and warmup >= 0, got {batch_size}, "
                         f"{steps} and {warmup}")
    built, dev, step = _training_step(model, preset, model_settings=model_settings,
                                      objective_options=objective_options,
                                      batch_size=batch_size, device=device, compile=compile)
    kind, T, B = built.kind, built.length, built.config.batch_size
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    _sync(dev)
    warmup_s = time.perf_counter() - t0  # compiling, with --compile
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(dev)
    tokens_per_s = steps * B * T / (time.perf_counter() - t0)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = peak if peak is not None else (peak_tflops(name) if dev.type == "cuda" else None)
    # the step timed is the objective's, so its FLOPs count what the objective adds
    achieved = kind.training_flops_per_token(built.model, built.objective) * tokens_per_s / 1e12
    return {"device": name, "model": kind.name, "preset": built.preset,
            "params": sum(p.numel() for p in built.model.parameters()),
            "tokens_per_s": tokens_per_s, "tflops": achieved, "peak_tflops": peak,
            "mfu": achieved / peak if peak else None, "batch_size": B, "seq_len": T,
            "steps": steps, "compile": compile, "warmup_s": warmup_s,
            "dtype": "bf16 autocast" if dev.type == "cuda" else "fp32"}


def step_events(events, *, cuda: bool) -> list[tuple[str, float, int]]:
    """(name, self time in microseconds, calls) of the profiler's averaged events that add up
    to the steps' time, longest first: on CUDA the GPU's own events (kernels, copies), whose
    time is not also counted in the operators that launched them; on a CPU the operators, by
    their CPU self time. Ranges a program annotates (the optimiser's step, a compiled graph's
    call) hold other events' time and are left out."""
    from torch.autograd import DeviceType

    picked = []
    for e in events:
        if getattr(e, "is_user_annotation", False):
            continue
        if e.device_type == (DeviceType.CUDA if cuda else DeviceType.CPU):
            us = e.self_device_time_total if cuda else e.self_cpu_time_total
            if us > 0:
                picked.append((e.key, us, e.count))
    return sorted(picked, key=lambda p: -p[1])


def profile(presets: str = "t12,xl-base,segtree-base", *, batch_size: int | None = None,
            warmup: int = 3, steps: int = 2, top: int = 15, device: str = "auto",
            compile: bool = False) -> list[dict]:
    """Where a training step's time goes: `steps` steps (after `warmup`, where a compiled
    model compiles) of each preset (a paper-scale preset, or MODEL/PRESET) under
    torch.profiler, and its `top` operators by self time: on CUDA the kernels' time on the
    GPU, on a CPU the operators' time on it; each with its share of all of them (whose sum
    per step is all_ms_per_step) and its calls per step. Every preset in this process, one
    after the other."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    if steps < 1 or warmup < 0 or top < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0 and top >= 1, got {steps}, {warmup} "
                         f"and {top}")
    rows = []
    for item in (p.strip() for p in presets.split(",") if p.strip()):
        model, _, preset = item.rpartition("/")
        built, dev, step = _training_step(model or None, preset, model_settings=None,
                                          objective_options=None, batch_size=batch_size,
                                          device=device, compile=compile)
        for _ in range(warmup):
            step()
        _sync(dev)
        cuda = dev.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with torch_profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            _sync(dev)
        events = step_events(prof.key_averages(), cuda=cuda)
        total = sum(us for _, us, _ in events)
        where = torch.cuda.get_device_name(dev) if cuda else "cpu"
        for rank, (name, us, calls) in enumerate(events[:top], start=1):
            rows.append({"preset": item, "model": built.kind.name, "device": where,
                         "compile": compile, "batch_size": built.config.batch_size,
                         "seq_len": built.length, "rank": rank, "name": name,
                         "ms_per_step": us / 1e3 / steps, "share": us / total,
                         "calls_per_step": calls / steps, "all_ms_per_step": total / 1e3 / steps})
        del built, step
        if cuda:
            torch.cuda.empty_cache()
    return rows


def model_point(model: str, preset: str, *, batch_size: int | None = None, steps: int = 10,
                warmup: int = 3, device: str = "auto", compile: bool = False,
                peak: float | None = None) -> dict:
    """One row of the models suite: `bench` of one kind at one preset, with the peak memory:
    CUDA's max_memory_allocated, or on the CPU this process's peak RSS (VmHWM), which
    includes Python and torch themselves; run it in a fresh process (models_suite does)."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    r = bench(model, preset, batch_size=batch_size, steps=steps, warmup=warmup, device=device,
              compile=compile, peak=peak)
    if dev.type == "cuda":
        memory, how = torch.cuda.max_memory_allocated(dev) / 2**20, "max_memory_allocated"
    else:
        memory, how = peak_rss_mb(), "peak RSS of the process"
    return {"model": r["model"], "preset": r["preset"], "device": r["device"],
            "torch": torch.__version__, "dtype": r["dtype"], "compile": compile,
            "params": r["params"], "batch_size": r["batch_size"], "seq_len": r["seq_len"],
            "tokens_per_s": r["tokens_per_s"], "tflops": r["tflops"],
            "peak_tflops": r["peak_tflops"], "mfu": r["mfu"], "peak_mb": memory,
            "memory": how, "warmup_s": r["warmup_s"]}


def _in_fresh_process(call: str, imports: str = "") -> dict:
    """Run `minixl.bench.<call>` in a new Python process (after `imports`); its JSON result."""
    code = "; ".join(filter(None, [imports, "import json", "from minixl import bench",
                                   f"print(json.dumps(bench.{call}))"]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{call.split('(')[0]} failed: {last}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def models_suite(preset: str | None = None, models: str | list | None = None,
                 batch_size: int | None = None, steps: int = 10, warmup: int = 3,
                 device: str = "auto", compile: bool = False,
                 peak_tflops: float | None = None) -> list[dict]:
    """`model_point` for every kind (or those named in models) at preset (None: each kind's
    paper-scale preset, else base: ModelKind.scale_preset), each in a fresh process. A kind
    of your own (MODULE:NAME) is imported there too."""
    names = (list(KINDS) if models is None else
             [m.strip() for m in models.split(",") if m.strip()] if isinstance(models, str)
             else list(models))
    papers = paper_presets()
    rows = []
    for name in names:
        kind, _ = resolve_preset(kind_named(name), None)  # a clear error, here
        if preset in papers and papers[preset] != kind.name:
            continue  # a paper-scale preset: its own model only
        point = kind.scale_preset if preset is None else preset
        imports = (f"from minixl.plugins import load_kind; load_kind({kind.source!r})"
                   if kind.source else "")  # a kind of your own: import it there too
        rows.append(_in_fresh_process(
            f"model_point({name!r}, {point!r}, batch_size={batch_size!r}, steps={steps!r}, "
            f"warmup={warmup!r}, device={device!r}, compile={compile!r}, peak={peak_tflops!r})",
            imports))
    return rows
