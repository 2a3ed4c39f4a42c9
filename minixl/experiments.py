"""Experiments too big for a chapter's time budget: each writes a CSV that a chapter plots.

Hand-written (not generated). Run one as ``python -m minixl.experiments NAME [options]``; its
defaults are small enough for a laptop CPU, and the chapter that plots its CSV names the
command and the machine that made the stored file. Every experiment is one function that
returns its rows, and one entry in `EXPERIMENTS`: (function, its command-line options).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path
from typing import Callable

__all__ = ["EXPERIMENTS", "write_csv", "main"]


def write_csv(rows: list[dict], path: str | Path) -> Path:
    """Write rows (dicts with the same keys) to path atomically: a crash leaves the old file."""
    if not rows:
        raise ValueError("no rows to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    with open(part, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(part, path)
    return path


# name -> (function(**options) -> rows, [(flag, type, default, help)], one-line summary)
EXPERIMENTS: dict[str, tuple[Callable[..., list[dict]], list[tuple], str]] = {}


def _add_row(rows: list[dict], row: dict) -> None:
    """Keep one run's row and print it at once, so a long sweep shows its progress."""
    rows.append(row)
    print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)


def _int_list(text: str, name: str, least: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated integers, e.g. 4,16,32; got {text!r}")
    if not values or min(values) < least:
        raise ValueError(f"--{name} needs at least one integer, each >= {least}; got {text!r}")
    return values


def depth_sweep(depths: str = "4,16,32", norms: str = "pre,post", seeds: str = "0,1,2",
                steps: int = 150, d_model: int = 32, seq_len: int = 32, batch_size: int = 16,
                lr: float = 2e-3, eval_bytes: int = 8192, corpus: str = "pydoc") -> list[dict]:
    """Chapter 2: do intermediate-layer losses make deep stacks trainable?

    For every depth x norm ("pre" | "post") x seed, train a CharTransformer twice on the same
    batches, with every position of the last layer only ("positions") and with the
    intermediate layer losses too ("positions+layers"); one row per run with its held-out bpc
    (all positions of the first eval_bytes of the validation split) and its wall time.
    """
    import time

    import torch

    from minixl.aux_losses import AuxLossConfig, AuxLosses, AuxObjective
    from minixl.char_transformer import CharTransformer, CharTransformerConfig, evaluate_bpc
    from minixl.data import RandomWindows, load_corpus
    from minixl.trainer import TrainConfig, train

    depth_list, seed_list = _int_list(depths, "depths"), _int_list(seeds, "seeds", 0)
    norm_list = [n.strip() for n in norms.split(",") if n.strip()]
    if not norm_list or any(n not in ("pre", "post") for n in norm_list):
        raise ValueError(f"--norms takes 'pre', 'post' or 'pre,post'; got {norms!r}")
    if min(steps, d_model, seq_len, batch_size, eval_bytes) < 1 or d_model % 4:
        raise ValueError("steps, seq_len, batch_size and eval_bytes must be positive and "
                         f"d_model a positive multiple of 4 (4 heads); got steps={steps}, "
                         f"d_model={d_model}, seq_len={seq_len}, batch_size={batch_size}, "
                         f"eval_bytes={eval_bytes}")
    data = load_corpus(corpus)
    held = data.valid[:eval_bytes + 1]
    rows = []
    for depth in depth_list:
        for norm in norm_list:
            for seed in seed_list:
                for losses, aux_config in (("positions", AuxLossConfig()),
                                           ("positions+layers", AuxLossConfig(layers=1.0))):
                    config = CharTransformerConfig(n_layer=depth, d_model=d_model, n_head=4,
                                                   d_inner=4 * d_model, block_size=seq_len,
                                                   norm=norm)
                    torch.manual_seed(seed)
                    model = CharTransformer(config)
                    objective = AuxObjective(AuxLosses(aux_config, n_layer=depth,
                                                       d_model=d_model))
                    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                      log_every=1, eval_every=steps)
                    t0 = time.perf_counter()
                    result = train(model, cfg, objective=objective, progress=False,
                                   batches=RandomWindows(data.train, batch_size, seq_len,
                                                         seed=seed))
                    seconds = time.perf_counter() - t0
                    last = [r["train_bpc"] for r in result.history][-10:]
                    _add_row(rows, dict(
                        depth=depth, norm=norm, losses=losses, seed=seed, steps=steps,
                        d_model=d_model, seq_len=seq_len,
                        train_bpc=round(sum(last) / len(last), 4),
                        valid_bpc=round(evaluate_bpc(model, held, seq_len=seq_len), 4),
                        seconds=round(seconds, 1)))
    return rows


