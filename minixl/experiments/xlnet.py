"""Chapter 5's experiment: what XLNet's memory buys at laptop scale.

Hand-written (not generated): a run of the registry in minixl.experiments. Each arm trains
Chapter 5's XLNet through minixl's one training loop with the batch source and objective the
command line uses (`minixl train --model xlnet`), so the arms differ only in their config.
"""

from __future__ import annotations

from . import int_list, keep_row

# Chapter 5.8's model: 2 layers of width 64, windows of 64 bytes, K about 6
SMALL = dict(n_layer=2, d_model=64, n_head=4, d_inner=256, seq_len=64, n_predict=11)

# arm -> (changes to the config, what the batches are)
ARMS = {
    "random windows": (dict(mem_len=0), "random windows"),
    "ordered streams": (dict(mem_len=0), "ordered streams"),
    "ordered streams + memory": (dict(), "ordered streams"),
    "pretraining input + memory": (dict(reuse_len=32, bi_data=True), "reuse block + A, B"),
}


def xlnet_memory(seeds: str = "0,1,2", steps: int = 500, mem_len: int = 64,
                 arms: str | None = None, eval_bytes: int = 16384, threads: int = 1,
                 corpus: str = "pydoc") -> list[dict]:
    """Chapter 5.6: XLNet trained with and without its memory across segments. One row per
    arm and seed, with the held-out bpc of three readings: windows of 64 read left to right
    with nothing before them (all-positions), segments of 64 read left to right with a memory
    of mem_len (Chapter 4's memory protocol, the same memory for every arm), and spans of 8
    in the middle of windows of 64 (infill)."""
    import time

    import torch

    from ..data import load_corpus
    from ..evaluation import evaluate
    from ..kinds import with_overrides
    from ..models import KINDS
    from ..training import TrainConfig, train
    from ..xlnet import PermutationObjective

    seed_list = int_list(seeds, "seeds", 0)
    chosen = list(ARMS) if arms is None else [a.strip() for a in arms.split(",") if a.strip()]
    unknown = [a for a in chosen if a not in ARMS]
    if unknown or not chosen:
        raise ValueError(f"unknown arm(s) {', '.join(unknown) or '(none given)'}: expected "
                         f"some of {', '.join(ARMS)}")
    if steps < 1 or mem_len < 1 or eval_bytes < 4 * SMALL["seq_len"]:
        raise ValueError(f"steps and mem_len must be >= 1 and eval_bytes >= "
                         f"{4 * SMALL['seq_len']}; got steps={steps}, mem_len={mem_len}, "
                         f"eval_bytes={eval_bytes}")
    torch.set_num_threads(threads)
    data = load_corpus(corpus)
    held = data.valid[:eval_bytes]
    kind = KINDS["xlnet"]
    rows = []
    for seed in seed_list:
        for arm in chosen:
            changes, batches = ARMS[arm]
            config = kind.config(**{**SMALL, "mem_len": mem_len, **changes})
            torch.manual_seed(seed)
            model = kind.build(config)
            source = _source(kind, data.train, config, seed, batches)
            t0 = time.perf_counter()
            result = train(model, TrainConfig(steps=steps, batch_size=16, lr=3e-3, warmup=50,
                                              seed=seed),
                           batches=source, objective=PermutationObjective(), progress=False)
            seconds = time.perf_counter() - t0
            reader = kind.build(with_overrides(config, mem_len=mem_len))  # the same weights,
            reader.load_state_dict(model.state_dict())  # read with a memory of mem_len
            T = config.seq_len
            scores = {name: evaluate(m, held, protocol, seq_len=T, kind=kind).bpc
                      for name, m, protocol in (("windows", model, "all-positions"),
                                                ("memory", reader, "memory"),
                                                ("infill", model, "infill"))}
            keep_row(rows, dict(
                arm=arm, seed=seed, steps=steps, batches=batches, mem_len=config.mem_len,
                reuse_len=config.reuse_len, bi_data=config.bi_data,
                bpc_windows=round(scores["windows"], 4), bpc_memory=round(scores["memory"], 4),
                bpc_infill=round(scores["infill"], 4),
                last_train_bpc=round(result.history[-1]["train_bpc"], 4),
                train_seconds=round(seconds, 1)))
    return rows


def _source(kind, text, config, seed: int, batches: str):
    """The arm's batches: the xlnet kind's own source (as `minixl train` reads them), but
    ordered streams for the arm that has no memory yet reads in order."""
    from ..data import OrderedStreams

    if batches == "ordered streams" and not config.mem_len:
        return OrderedStreams(text, 16, config.seq_len)
    return kind.batches(text, 16, config, seed=seed)
