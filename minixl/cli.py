"""The `minixl` command line: train, sample, eval, bench.

Hand-written glue (not generated). Run `minixl --help` or `python -m minixl --help`. Nothing
here names a model: the model flags, presets, objective options and evaluation protocols
come from the registered model kinds (`minixl.kinds`; `--model MODULE:NAME` loads one of
your own), and `minixl bench --suite NAME` runs an entry of the registry of runs
(`minixl.experiments`) with that entry's own options.

Exit codes (`minixl.errors.exit_code`, the one place that maps errors to them, shared with
the registry of runs): 0 done; 2 bad input (one
line says what was wrong and what is expected); 3 training diverged (the last good
checkpoint is kept); 4 the run folder could not be written (the last checkpoint is kept);
130 and 143 stopped by SIGINT (Ctrl-C) and SIGTERM, after saving a checkpoint of the last
finished step when training (a training error carries its code as `exit_code`).
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from dataclasses import fields

import torch

from .char_transformer import generate
from .checkpoint import load_checkpoint
from .data import decode, encode, load_corpus
from .device import autocast, resolve_device
from .errors import ERRORS, exit_code
from .evaluation import PROTOCOLS
from .experiments import EXPERIMENTS
from .experiments import main as run_entry
from .kinds import (DEFAULT_MODEL, KINDS, model_fields, model_from_checkpoint, paper_presets,
                    resolve_preset)
from .options import CHECKPOINT, CORPUS, DEVICE, Option, add_options, flag, parent
from .plugins import kind_named, load_kind
from .scoring import check_score, score

__all__ = ["main", "build_parser"]

EPILOG = ("exit codes: 0 done, 2 bad input, 3 training diverged, 4 the run folder could not "
          "be written (disk full, file too large, no permission, I/O error; the last checkpoint "
          "is kept), 130/143 stopped by SIGINT/SIGTERM (checkpoint saved); under torchrun, "
          "torchrun's 1 for any of these, minixl's code in its report")

# The trainer's settings (minixl.training.TrainConfig) a flag may override; unset flags
# keep the preset's value.
TRAIN_OPTIONS = (
    Option("steps", int, None, "total optimiser steps of the run (not steps to add): it sets "
           "the learning-rate schedule"),
    Option("batch_size", int, None, "windows (or parallel streams) per step, over all "
           "processes and micro-batches"),
    Option("grad_accum", int, None, "split each step's batch into N micro-batches whose "
           "gradients add up: the same step in less memory (default 1)"),
    Option("weight_decay_on", str, None, "matrices: decay the weight matrices, not biases, "
           "norms or the tables a model keeps apart (default for a new run); all: decay every "
           "tensor; a resumed run keeps its checkpoint's", choices=("matrices", "all")),
    Option("dtype", str, None, "fp32; bf16 (autocast: matmuls in bf16, attention of --model "
           "char, the loss, weights, optimiser state and checkpoints in fp32); auto (the "
           "default for a new run): bf16 on a GPU, and on a CPU with fast bf16 for a model "
           "measured to gain from it, else fp32; a resumed run keeps its checkpoint's (given on "
           "resume, it is taken, and the run no longer continues bit for bit)",
           choices=("fp32", "bf16", "auto")),
    Option("lr", float, None, "peak learning rate"),
    Option("warmup", int, None, "steps of linear warm-up"),
    Option("grad_clip", float, None, "clip the gradient norm (0 = no clipping)"),
    Option("seed", int, None, "seeds the weights, the batches and dropout"),
    Option("eval_every", int, None, "held-out bpc every N steps"),
    Option("eval_bytes", int, None, "held-out bytes scored during training"),
    Option("ckpt_every", int, None, "checkpoint every N steps"),
    Option("log_every", int, None, "a metrics.csv row every N steps"),
)


def _report(command: str, err: BaseException) -> str:
    """The one line that says why `minixl COMMAND` ended with err."""
    if isinstance(err, ERRORS):
        return f"minixl {command}: error: {err}"
    if isinstance(err, KeyboardInterrupt):
        return (f"minixl {command}: interrupted; nothing was saved (a checkpoint already on "
                "disk is unchanged)")
    return f"minixl {command}: {err}"


def _given(args, names) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _kinds_that(test) -> str:
    return ", ".join(k.name for k in KINDS.values() if test(k))


def _model_parent() -> argparse.ArgumentParser:
    """--model, --preset, every config setting of every registered kind, --compile."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model", help="; ".join(f"{k.name}: {k.summary}" for k in KINDS.values())
                   + f" (default {DEFAULT_MODEL}, or the preset's); or MODULE:NAME, a "
                   "minixl.kinds.ModelKind of your own")
    p.add_argument("--preset", help="tiny, small or base of any of the book's models, or one "
                   "that a model of your own declares (default tiny); or a "
                   "paper-scale preset, which picks its model: " + "; ".join(
                       f"{name} (--model {kind}): {KINDS[kind].presets[name].help}"
                       for name, kind in paper_presets().items()))
    g = p.add_argument_group("model settings (override the preset; each names the models it "
                             "applies to)")
    for name, (typ, kinds) in model_fields().items():
        helps: dict[str, list[str]] = {}  # a line of help -> the kinds that give it
        for k in kinds:
            helps.setdefault(KINDS[k].help_for(name), []).append(k)
        if len(helps) == 1:
            text = f"{next(iter(helps))} ({', '.join(kinds)})".strip()
        else:
            text = "; ".join(f"{', '.join(ks)}: {h}" for h, ks in helps.items())
        if typ is bool:
            g.add_argument(flag(name), action=argparse.BooleanOptionalAction, default=None,
                           help=text)
        else:
            g.add_argument(flag(name), type=typ, help=text)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    return p


