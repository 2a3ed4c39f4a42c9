"""The benchmarks behind `minixl bench`: training tokens/s and model FLOPs utilisation, and
the suites of `minixl bench --suite NAME` (the `SUITES` registry), each writing a CSV.

Hand-written shared machinery (not generated). `bench` times the trainer's own `train_step`
on random bytes, with the state carried from step to step as in training, for any model
kind. The suites:

- ``models``: `bench` for every model kind at one preset (the paper-scale ones by default),
  each in a fresh process so that the peak memory is the model's own;
- ``hf-xl``: minixl's TransformerXL against Hugging Face's TransfoXLLMHeadModel (transformers
  4.37.x) at the same config, forward + backward tokens/s interleaved in one run;
- ``xl-eval``: evaluation speed of Transformer-XL's memory (keys and values cached, and not)
  against the sliding window, at several attention lengths, with the bpc of both;
- ``segtree``: Chapter 6's `attention_layer_cost` for every method and length, in a fresh
  process each, so that the peak memory it reports is the layer's own.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from .experiments import write_csv  # atomic CSV writing, shared with the experiments
from .device import autocast, resolve_device
from .models import KINDS, PAPER_PRESETS, ModelKind, model_from_checkpoint, resolve_preset
from .segtree import LAYER_METHODS

__all__ = ["PEAKS", "peak_tflops", "bench", "segtree_suite", "models_suite", "hf_xl_suite",
           "xl_eval_suite", "shaw_suite", "sliding_nll", "write_csv", "markdown_table", "Suite", "SUITES",
           "HF_VERSION"]

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
          device: str = "auto", compile: bool = False, peak: float | None = None,
          aux: tuple[str, int] = ("positions", 1)) -> dict:
    """Training throughput (forward, backward, AdamW step) in tokens/s, and MFU on CUDA.

    aux: the objective's (aux_losses, aux_targets), as `minixl train` takes them; the FLOP
    count is the model's alone (Chapter 2's extra classifiers are not counted)."""
    if batch_size < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"need batch_size >= 1, steps >= 1 and warmup >= 0, got {batch_size}, "
                         f"{steps} and {warmup}")
    dev = resolve_device(device)
    torch.manual_seed(0)
    model = kind.build(model_cfg).to(dev)
    from .trainer import next_byte_objective, train_step  # only when timing: `minixl
    # sample` and `eval` build the parser, which lists the suites, but never train

    objective = kind.objective(model_cfg, *aux) or next_byte_objective
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
            "steps": steps, "compile": compile,
            "dtype": "bf16 autocast" if dev.type == "cuda" else "fp32"}


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
    write_csv(rows, csv_path)
    return rows


# ---------------------------------------------------------------- the suites' common parts

def _cell(value) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """The rows as a markdown table (all columns, or the named ones)."""
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _in_fresh_process(call: str) -> dict:
    """Run `minixl.bench.<call>` in a new Python process; its JSON result."""
    code = f"import json; from minixl import bench; print(json.dumps(bench.{call}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{call.split('(')[0]} failed: {last}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _peak_rss_mb() -> float | None:
    """This process's peak resident memory (VmHWM, Linux) in MB, or None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# ---------------------------------------------------------------- models

# The models suite's default: each kind at its paper-scale preset (shaw has none: its base).
PAPER_SCALE = {**{kind: name for name, kind in PAPER_PRESETS.items()}, "shaw": "base"}


def model_point(model: str, preset: str, *, batch_size: int | None = None, steps: int = 10,
                warmup: int = 3, device: str = "auto", compile: bool = False,
                peak: float | None = None) -> dict:
    """One row of the models suite: `bench` of one kind at one preset (its training batch
    unless batch_size says otherwise, its preset's auxiliary losses), with the peak memory:
    CUDA's max_memory_allocated, or on the CPU this process's peak RSS (VmHWM), which
    includes Python and torch themselves; run it in a fresh process (models_suite does)."""
    kind, preset = resolve_preset(model, preset)
    model_cfg, train_kw = kind.preset(preset)
    batch_size = batch_size or train_kw["batch_size"]
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    r = bench(kind, model_cfg, batch_size=batch_size, steps=steps, warmup=warmup, device=device,
              compile=compile, peak=peak, aux=kind.aux_defaults(preset))
    if dev.type == "cuda":
        memory, how = torch.cuda.max_memory_allocated(dev) / 2**20, "max_memory_allocated"
    else:
        memory, how = _peak_rss_mb(), "peak RSS of the process"
    return {"model": kind.name, "preset": preset, "device": r["device"],
            "torch": torch.__version__, "dtype": r["dtype"], "compile": compile,
            "params": r["params"], "batch_size": batch_size, "seq_len": r["seq_len"],
            "tokens_per_s": r["tokens_per_s"], "tflops": r["tflops"],
            "peak_tflops": r["peak_tflops"], "mfu": r["mfu"], "peak_mb": memory,
            "memory": how}


