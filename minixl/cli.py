"""The `minixl` command line: train, sample, eval, bench.

Hand-written glue (not generated). Run `minixl --help` or `python -m minixl --help`.

Exit codes: 0 done; 2 bad input (one line says what was wrong and what is expected);
3 training diverged (the last good checkpoint is kept); 130 and 143 stopped by SIGINT
(Ctrl-C) and SIGTERM after saving a checkpoint of the last finished step.
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import MISSING, fields

import torch

from .char_transformer import generate
from .checkpoint import CheckpointError, load_checkpoint
from .data import DownloadError, decode, encode, load_corpus
from .device import autocast, resolve_device
from .evaluation import INFILL_SPAN, PROTOCOLS, evaluate
from .models import KINDS, PAPER_PRESETS, model_from_checkpoint, resolve_preset, with_overrides

__all__ = ["main", "build_parser"]

# What each model setting means; every field of every kind's config becomes a flag.
FIELD_HELP = {
    "block_size": "the window length", "pos": "absolute positions: per_layer, sinusoid or none",
    "max_relative": "the clipping distance k of relative attention",
    "tgt_len": "the segment length", "seq_len": "the window length",
    "attention_impl": "eager (the chapter's code), sdpa or flex (fused kernels; Chapter 4.11)",
    "n_predict": "bytes predicted per window, the last of a random factorisation order "
                 "(partial prediction, K = seq-len / n-predict)",
    "mem_len": "memory length per layer (0 = none; xlnet carries it only when sampling)",
    "clamp_len": "cap on relative distances (0 = none)", "d_head": "width of one head",
    "pre_lnorm": "layer norm before each sublayer (tiny, small) or after it (base, as the paper)",
    "dropatt": "dropout on attention weights", "layer_norm_eps": "the layer norms' epsilon",
    "k": "tree neighbours per side and level", "causal": "no right context (a language "
    "model must be causal)", "n_classes": "classes read from the root (0 = none; a language "
    "model has none)",
}
# The paper-scale presets (minixl.models documents each); steps and batch are ours.
PRESET_HELP = {
    "t12": "Al-Rfou et al. (2018), 12 layers, d 512, context 512, with Chapter 2's auxiliary "
           "losses",
    "xl-base": "Dai et al. (2019), 12 layers, d 512, tgt and mem 512 (20k steps, not 400k)",
    "xlnet-base": "Yang et al. (2019), XLNet-Base: 12 layers, d 768, windows of 512",
    "segtree-base": "Ye et al. (2019), BP-Transformer: 12 layers, d 512, context 8192, k 64",
}
TRAIN_FLAGS = ("steps", "batch_size", "grad_accum", "lr", "warmup", "grad_clip", "seed",
               "eval_every", "eval_bytes", "ckpt_every", "log_every")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _model_fields() -> dict[str, tuple[type, list[str]]]:
    """Every model setting any kind has: name -> (type, the kinds that have it)."""
    found: dict[str, tuple[type, list[str]]] = {}
    for kind in KINDS.values():
        for f in fields(kind.config):
            if f.name != "vocab_size" and f.default is not MISSING:
                found.setdefault(f.name, (type(f.default), []))[1].append(kind.name)
    return found


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=list(KINDS), help="; ".join(
        f"{k.name}: {k.summary}" for k in KINDS.values()) + " (default char, or the preset's)")
    p.add_argument("--preset", help="tiny, small or base of any model (default tiny); or a "
                   "paper-scale preset, which picks its model: " + "; ".join(
                       f"{name} (--model {kind}): {PRESET_HELP[name]}"
                       for name, kind in PAPER_PRESETS.items()))
    g = p.add_argument_group("model settings (override the preset; each names the models it "
                             "applies to)")
    for name, (typ, kinds) in _model_fields().items():
        what = f"{FIELD_HELP[name]} " if name in FIELD_HELP else ""
        if typ is bool:
            g.add_argument(_flag(name), action=argparse.BooleanOptionalAction, default=None,
                           help=f"{what}({', '.join(kinds)})")
        else:
            g.add_argument(_flag(name), type=typ, help=f"{what}({', '.join(kinds)})")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu or cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")


def _given(args, names) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _kind_preset(args):
    """The model kind that --model and --preset select (a paper-scale preset picks its own);
    args.model and args.preset are set to the resolved names."""
    kind, args.preset = resolve_preset(args.model, args.preset)
    args.model = kind.name
    return kind


def _aux(kind, args) -> tuple[str, int]:
    """(aux_losses, aux_targets): the flags where given, else the preset's (t12 trains with
    Chapter 2's auxiliary losses), else the last position's loss at every position."""
    losses, targets = kind.aux_defaults(args.preset)
    return (args.aux_losses or losses, targets if args.aux_targets is None else args.aux_targets)


def _model_config(kind, args):
    """The preset's model config with the model flags applied; its training settings."""
    model_cfg, train_kw = kind.preset(args.preset)
    given = _given(args, _model_fields())
    own = {f.name for f in fields(kind.config)}
    foreign = [n for n in given if n not in own]
    if foreign:
        others = sorted({k for n in foreign for k in _model_fields()[n][1]})
        raise ValueError(f"{', '.join(map(_flag, foreign))} appl{'ies' if len(foreign) == 1 else 'y'}"
                         f" to --model {' or '.join(others)}, not --model {kind.name}")
    return with_overrides(model_cfg, **given), train_kw


