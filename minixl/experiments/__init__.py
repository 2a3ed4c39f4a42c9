"""The registry of runs that write a CSV: the benchmarks and the experiments behind the chapters.

Hand-written (not generated). Each entry of `EXPERIMENTS` is an `Experiment`: the function
that makes its rows (named "module:function" and imported only when it runs), its options
(name, type, default, help: the command line is built from them), the CSV it writes by
default (under book/, where a chapter plots it), the columns its printed table shows, and a
line of summary. Two command lines run an entry, the same way:

    python -m minixl.experiments NAME [--csv PATH] [options]
    minixl bench --suite NAME [--csv PATH] [options]

Both print the rows as a markdown table and write every column to the CSV atomically. Each
default is small enough for a laptop CPU; a test runs every entry on a tiny setting. Each
chapter's experiments live in its home (`minixl.xlnet.experiments`; Chapter 7's bench in
`minixl.one_bench.bench_all` and `.bench_cost`), named here and imported when an entry
runs; the benchmark of every model kind is `minixl.bench`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import importlib
import inspect
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import exit_code
from ..options import CORPUS, DEVICE, Option, add_options

__all__ = ["Experiment", "EXPERIMENTS", "register", "run", "default_csv", "write_csv",
           "markdown_table", "keep_row", "int_list", "torch_threads", "pins_threads",
           "build_parser", "main"]


@dataclass(frozen=True)
class Experiment:
    """One run that writes a CSV (see the module docstring). report, if given, names a
    function rows -> text printed after the table (a fitted slope, a verdict)."""

    name: str
    run: str  # "module:function", the function(**options) -> rows
    csv: str
    summary: str
    options: tuple[Option, ...] = ()
    columns: tuple[str, ...] = ()  # the printed table's (empty: every column)
    report: str | None = None
    # the function also takes csv=, the path its rows go to, and writes files of its own
    # beside it as it goes (a long run that resumes)
    beside: bool = False
    # the columns that measure the machine or read the clock (times, memory, what a time
    # decides, when a run ended), in its CSV or those beside it: they move from run to run;
    # every other column of a re-run on the same machine is the same
    measured: tuple[str, ...] = ()

    def function(self) -> Callable[..., list[dict]]:
        return _load(self.run)


def _load(spec: str) -> Callable:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


EXPERIMENTS: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add an entry (a name that is taken is an error)."""
    if experiment.name in EXPERIMENTS:
        raise ValueError(f"an experiment called {experiment.name!r} is registered already")
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def default_csv(path: str, here: str | Path | None = None) -> str:
    """Where an entry writes when no --csv is given, for an entry whose place in the book is
    `path` (book/...): that place when the command runs from the root of the book's
    checkout (the stored results are made so); anywhere else runs/ with the same name below
    it (book/bench/quality.csv -> runs/bench/quality.csv), as `minixl train` keeps its runs
    there, never a book/ folder made in whatever folder one stands in."""
    here = Path.cwd() if here is None else Path(here)
    if (here / "book").is_dir() and (here / "minixl" / "__init__.py").is_file():
        return path
    return _outside_the_book(path)


def _outside_the_book(path: str) -> str:
    return str(Path("runs", *Path(path).parts[1:]))


def run(name: str, *, csv: str | Path | None = None, **options) -> list[dict]:
    """The rows of entry `name` with these options (the others at their defaults); csv: where
    they will be written (an entry that writes files beside them is told; default
    default_csv(its own))."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}: expected one of {', '.join(EXPERIMENTS)}")
    entry = EXPERIMENTS[name]
    known = {o.name for o in entry.options}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"{name} takes no option {', '.join(unknown)}; it takes "
                         f"{', '.join(sorted(known)) or 'none'}")
    given = {o.name: options.get(o.name, o.default) for o in entry.options}
    if entry.beside:
        given["csv"] = str(csv or default_csv(entry.csv))
    rows = entry.function()(**given)
    if not rows:
        raise ValueError(f"{name} measured nothing with these settings")
    return rows


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


def keep_row(rows: list[dict], row: dict) -> None:
    """Keep one run's row and print it at once, so a long sweep shows its progress."""
    rows.append(row)
    print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block on n torch threads and give the caller's count back after: a matrix
    product rounds by how many threads share it, so a run meant to repeat pins its count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pins_threads(function: Callable) -> Callable:
    """Decorate an experiment that takes `threads`: it runs on that many torch threads, and
    the caller's count comes back after, whether it returns or raises (see torch_threads)."""
    signature = inspect.signature(function)
    if "threads" not in signature.parameters:
        raise TypeError(f"{function.__name__} takes no threads argument to pin")

    @functools.wraps(function)
    def pinned(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        with torch_threads(bound.arguments["threads"]):
            return function(*args, **kwargs)

    return pinned


def int_list(text: str, name: str, least: int = 1) -> list[int]:
    """'4,16,32' -> [4, 16, 32], each >= least; a clear error naming --name otherwise."""
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated integers, e.g. 4,16,32; got "
                         f"{text!r}") from None
    if not values or min(values) < least:
        raise ValueError(f"--{name} needs at least one integer, each >= {least}; got {text!r}")
    return values


