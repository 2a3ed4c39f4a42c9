"""Chapter 2's experiment: do intermediate-layer losses make deep stacks trainable?

Hand-written (not generated): entries of the registry of runs (`minixl.experiments`); the
chapter plots the stored CSV and names the command that made it. Chapter modules are
imported inside the functions, so that importing this module costs nothing.
"""

from __future__ import annotations

from . import int_list, keep_row, pins_threads

__all__ = ["depth_sweep"]


@pins_threads
def depth_sweep(depths: str = "4,16,32", norms: str = "pre,post", seeds: str = "0,1,2",
                steps: int = 150, d_model: int = 32, seq_len: int = 32, batch_size: int = 16,
                lr: float = 2e-3, eval_bytes: int = 8192, threads: int = 1,
                corpus: str = "pydoc") -> list[dict]:
    """Chapter 2: do intermediate-layer losses make deep stacks trainable?

    For every depth x norm ("pre" | "post") x seed, train a CharTransformer twice on the same
    batches, with every position of the last layer only ("positions") and with the
    intermediate layer losses too ("positions+layers"); one row per run with its held-out bpc
    (all positions of the first eval_bytes of the validation split) and its wall time, on
    `threads` torch threads.
    """
    import time

    import torch

    from ..aux_losses import AuxLossConfig, AuxLosses, AuxObjective
    from ..char_transformer import CharTransformer, CharTransformerConfig, evaluate_bpc
    from ..data import RandomWindows, load_corpus
    from ..training import TrainConfig, train

    depth_list, seed_list = int_list(depths, "depths"), int_list(seeds, "seeds", 0)
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
                    keep_row(rows, dict(
                        depth=depth, norm=norm, losses=losses, seed=seed, steps=steps,
                        d_model=d_model, seq_len=seq_len,
                        train_bpc=round(sum(last) / len(last), 4),
                        valid_bpc=round(evaluate_bpc(model, held, seq_len=seq_len), 4),
                        seconds=round(seconds, 1)))
    return rows