def _objective_options() -> list[Option]:
    """Every objective option of every registered kind (once each), its help naming them."""
    found: dict[str, Option] = {}
    for kind in KINDS.values():
        for o in (kind.objective.options if kind.objective else ()):
            found.setdefault(o.name, o)
    return [Option(o.name, o.type, None, f"{o.help} (default {o.default}; " + _kinds_that(
        lambda k: k.objective and o.name in {x.name for x in k.objective.options}) + ")")
            for o in found.values()]


def _eval_overrides() -> list[Option]:
    """The config fields `eval --protocol memory` may change, over every registered kind."""
    found: dict[str, Option] = {}
    for kind in KINDS.values():
        types = {f.name: type(f.default) for f in fields(kind.config)}
        for name in kind.eval_overrides:
            found.setdefault(name, Option(name, types[name], None, f"memory: {kind.help_for(name)} "
                             "(default: training's) (" + _kinds_that(
                                 lambda k, n=name: n in k.eval_overrides) + ")"))
    return list(found.values())


def _default_out(kind, preset: str) -> str:
    return f"runs/{preset}" + ("" if kind.name == DEFAULT_MODEL else f"-{kind.name}")


# ---------------------------------------------------------------- train

def cmd_train(args) -> int:
    # the trainer is imported by the commands that train, here and in _train and cmd_bench:
    # `minixl sample` and `minixl eval` never load it (a test asserts so)
    from .training.distributed import process_group

    # Under torchrun every process runs this; the process group is held for the whole command
    # (and handed to the trainer), so that a refusal is said once, by rank 0, before any
    # process leaves.
    with process_group(args.device) as ranks:
        try:
            return _train(args, ranks)
        except Exception as err:
            code = exit_code(err)
            if code is None:
                raise
            if code > 128:  # stopped by a signal, the checkpoint saved: let us exit
                for signum in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(signum, signal.SIG_IGN)
            if ranks.rank == 0:
                print(_report("train", err), file=sys.stderr)
            return code