def pick_arms(arms: str | None, known, sep: str = ";") -> list[str]:
    """The arms named in `arms` (separated by `sep`; None: all of `known`), each checked
    against `known`; a clear error naming the unknown ones and the choices otherwise."""
    chosen = list(known) if arms is None else [a.strip() for a in arms.split(sep) if a.strip()]
    unknown = [a for a in chosen if a not in known]
    if unknown or not chosen:
        joint = f"{sep} "
        also = f" (separated by {sep!r})" if sep != "," else ""
        raise ValueError(f"unknown arm(s) {joint.join(unknown) or '(none given)'}: expected "
                         f"some of {joint.join(known)}{also}")
    return chosen


def scale_embeddings(model) -> None:
    """Multiply model.tok's output by sqrt(C), as the sinusoid model does, on the input path
    only (a tied output layer reads the weights, not this output): the arm that differs
    from a model without positions' scale in that one thing."""
    scale = math.sqrt(model.config.d_model)
    model.tok.register_forward_hook(lambda module, args, out: out * scale)


# ---------------------------------------------------------------- the command line

def build_parser(prog: str = "python -m minixl.experiments") -> argparse.ArgumentParser:
    """One subcommand per entry, its flags built from the entry's options."""
    parser = argparse.ArgumentParser(prog=prog, description="Runs that write a CSV: the "
                                     "benchmarks and the experiments behind the chapters.")
    sub = parser.add_subparsers(dest="name", required=True, metavar="NAME")
    for entry in EXPERIMENTS.values():
        p = sub.add_parser(entry.name, help=entry.summary, description=entry.summary)
        p.add_argument("--csv", default=default_csv(entry.csv),
                       help=f"where to write (default {entry.csv} from the root of the book's "
                       f"checkout, else {_outside_the_book(entry.csv)})")
        p.add_argument("--all-columns", action="store_true",
                       help="print every column, not only the main ones")
        add_options(p, entry.options)
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m minixl.experiments",
         say: str | None = None) -> int:
    """Run one entry from the command line: exit 0 done, else minixl.errors.exit_code's
    (2 bad input; one line, that starts with `say`, by default the program's name, says
    why). An error that map does not know is a bug: its traceback is shown."""
    args = build_parser(prog).parse_args(argv)
    entry = EXPERIMENTS[args.name]
    options = {o.name: getattr(args, o.name) for o in entry.options}
    try:
        rows = run(entry.name, csv=args.csv, **options)
        path = write_csv(rows, args.csv)
    except Exception as err:  # (a Ctrl-C ends the process as Python ends it: 130)
        code = exit_code(err)
        if code is None:
            raise
        print(f"{say or prog}: error: {err}", file=sys.stderr)
        return code
    shown = [c for c in entry.columns if c in rows[0]]  # (a run may return other rows)
    print(markdown_table(rows, None if args.all_columns else shown or None))
    if entry.report:
        print(_load(entry.report)(rows))
    print(f"{len(rows)} rows written to {path}")
    return 0


# ---------------------------------------------------------------- the entries

_SEEDS = Option("seeds", str, "0,1,2", "comma-separated seeds, one run per seed and arm")
_THREADS = Option("threads", int, 1, "CPU threads (one is steadiest on a shared machine)")
_CUDA_DEVICE = Option("device", str, "cpu", "cpu, cuda or cuda:N")
# the benches of every mechanism (bench_all, bench_cost, bench_recall) share these
_MODELS = Option("models", str, None, "comma-separated bench arms, model kinds or MODULE:NAME "
                 "(default: every registered kind's arms)")