def _weight_decay_on(args, out: str) -> str:
    """--weight-decay-on as given; else the checkpoint's when resuming (one written before
    the flag existed decayed everything), matrices for a new run."""
    if args.weight_decay_on is not None:
        return args.weight_decay_on
    if args.resume:
        try:
            saved = load_checkpoint(f"{out}/checkpoint.pt", for_resume=True)["train_config"]
            return saved.get("weight_decay_on", "all")
        except CheckpointError:
            pass  # the trainer says what is wrong with it
    return "matrices"


def cmd_train(args) -> int:
    from .device import distributed_env
    from .trainer import TrainingDiverged, TrainingInterrupted

    rank, _, world = distributed_env()  # under torchrun: one of `world` processes
    try:
        return _train_run(args, rank, world)
    except (ValueError, CheckpointError, DownloadError, OSError):
        if rank:  # every process meets the same error; rank 0 says it
            return 2
        raise
    except TrainingInterrupted as err:
        for signum in (signal.SIGINT, signal.SIGTERM):  # the checkpoint is saved: let us exit
            signal.signal(signum, signal.SIG_IGN)
        if not rank:
            print(f"minixl train: {err}", file=sys.stderr)
        return 128 + err.signum
    except TrainingDiverged as err:
        if not rank:
            print(f"minixl train: {err}", file=sys.stderr)
        return 3