def _train(args, ranks) -> int:
    """cmd_train's work, in each process of a distributed run; only rank 0 prints."""
    from .launch import setup_run  # the trainer: see cmd_train

    say = print if ranks.rank == 0 else (lambda *a, **k: None)
    if args.sample_len < 0 or (args.sample_len and not args.prompt):
        raise ValueError("--sample-len must be >= 0, and --prompt not empty when it is > 0")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise ValueError(f"--peak-tflops must be a positive number of TFLOP/s, got "
                         f"{args.peak_tflops}")
    kind, preset = resolve_preset(None if args.model is None else kind_named(args.model),
                                  args.preset)
    out = args.out or _default_out(kind, preset)
    run = setup_run(kind, preset, corpus=args.corpus or "pydoc", device=args.device, out=out,
                    model_settings=_given(args, model_fields()),
                    train_settings={**_given(args, [o.name for o in TRAIN_OPTIONS]),
                                    "compile": args.compile},
                    objective_options=_given(args, [o.name for o in _objective_options()]),
                    resume=args.resume, overwrite=args.overwrite,
                    allow_change=tuple(args.allow_change))
    cfg, model, length = run.built.config, run.built.model, run.built.length
    n_params = sum(p.numel() for p in model.parameters())
    say(f"minixl train: --model {kind.name}, {n_params:,} parameters, {cfg.steps} steps of "
        f"{cfg.batch_size} x {length} bytes of {run.corpus.name}, {cfg.dtype} "
        f"({run.dtype_why}), run folder {out}", flush=True)
    say(f"minixl train: world size {ranks.world}" + (
        f" (torchrun: {ranks.world} processes, each {cfg.batch_size // ranks.world} of the "
        f"{cfg.batch_size} sequences of a step)" if ranks.world > 1 else " (one process)") + (
        f", {cfg.grad_accum} micro-batches per step" if cfg.grad_accum > 1 else ""), flush=True)
    result = run.train(progress=not args.no_progress, ranks=ranks, peak_tflops=args.peak_tflops)
    if ranks.rank:
        return 0
    print(f"corpus: {run.corpus.description}")
    print(f"trained {cfg.steps} steps on {result.device} in {result.seconds:.0f} s")
    print(f"held-out bpc (valid, {kind.protocol_names[0]}): {result.valid_bpc:.3f}")
    print(f"run folder: {result.out} (checkpoint.pt, metrics.csv, loss.png)")
    if args.sample_len:
        gen = torch.Generator().manual_seed(cfg.seed)
        text = generate(result.model, encode(args.prompt), args.sample_len, temperature=0.8,
                        generator=gen)
        print("sample:\n" + decode(text))
    return 0


# ---------------------------------------------------------------- sample, eval

def _checkpoint_model(args, device):
    """(checkpoint, its model on device, its kind); --model, when given, must match."""
    ckpt = load_checkpoint(args.checkpoint)
    model = model_from_checkpoint(ckpt).to(device)
    kind = KINDS[ckpt["meta"]["kind"]]
    if args.model is not None and kind_named(args.model).name != kind.name:
        raise ValueError(f"{args.checkpoint} holds a --model {kind.name} checkpoint, not "
                         f"--model {args.model}")
    return ckpt, model, kind


def cmd_sample(args) -> int:
    if args.n < 0:
        raise ValueError(f"--n is how many bytes to generate, >= 0; got {args.n}")
    if 0 < args.temperature and torch.tensor(args.temperature, dtype=torch.float32) == 0:
        raise ValueError(f"temperature {args.temperature:g} rounds to 0 in float32, the logits' "
                         "precision; use 1e-30 or more (a tiny temperature samples greedily)")
    device = resolve_device(args.device)
    _, model, _ = _checkpoint_model(args, device)
    gen = torch.Generator().manual_seed(args.seed)
    with autocast(device):
        out = generate(model, encode(args.prompt), args.n, temperature=args.temperature,
                       top_k=args.top_k, generator=gen)
    print(decode(out))
    return 0


def cmd_eval(args) -> int:
    device = resolve_device(args.device)
    ckpt, model, kind = _checkpoint_model(args, device)
    settings = dict(protocol=args.protocol, seq_len=args.seq_len, stride=args.stride,
                    **_given(args, [o.name for o in _eval_overrides()]))
    check_score(model, kind, **settings)  # before the corpus is read
    if args.max_bytes is not None and args.max_bytes < 2:
        raise ValueError(f"--max-bytes must be at least 2, got {args.max_bytes}")
    source = args.corpus or (ckpt["meta"].get("corpus") or {}).get("source")
    if source is None:
        raise ValueError(f"{args.checkpoint} does not say which corpus it was trained on; "
                         "pass --corpus")
    data = getattr(load_corpus(source), args.split)[:args.max_bytes]
    result = score(model, data, kind, batch_size=args.batch_size, dtype=args.dtype, **settings)
    print(f"{source} {args.split}: {result}")
    return 0