# the choices are minixl.model_kind.FLOP_POLICIES, spelled out: that module imports torch,
# and this one loads without it
_FLOP_POLICY = Option("flop_policy", str, "causal", "how every arm's training FLOPs are "
                      "counted: causal (each query charged only the keys it may read) or kernel "
                      "(a dense window's masked half charged too, what an eager kernel computes; "
                      "the book's first runs counted so)",
                      choices=("kernel", "causal"))
_SHAPE_LENGTH = Option("shape_length", int, 256, "the length each contestant is sized at: its "
                       "width and depth then stay at every length")

register(Experiment(
    "models", "minixl.bench:models_suite", "book/bench_models.csv",
    "training tokens/s, TFLOP/s, MFU and peak memory of every model kind, each in a fresh "
    "process",
    (Option("preset", str, None, "one preset for every kind (a paper-scale preset: its own "
            "model only; default: each kind's paper-scale preset, else base)"),
     Option("models", str, None, "comma-separated model kinds (default: every kind)"),
     Option("batch_size", int, None, "sequences per step (default: the preset's training "
            "batch)"),
     Option("steps", int, 10, "timed steps"), Option("warmup", int, 3, "untimed steps first"),
     DEVICE, Option("compile", bool, False, "torch.compile each model"),
     Option("peak_tflops", float, None, "the device's bf16 peak, if minixl does not know it")),
    ("model", "preset", "device", "batch_size", "seq_len", "params", "tokens_per_s", "tflops",
     "mfu", "peak_mb"),
    measured=("tokens_per_s", "tflops", "mfu", "peak_mb", "warmup_s")))

register(Experiment(
    "profile", "minixl.bench:profile", "book/gpu/profile/profile.csv",
    "where a training step's time goes: the top operators (on CUDA, GPU kernels) by self "
    "time of a step of each preset, under torch.profiler",
    (Option("presets", str, "t12,xl-base,segtree-base", "comma-separated paper-scale presets "
            "or MODEL/PRESET (xl/tiny)"),
     Option("batch_size", int, None, "sequences per step (default: the preset's training "
            "batch)"),
     Option("steps", int, 2, "profiled steps"),
     Option("warmup", int, 3, "unprofiled steps first (where a compiled model compiles)"),
     Option("top", int, 15, "operators kept per preset"),
     DEVICE, Option("compile", bool, False, "torch.compile each model, as --compile does")),
    ("preset", "device", "compile", "rank", "name", "ms_per_step", "share", "calls_per_step"),
    measured=("ms_per_step", "share", "calls_per_step", "all_ms_per_step", "rank", "name")))

register(Experiment(
    "positions", "minixl.char_transformer.experiments:positions", "book/positions.csv",
    "Chapter 1: held-out bpc of per-layer position tables and a sinusoid (and the per-layer "
    "tables with the sinusoid model's embedding scale), by depth and seed",
    (Option("depths", str, "4,8", "comma-separated numbers of layers"), _SEEDS,
     Option("steps", int, 200, "optimiser steps per run (section 1.7: 200)"), _THREADS,
     Option("arms", str, "per_layer,sinusoid,per_layer_scaled", "comma-separated: "
            "per_layer, sinusoid, per_layer_scaled (per-layer tables, token embeddings "
            "scaled by sqrt(C) as the sinusoid model's are)")),
    measured=("seconds",)))