def models_suite(*, preset: str | None = None, batch_size: int | None = None, steps: int = 10,
                 warmup: int = 3, device: str = "auto", compile: bool = False,
                 peak: float | None = None, models=None) -> list[dict]:
    """`model_point` for every kind (or those named in models) at preset (None: the paper-
    scale ones, PAPER_SCALE), each in a fresh process."""
    models = list(KINDS) if models is None else list(models)
    rows = []
    for name in models:
        if preset is None:
            point = PAPER_SCALE[name]
        elif preset in PAPER_PRESETS:  # a paper-scale preset: its own model only
            if PAPER_PRESETS[preset] != name:
                continue
            point = preset
        else:
            point = preset
        rows.append(_in_fresh_process(
            f"model_point({name!r}, {point!r}, batch_size={batch_size!r}, steps={steps!r}, "
            f"warmup={warmup!r}, device={device!r}, compile={compile!r}, peak={peak!r})"))
    return rows


# ---------------------------------------------------------------- hf-xl

HF_VERSION = "4.37"  # the last transformers release line whose TransfoXL runs
HF_INSTALL = ("pip install 'minixl[hf-transfoxl]' (transformers==4.37.2) in an environment of "
              "its own: the dev extra needs transformers>=5")


def _transfoxl():
    """Hugging Face's TransfoXL classes, or a clear error when transformers 4.37.x is absent."""
    try:
        import transformers
    except ImportError:
        raise ValueError(f"--suite hf-xl needs transformers {HF_VERSION}.x, which is not "
                         f"installed: {HF_INSTALL}") from None
    if not transformers.__version__.startswith(HF_VERSION + "."):
        raise ValueError(f"--suite hf-xl needs transformers {HF_VERSION}.x (TransfoXL was "
                         f"removed later), found {transformers.__version__}: {HF_INSTALL}")
    import warnings

    with warnings.catch_warnings():  # TransfoXL is deprecated in 4.37: it says so on import
        warnings.simplefilter("ignore")
        from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    return TransfoXLConfig, TransfoXLLMHeadModel


def hf_transfoxl(cfg) -> torch.nn.Module:
    """Hugging Face's TransfoXLLMHeadModel at a minixl TransformerXLConfig: bytes (vocab 256),
    no adaptive softmax or embedding (cutoffs [], div_val 1), the same dropout and norm."""
    TransfoXLConfig, TransfoXLLMHeadModel = _transfoxl()
    hf = TransfoXLConfig(
        vocab_size=cfg.vocab_size, cutoffs=[], div_val=1, adaptive=False, d_model=cfg.d_model,
        d_embed=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, d_inner=cfg.d_inner,
        n_layer=cfg.n_layer, tgt_len=cfg.tgt_len, mem_len=cfg.mem_len,
        clamp_len=cfg.clamp_len or -1, dropout=cfg.dropout, dropatt=cfg.dropatt,
        pre_lnorm=cfg.pre_lnorm, same_length=False, attn_type=0, tie_word_embeddings=True)
    return TransfoXLLMHeadModel(hf)