def _train_run(args, rank: int, world: int) -> int:
    """cmd_train's work, in each process of a distributed run; only rank 0 prints."""
    from .device import training_device
    from .trainer import TrainConfig, train

    say = print if rank == 0 else (lambda *a, **k: None)
    kind = _kind_preset(args)
    model_cfg, train_kw = _model_config(kind, args)
    out = args.out or f"runs/{args.preset}" + ("" if kind.name == "char" else f"-{kind.name}")
    cfg = with_overrides(TrainConfig(**train_kw), device=args.device, compile=args.compile,
                         weight_decay_on=_weight_decay_on(args, out), **_given(args, TRAIN_FLAGS))
    aux = _aux(kind, args)
    torch.manual_seed(cfg.seed)  # seeds the objective's own weights (Chapter 2's heads)
    objective = kind.objective(model_cfg, *aux)
    if args.sample_len < 0 or (args.sample_len and not args.prompt):
        raise ValueError("--sample-len must be >= 0, and --prompt not empty when it is > 0")
    length = getattr(model_cfg, kind.length)
    if kind.protocols[0] == "infill" and length <= INFILL_SPAN:  # found now, not after training
        raise ValueError(f"{_flag(kind.length)} {length} is too short for the held-out infill "
                         f"evaluation, a span of {INFILL_SPAN} bytes inside each window: use "
                         f"{_flag(kind.length)} {INFILL_SPAN + 1} or more")
    source = args.corpus or "pydoc"
    corpus = load_corpus(source)
    device = training_device(cfg.device)
    # the train split (at most ~100 MB of bytes) goes to the GPU once: batches are cut there
    batches = kind.batches(corpus.train.to(device), cfg.batch_size, model_cfg, seed=cfg.seed)
    if len(corpus.valid) < length + 1:
        raise ValueError(f"the valid split of {corpus.name!r} has {len(corpus.valid):,} bytes, "
                         f"too few for one window of {length}; use more text or a smaller "
                         f"{_flag(kind.length)}")

    def held_out(model, n_bytes):
        data = corpus.valid if n_bytes is None else corpus.valid[:n_bytes]
        return evaluate(model, data, kind.protocols[0], seq_len=length,
                        batch_size=cfg.batch_size).bpc

    torch.manual_seed(cfg.seed)
    model = kind.build(model_cfg)
    meta = {"kind": kind.name, "objective": "{} targets={}".format(*aux),
            "corpus": {"source": source, "sha256": corpus.sha256}}
    n_params = sum(p.numel() for p in model.parameters())
    say(f"minixl train: --model {kind.name}, {n_params:,} parameters, {cfg.steps} steps of "
        f"{cfg.batch_size} x {length} bytes of {corpus.name}, run folder {out}", flush=True)
    say(f"minixl train: world size {world}" + (
        f" (torchrun: {world} processes, each {cfg.batch_size // world} of the {cfg.batch_size} "
        "sequences of a step)" if world > 1 else " (one process)") + (
        f", {cfg.grad_accum} micro-batches per step" if cfg.grad_accum > 1 else ""), flush=True)
    result = train(model, cfg, batches=batches, objective=objective, held_out=held_out,
                   out=out, resume=args.resume, overwrite=args.overwrite,
                   allow_change=tuple(args.allow_change), meta=meta,
                   progress=not args.no_progress)
    if rank:
        return 0
    print(f"corpus: {corpus.description}")
    print(f"trained {cfg.steps} steps on {result.device} in {result.seconds:.0f} s")
    print(f"held-out bpc (valid, {kind.protocols[0]}): {result.valid_bpc:.3f}")
    print(f"run folder: {result.out} (checkpoint.pt, metrics.csv, loss.png)")
    if args.sample_len:
        gen = torch.Generator().manual_seed(cfg.seed)
        text = generate(result.model, encode(args.prompt), args.sample_len, temperature=0.8,
                        generator=gen)
        print("sample:\n" + decode(text))
    return 0


def cmd_sample(args) -> int:
    if args.n < 0:
        raise ValueError(f"--n is how many bytes to generate, >= 0; got {args.n}")
    if 0 < args.temperature and torch.tensor(args.temperature, dtype=torch.float32) == 0:
        raise ValueError(f"temperature {args.temperature:g} rounds to 0 in float32, the logits' "
                         "precision; use 1e-30 or more (a tiny temperature samples greedily)")
    device = resolve_device(args.device)
    model = model_from_checkpoint(args.checkpoint).to(device)
    gen = torch.Generator().manual_seed(args.seed)
    with autocast(device):
        out = generate(model, encode(args.prompt), args.n, temperature=args.temperature,
                       top_k=args.top_k, generator=gen)
    print(decode(out))
    return 0