register(Experiment(
    "nanogpt_race", "minixl.char_transformer.experiments:nanogpt_race",
    "book/nanogpt_race.csv",
    "Chapter 1's loop: `minixl train` against nanoGPT's train.py, whole commands in turn, "
    "on Tiny Shakespeare at nanoGPT's CPU recipe (or its GPU recipe, or GPT-2 small's shape)",
    (Option("nanogpt", str, None, "a checkout of github.com/karpathy/nanoGPT", required=True),
     Option("text", str, None, "Tiny Shakespeare (nanoGPT's data/shakespeare_char/input.txt)",
            required=True),
     Option("rounds", int, 3, "runs of each, in turn"),
     Option("steps", int, 2000, "optimiser steps of each run (the recipe's: 2000)"),
     Option("dtypes", str, "auto", "minixl's --dtype in each round, comma-separated (auto, "
            "its default, is the program called minixl; fp32,auto adds an fp32 run)"),
     Option("recipe", str, "cpu", "cpu: nanoGPT's CPU recipe (4 x 128, window 64, batch 12); "
            "shakespeare: its GPU recipe (6 x 384, window 256, batch 64, dropout 0.2); "
            "gpt2-small: GPT-2 small's shape (12 x 768, window 1024, batch 12, lr 6e-4)",
            choices=("cpu", "shakespeare", "gpt2-small")),
     Option("device", str, "cpu", "where both programs train", choices=("cpu", "cuda")),
     Option("compile", bool, False, "both programs compile their model (nanoGPT's "
            "--compile=True, minixl's --compile)")),
    report="minixl.char_transformer.experiments:race_ratio",
    measured=("seconds",)))

register(Experiment(
    "depth", "minixl.aux_losses.experiments:depth_sweep", "book/depth_sweep.csv",
    "Chapter 2: held-out bpc by depth, pre/post-norm, with and without intermediate losses",
    (Option("depths", str, "4,16,32", "comma-separated numbers of layers"),
     Option("norms", str, "pre,post", "'pre', 'post' or both: where each layer normalises"),
     _SEEDS, Option("steps", int, 150, "optimiser steps per run"),
     Option("d_model", int, 32, "model width (4 heads, feed-forward 4x wider)"),
     Option("seq_len", int, 32, "window length in bytes"),
     Option("batch_size", int, 16, "windows per step"),
     Option("lr", float, 2e-3, "peak learning rate"),
     Option("eval_bytes", int, 8192, "held-out bytes scored at the end of each run"),
     _THREADS),
    measured=("seconds",)))

register(Experiment(
    "aux_ablation", "minixl.aux_losses.experiments:aux_ablation", "book/aux_ablation.csv",
    "Chapter 2.6: the losses added one at a time (and two arms without warm-up), 3 seeds, "
    "read by both protocols, and every layer's own readout",
    (_SEEDS, Option("steps", int, 150, "optimiser steps per run (section 2.6: 150)"),
     Option("arms", str, None, "arms separated by ';': plain; + positions; + layers; + targets; "
            "+ positions, no warm-up; + layers, no warm-up (default: all six)"),
     Option("eval_bytes", int, 8192, "held-out bytes of the all-positions reading and the "
            "layers' readouts"),
     Option("sliding_bytes", int, 2048, "held-out bytes read both ways (the sliding window "
            "costs one window per byte)"),
     _THREADS),
    ("arm", "seed", "warmup", "valid_bpc", "all_positions_bpc", "sliding_bpc",
     "train_seconds"),
    measured=("train_seconds",)))

register(Experiment(
    "shaw_cost", "minixl.relative_attention.experiments:shaw_cost", "book/bench_shaw.csv",
    "Chapter 3: the bucket and gathered forms of Shaw attention, forward + backward, and the "
    "form minixl picks",
    (Option("lengths", str, None, "comma-separated sequence lengths (default 16,32,64,128,256; "
            "on CUDA 64 to 1024)"),
     Option("clips", str, "4,16", "comma-separated clipping distances k"),
     Option("repeats", int, 5, "timed runs per point (the fastest is kept)"), DEVICE),
    ("T", "max_relative", "device", "bucket_ms", "gathered_ms", "fastest", "chosen"),
    measured=("bucket_ms", "gathered_ms", "fastest")))

register(Experiment(
    "shaw_positions", "minixl.relative_attention.experiments:shaw_positions",
    "book/shaw_positions.csv",
    "Chapter 3.7: learned per-layer positions, a sinusoid and Shaw's relative attention, with "
    "and without the sinusoid model's sqrt(C) embedding scale, 3 seeds, at 3 lengths",
    (_SEEDS, Option("steps", int, 250, "optimiser steps per run (section 3.7: 250)"),
     Option("max_relative", int, 16, "Shaw's clipping distance K"),
     Option("lengths", str, "64,128,256", "comma-separated evaluation window lengths"),
     Option("eval_bytes", int, 16385, "held-out bytes scored (the first of the split)"),
     _THREADS,
     Option("arms", str, "per_layer,per_layer_scaled,sinusoid,shaw,shaw_scaled",
            "comma-separated: per_layer, per_layer_scaled, sinusoid, shaw, shaw_scaled "
            "(*_scaled: token embeddings scaled by sqrt(C) as the sinusoid model's are)")),
    measured=("seconds",)))

