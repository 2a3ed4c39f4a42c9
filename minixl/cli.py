"""The `minixl` command line: train, sample, eval, bench.

Hand-written (not generated). Run `minixl --help` or `python -m minixl --help`.
"""

from __future__ import annotations

import argparse
import sys
import torch

from . import train as T
from .aux_losses import evaluate_bpc_sliding
from .char_transformer import generate
from .data import DownloadError, decode, encode, load_corpus
from .transformer_xl import NoMemory, evaluate_bpc_xl, generate_xl

__all__ = ["main"]

SHARED_FLAGS = ("n_layer", "d_model", "n_head", "d_inner", "dropout")
CHAR_FLAGS = ("block_size", "pos")
XL_FLAGS = ("tgt_len", "mem_len", "clamp_len", "d_head", "pre_lnorm")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help=f"one of {', '.join(T.PRESETS)} (default tiny)")
    p.add_argument("--model", choices=T.MODELS, default="char",
                   help="char (Chapters 1-3, windows) or xl (Chapter 4's Transformer-XL, "
                   "segments with memory)")
    g = p.add_argument_group("model sizes (override the preset)")
    for name in ("n_layer", "d_model", "n_head", "d_inner"):
        g.add_argument(_flag(name), type=int)
    g.add_argument("--dropout", type=float)
    g.add_argument("--block-size", type=int, help="char: the window length")
    g.add_argument("--pos", help="char: per_layer, sinusoid or none")
    g.add_argument("--tgt-len", type=int, help="xl: the segment length")
    g.add_argument("--mem-len", type=int, help="xl: memory length per layer")
    g.add_argument("--clamp-len", type=int, help="xl: cap on relative distances (0 = none)")
    g.add_argument("--d-head", type=int, help="xl: width of one head")
    g.add_argument("--pre-lnorm", action=argparse.BooleanOptionalAction, default=None,
                   help="xl: layer norm before each sublayer (the tiny and small presets) or "
                   "after it (base, as in the paper)")
    p.add_argument("--attention", choices=T.ATTENTIONS, default="default",
                   help="default (Chapter 1) or shaw (Chapter 3's relative attention; implies "
                   "--pos none unless --pos is given)")
    p.add_argument("--max-relative", type=int, default=16,
                   help="shaw: the clipping distance k (default 16)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu or cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")


MEMORY_FLAGS = ("tgt_len", "mem_len", "clamp_len")


def _given(args, names: tuple[str, ...]) -> list[str]:
    """The flags among names that were set on the command line."""
    return [_flag(n) for n in names if getattr(args, n, None) is not None]


def _reject(args, names: tuple[str, ...], model: str) -> None:
    given = _given(args, names)
    if given:
        other = "char" if model == "xl" else "xl"
        raise ValueError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to "
                         f"--model {other}, not --model {model}")


def _configs(args):
    model_cfg, train_cfg = T.preset(args.preset, args.model)
    _reject(args, CHAR_FLAGS if args.model == "xl" else XL_FLAGS, args.model)
    if args.model == "char" and args.attention == "shaw" and args.pos is None:
        args.pos = "none"  # relative attention replaces absolute positions
    own = XL_FLAGS if args.model == "xl" else CHAR_FLAGS
    model_cfg = T.with_overrides(model_cfg, **{k: getattr(args, k) for k in SHARED_FLAGS + own})
    train_over = {k: getattr(args, k, None) for k in
                  ("corpus", "out", "steps", "batch_size", "lr", "eval_every", "ckpt_every", "seed",
                   "aux_losses", "aux_targets")}
    return model_cfg, T.with_overrides(train_cfg, device=args.device, compile=args.compile,
                                       attention=args.attention, max_relative=args.max_relative,
                                       model=args.model, **train_over)


def _sample(model, prompt, n, **kw):
    """Chapter 1's generate for windowed models, Chapter 4's (with memory) for Transformer-XL."""
    sample = generate_xl if T.is_xl(model) else generate
    return sample(model, prompt, n, **kw)