def cmd_eval(args) -> int:
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)
    model = model_from_checkpoint(ckpt).to(device)
    kind = KINDS[ckpt["meta"]["kind"]]
    if args.model is not None and args.model != kind.name:
        raise ValueError(f"{args.checkpoint} holds a --model {kind.name} checkpoint, not "
                         f"--model {args.model}")
    protocol = args.protocol or kind.protocols[0]
    if protocol not in kind.protocols:
        raise ValueError(f"--protocol {protocol} does not apply to a --model {kind.name} "
                         f"checkpoint; use {' or '.join(kind.protocols)}")
    overrides = _given(args, ("tgt_len", "mem_len", "clamp_len"))
    foreign = [n for n in overrides if n not in kind.eval_overrides]
    if foreign:
        takers = " or ".join(k.name for k in KINDS.values() if set(foreign) <= set(k.eval_overrides))
        verb = "applies" if len(foreign) == 1 else "apply"
        raise ValueError(f"{', '.join(map(_flag, foreign))} {verb} to --model {takers} "
                         f"checkpoints, not to a --model {kind.name} checkpoint")
    if overrides and protocol != "memory":
        raise ValueError(f"{', '.join(map(_flag, overrides))} apply to --protocol memory; the "
                         "window protocols take --seq-len")
    if args.stride is not None and protocol != "sliding":
        raise ValueError(f"--stride applies to --protocol sliding, not --protocol {protocol}")
    if args.seq_len is not None and protocol == "memory":
        raise ValueError("--seq-len applies to the window protocols; with memory use "
                         "--tgt-len and --mem-len")
    model.config = with_overrides(model.config, **overrides)  # validated by the config itself
    seq_len = getattr(model.config, kind.length) if args.seq_len is None else args.seq_len
    if args.max_bytes is not None and args.max_bytes < 2:
        raise ValueError(f"--max-bytes must be at least 2, got {args.max_bytes}")
    source = args.corpus or (ckpt["meta"].get("corpus") or {}).get("source")
    if source is None:
        raise ValueError(f"{args.checkpoint} does not say which corpus it was trained on; "
                         "pass --corpus")
    data = getattr(load_corpus(source), args.split)[:args.max_bytes]
    result = evaluate(model, data, protocol, seq_len=seq_len, stride=args.stride,
                      batch_size=args.batch_size)
    print(f"{source} {args.split}: {result}")
    return 0


def cmd_bench(args) -> int:
    from .bench import bench

    if args.suite == "segtree":
        args.csv = args.csv or "book/segtree_cost.csv"
        return _segtree_suite(args)
    if args.suite is not None:
        return _suite(args)
    kind = _kind_preset(args)
    model_cfg, _ = _model_config(kind, args)
    r = bench(kind, model_cfg, batch_size=args.batch_size or 32, steps=args.steps,
              warmup=args.warmup, device=args.device, compile=args.compile, peak=args.peak_tflops,
              aux=kind.aux_defaults(args.preset))
    print(f"device: {r['device']}  model: {kind.name}  params: {r['params']:,}  batch "
          f"{r['batch_size']} x {r['seq_len']}  compile: {r['compile']}")
    print(f"train tokens/s: {r['tokens_per_s']:,.0f}  achieved: {r['tflops']:.2f} TFLOP/s")
    if r["mfu"] is not None:
        print(f"MFU: {100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f} TFLOP/s (bf16 dense peak)")
    elif r["device"] == "cpu":
        print("MFU: not reported on the CPU")
    else:
        print(f"MFU: unknown peak for {r['device']}; pass --peak-tflops")
    return 0


def _suite(args) -> int:
    """`minixl bench --suite NAME` (models, hf-xl, xl-eval): its rows written to --csv (the
    suite's default path) and printed as a markdown table."""
    from .bench import SUITES, markdown_table, write_csv

    suite = SUITES[args.suite]
    if args.model is not None:
        raise ValueError(f"--suite {args.suite} picks its own models; drop --model")
    if args.suite != "models" and args.compile:
        raise ValueError(f"--compile applies to --suite models, not --suite {args.suite}")
    takes = {"hf-xl": {f.name for f in fields(KINDS["xl"].config)}, "xl-eval": {"tgt_len"}}
    wrong = [n for n in _given(args, _model_fields()) if n not in takes.get(args.suite, ())]
    if wrong:
        raise ValueError(f"{', '.join(map(_flag, wrong))} do{'es' * (len(wrong) == 1)} not apply "
                         f"to --suite {args.suite}" + (" (it benchmarks the presets as they are)"
                                                       if args.suite == "models" else ""))
    rows = suite.run(args)
    if not rows:
        raise ValueError(f"--suite {args.suite} measured nothing with these settings")
    path = write_csv(rows, args.csv or suite.csv)
    print(markdown_table(rows, list(suite.columns) if not args.markdown else None))
    print(f"written to {path}")
    return 0