register(Experiment(
    "xl_eval_speed", "minixl.transformer_xl.experiments:xl_eval_speed",
    "book/xl_eval_speed.csv",
    "Chapter 4: evaluation time per byte of the sliding window and of XL's memory (hidden "
    "states, keys and values), measured and predicted",
    (Option("lengths", str, "64,128,256,512,1024,2048", "comma-separated attention lengths A"),
     Option("streams", int, 4, "rows per forward pass, the same for every protocol"),
     Option("tgt_len", int, 32, "segment length of the memory protocols"),
     Option("preset", str, None, "take the model's sizes from this --model xl preset (e.g. "
            "xl-base) instead of the size options"),
     Option("n_layer", int, 3, "layers"), Option("d_model", int, 64, "model width"),
     Option("n_head", int, 4, "heads"), Option("d_head", int, 16, "width of a head"),
     Option("d_inner", int, 256, "feed-forward width"),
     Option("passes", int, 8, "timed forward passes (windows or segments) per protocol and "
            "length"),
     Option("seed", int, 0, "seed of the weights and the bytes"), _THREADS, _CUDA_DEVICE),
    measured=("sliding_us", "states_us", "kv_us", "measured_states", "measured_kv")))

register(Experiment(
    "xl_order", "minixl.transformer_xl.experiments:xl_order", "book/xl_order.csv",
    "Chapter 4: recurrence vs data order and stale memory, held-out bpc per arm and seed",
    (_SEEDS, Option("steps", int, 250, "optimiser steps per run"),
     Option("eval_bytes", int, 8192, "held-out bytes scored at the end of each run"),
     _THREADS)))

register(Experiment(
    "hf-xl", "minixl.transformer_xl.experiments:hf_xl", "book/bench_hf_xl.csv",
    "Chapter 4: forward + backward tokens/s of minixl's Transformer-XL against Hugging "
    "Face's TransfoXL (transformers 4.37.x) at one --model xl preset",
    (Option("preset", str, "xl-base", "the --model xl preset both are built at"),
     Option("batch_size", int, None, "sequences per step (default: the preset's)"),
     Option("steps", int, 10, "timed steps per round"),
     Option("warmup", int, 3, "untimed steps of each first"),
     Option("rounds", int, 3, "rounds, alternating between the two"), DEVICE),
    ("preset", "device", "dtype", "batch_size", "tgt_len", "mem_len", "minixl_tokens_per_s",
     "hf_tokens_per_s", "ratio"),
    measured=("minixl_tokens_per_s", "hf_tokens_per_s", "ratio")))

register(Experiment(
    "xlnet_memory", "minixl.xlnet.experiments:xlnet_memory", "book/xlnet_memory.csv",
    "Chapter 5.6: XLNet with and without its memory across segments (random windows, ordered "
    "streams, the paper's pretraining input), held-out bpc of three readings per arm and seed; "
    "the pretraining arm also read with its segment ids",
    (_SEEDS, Option("steps", int, 500, "optimiser steps per run (section 5.8: 500)"),
     Option("mem_len", int, 64, "the memory of the arms that have one, and of the memory "
            "reading for every arm"),
     Option("arms", str, None, "arms separated by ';': random windows; ordered streams; "
            "ordered streams + memory; pretraining input + memory (default: all four)"),
     Option("eval_bytes", int, 16384, "held-out bytes scored at the end of each run"),
     _THREADS),
    ("arm", "seed", "bpc_windows", "bpc_memory", "bpc_infill", "last_train_bpc",
     "train_seconds"),
    measured=("train_seconds",)))

