"""Chapter 1's experiments: per-layer position tables against a sinusoid, by depth; and the
trainer (Chapter 1's loop, with what a long run needs) against nanoGPT's on its CPU recipe.

Hand-written (not generated): entries of the registry of runs (`minixl.experiments`); the
chapter plots the stored CSV and names the command that made it. The registry imports this
module only when one of its entries runs.
"""

from __future__ import annotations

from pathlib import Path

from ..char_transformer import CharTransformer, CharTransformerConfig, evaluate_bpc
from ..data import RandomWindows, load_corpus
from ..experiments import int_list, keep_row, pick_arms, pins_threads, scale_embeddings
from ..training import TrainConfig, train

__all__ = ["positions", "POSITION_ARMS", "nanogpt_race", "race_ratio"]


POSITION_ARMS = ("per_layer", "sinusoid", "per_layer_scaled")


@pins_threads
def positions(depths: str = "4,8", seeds: str = "0,1,2", steps: int = 200, threads: int = 1,
              arms: str = ",".join(POSITION_ARMS), corpus: str = "pydoc") -> list[dict]:
    """Chapter 1, exercise 5: per-layer position tables against one sinusoid, by depth.

    Section 1.7's run (width 128, 4 heads, windows of 128, 16 per step, Chapter 1's loop
    through `minixl.train`, which gives the same weights) for every depth x seed x arm; one
    row per run with its held-out bpc over the whole validation split. The sinusoid model
    multiplies its token embeddings by sqrt(C) (Vaswani et al.), the per-layer model does
    not, so a third arm, per_layer_scaled, is the per-layer model with that factor: it
    differs from per_layer in the scale only and from sinusoid in the positions only. It
    runs on `threads` torch threads (a product's rounding depends on how many share it).
    """
    import time

    import torch

    depth_list, seed_list = int_list(depths, "depths"), int_list(seeds, "seeds", 0)
    arm_list = pick_arms(arms, POSITION_ARMS, sep=",")
    if steps < 1:
        raise ValueError(f"--steps must be positive, got {steps}")
    data = load_corpus(corpus)
    rows = []
    for n_layer in depth_list:
        for seed in seed_list:
            for arm in arm_list:
                torch.manual_seed(seed)
                pos = "sinusoid" if arm == "sinusoid" else "per_layer"
                model = CharTransformer(CharTransformerConfig(n_layer=n_layer, pos=pos))
                if arm == "per_layer_scaled":
                    scale_embeddings(model)
                start = time.perf_counter()
                train(model, TrainConfig(steps=steps, batch_size=16, lr=2e-3, warmup=30,
                                         weight_decay=0.01, grad_clip=1.0, seed=seed,
                                         device="cpu"),
                      batches=RandomWindows(data.train, 16, 128, seed=seed), progress=False)
                keep_row(rows, dict(n_layer=n_layer, seed=seed, pos=arm, steps=steps,
                                 valid_bpc=round(evaluate_bpc(model, data.valid, seq_len=128), 4),
                                 seconds=round(time.perf_counter() - start, 1)))
    return rows


# The race's recipes: (layers, heads, width, window, batch, dropout, lr). "cpu" is nanoGPT's
# CPU recipe for Tiny Shakespeare (its README); "shakespeare" its GPU recipe (the defaults of
# config/train_shakespeare_char.py); "gpt2-small" GPT-2 small's shape on the same text, at
# nanoGPT's GPT-2 learning rate. Every recipe warms up for 100 steps.
RACE_RECIPES = {"cpu": (4, 4, 128, 64, 12, 0.0, 1e-3),
                "shakespeare": (6, 6, 384, 256, 64, 0.2, 1e-3),
                "gpt2-small": (12, 12, 768, 1024, 12, 0.0, 6e-4)}


def race_commands(root: Path, source: Path, tmp: str, *, steps: int, dtypes: list[str],
                  recipe: str, device: str, compile: bool) -> dict:
    """The race's commands, {program: (argv, working folder)}: nanoGPT's train.py and
    `minixl train` (once per --dtype in dtypes) at one of RACE_RECIPES, the same shape,
    dropout, learning rate and warm-up in both."""
    import sys

    n_layer, n_head, width, window, batch, dropout, lr = RACE_RECIPES[recipe]
    return {
        "nanoGPT": ([sys.executable, "train.py", "config/train_shakespeare_char.py",
                     f"--device={device}", f"--compile={compile}", "--eval_iters=20",
                     # a log line waits for the GPU: there, nanoGPT's own interval
                     f"--log_interval={1 if device == 'cpu' else 10}",
                     f"--block_size={window}", f"--batch_size={batch}",
                     f"--n_layer={n_layer}", f"--n_head={n_head}", f"--n_embd={width}",
                     f"--max_iters={steps}", f"--lr_decay_iters={steps}",
                     f"--learning_rate={lr}", f"--min_lr={lr / 10}", "--warmup_iters=100",
                     f"--dropout={dropout}", f"--out_dir={tmp}/nanogpt"], root),
        **{("minixl" if d == "auto" else f"minixl --dtype {d}"): (
            [sys.executable, "-m", "minixl", "train", "--model", "char", "--n-layer",
             str(n_layer), "--d-model", str(width), "--n-head", str(n_head), "--d-inner",
             str(4 * width), "--block-size", str(window), "--batch-size", str(batch),
             "--steps", str(steps), "--lr", str(lr), "--warmup", "100", "--dropout",
             str(dropout), "--corpus", str(source.resolve()), "--eval-every", "250",
             "--out", f"{tmp}/minixl", "--overwrite", "--device", device, "--no-progress",
             *(["--compile"] if compile else []),
             *([] if d == "auto" else ["--dtype", d])], None) for d in dtypes},
    }