EXPERIMENTS["depth"] = (depth_sweep, [
    ("--depths", str, "4,16,32", "comma-separated numbers of layers"),
    ("--norms", str, "pre,post", "'pre', 'post' or both: where each layer normalises"),
    ("--seeds", str, "0,1,2", "comma-separated seeds, one run per seed and arm"),
    ("--steps", int, 150, "optimiser steps per run"),
    ("--d-model", int, 32, "model width (4 heads, feed-forward 4x wider)"),
    ("--seq-len", int, 32, "window length in bytes"),
    ("--batch-size", int, 16, "windows per step"),
    ("--lr", float, 2e-3, "peak learning rate"),
    ("--eval-bytes", int, 8192, "held-out bytes scored at the end of each run"),
], "Chapter 2: held-out bpc by depth, pre/post-norm, with and without intermediate losses")


# ---------------------------------------------------------------- Chapter 1: positions


def positions(depths: str = "4,8", seeds: str = "0,1,2", steps: int = 200,
              corpus: str = "pydoc") -> list[dict]:
    """Chapter 1, exercise 5: per-layer position tables against one sinusoid, by depth.

    Section 1.7's run (width 128, 4 heads, windows of 128, 16 per step, Chapter 1's loop
    through `minixl.train`, which gives the same weights) for every depth x seed x kind of
    position; one row per run with its held-out bpc over the whole validation split.
    """
    import time

    import torch

    from minixl.char_transformer import CharTransformer, CharTransformerConfig, evaluate_bpc
    from minixl.data import RandomWindows, load_corpus
    from minixl.trainer import TrainConfig, train

    depth_list, seed_list = _int_list(depths, "depths"), _int_list(seeds, "seeds", 0)
    if steps < 1:
        raise ValueError(f"--steps must be positive, got {steps}")
    data = load_corpus(corpus)
    rows = []
    for n_layer in depth_list:
        for seed in seed_list:
            for pos in ("per_layer", "sinusoid"):
                torch.manual_seed(seed)
                model = CharTransformer(CharTransformerConfig(n_layer=n_layer, pos=pos))
                start = time.perf_counter()
                train(model, TrainConfig(steps=steps, batch_size=16, lr=2e-3, warmup=30,
                                         weight_decay=0.01, grad_clip=1.0, seed=seed,
                                         device="cpu"),
                      batches=RandomWindows(data.train, 16, 128, seed=seed), progress=False)
                _add_row(rows, dict(n_layer=n_layer, seed=seed, pos=pos, steps=steps,
                                 valid_bpc=round(evaluate_bpc(model, data.valid, seq_len=128), 4),
                                 seconds=round(time.perf_counter() - start, 1)))
    return rows


EXPERIMENTS["positions"] = (positions, [
    ("--depths", str, "4,8", "comma-separated numbers of layers"),
    ("--seeds", str, "0,1,2", "comma-separated seeds, one run per seed and kind"),
    ("--steps", int, 200, "optimiser steps per run (section 1.7: 200)"),
], "Chapter 1: held-out bpc of per-layer position tables and a sinusoid, by depth and seed")


# ---------------------------------------------------------------- Chapter 4: Transformer-XL


def eval_flops_per_byte(protocol: str, A: int, *, n_layer: int, d_model: int, n_head: int,
                        d_head: int, d_inner: int, vocab_size: int = 256, tgt_len: int = 32
                        ) -> float:
    """Multiply-adds per predicted byte of one evaluation protocol at attention length A.

    "sliding": one window of A bytes per predicted byte, every position recomputed (the
    vanilla protocol); "states": Transformer-XL's hidden-state memory, segments of tgt_len
    with A - tgt_len cached states that every segment projects into keys, values (and
    distances) again; "kv": the key/value cache, only the segment's own bytes projected.
    Counts what the eager code computes: the projections, both score products, the values,
    the output projection, the feed-forward and the output layer, for every position passed.
    """
    if protocol not in ("sliding", "states", "kv"):
        raise ValueError(f"protocol must be 'sliding', 'states' or 'kv', got {protocol!r}")
    if not 1 <= tgt_len <= A:
        raise ValueError(f"need 1 <= tgt_len <= A, got tgt_len={tgt_len}, A={A}")
    C, HD = d_model, n_head * d_head
    per_query = HD * C + 2 * C * d_inner  # output projection and feed-forward, per position
    if protocol == "sliding":  # a forward pass over A positions, one prediction kept
        n_q, n_k, projected = A, A, A
    else:  # a segment of tgt_len queries against A keys, per predicted byte below
        n_q, n_k = tgt_len, A
        projected = A if protocol == "states" else tgt_len
    layer = projected * 3 * C * HD + n_k * C * HD * (protocol != "kv")  # qkv_net and r_net
    layer += 3 * n_q * n_k * HD + n_q * per_query  # two score products, values; rest
    total = n_layer * layer + n_q * C * vocab_size
    return total / (1 if protocol == "sliding" else tgt_len)