register(Experiment(
    "xlnet_k_cost", "minixl.xlnet.experiments:xlnet_k_cost", "book/xlnet_k_cost.csv",
    "Chapter 5.5: a training step's time against K in interleaved rounds (fastest and "
    "median), beside its FLOPs split into the content and the query stream",
    (Option("ks", str, "1,2,4,6,8", "comma-separated K (n_predict = 64 // K)"),
     Option("rounds", int, 11, "interleaved rounds (every K once per round)"),
     Option("steps", int, 10, "timed steps of each K per round"),
     Option("batch_size", int, 16, "sequences of 64 bytes per step"), _THREADS,
     _CUDA_DEVICE),
    ("K", "n_predict", "fastest_ms", "median_ms", "fastest_ratio", "median_ratio", "gflops",
     "content_gflops", "query_gflops", "flops_ratio"),
    measured=("fastest_ms", "median_ms", "fastest_ratio", "median_ratio")))

register(Experiment(
    "xlnet_objectives", "minixl.xlnet.experiments:xlnet_objectives",
    "book/xlnet_objectives.csv",
    "Chapter 5.8: causal, XLNet (11 and 64 targets, and span targets) and BERT-style "
    "objectives on one model, 3 seeds, held-out infilling and left-to-right bpc",
    (_SEEDS, Option("steps", int, 500, "optimiser steps per run (section 5.8: 500)"),
     Option("arms", str, None, "arms separated by ';' (default: the five of section 5.8; "
            "also XLNet, 32 targets and XLNet, 16 targets, for exercise 5)"),
     Option("eval_bytes", int, 16384, "held-out bytes scored at the end of each run"),
     _THREADS),
    ("arm", "seed", "bpc_infill", "bpc_infill_independent", "bpc_infill_causal",
     "bpc_left_to_right", "train_seconds"),
    measured=("train_seconds",)))

register(Experiment(
    "xlnet_control", "minixl.xlnet.experiments:pair_control", "book/xlnet_control.csv",
    "Chapter 5.2: the positive control: one small XLNet trained by the permutation, "
    "independent and causal objectives on pair records, bits per pair read three ways",
    (_SEEDS, Option("steps", int, 500, "optimiser steps per run"),
     Option("eval_windows", int, 256, "held-out windows whose middle pair is scored"),
     _THREADS),
    ("arm", "seed", "steps", "bits_joint", "bits_independent", "bits_causal")))

register(Experiment(
    "segtree_cost", "minixl.segtree.experiments:segtree_bench", "book/segtree_cost.csv",
    "Chapter 6.7: one causal attention layer (SegTree fast and gathered, dense fused and "
    "written out) against n, interleaved rounds in one process, peak memory per point in "
    "a fresh one",
    (Option("max_n", int, 65536, "the longest input, from min-n doubling"),
     Option("min_n", int, 1024, "the shortest input"),
     Option("rounds", int, 3, "interleaved rounds (every method once per round)"),
     Option("methods", str, "segtree,segtree-gathered,dense-fused,dense-written,"
            "segtree-projections", "comma-separated layers to measure"), DEVICE),
    ("method", "n", "seconds", "median_seconds", "peak_mb"),
    report="minixl.segtree.experiments:bench_report",
    measured=("seconds", "median_seconds", "peak_mb")))

register(Experiment(
    "segtree_quality", "minixl.segtree.experiments:segtree_quality", "book/segtree_quality.csv",
    "Chapter 6.8: held-out bpc of dense, Shaw and SegTree (pre- and post-norm) models at "
    "windows 256 to 1,024, 3 seeds",
    (Option("windows", str, "256,512,1024", "comma-separated window lengths"),
     Option("arms", str, "dense,shaw,segtree,segtree-post", "comma-separated models"),
     Option("post_windows", str, "256", "the windows at which segtree-post (the paper's "
            "post-norm block) runs"),
     Option("shaw_windows", str, "256,512,1024", "the windows at which shaw runs"), _SEEDS,
     Option("steps", int, 150, "optimiser steps per run"),
     Option("batch_size", int, 4, "windows per step"),
     Option("lr", float, 3e-3, "peak learning rate"),
     Option("max_relative", int, 64, "the Shaw model's clipping distance"),
     Option("eval_bytes", int, 32768, "held-out bytes scored at the end of each run"),
     _THREADS),
    ("arm", "window", "seed", "params", "valid_bpc", "train_seconds"),
    measured=("train_seconds",)))