def cmd_train(args) -> None:
    model_cfg, cfg = _configs(args)
    if args.sample_len and not args.prompt:
        raise ValueError("--prompt must not be empty when a sample is asked for (--sample-len)")
    result = T.train(model_cfg, cfg, resume=args.resume, overwrite=args.overwrite,
                     progress=not args.no_progress)
    model = result["model"]
    print(f"corpus: {result['corpus'].description}")
    print(f"trained {cfg.steps} steps on {result['device']} in {result['seconds']:.0f} s")
    how = "with memory" if cfg.model == "xl" else "all positions"
    print(f"held-out bpc (valid, {how}): {result['valid_bpc']:.3f}")
    print(f"run folder: {result['out']} (checkpoint.pt, metrics.csv, loss.png)")
    if args.sample_len:
        gen = torch.Generator().manual_seed(cfg.seed)
        out = _sample(model, encode(args.prompt), args.sample_len, temperature=0.8, generator=gen)
        print("sample:\n" + decode(out))


def cmd_sample(args) -> None:
    device = T.resolve_device(args.device)
    model = T.model_from_checkpoint(args.checkpoint).to(device)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = encode(args.prompt)
    with T.autocast(device):
        out = _sample(model, prompt, args.n, temperature=args.temperature, top_k=args.top_k,
                      generator=gen)
    print(decode(out))


def cmd_eval(args) -> None:
    device = T.resolve_device(args.device)
    ckpt = T.load_checkpoint(args.checkpoint)
    kind = T.checkpoint_model_kind(ckpt)
    if args.model is not None and args.model != kind:
        raise ValueError(f"{args.checkpoint} holds a --model {kind} checkpoint, not --model "
                         f"{args.model}")
    if kind == "char":
        _reject(args, MEMORY_FLAGS, "char")
    model = T.model_from_checkpoint(ckpt).to(device)
    corpus_name = args.corpus or ckpt["train_config"]["corpus"]
    corpus = load_corpus(corpus_name)
    data = getattr(corpus, args.split)
    if args.max_bytes is not None:
        if args.max_bytes < 2:
            raise ValueError(f"--max-bytes must be at least 2, got {args.max_bytes}")
        data = data[:args.max_bytes]
    protocol = args.protocol or ("memory" if kind == "xl" else "all-positions")
    if args.stride is not None and protocol != "sliding":
        raise ValueError("--stride applies to --protocol sliding only")
    if protocol == "memory":
        if kind != "xl":
            raise ValueError("--protocol memory needs a --model xl checkpoint; this one is a "
                             "windowed model (use all-positions or sliding)")
        if args.seq_len is not None:
            raise ValueError("--seq-len applies to the window protocols; with memory use "
                             "--tgt-len and --mem-len")
        # the config's own checks validate the overrides
        c = T.with_overrides(model.config, **{n: getattr(args, n) for n in MEMORY_FLAGS})
        tgt_len, mem_len = c.tgt_len, c.mem_len
        streams = T.xl_eval_streams(len(data), tgt_len, args.batch_size)
        with T.autocast(device):
            bpc = evaluate_bpc_xl(model, data, tgt_len=tgt_len, mem_len=mem_len,
                                  clamp_len=c.clamp_len, batch_size=streams)
        print(f"{corpus_name} {args.split}: {bpc:.4f} bpc ({len(data):,} bytes as {streams} "
              f"stream{'s' * (streams > 1)}, segments of {tgt_len}, memory of {mem_len})")
        return
    if kind == "xl":
        given = _given(args, MEMORY_FLAGS)
        if given:
            raise ValueError(f"{', '.join(given)} apply to --protocol memory; the window "
                             "protocols take --seq-len")
        model, block = NoMemory(model), model.config.tgt_len
    else:
        block = model.config.block_size
    seq_len = args.seq_len or block
    if seq_len > block and getattr(model, "pos", None) is not None:
        raise ValueError(f"--seq-len {seq_len} is longer than the model's block_size "
                         f"{block} (its learned position table); only models "
                         "without absolute positions (--pos none) evaluate beyond it")
    stride = seq_len if protocol == "all-positions" else (args.stride or 1)
    with T.autocast(device):
        bpc = evaluate_bpc_sliding(model, data, seq_len=seq_len, stride=stride,
                                   batch_size=args.batch_size)
    how = ("all positions of non-overlapping windows" if stride == seq_len else
           f"sliding window, last {stride} position{'s' * (stride > 1)} of each window")
    print(f"{corpus_name} {args.split}: {bpc:.4f} bpc ({len(data):,} bytes, windows of {seq_len}, "
          f"{how})")


