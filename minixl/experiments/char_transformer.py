"""Chapter 1's experiment: per-layer position tables against a sinusoid, by depth.

Hand-written (not generated): entries of the registry of runs (`minixl.experiments`); the
chapter plots the stored CSV and names the command that made it. Chapter modules are
imported inside the functions, so that importing this module costs nothing.
"""

from __future__ import annotations

from . import int_list, keep_row

__all__ = ["positions"]


def positions(depths: str = "4,8", seeds: str = "0,1,2", steps: int = 200,
              corpus: str = "pydoc") -> list[dict]:
    """Chapter 1, exercise 5: per-layer position tables against one sinusoid, by depth.

    Section 1.7's run (width 128, 4 heads, windows of 128, 16 per step, Chapter 1's loop
    through `minixl.train`, which gives the same weights) for every depth x seed x kind of
    position; one row per run with its held-out bpc over the whole validation split.
    """
    import time

    import torch

    from ..char_transformer import CharTransformer, CharTransformerConfig, evaluate_bpc
    from ..data import RandomWindows, load_corpus
    from ..training import TrainConfig, train

    depth_list, seed_list = int_list(depths, "depths"), int_list(seeds, "seeds", 0)
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
                keep_row(rows, dict(n_layer=n_layer, seed=seed, pos=pos, steps=steps,
                                 valid_bpc=round(evaluate_bpc(model, data.valid, seq_len=128), 4),
                                 seconds=round(time.perf_counter() - start, 1)))
    return rows