# ---------------------------------------------------------------- bench

def cmd_bench(args) -> int:
    from .bench import bench  # the trainer: see cmd_train

    r = bench(args.model, args.preset, model_settings=_given(args, model_fields()),
              objective_options=_given(args, [o.name for o in _objective_options()]),
              batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
              device=args.device, compile=args.compile, peak=args.peak_tflops)
    print(f"device: {r['device']}  model: {r['model']}  params: {r['params']:,}  batch "
          f"{r['batch_size']} x {r['seq_len']}  compile: {r['compile']}")
    print(f"warm-up: {args.warmup} steps in {r['warmup_s']:.1f} s"
          + (" (compiling included)" if r["compile"] else ""))
    print(f"train tokens/s: {r['tokens_per_s']:,.0f}  achieved: {r['tflops']:.2f} TFLOP/s")
    if r["mfu"] is not None:
        print(f"MFU: {100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f} TFLOP/s (bf16 dense peak)")
    elif r["device"] == "cpu":
        print("MFU: not reported on the CPU")
    else:
        print(f"MFU: unknown peak for {r['device']}; pass --peak-tflops")
    return 0


def _suite(args, parser: argparse.ArgumentParser) -> int:
    """`minixl bench --suite NAME [options]`: the registry's entry NAME, with its options
    (all that follows --suite; the benchmark's own options, parsed by `parser`, do not
    apply)."""
    own = {k: v for k, v in vars(args).items() if k not in ("suite", "func")}
    if own != {k: v for k, v in vars(parser.parse_args(["bench"])).items()
               if k not in ("suite", "func")}:
        raise ValueError("--suite NAME runs an entry of the registry of runs with its own "
                         "options: put them after the name (minixl bench --suite NAME "
                         "--OPTION ...; minixl bench --suite NAME --help lists them)")
    return run_entry(args.suite, prog="minixl bench --suite", say="minixl bench")