def cmd_bench(args) -> None:
    model_cfg, _ = _configs(args)
    r = T.bench(model_cfg, batch_size=args.batch_size, steps=args.steps, device=args.device,
                compile=args.compile, peak=args.peak_tflops, attention=args.attention,
                max_relative=args.max_relative, model=args.model)
    what = "model: xl (memory carried)" if args.model == "xl" else f"attention: {r['attention']}"
    print(f"device: {r['device']}  params: {r['params']:,}  batch {r['batch_size']} x "
          f"{r['block_size']}  {what}  compile: {r['compile']}")
    print(f"train tokens/s: {r['tokens_per_s']:,.0f}  achieved: {r['tflops']:.2f} TFLOP/s")
    if r["mfu"] is not None:
        print(f"MFU: {100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f} TFLOP/s (bf16 dense peak)")
    elif r["device"] == "cpu":
        print("MFU: not reported on the CPU")
    else:
        print(f"MFU: unknown peak for {r['device']}; pass --peak-tflops")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minixl", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model; writes a run folder")
    _model_flags(t)
    t.add_argument("--corpus", help="pydoc (default), enwik8, text8, or a path to a text file")
    t.add_argument("--out", help="run folder (default runs/PRESET)")
    t.add_argument("--steps", type=int)
    t.add_argument("--batch-size", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--eval-every", type=int, help="held-out bpc every N steps")
    t.add_argument("--ckpt-every", type=int, help="checkpoint every N steps")
    t.add_argument("--seed", type=int)
    t.add_argument("--aux-losses", help="Chapter 2's losses: comma-separated positions, "
                   "layers[=W], targets[=W], or none (default: positions)")
    t.add_argument("--aux-targets", type=int, help="extra bytes ahead predicted by 'targets' "
                   "(default 1)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    t.add_argument("--overwrite", action="store_true", help="start again over an existing run")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--sample-len", type=int, default=300, help="bytes to sample at the end")
    t.add_argument("--prompt", default="The ", help="prompt of the final sample")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--prompt", default="The ")
    s.add_argument("--n", type=int, default=300, help="bytes to generate")
    s.add_argument("--temperature", type=float, default=0.8)
    s.add_argument("--top-k", type=int)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="auto")
    s.set_defaults(func=cmd_sample)

    e = sub.add_parser("eval", help="held-out bpc of a checkpoint")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--corpus", help="default: the corpus it was trained on")
    e.add_argument("--split", choices=["valid", "test"], default="valid")
    e.add_argument("--model", choices=T.MODELS, help="optional: check that the checkpoint "
                   "holds this kind of model")
    e.add_argument("--seq-len", type=int, help="window length (default: block_size, or tgt_len "
                   "for xl)")
    e.add_argument("--protocol", choices=["memory", "all-positions", "sliding"],
                   help="memory (xl, the default there): segments with memory; all-positions "
                   "(default for char): every position of non-overlapping windows; sliding: the "
                   "paper's one prediction per window (seq-len times slower)")
    e.add_argument("--tgt-len", type=int, help="memory: segment length (default: training's)")
    e.add_argument("--mem-len", type=int, help="memory: memory length (default: training's; "
                   "may be longer)")
    e.add_argument("--clamp-len", type=int, help="memory: cap on relative distances")
    e.add_argument("--stride", type=int, help="sliding: positions scored per window (default 1)")
    e.add_argument("--max-bytes", type=int, help="evaluate only the first N bytes of the split")
    e.add_argument("--batch-size", type=int, default=64, help="windows per batch; with memory, "
                   "the most parallel streams (each kept at least 32 segments long)")
    e.add_argument("--device", default="auto")
    e.set_defaults(func=cmd_eval)

    b = sub.add_parser("bench", help="training tokens/s, and MFU on CUDA")
    _model_flags(b)
    b.add_argument("--batch-size", type=int, default=32)
    b.add_argument("--steps", type=int, default=20, help="timed steps after 5 warm-up steps")
    b.add_argument("--peak-tflops", type=float, help="the device's peak, if minixl does not know it")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, T.CheckpointError, DownloadError, OSError) as err:
        print(f"minixl {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
