"""Chapter 2's experiment: do intermediate-layer losses make deep stacks trainable?

Hand-written (not generated): entries of the registry of runs (`minixl.experiments`); the
chapter plots the stored CSV and names the command that made it. The registry imports this
module only when one of its entries runs.
"""

from __future__ import annotations

import math

from ..aux_losses import AuxLossConfig, AuxLosses, AuxObjective, evaluate_bpc_sliding
from ..char_transformer import CharTransformer, CharTransformerConfig, eval_mode, evaluate_bpc
from ..data import RandomWindows, load_corpus
from ..experiments import int_list, keep_row, pick_arms, pins_threads
from ..training import TrainConfig, train

__all__ = ["depth_sweep", "aux_ablation", "ABLATION_ARMS"]


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


# Section 2.6's arms: each differs from the one it is read against in one thing. The first
# four add one loss at a time (the paper's order); the last two repeat the middle pair
# without the warm-up, the positive control: with a 30-step warm-up the losses of the lowest
# layers (stopped at l / (2n) of the run) end while the learning rate is still small.
ABLATION_ARMS = {
    "plain": (dict(positions=False), 30),
    "+ positions": (dict(), 30),
    "+ layers": (dict(layers=1.0), 30),
    "+ targets": (dict(layers=1.0, targets=1), 30),
    "+ positions, no warm-up": (dict(), 0),
    "+ layers, no warm-up": (dict(layers=1.0), 0),
}


@pins_threads
def aux_ablation(seeds: str = "0,1,2", steps: int = 150, arms: str | None = None,
                 eval_bytes: int = 8192, sliding_bytes: int = 2048, threads: int = 1,
                 corpus: str = "pydoc") -> list[dict]:
    """Chapter 2.6: the losses added one at a time to a 12-layer, 64-wide model (windows of
    64, 16 a step, lr 2e-3), per arm of ABLATION_ARMS (';'-separated names; default all)
    and seed. Each run is read two ways on the same held-out bytes: every position of
    non-overlapping windows (Chapter 1's estimate, on eval_bytes and on the first
    sliding_bytes) and the paper's sliding window, the last position of a window that moves
    one byte at a time (on sliding_bytes); and, at the half-way step (just after the last
    intermediate loss, layer n - 1's at (n - 1) / (2n) of the run, stops) and at the end,
    the held-out bpc of every layer's own readout
    (final norm and tied head on that layer's output), ';'-separated from the first layer."""
    import time

    import torch
    import torch.nn.functional as F

    names = pick_arms(arms, ABLATION_ARMS)
    seed_list = int_list(seeds, "seeds", 0)
    if steps < 2 or min(eval_bytes, sliding_bytes) < 65:
        raise ValueError(f"need steps >= 2 and eval_bytes, sliding_bytes > 64 (one window); "
                         f"got steps={steps}, eval_bytes={eval_bytes}, "
                         f"sliding_bytes={sliding_bytes}")
    config = CharTransformerConfig(n_layer=12, d_model=64, n_head=4, d_inner=256, block_size=64)
    data = load_corpus(corpus)
    held, short = data.valid[:eval_bytes + 1], data.valid[:sliding_bytes + 1]

    @torch.no_grad()
    def layer_bpc(model) -> str:
        """Every layer's own readout, bits per byte over the held-out windows."""
        n = (len(held) - 1) // 64
        x, y = held[:n * 64].long().view(n, 64), held[1:n * 64 + 1].long().view(n, 64)
        with eval_mode(model):
            _, hidden = model(x, return_hidden=True)
        bits = [F.cross_entropy(model.readout(h).transpose(1, 2), y).item() / math.log(2)
                for h in hidden]
        return ";".join(f"{b:.4f}" for b in bits)

    rows = []
    for name in names:
        aux, warmup = ABLATION_ARMS[name]
        for seed in seed_list:
            torch.manual_seed(seed)
            model = CharTransformer(config)
            objective = AuxObjective(AuxLosses(AuxLossConfig(**aux), n_layer=12, d_model=64))
            readouts = []

            def held_out(m, n_bytes):
                readouts.append(layer_bpc(m))
                return evaluate_bpc(m, held, seq_len=64, batch_size=64)

            cfg = TrainConfig(steps=steps, batch_size=16, lr=2e-3, warmup=warmup, seed=seed,
                              log_every=steps, eval_every=steps // 2)
            t0 = time.perf_counter()
            result = train(model, cfg, objective=objective, progress=False, held_out=held_out,
                           batches=RandomWindows(data.train, 16, 64, seed=seed))
            seconds = time.perf_counter() - t0
            keep_row(rows, dict(
                arm=name, seed=seed, steps=steps, warmup=warmup,
                valid_bpc=round(result.history[-1]["valid_bpc"], 4),
                all_positions_bpc=round(evaluate_bpc(model, short, seq_len=64, batch_size=64), 4),
                sliding_bpc=round(evaluate_bpc_sliding(model, short, seq_len=64, stride=1,
                                                       batch_size=256), 4),
                layers_half_way=readouts[0], layers_end=readouts[-1],
                train_seconds=round(seconds, 1)))
    return rows