register(Experiment(
    "segtree_reach", "minixl.segtree.experiments:segtree_reach", "book/segtree_reach.csv",
    "Chapter 6.9: reach through the tree's summaries (a flag question, and recall of 6 "
    "letters) against dense models with a short and a full window",
    (Option("window", int, 512, "the SegTree model's window (and the long dense one's)"),
     Option("filler", int, 120, "dots between the two copies (distance = filler + 8)"),
     Option("dense_window", int, 64, "the short dense model's window"),
     Option("steps", int, 600, "optimiser steps per recall run"),
     Option("question_steps", int, 800, "optimiser steps per flag-question run"),
     Option("batch_size", int, 8, "windows of `window` bytes per step (the short model gets "
            "as many bytes in shorter windows)"),
     Option("lr", float, 3e-3, "peak learning rate"),
     Option("seeds", str, "0", "comma-separated seeds of the recall runs"),
     Option("question_seeds", str, "0,1,2", "comma-separated seeds of the flag-question runs"),
     _THREADS),
    ("task", "arm", "window", "seed", "distance", "accuracy", "accuracy_near", "accuracy_far",
     "bits")))

register(Experiment(
    "bench_all", "minixl.one_bench.bench_all:bench_all", "book/bench/quality.csv",
    "The bench of every mechanism: every contestant at one parameter count and each budget of "
    "training FLOPs (minixl.planner), held-out bpc under its own protocol and read left to "
    "right, and the reach task by distance; plan.csv and reach.csv beside --csv, each point "
    "written when done (a stopped run resumes)",
    (Option("budgets", str, "5e11,1e12,2e12", "comma-separated budgets of training FLOPs: "
            "every contestant trains once at each (the reach task at the largest)"),
     Option("params", int, 200_000, "the parameter count every contestant is sized to"),
     _SEEDS,
     _MODELS,
     Option("lengths", str, "128,512", "comma-separated window (or segment) lengths"),
     Option("distances", str, "16,64,256,1024,4096", "comma-separated distances of the reach "
            "task (each at least 8)"),
     Option("batch_size", int, 8, "windows (or streams) per step, every contestant"),
     Option("eval_bytes", int, 32768, "held-out bytes read by both protocols"),
     Option("reach_eval", int, 200, "held-out reach records per seed"),
     Option("lr", float, 2e-3, "peak learning rate, every contestant (unless --lrs)"),
     Option("lrs", str, None, "comma-separated peak learning rates (at least three): each "
            "arm is first trained at each, at the smallest budget and length on the smallest "
            "seed, scored on the training split's last bytes (held out of those runs), and "
            "the best is that arm's rate (lr.csv, plan.csv)"),
     _FLOP_POLICY, _CUDA_DEVICE, _THREADS,
     Option("reach_only", bool, False, "the reach task alone, no held-out text (a control "
            "of it at other distances, say); --csv then names a reach.csv in a folder of its "
            "own"),
     CORPUS),
    ("arm", "length", "seed", "params", "steps", "own_protocol", "own_bpc", "common_bpc",
     "train_seconds"), beside=True,
    measured=("train_seconds", "seconds", "ended")))

register(Experiment(
    "bench_cost", "minixl.one_bench.bench_cost:bench_cost", "book/bench/cost.csv",
    "The bench's cost against length: every contestant at one parameter count, time and "
    "peak memory per byte of a training step (memory in a fresh process, under a cap), of "
    "reading and of generating byte by byte; what does not fit is written as such",
    (Option("params", int, 200_000, "the parameter count every contestant is sized to"),
     Option("lengths", str, "256,1024,4096,16384", "comma-separated text lengths: one "
            "window of each for a window model; for a memory model (XL), segments of its "
            "--shape-length with a memory grown to the length"),
     _SHAPE_LENGTH,
     Option("models", str, None, "comma-separated bench arms, model kinds or MODULE:NAME "
            "(default: every registered kind's arms but the controls, XL with no memory)"),
     Option("rounds", int, 2, "interleaved rounds of the times (the fastest is kept, and "
            "the slowest beside it)"),
     Option("gen_bytes", int, 4, "bytes generated one at a time, timed"),
     Option("memory_limit_gb", float, 8.0, "the cap on what one training step may add "
            "(GiB)"),
     _THREADS),
    ("arm", "length", "shape", "params", "segment", "memory", "fits", "train_peak_mb",
     "train_ms_per_byte", "read_ms_per_byte", "generate_ms_per_byte", "note"),
    report="minixl.one_bench.bench_cost:report", beside=True,
    measured=("train_peak_mb", "train_ms_per_byte", "train_ms_slowest", "read_ms_per_byte",
              "read_ms_slowest", "generate_ms_per_byte", "generate_ms_slowest")))