def xl_eval_speed(lengths: str = "64,128,256,512,1024,2048", streams: int = 4,
                  tgt_len: int = 32, n_layer: int = 3, d_model: int = 64, n_head: int = 4,
                  d_head: int = 16, d_inner: int = 256, passes: int = 8, seed: int = 0,
                  threads: int = 1) -> list[dict]:
    """Chapter 4.9: seconds per predicted byte of the sliding window, the hidden-state memory
    and the key/value cache at each attention length A, batched alike (`streams` rows per
    forward pass), beside the multiply-adds per byte that eval_flops_per_byte predicts.

    The model is an untrained TransformerXL (speed does not depend on the weights). The
    sliding window times forward passes of [streams, A] (one byte predicted per row); the
    memory protocols fill a memory of A - tgt_len, then time segments against it. Each
    time is the median of `passes` passes, on `threads` CPU threads.
    """
    import time

    import torch

    from minixl.transformer_xl import TransformerXL, TransformerXLConfig

    A_list = _int_list(lengths, "lengths")
    if min(streams, tgt_len, passes) < 1 or min(A_list) < tgt_len:
        raise ValueError(f"streams, tgt_len and passes must be positive and every length >= "
                         f"tgt_len; got streams={streams}, tgt_len={tgt_len}, passes={passes}, "
                         f"lengths={lengths}")
    sizes = dict(n_layer=n_layer, d_model=d_model, n_head=n_head, d_head=d_head,
                 d_inner=d_inner)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = TransformerXL(TransformerXLConfig(**sizes, tgt_len=tgt_len, mem_len=0)).eval()
    g = torch.Generator().manual_seed(seed)
    rows = []
    with torch.no_grad():
        for A in A_list:
            x = torch.randint(0, 256, (streams, A), generator=g)
            def median_time(run) -> float:  # the median pass: robust to a busy machine
                times = []
                for _ in range(passes):
                    t0 = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - t0)
                return sorted(times)[len(times) // 2]

            model(x, mem_len=0)  # warm up
            sliding = median_time(lambda: model(x, mem_len=0)) / streams
            memory = {}
            for protocol, kv in (("states", False), ("kv", True)):
                seg = torch.randint(0, 256, (streams, tgt_len), generator=g)
                state = None
                for _ in range(-(-A // tgt_len)):  # fill the memory to A - tgt_len
                    _, state = model.step(seg, state, kv_cache=kv, mem_len=A - tgt_len)
                full = state  # every timed segment starts from the same full memory
                memory[protocol] = median_time(lambda: model.step(
                    seg, full, kv_cache=kv, mem_len=A - tgt_len)) / (streams * tgt_len)
            flops = {p: eval_flops_per_byte(p, A, **sizes, tgt_len=tgt_len)
                     for p in ("sliding", "states", "kv")}
            _add_row(rows, dict(
                A=A, tgt_len=tgt_len, streams=streams,
                sliding_us=round(1e6 * sliding, 2), states_us=round(1e6 * memory["states"], 2),
                kv_us=round(1e6 * memory["kv"], 2),
                measured_states=round(sliding / memory["states"], 2),
                measured_kv=round(sliding / memory["kv"], 2),
                predicted_states=round(flops["sliding"] / flops["states"], 2),
                predicted_kv=round(flops["sliding"] / flops["kv"], 2)))
    return rows


EXPERIMENTS["xl_eval_speed"] = (xl_eval_speed, [
    ("--lengths", str, "64,128,256,512,1024,2048", "comma-separated attention lengths A"),
    ("--streams", int, 4, "rows per forward pass, the same for every protocol"),
    ("--tgt-len", int, 32, "segment length of the memory protocols"),
    ("--n-layer", int, 3, "layers"),
    ("--d-model", int, 64, "model width"),
    ("--n-head", int, 4, "heads"),
    ("--d-head", int, 16, "width of a head"),
    ("--d-inner", int, 256, "feed-forward width"),
    ("--passes", int, 8, "timed forward passes (windows or segments) per protocol and length"),
    ("--seed", int, 0, "seed of the weights and the bytes"),
    ("--threads", int, 1, "CPU threads (one is steadiest on a shared machine)"),
], "Chapter 4: evaluation speed-up over the sliding window, measured and predicted")


def xl_order(seeds: str = "0,1,2", steps: int = 250, eval_bytes: int = 8192,
             threads: int = 1, corpus: str = "pydoc") -> list[dict]:
    """Chapter 4.8: why recurrence did not help. Four arms of Chapter 4's 3 x 64 model on
    segments of 32, trained by one loop that differs only in data order and memory:
    ordered streams with the carried (stale) memory, ordered streams without memory, random
    windows of 64 whose first 32 bytes are run through the current weights as a fresh memory
    (no gradient, loss on the last 32), and random windows of 32 without memory. One row per
    arm and seed: held-out bpc at attention length 64 (memory 32, or windows of 64 moved 32
    at a time) and at 32 (no memory, windows of 32).
    """
    import math

    import torch
    import torch.nn.functional as F

    from minixl.aux_losses import evaluate_bpc_sliding
    from minixl.data import OrderedStreams, RandomWindows, load_corpus
    from minixl.transformer_xl import TransformerXL, TransformerXLConfig, evaluate_bpc_xl

    seed_list = _int_list(seeds, "seeds", 0)
    if min(steps, eval_bytes) < 64:
        raise ValueError(f"steps and eval_bytes must be >= 64; got steps={steps}, "
                         f"eval_bytes={eval_bytes}")
    torch.set_num_threads(threads)
    data = load_corpus(corpus)
    held = data.valid[:eval_bytes + 1]
    small = dict(n_layer=3, d_model=64, n_head=4, d_head=16, d_inner=256, tgt_len=32,
                 pre_lnorm=True)
    B, T, lr, warmup = 16, 32, 2e-3, 30
    arms = ["ordered, stale memory", "ordered, no memory", "random, fresh memory",
            "random, no memory"]
    rows = []
    for seed in seed_list:
        for arm in arms:
            torch.manual_seed(seed)
            memory = "no memory" not in arm
            model = TransformerXL(TransformerXLConfig(**small, mem_len=T if memory else 0))
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / warmup) * (
                0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
            if arm.startswith("ordered"):
                source = OrderedStreams(data.train, B, T)
            else:
                source = RandomWindows(data.train, B, 2 * T if memory else T, seed=seed)
            mems = None
            model.train()
            for step in range(steps):
                batch = source(step)
                x, y = batch.x.long(), batch.y.long()
                if arm == "random, fresh memory":
                    with torch.no_grad():
                        _, mems = model(x[:, :T])  # the first half, by the current weights
                    x, y = x[:, T:], y[:, T:]
                elif arm == "ordered, stale memory" and batch.fresh:
                    mems = None
                logits, new = model(x, mems if memory else None)
                if arm == "ordered, stale memory":
                    mems = new
                loss = F.cross_entropy(logits.transpose(1, 2), y)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
            model.eval()
            if memory:
                at64 = evaluate_bpc_xl(model, held, mem_len=T, batch_size=8)
            else:
                at64 = evaluate_bpc_sliding(model, held, seq_len=2 * T, stride=T)
            at32 = evaluate_bpc_xl(model, held, mem_len=0, batch_size=8)
            _add_row(rows, dict(arm=arm, seed=seed, steps=steps, bpc_at_64=round(at64, 4),
                             bpc_at_32=round(at32, 4), last_train_bpc=round(
                                 loss.item() / math.log(2), 4)))
    return rows


EXPERIMENTS["xl_order"] = (xl_order, [
    ("--seeds", str, "0,1,2", "comma-separated seeds, one run per seed and arm"),
    ("--steps", int, 250, "optimiser steps per run"),
    ("--eval-bytes", int, 8192, "held-out bytes scored at the end of each run"),
    ("--threads", int, 1, "CPU threads"),
], "Chapter 4: recurrence vs data order and stale memory, held-out bpc per arm and seed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minixl.experiments",
                                     description="Experiments that write a CSV for a chapter.")
    sub = parser.add_subparsers(dest="name", required=True)
    for name, (_, options, summary) in EXPERIMENTS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        p.add_argument("--csv", required=True, help="where to write the rows")
        for flag, typ, default, text in options:
            p.add_argument(flag, type=typ, default=default, help=f"{text} (default {default})")
    args = parser.parse_args(argv)
    fn = EXPERIMENTS[args.name][0]
    options = {k: v for k, v in vars(args).items() if k not in ("name", "csv")}
    try:
        rows = fn(**options)
    except ValueError as err:
        print(f"python -m minixl.experiments {args.name}: {err}", file=sys.stderr)
        return 2
    path = write_csv(rows, args.csv)
    print(f"{len(rows)} rows written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