def hf_xl_suite(*, preset: str = "xl-base", batch_size: int | None = None, steps: int = 10,
                warmup: int = 3, rounds: int = 3, device: str = "auto", **overrides) -> list[dict]:
    """Forward + backward tokens/s of minixl's TransformerXL and of Hugging Face's TransfoXL
    at the same config, device and precision (bf16 autocast on CUDA), each carrying its
    memory from step to step: `rounds` rounds of `steps` steps of each, interleaved, after
    `warmup` steps of each. One row: both throughputs and their ratio (minixl / HF)."""
    from .models import with_overrides

    hf_cls = _transfoxl()  # the clear error first
    del hf_cls
    kind, preset = resolve_preset("xl", preset)
    cfg, train_kw = kind.preset(preset)
    cfg = with_overrides(cfg, **overrides)
    batch_size = batch_size or train_kw["batch_size"]
    if min(steps, rounds) < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1, rounds >= 1 and warmup >= 0, got {steps}, {rounds} "
                         f"and {warmup}")
    dev = resolve_device(device)
    torch.manual_seed(0)
    ours, theirs = kind.build(cfg).to(dev).train(), hf_transfoxl(cfg).to(dev).train()
    T = cfg.tgt_len
    tokens = torch.randint(0, cfg.vocab_size, (batch_size, T + 1), device=dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    state = {"ours": None, "hf": None}

    def step_ours():
        with autocast(dev):
            logits, state["ours"] = ours.step(x, state["ours"])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()

    def step_hf():  # labels shifted inside: T inputs score T - 1 next bytes (tokens/s: T)
        with autocast(dev):
            out = theirs(input_ids=x, labels=x, mems=state["hf"])
            loss = out.losses.float().mean() if out.loss is None else out.loss
        loss.backward()
        state["hf"] = [m.detach() for m in out.mems]

    def timed(fn, n):
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(dev)
        return time.perf_counter() - t0

    import warnings

    seconds = {"ours": 0.0, "hf": 0.0}
    with warnings.catch_warnings():  # TransfoXL warns about its output format at every call
        warnings.simplefilter("ignore")
        timed(step_ours, warmup), timed(step_hf, warmup)
        for _ in range(rounds):
            seconds["ours"] += timed(step_ours, steps)
            seconds["hf"] += timed(step_hf, steps)
    n_tokens = rounds * steps * batch_size * T
    import transformers

    ours_tps, hf_tps = n_tokens / seconds["ours"], n_tokens / seconds["hf"]
    return [{"preset": preset, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
             else "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
             "dtype": "bf16 autocast" if dev.type == "cuda" else "fp32",
             "n_layer": cfg.n_layer, "d_model": cfg.d_model, "tgt_len": T, "mem_len": cfg.mem_len,
             "batch_size": batch_size, "minixl_params": sum(p.numel() for p in ours.parameters()),
             "hf_params": sum(p.numel() for p in theirs.parameters()),
             "minixl_tokens_per_s": ours_tps, "hf_tokens_per_s": hf_tps,
             "ratio": ours_tps / hf_tps}]


# ---------------------------------------------------------------- xl-eval

@torch.no_grad()
def sliding_nll(model: torch.nn.Module, data: torch.Tensor, *, seq_len: int,
                batch_size: int = 16) -> torch.Tensor:
    """Al-Rfou et al.'s sliding window, one new byte per window: loss in nats of data[i + 1]
    from the window data[i - seq_len + 1 : i + 1], for every i from seq_len - 1 to N - 2 (each
    byte with a full window), batch_size windows per forward pass. Returns [N - seq_len]."""
    n = len(data) - seq_len
    if n < 1:
        raise ValueError(f"need more than seq_len = {seq_len} bytes, got {len(data)}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    losses = []
    try:
        for b in range(0, n, batch_size):
            starts = torch.arange(b, min(n, b + batch_size))
            seq = data[starts[:, None] + torch.arange(seq_len + 1)].long().to(device)
            logits, _ = model.step(seq[:, :-1])  # (W, L, V), every window on its own
            losses.append(F.cross_entropy(logits[:, -1].float(), seq[:, -1], reduction="none"))
    finally:
        model.train(was_training)
    return torch.cat(losses).cpu()


def _timed(dev, fn):
    _sync(dev)
    t0 = time.perf_counter()
    out = fn()
    _sync(dev)
    return out, time.perf_counter() - t0


def xl_eval_suite(*, lengths=(512, 1024), tgt_len: int | None = None, preset: str = "tiny",
                  checkpoint: str | None = None, corpus: str | None = None,
                  sliding_bytes: int = 128, segments: int = 8, batch_size: int = 16,
                  device: str = "auto", seed: int = 0) -> list[dict]:
    """Evaluation speed of Transformer-XL's memory against the sliding window, per attention
    length A: (a) windows of A, one new byte scored per window (`sliding_nll`), on
    sliding_bytes bytes; (b) the memory protocol (`stream_nll`), batch_size streams of
    `segments` segments of tgt_len (default: the model's, at most A / 2) with a memory of
    A - tgt_len, its keys and values cached, and (c) the same with the hidden states carried
    and projected again every segment (kv_cache=False). Both sides read batch_size sequences
    at a time. The model: a checkpoint's (--model xl) on a corpus's valid split, or an
    untrained one at preset on random bytes (its bpc, about 8, says nothing about the model)."""
    from .data import load_corpus
    from .transformer_xl import stream_nll

    lengths = [int(a) for a in lengths]
    if not lengths or min(lengths) < 2 or min(sliding_bytes, segments, batch_size) < 1:
        raise ValueError(f"need attention lengths >= 2 and sliding_bytes, segments and batch_size "
                         f">= 1, got {lengths}, {sliding_bytes}, {segments} and {batch_size}")
    dev = resolve_device(device)
    if checkpoint is not None:
        model = model_from_checkpoint(checkpoint)
        if model.__class__.__name__ != "TransformerXL":
            raise ValueError(f"{checkpoint} holds a {type(model).__name__}; --suite xl-eval "
                             "needs a --model xl checkpoint")
        if corpus is None:
            raise ValueError("with --checkpoint, pass --corpus (the text to score)")
        data, what = load_corpus(corpus).valid, f"{Path(checkpoint).name} on {corpus} valid"
    else:
        kind, preset = resolve_preset("xl", preset)
        torch.manual_seed(seed)
        model = kind.build(kind.preset(preset)[0])
        data, what = None, f"untrained xl {preset} on random bytes"
    model = model.to(dev).eval()
    rows = []
    for A in lengths:
        T = tgt_len or min(model.config.tgt_len, A // 2)
        if not 1 <= T < A:
            raise ValueError(f"--tgt-len must be between 1 and the attention length - 1, got "
                             f"{T} for attention length {A}")
        M = A - T
        need = max(A + sliding_bytes, batch_size * segments * T) + 1
        if data is None:
            g = torch.Generator().manual_seed(seed + A)
            text = torch.randint(0, 256, (need,), generator=g, dtype=torch.uint8)
        elif len(data) < need:
            raise ValueError(f"the corpus's valid split has {len(data):,} bytes; attention "
                             f"length {A} needs {need:,}: use fewer --sliding-bytes/--segments")
        else:
            text = data[:need]
        mem_text = text[:batch_size * segments * T + 1]
        with autocast(dev):  # warm-up: one batch of each, untimed
            sliding_nll(model, text[:A + batch_size], seq_len=A, batch_size=batch_size)
            for cached in (True, False):
                stream_nll(model, mem_text[:batch_size * 2 * T + 1], tgt_len=T,
                           batch_size=batch_size, mem_len=M, kv_cache=cached)
            slide, t_slide = _timed(dev, lambda: sliding_nll(
                model, text[:A + sliding_bytes], seq_len=A, batch_size=batch_size))
            row = {"attention_len": A, "tgt_len": T, "mem_len": M, "batch_size": batch_size,
                   "model": what, "device": torch.cuda.get_device_name(dev)
                   if dev.type == "cuda" else "cpu", "torch": torch.__version__,
                   "sliding_bytes": slide.numel(),
                   "sliding_s_per_byte": t_slide / slide.numel()}
            for name, cached in (("cached", True), ("uncached", False)):
                nll, t = _timed(dev, lambda: stream_nll(model, mem_text, tgt_len=T,
                                                        batch_size=batch_size, mem_len=M,
                                                        kv_cache=cached))
                row[f"memory_{name}_s_per_byte"] = t / nll.numel()
                row[f"memory_{name}_bpc"] = nll.mean().item() / math.log(2)
            row["memory_bytes"] = nll.numel()
        row["speedup"] = row["sliding_s_per_byte"] / row["memory_cached_s_per_byte"]
        row["speedup_uncached"] = row["sliding_s_per_byte"] / row["memory_uncached_s_per_byte"]
        row["sliding_bpc"] = slide.mean().item() / math.log(2)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Suite:
    """One `minixl bench --suite NAME`: run(args) -> rows, the CSV it writes by default, the
    columns its printed table shows, and a line of help."""

    run: Callable
    csv: str
    columns: tuple[str, ...]
    summary: str


def _lengths(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--lengths takes comma-separated integers, got {text!r}") from None


def _models_run(args) -> list[dict]:
    return models_suite(preset=args.preset, batch_size=args.batch_size, steps=args.steps,
                        warmup=args.warmup, device=args.device, compile=args.compile,
                        peak=args.peak_tflops)


def _hf_xl_run(args) -> list[dict]:
    from dataclasses import fields

    overrides = {f.name: getattr(args, f.name) for f in fields(KINDS["xl"].config)
                 if getattr(args, f.name, None) is not None}
    return hf_xl_suite(preset=args.preset or "xl-base", batch_size=args.batch_size,
                       steps=args.steps, warmup=args.warmup, device=args.device, **overrides)


def _xl_eval_run(args) -> list[dict]:
    default = "800,1800,2800,3800" if resolve_device(args.device).type == "cuda" else "512,1024"
    return xl_eval_suite(lengths=_lengths(args.lengths or default), tgt_len=args.tgt_len,
                         preset=args.preset or "tiny", checkpoint=args.checkpoint,
                         corpus=args.corpus, sliding_bytes=args.sliding_bytes,
                         segments=args.segments, batch_size=args.batch_size or 16,
                         device=args.device)


def shaw_suite(*, lengths=(16, 32, 64, 128, 256), clips=(4, 16), repeats: int = 5,
               device: str = "auto") -> list[dict]:
    """Chapter 3's two forms of Shaw attention (bucket, gathered), forward + backward, at
    every length and clipping distance, with the form `shaw_form` picks there."""
    from .relative_attention import SHAW_FORMS, shaw_attention_cost, shaw_form

    dev = str(resolve_device(device))
    rows = []
    for T in lengths:
        for k in clips:
            times = {m: shaw_attention_cost(m, T, max_relative=k, repeats=repeats, device=dev)
                     for m in SHAW_FORMS}
            fastest = min(times, key=lambda m: times[m]["seconds"])
            rows.append({"T": T, "max_relative": k, "device": times[fastest]["device"],
                         "torch": torch.__version__,
                         **{f"{m}_ms": 1e3 * r["seconds"] for m, r in times.items()},
                         "fastest": fastest, "chosen": shaw_form(T, T, k)})
    return rows


def _shaw_run(args) -> list[dict]:
    default = "16,32,64,128,256" if resolve_device(args.device).type != "cuda" else \
        "64,128,256,512,1024"
    return shaw_suite(lengths=_lengths(args.lengths or default), repeats=args.repeats,
                      device=args.device)


def _segtree_run(args) -> list[dict]:
    return segtree_suite(max_n=args.max_n, csv_path=args.csv, repeats=args.repeats,
                         device=args.device)


SUITES: dict[str, Suite] = {
    "models": Suite(_models_run, "book/bench_models.csv",
                    ("model", "preset", "device", "batch_size", "seq_len", "params",
                     "tokens_per_s", "tflops", "mfu", "peak_mb"),
                    "training tokens/s, TFLOP/s, MFU and peak memory of every model at --preset "
                    "(default the paper-scale presets), each in a fresh process"),
    "hf-xl": Suite(_hf_xl_run, "book/bench_hf_xl.csv",
                   ("preset", "device", "dtype", "batch_size", "tgt_len", "mem_len",
                    "minixl_tokens_per_s", "hf_tokens_per_s", "ratio"),
                   "forward + backward tokens/s of minixl's Transformer-XL against Hugging "
                   "Face's TransfoXL (transformers 4.37.x) at --preset (default xl-base)"),
    "xl-eval": Suite(_xl_eval_run, "book/bench_xl_eval.csv",
                     ("attention_len", "tgt_len", "mem_len", "sliding_s_per_byte",
                      "memory_cached_s_per_byte", "memory_uncached_s_per_byte", "speedup",
                      "speedup_uncached", "sliding_bpc", "memory_cached_bpc",
                      "memory_uncached_bpc"),
                     "evaluation time per byte of XL's memory (cached and not) against the "
                     "sliding window, at --lengths"),
    "shaw": Suite(_shaw_run, "book/bench_shaw.csv",
                  ("T", "max_relative", "device", "bucket_ms", "gathered_ms", "fastest",
                   "chosen"),
                  "Chapter 3's bucket and gathered forms of Shaw attention, forward + backward, "
                  "at --lengths and clipping distances 4 and 16, and the form minixl picks"),
    "segtree": Suite(_segtree_run, "book/segtree_cost.csv", ("method", "n", "seconds", "peak_mb"),
                     "Chapter 6's cost sweep of one attention layer against its length "
                     "(SegTree, dense, fused dense), each in a fresh process"),
}