register(Experiment(
    "bench_recall", "minixl.one_bench.recall:bench_recall", "book/bench/recall/recall.csv",
    "Recall at length: every contestant sized once, the same training FLOPs at each context "
    "length, trained on multi-query associative recall in bytes (loss on the answers), "
    "accuracy by band of distance, each band marked in or out of reach before training; a "
    "dense-attention positive control in every run (a stopped run resumes)",
    (Option("budget", float, 1.5e13, "training FLOPs of every contestant at every length (at "
            "1.5e13 Shaw's arm, sized at 64, takes 20,304 steps of 16 windows of 64 bytes)"),
     Option("params", int, 100_000, "the parameter count every contestant is sized to"),
     _SEEDS,
     _MODELS,
     Option("lengths", str, "64", "comma-separated window (or segment) lengths (the issue's "
            "256,1024,4096, with --shape-length 256 and --distances 16,64,256,1024,4096, is a "
            "GPU's run)"),
     Option("shape_length", int, 64, "the length each contestant is sized at: its width and "
            "depth then stay at every length"),
     Option("distances", str, "4,32,64,128,256", "comma-separated edges of the bands of "
            "distance in bytes (each query's distance drawn within a band); the first band is "
            "the control's, inside every window"),
     Option("batch_size", int, 16, "windows (or streams) per step, every contestant"),
     Option("train_bytes", int, 1 << 20, "bytes of the training stream"),
     Option("near", float, 0.7, "the nearest band's share of the training stream's draws "
            "of distance (a little less of the queries asked: 0.64 for 0.7 at the default "
            "bands; the held-out stream's bands are drawn equally)"),
     Option("eval_items", int, 2000, "held-out items (3 bytes each) per seed"),
     Option("lr", float, 3e-3, "peak learning rate, every contestant"),
     Option("control", str, "shaw", "the bench arm of the positive control (dense attention)"),
     Option("control_accuracy", float, 0.95, "the accuracy the control must reach in the "
            "nearest band, in every seed"),
     _FLOP_POLICY, _CUDA_DEVICE, _THREADS),
    ("arm", "length", "seed", "steps", "band", "cases", "accuracy", "bits", "reachable"),
    beside=True, measured=("train_seconds",)))

register(Experiment(
    "bench_context", "minixl.one_bench.context:bench_context", "book/bench/context/context.csv",
    "Text at length: every contestant sized once, trained at each context length with the same "
    "FLOPs, held-out bpc of the same bytes read with each context (from a fresh state), each "
    "context marked in or out of reach; the bits each doubling buys (a stopped run resumes)",
    (Option("budget", float, 5e11, "training FLOPs of every contestant at every length (the "
            "reading costs about half as much again on a CPU)"),
     Option("params", int, 200_000, "the parameter count every contestant is sized to"),
     _SEEDS,
     _MODELS,
     Option("lengths", str, "128,512", "comma-separated window (or segment) lengths"),
     Option("shape_length", int, 128, "the length each contestant is sized at: its width and "
            "depth then stay at every length"),
     Option("contexts", str, "32,64,128,256,512,1024", "comma-separated contexts "
            "(bytes) each held-out block is read with, from a fresh state"),
     Option("block", int, 32, "held-out bytes scored after each context"),
     Option("targets", int, 2048, "held-out bytes scored at each context (the same ones; "
            "whole blocks of them)"),
     Option("batch_bytes", int, 1024, "bytes a step at every length (batch_bytes // length "
            "windows or streams), every contestant"),
     Option("lr", float, 2e-3, "peak learning rate, every contestant"),
     _FLOP_POLICY, _CUDA_DEVICE, _THREADS),
    ("arm", "length", "seed", "steps", "context", "bytes", "bpc", "reachable"),
    beside=True, measured=("train_seconds",)))