def _segtree_suite(args) -> int:
    """`minixl bench --suite segtree`: Chapter 6's cost sweep, written to a CSV."""
    from .bench import segtree_suite
    from .segtree import LAYER_METHODS, loglog_slope

    rows = segtree_suite(max_n=args.max_n, csv_path=args.csv, repeats=args.repeats,
                         device=args.device)
    print(f"one causal attention layer (width 64, 4 heads; segtree k = 1), forward + backward "
          f"on {rows[0]['device']}:")
    for method in LAYER_METHODS:
        mine = [r for r in rows if r["method"] == method]
        cells = "  ".join(f"n={r['n']}: {1e3 * r['seconds']:.1f} ms, {r['peak_mb']:.0f} MB"
                          for r in mine)
        slope = (f"  (slope {loglog_slope([r['n'] for r in mine], [r['seconds'] for r in mine]):.2f})"
                 if len(mine) > 1 else "")
        print(f"  {method}: {cells}{slope}")
    print(f"written to {args.csv}")
    return 0


def _names(text: str) -> list[str]:
    return [s.strip().replace("-", "_") for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minixl", description=__doc__.splitlines()[0],
                                epilog="exit codes: 0 done, 2 bad input, 3 training diverged, "
                                "130/143 stopped by SIGINT/SIGTERM (checkpoint saved)")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model; writes a run folder")
    _model_flags(t)
    t.add_argument("--corpus", help="pydoc (default), enwik8, text8, or a path to a text file")
    t.add_argument("--out", help="run folder (default runs/PRESET, or runs/PRESET-MODEL)")
    t.add_argument("--steps", type=int, help="total optimiser steps of the run (not steps to "
                   "add): it sets the learning-rate schedule")
    t.add_argument("--batch-size", type=int, help="windows (or parallel streams) per step, "
                   "over all processes and micro-batches")
    t.add_argument("--grad-accum", type=int, help="split each step's batch into N micro-batches "
                   "whose gradients add up: the same step in less memory (default 1)")
    t.add_argument("--weight-decay-on", choices=["matrices", "all"], help="matrices: decay the "
                   "weight matrices, not biases, norms, u/v or position tables (default for a "
                   "new run); all: decay every tensor; a resumed run keeps its checkpoint's")
    t.add_argument("--lr", type=float, help="peak learning rate")
    t.add_argument("--warmup", type=int, help="steps of linear warm-up")
    t.add_argument("--grad-clip", type=float, help="clip the gradient norm (0 = no clipping)")
    t.add_argument("--seed", type=int, help="seeds the weights, the batches and dropout")
    t.add_argument("--eval-every", type=int, help="held-out bpc every N steps")
    t.add_argument("--eval-bytes", type=int, help="held-out bytes scored during training")
    t.add_argument("--ckpt-every", type=int, help="checkpoint every N steps")
    t.add_argument("--log-every", type=int, help="a metrics.csv row every N steps")
    t.add_argument("--aux-losses", help="Chapter 2's losses (char, shaw): comma-separated "
                   "positions, layers[=W], targets[=W], or none (default: positions)")
    t.add_argument("--aux-targets", type=int, help="extra bytes ahead predicted by 'targets' "
                   "(default 1)")
    t.add_argument("--resume", action="store_true", help="continue OUT/checkpoint.pt exactly; "
                   "settings must match the saved ones (see --allow-change)")
    t.add_argument("--allow-change", type=_names, default=[], metavar="NAME[,NAME]",
                   help="with --resume: training settings to change on purpose, e.g. steps "
                   "(stretches the schedule to the new total), lr, corpus")
    t.add_argument("--overwrite", action="store_true", help="delete the run in OUT, start again")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--sample-len", type=int, default=300, help="bytes to sample at the end")
    t.add_argument("--prompt", default="The ", help="prompt of the final sample")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--prompt", default="The ")
    s.add_argument("--n", type=int, default=300, help="bytes to generate")
    s.add_argument("--temperature", type=float, default=0.8, help="> 0; below 1 sharpens")
    s.add_argument("--top-k", type=int, help="sample among the k likeliest bytes")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="auto")
    s.set_defaults(func=cmd_sample)

    e = sub.add_parser("eval", help="held-out bpc of a checkpoint")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--corpus", help="default: the corpus it was trained on")
    e.add_argument("--split", choices=["valid", "test"], default="valid")
    e.add_argument("--model", choices=list(KINDS), help="optional: check that the checkpoint "
                   "holds this kind of model")
    e.add_argument("--protocol", choices=PROTOCOLS, help="memory (the default for xl): segments "
                   "with memory; all-positions (the default for char and shaw): every position "
                   "of windows; sliding: the paper's one prediction per window (seq-len times "
                   f"slower); infill (the default for xlnet): a span of {INFILL_SPAN} bytes in the "
                   "middle of each window, read with both sides seen")
    e.add_argument("--seq-len", type=int, help="window length (default: the training one)")
    e.add_argument("--stride", type=int, help="sliding: positions scored per window (default 1)")
    e.add_argument("--tgt-len", type=int, help="memory: segment length (default: training's)")
    e.add_argument("--mem-len", type=int, help="memory: memory length (default: training's; "
                   "may be longer)")
    e.add_argument("--clamp-len", type=int, help="memory: cap on relative distances")
    e.add_argument("--max-bytes", type=int, help="evaluate only the first N bytes of the split")
    e.add_argument("--batch-size", type=int, default=64, help="windows per batch; with memory, "
                   "the most parallel streams (each kept at least 32 segments long)")
    e.add_argument("--device", default="auto")
    e.set_defaults(func=cmd_eval)

    from .bench import SUITES

    b = sub.add_parser("bench", help="training tokens/s, and MFU on CUDA; --suite NAME for the "
                       "benchmark suites")
    _model_flags(b)
    b.add_argument("--batch-size", type=int, help="default 32; a suite: the preset's training "
                   "batch (xl-eval: 16 sequences)")
    b.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up ones")
    b.add_argument("--warmup", type=int, default=5, help="with --suite models and hf-xl: "
                   "untimed steps first (default 5)")
    b.add_argument("--peak-tflops", type=float, help="the device's peak, if minixl does not know it")
    b.add_argument("--suite", choices=list(SUITES), help="; ".join(
        f"{name}: {s.summary}" for name, s in SUITES.items()) + "; each written to --csv")
    b.add_argument("--csv", help="with --suite: where to write (default "
                   + ", ".join(f"{s.csv} for {name}" for name, s in SUITES.items()) + ")")
    b.add_argument("--markdown", action="store_true", help="with --suite: print every column, "
                   "not only the main ones")
    b.add_argument("--max-n", type=int, default=4096, help="--suite segtree: the longest input, "
                   "from 256 doubling (default 4096)")
    b.add_argument("--repeats", type=int, default=3, help="--suite segtree, shaw: timed runs "
                   "per point")
    b.add_argument("--lengths", help="--suite xl-eval: attention lengths, comma-separated "
                   "(default 512,1024 on the CPU, 800,1800,2800,3800 on CUDA); --suite shaw: "
                   "sequence lengths (default 16,32,64,128,256; on CUDA 64 to 1024)")
    b.add_argument("--sliding-bytes", type=int, default=128, help="--suite xl-eval: bytes the "
                   "sliding window scores per length (default 128)")
    b.add_argument("--segments", type=int, default=8, help="--suite xl-eval: segments per "
                   "stream the memory protocol reads (default 8)")
    b.add_argument("--checkpoint", help="--suite xl-eval: a --model xl checkpoint (default an "
                   "untrained model at --preset, on random bytes)")
    b.add_argument("--corpus", help="--suite xl-eval with --checkpoint: the text to score")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, CheckpointError, DownloadError, OSError) as err:
        print(f"minixl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"minixl {args.command}: interrupted; nothing was saved (a checkpoint already on "
              "disk is unchanged)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
