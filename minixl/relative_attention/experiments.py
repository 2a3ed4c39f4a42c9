"""Chapter 3's experiments: the bucket and gathered forms of Shaw et al.'s relative attention,
timed against each other, and the form minixl picks; and section 3.7's position arms over
three seeds, each arm one change from its neighbour.

Hand-written (not generated): an entry of the registry of runs (`minixl.experiments`).
"""

from __future__ import annotations

from ..char_transformer import CharTransformer, CharTransformerConfig, evaluate_bpc
from ..data import RandomWindows, load_corpus
from ..device import resolve_device
from ..experiments import int_list, keep_row, pick_arms, pins_threads, scale_embeddings
from ..relative_attention import SHAW_FORMS, shaw_attention_cost, shaw_factory, shaw_form
from ..training import TrainConfig, train

__all__ = ["shaw_cost", "shaw_positions", "SHAW_POSITION_ARMS"]

# Section 3.7's arms. The sinusoid model multiplies its token embeddings by sqrt(C)
# (Vaswani et al.), the others do not, so each of the two without it has a twin with it:
# per_layer -> per_layer_scaled and shaw -> shaw_scaled change the scale only, and
# shaw_scaled -> sinusoid (or per_layer_scaled) changes the positions only.
SHAW_POSITION_ARMS = ("per_layer", "per_layer_scaled", "sinusoid", "shaw", "shaw_scaled")


def shaw_cost(lengths: str | None = None, clips: str = "4,16", repeats: int = 5,
              device: str = "auto") -> list[dict]:
    """Both forms, forward + backward, at every length and clipping distance (the fastest of
    `repeats` runs each), with the fastest form and the one `shaw_form` picks there."""
    import torch

    dev = str(resolve_device(device))
    if lengths is None:
        lengths = "64,128,256,512,1024" if dev.startswith("cuda") else "16,32,64,128,256"
    rows = []
    for T in int_list(lengths, "lengths"):
        for k in int_list(clips, "clips", 0):
            times = {m: shaw_attention_cost(m, T, max_relative=k, repeats=repeats, device=dev)
                     for m in SHAW_FORMS}
            fastest = min(times, key=lambda m: times[m]["seconds"])
            rows.append({"T": T, "max_relative": k, "device": times[fastest]["device"],
                         "torch": torch.__version__,
                         **{f"{m}_ms": 1e3 * r["seconds"] for m, r in times.items()},
                         "fastest": fastest, "chosen": shaw_form(T, T, k)})
    return rows


@pins_threads
def shaw_positions(seeds: str = "0,1,2", steps: int = 250, max_relative: int = 16,
                   lengths: str = "64,128,256", eval_bytes: int = 16385, threads: int = 1,
                   arms: str = ",".join(SHAW_POSITION_ARMS),
                   corpus: str = "pydoc") -> list[dict]:
    """Section 3.7's run for every seed x arm: a 3-layer, 64-wide model (4 heads), trained
    on 64-byte windows, 16 a step, through `minixl.train` at its defaults on the CPU
    (the chapter's loop, same weights), then held-out bpc over the first `eval_bytes` of
    the validation split, every position of non-overlapping windows of each of `lengths`
    (empty where a learned table has no rows that far). Shaw arms clip at `max_relative`
    and add no absolute positions; the *_scaled arms multiply the token embeddings by
    sqrt(C) on the input path, as the sinusoid model does. It runs on `threads` torch
    threads.
    """
    import time

    import torch

    seed_list = int_list(seeds, "seeds", 0)
    length_list = int_list(lengths, "lengths")
    arm_list = pick_arms(arms, SHAW_POSITION_ARMS, sep=",")
    for name, value in (("steps", steps), ("eval_bytes", eval_bytes)):
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if max_relative < 0:
        raise ValueError(f"--max-relative must be >= 0, got {max_relative}")
    data = load_corpus(corpus)
    held_out = data.valid[:eval_bytes]
    rows = []
    for seed in seed_list:
        for arm in arm_list:
            pos = {"per_layer": "per_layer", "per_layer_scaled": "per_layer",
                   "sinusoid": "sinusoid"}.get(arm, "none")
            config = CharTransformerConfig(n_layer=3, d_model=64, n_head=4, d_inner=256,
                                           block_size=64, pos=pos)
            torch.manual_seed(seed)
            extra = {"attention": shaw_factory(max_relative)} if arm.startswith("shaw") else {}
            model = CharTransformer(config, **extra)
            if arm.endswith("_scaled"):
                scale_embeddings(model)
            start = time.perf_counter()
            train(model, TrainConfig(steps=steps, batch_size=16, seed=seed, device="cpu"),
                  batches=RandomWindows(data.train, 16, 64, seed=seed), progress=False)
            seconds = time.perf_counter() - start
            row = dict(arm=arm, seed=seed, steps=steps,
                       max_relative=max_relative if arm.startswith("shaw") else "")
            for n in length_list:
                fits = pos != "per_layer" or n <= config.block_size
                row[f"bpc_{n}"] = (round(evaluate_bpc(model, held_out, seq_len=n), 4)
                                   if fits else "")
            row["seconds"] = round(seconds, 1)
            keep_row(rows, row)
    return rows