# ---------------------------------------------------------------- the parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minixl", description=__doc__.splitlines()[0],
                                epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True)
    device, model = parent(DEVICE), _model_parent()

    t = sub.add_parser("train", parents=[model, device], help="train a model; writes a run "
                       "folder", epilog=EPILOG)
    t.add_argument("--corpus", help=CORPUS.help)
    t.add_argument("--out", help="run folder (default runs/PRESET, or runs/PRESET-MODEL)")
    add_options(t.add_argument_group("training settings (override the preset)"),
                TRAIN_OPTIONS, keep_defaults=False)
    add_options(t.add_argument_group("objective (the models named take it)"),
                _objective_options(), keep_defaults=False)
    t.add_argument("--resume", action="store_true", help="continue OUT/checkpoint.pt exactly; "
                   "settings must match the saved ones (see --allow-change)")
    t.add_argument("--allow-change", type=lambda text: [s.strip().replace("-", "_") for s in
                                                        text.split(",") if s.strip()],
                   default=[], metavar="NAME[,NAME]",
                   help="with --resume: training settings to change on purpose, e.g. steps "
                   "(stretches the schedule to the new total), lr, corpus")
    t.add_argument("--overwrite", action="store_true", help="delete the run in OUT, start again")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--peak-tflops", type=float, help="the device's peak, for metrics.csv's mfu "
                   "column (default: a GPU's bf16 peak where minixl knows it; none on a CPU)")
    t.add_argument("--sample-len", type=int, default=300, help="bytes to sample at the end")
    t.add_argument("--prompt", default="The ", help="prompt of the final sample")
    t.set_defaults(func=cmd_train)

    reads = parent(CHECKPOINT, DEVICE)
    reads.add_argument("--model", help="optional: check that the checkpoint holds this model; "
                       "MODULE:NAME loads a model of your own")
    s = sub.add_parser("sample", parents=[reads], help="generate text from a checkpoint")
    s.add_argument("--prompt", default="The ")
    s.add_argument("--n", type=int, default=300, help="bytes to generate")
    s.add_argument("--temperature", type=float, default=0.8, help="> 0; below 1 sharpens")
    s.add_argument("--top-k", type=int, help="sample among the k likeliest bytes")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_sample)

    e = sub.add_parser("eval", parents=[reads], help="held-out bpc of a checkpoint")
    e.add_argument("--corpus", help="default: the corpus it was trained on")
    e.add_argument("--split", choices=["valid", "test"], default="valid")
    e.add_argument("--protocol", help="one the model's kind declares; default: its first ("
                   + "; ".join(f"{k.name}: {k.protocol_names[0]}" for k in KINDS.values())
                   + "). " + "; ".join(f"{p.name}: {p.help}" for p in PROTOCOLS.values())
                   + "; or a protocol of a model of your own")
    e.add_argument("--seq-len", type=int, help="window length (default: the training one)")
    e.add_argument("--stride", type=int, help="sliding: positions scored per window (default 1)")
    add_options(e, _eval_overrides(), keep_defaults=False)
    e.add_argument("--max-bytes", type=int, help="evaluate only the first N bytes of the split")
    e.add_argument("--batch-size", type=int, default=64, help="windows per batch; with memory, "
                   "the most parallel streams (each kept at least 32 segments long)")
    e.add_argument("--dtype", choices=("fp32", "bf16"), help="bf16 autocast or fp32, whatever "
                   "the checkpoint was trained in (its weights are fp32); default: bf16 on a "
                   "GPU, fp32 on a CPU")
    e.set_defaults(func=cmd_eval)

    b = sub.add_parser("bench", parents=[model, device], help="training tokens/s, and MFU on "
                       "CUDA; --suite NAME runs an entry of the registry of runs")
    b.add_argument("--batch-size", type=int, help="sequences per step (default: the preset's)")
    b.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up ones")
    b.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    b.add_argument("--peak-tflops", type=float, help="the device's peak, if minixl does not "
                   "know it")
    add_options(b.add_argument_group("objective (the models named take it; default: the "
                                     "preset's)"), _objective_options(), keep_defaults=False)
    b.add_argument("--suite", nargs=argparse.REMAINDER, metavar="NAME [OPTION ...]",
                   help="run an entry of the registry of runs instead, with its own options, "
                   "all that follows NAME (minixl bench --suite NAME --help): " + "; ".join(
                       f"{n}: {x.summary}" for n, x in EXPERIMENTS.items()))
    b.set_defaults(func=cmd_bench)
    return p


class _Quiet(argparse.ArgumentParser):
    """A parser that leaves every complaint to the command's own parser."""

    def error(self, message):
        raise ValueError(message)


def _load_own_kinds(argv: list[str]) -> None:
    """Load the model of your own that --model MODULE:NAME names, so that the parser that
    follows knows its settings and presets."""
    early = _Quiet(add_help=False)
    early.add_argument("--model")
    try:
        model = early.parse_known_args(argv)[0].model
    except ValueError:  # (--model without a value: the real parser says so)
        return
    if model and ":" in model:
        load_kind(model)


def run() -> None:
    """The `minixl` command (and `python -m minixl`): main() on sys.argv, then exit with its
    code. Before exiting it freezes what the garbage collector tracks, so that the
    collector's last pass at exit does not walk every object torch and the run made."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else "minixl"
    # `--suite=NAME OPTIONS`: its options follow NAME as with `--suite NAME OPTIONS`
    argv = [part for a in argv for part in (a.split("=", 1) if a.startswith("--suite=")
                                            else [a])]
    try:
        _load_own_kinds(argv)
        parser = build_parser()
        args = parser.parse_args(argv)
        command = args.command
        if getattr(args, "suite", None) is not None:
            return _suite(args, parser)
        return args.func(args)
    except (Exception, KeyboardInterrupt) as err:
        code = exit_code(err)
        if code is None:
            raise
        print(_report(command, err), file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