def nanogpt_race(nanogpt: str, text: str, rounds: int = 3, steps: int = 2000,
                 dtypes: str = "auto", recipe: str = "cpu", device: str = "cpu",
                 compile: bool = False) -> list[dict]:
    """Chapter 1's loop at a known recipe: `minixl train` against nanoGPT's train.py (a
    checkout of github.com/karpathy/nanoGPT at `nanogpt`), both on Tiny Shakespeare (`text`,
    its input.txt) at one of RACE_RECIPES (default: nanoGPT's CPU recipe, 4 layers of width
    128, 4 heads, windows of 64, batches of 12, lr 1e-3 after 100 warm-up steps, no dropout),
    `steps` steps, each with its own evaluation, checkpoints and (minixl) final sample, on
    `device`, both compiled or neither. The whole commands run in turn, `rounds` times each:
    nanoGPT's, then `minixl train` once for each of `dtypes` (comma-separated --dtype values;
    'auto', minixl's default, is the program called minixl, another is called 'minixl
    --dtype D'); one row per run: its seconds and its held-out bits per character (nanoGPT's
    on the last 10% of the text, minixl's on the 5% before the last 5%)."""
    import math
    import pickle
    import re
    import subprocess
    import tempfile
    import time

    import numpy as np

    root, source = Path(nanogpt), Path(text)
    if not (root / "train.py").is_file() or not (root / "config" /
                                                  "train_shakespeare_char.py").is_file():
        raise ValueError(f"--nanogpt {nanogpt}: expected a checkout of nanoGPT (train.py and "
                         "config/train_shakespeare_char.py)")
    if not source.is_file():
        raise ValueError(f"--text {text}: no such file (Tiny Shakespeare's input.txt)")
    if rounds < 1 or steps < 1:
        raise ValueError(f"need rounds >= 1 and steps >= 1, got {rounds} and {steps}")
    if recipe not in RACE_RECIPES:
        raise ValueError(f"--recipe {recipe!r}: expected one of {', '.join(RACE_RECIPES)}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: the race runs on cpu or cuda")
    dtype_list = [d.strip() for d in dtypes.split(",") if d.strip()]
    if not dtype_list or any(d not in ("auto", "fp32", "bf16") for d in dtype_list):
        raise ValueError(f"--dtypes takes comma-separated values among auto, fp32 and bf16; "
                         f"got {dtypes!r}")
    # nanoGPT's data/shakespeare_char/prepare.py, without its download: characters as ids,
    # the first 90% to train on
    data = source.read_text()
    chars = sorted(set(data))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in data], dtype=np.uint16)
    prepared = root / "data" / "shakespeare_char"
    prepared.mkdir(parents=True, exist_ok=True)
    cut = int(0.9 * len(ids))
    ids[:cut].tofile(prepared / "train.bin")
    ids[cut:].tofile(prepared / "val.bin")
    with open(prepared / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": stoi}, f)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        commands = race_commands(root, source, tmp, steps=steps, dtypes=dtype_list,
                                 recipe=recipe, device=device, compile=compile)

        def score(program: str, out: str) -> float:
            if program == "nanoGPT":
                return float(re.findall(r"val loss ([\d.]+)", out)[-1]) / math.log(2)
            return float(re.findall(r"held-out bpc \([^)]*\): ([\d.]+)", out)[-1])
        for i in range(rounds):
            for program, (cmd, cwd) in commands.items():
                t0 = time.perf_counter()
                r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
                seconds = time.perf_counter() - t0
                if r.returncode != 0:
                    last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                    raise RuntimeError(f"{program} failed: {last}")
                keep_row(rows, dict(program=program, round=i + 1, steps=steps,
                                    seconds=round(seconds, 2),
                                    held_out_bpc=round(score(program, r.stdout), 4)))
    return rows


def race_ratio(rows: list[dict]) -> str:
    """Each minixl program's time over nanoGPT's, round by round: the median and the range."""
    import statistics

    rounds = {}
    for r in rows:
        rounds.setdefault(r["round"], {})[r["program"]] = float(r["seconds"])
    lines = []
    for program in dict.fromkeys(r["program"] for r in rows if r["program"] != "nanoGPT"):
        ratios = sorted(p[program] / p["nanoGPT"] for p in rounds.values())
        lines.append(f"{program}'s time / nanoGPT's: median {statistics.median(ratios):.3f} of "
                     f"{len(ratios)} rounds (min {ratios[0]:.3f}, max {ratios[-1]:.3f})")
    return "\n".join(lines)
