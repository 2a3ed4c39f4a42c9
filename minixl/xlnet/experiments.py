"""Chapter 5's experiments: the cost of a step against K (xlnet_k_cost, section 5.5), what
XLNet's memory buys at laptop scale (xlnet_memory, 5.6), and which objective fills spans best
with the supervision equalised (xlnet_objectives, 5.8).

Hand-written (not generated): runs of the registry in minixl.experiments. Each arm trains
Chapter 5's XLNet through minixl's one training loop with the objective (and, for the memory,
the batch source) that `minixl train --model xlnet` uses, so the arms differ only in what
they name.
"""

from __future__ import annotations

import math

from ..data import OrderedStreams, RandomWindows, load_corpus
from ..evaluation import evaluate
from ..experiments import int_list, keep_row, pick_arms, pins_threads, torch_threads
from ..kinds import KINDS, with_overrides
from ..training import TrainConfig, train
from ..xlnet import (CLS, PermutationObjective, SEP, XLNet, XLNetConfig, evaluate_infill,
                     masks_from_ranks, span_bits, training_masks)

# Chapter 5.8's model: 2 layers of width 64, windows of 64 bytes, K about 6
SMALL = dict(n_layer=2, d_model=64, n_head=4, d_inner=256, seq_len=64, n_predict=11)

# arm -> (changes to the config, what the batches are)
ARMS = {
    "random windows": (dict(mem_len=0), "random windows"),
    "ordered streams": (dict(mem_len=0), "ordered streams"),
    "ordered streams + memory": (dict(), "ordered streams"),
    "pretraining input + memory": (dict(reuse_len=32, bi_data=True), "reuse block + A, B"),
}


# the pretraining input's arm only: its readings with segment ids (xlnet_memory)
LAYOUT_COLUMNS = ("bpc_windows_one_segment", "bpc_memory_one_segment", "bpc_infill_one_segment",
                  "bpc_layout", "bpc_layout_no_segments")


def _held_out(corpus: str, eval_bytes: int):
    """The corpus, and its first eval_bytes held-out bytes."""
    data = load_corpus(corpus)
    return data, data.valid[:eval_bytes]


def _train(model, batches, objective: str, seed: int, steps: int):
    """Section 5.8's recipe (batches of 16, lr 3e-3, 50 warm-up steps) through minixl's
    training loop: (the result, seconds)."""
    import time

    t0 = time.perf_counter()
    result = train(model, TrainConfig(steps=steps, batch_size=16, lr=3e-3, warmup=50,
                                      seed=seed),
                   batches=batches, objective=PermutationObjective(objective), progress=False)
    return result, time.perf_counter() - t0


@pins_threads
def xlnet_memory(seeds: str = "0,1,2", steps: int = 500, mem_len: int = 64,
                 arms: str | None = None, eval_bytes: int = 16384, threads: int = 1,
                 corpus: str = "pydoc") -> list[dict]:
    """Chapter 5.6: XLNet trained with and without its memory across segments. One row per
    arm and seed, with the held-out bpc of three readings: windows of 64 read left to right
    with nothing before them (all-positions), segments of 64 read left to right with a memory
    of mem_len (Chapter 4's memory protocol, the same memory for every arm), and spans of 8
    in the middle of windows of 64 (infill). The pretraining input's arm, which trained with
    segment ids, is also read with them (LAYOUT_COLUMNS, empty for the other arms): the three
    readings with every position in segment 0, and its own layout (layout_bpc) with and
    without its ids."""

    import torch

    seed_list = int_list(seeds, "seeds", 0)
    chosen = pick_arms(arms, ARMS)
    if steps < 1 or mem_len < 1 or eval_bytes < 4 * SMALL["seq_len"]:
        raise ValueError(f"steps and mem_len must be >= 1 and eval_bytes >= "
                         f"{4 * SMALL['seq_len']}; got steps={steps}, mem_len={mem_len}, "
                         f"eval_bytes={eval_bytes}")
    data, held = _held_out(corpus, eval_bytes)
    kind = KINDS["xlnet"]
    rows = []
    for seed in seed_list:
        for arm in chosen:
            changes, batches = ARMS[arm]
            config = kind.config(**{**SMALL, "mem_len": mem_len, **changes})
            torch.manual_seed(seed)
            model = kind.build(config)
            result, seconds = _train(model, _source(kind, data.train, config, seed, batches),
                                     "permutation", seed, steps)
            reader = model  # the same weights, read with a memory of mem_len
            if config.mem_len != mem_len:
                reader = kind.build(with_overrides(config, mem_len=mem_len))
                reader.load_state_dict(model.state_dict())
            T = config.seq_len
            scores = {name: evaluate(m, held, kind.protocol(protocol), seq_len=T,
                                     kind=kind).bpc
                      for name, m, protocol in (("windows", model, "all-positions"),
                                                ("memory", reader, "memory"),
                                                ("infill", model, "infill"))}
            trained = {}  # the pretraining input's arm, read with the segment ids it trained with
            if config.reuse_len:
                one = _OneSegment(model)
                trained = {f"bpc_{name}_one_segment": round(evaluate(
                    one, held, kind.protocol(protocol), seq_len=T, kind=kind).bpc, 4)
                    for name, protocol in (("windows", "all-positions"), ("memory", "memory"),
                                           ("infill", "infill"))}
                a_len = (T - config.reuse_len - 3) // 2
                for name, ids in (("bpc_layout", True), ("bpc_layout_no_segments", False)):
                    trained[name] = round(layout_bpc(model, held, reuse_len=config.reuse_len,
                                                     a_len=a_len, segments=ids), 4)
            keep_row(rows, dict(
                arm=arm, seed=seed, steps=steps, batches=batches, mem_len=config.mem_len,
                reuse_len=config.reuse_len, bi_data=config.bi_data,
                bpc_windows=round(scores["windows"], 4), bpc_memory=round(scores["memory"], 4),
                bpc_infill=round(scores["infill"], 4),
                **{k: trained.get(k, "") for k in LAYOUT_COLUMNS},
                last_train_bpc=round(result.history[-1]["train_bpc"], 4),
                train_seconds=round(seconds, 1)))
    return rows


class _OneSegment:
    """model, read with every position in segment 0 (its memory is segment 0 already): the
    segment ids of a plain text read as one piece. Calls go to model with segments of
    zeros; everything else (step, parameters, eval, config) is model's own."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, tokens, **kw):
        import torch

        return self.model(tokens, segments=torch.zeros_like(tokens), **kw)

    def step(self, tokens, state=None):
        return XLNet.step(self, tokens, state)


def layout_input(text, *, seq_len: int, reuse_len: int, a_len: int):
    """The pretraining input for rows of text [B, seq_len - 3]: (x [B, T], (content, query)
    masks [T, T], targets [B, P], segment ids [B, T]). x is [reuse block of reuse_len; A (a_len
    bytes), SEP, B, SEP, CLS], B the true continuation of A. As in training (pretraining_masks)
    the reuse block reads nothing after it (rank 0) and SEP and CLS are the tail's context
    (rank 1: they read the reuse block and each other); A's and B's bytes are predicted left
    to right (ranks 2, 3, ...); the ids are training's: the reuse block and A 0, B and the SEP
    after it 1, CLS 2."""
    import torch

    T, R = seq_len, reuse_len
    free = T - R - 3  # the bytes of A and B
    if text.dim() != 2 or text.size(1) != R + free:
        raise ValueError(f"text must be rows of {R + free} bytes, got {tuple(text.shape)}")
    if not 1 <= a_len < free:
        raise ValueError(f"a_len must leave A and B at least one byte each of {free}, got "
                         f"{a_len}")
    is_byte = torch.tensor([False] * R + [True] * a_len + [False] + [True] * (free - a_len)
                           + [False, False])
    tail = torch.arange(T) - R  # the position in the tail: A, then SEP, then B
    rank = torch.where(is_byte, tail - (tail > a_len).long() + 2,  # A, B: 2, 3, ..., free + 1
                       (tail >= 0).long())  # the reuse block 0, SEP and CLS 1
    x = torch.full((text.size(0), T), SEP, dtype=torch.long)
    x[:, -1] = CLS
    x[:, is_byte | (torch.arange(T) < R)] = text.long()
    seg = torch.zeros(T, dtype=torch.long)
    seg[R + a_len + 1:] = 1
    seg[-1] = 2
    targets = is_byte.nonzero().flatten().expand(text.size(0), -1)
    return x, masks_from_ranks(rank), targets, seg.expand(text.size(0), T)


def layout_bpc(model, held, *, reuse_len: int, a_len: int, streams: int = 4,
               segments: bool = True) -> float:
    """Bits per byte of the A and B bytes of held-out text in the pretraining input
    (layout_input), cut the way PretrainStreams cuts its rows but read forwards, B always A's
    continuation: each of `streams` rows moves reuse_len bytes per step with the memory of its
    earlier reuse blocks, as in training; with the segment ids training gave (segments=True)
    or none."""
    import torch
    import torch.nn.functional as F

    T, R = model.config.seq_len, reuse_len
    n = len(held) // streams
    rows = held[:n * streams].reshape(streams, n)
    was_training = model.training
    model.eval()
    bits, count, mems = 0.0, 0, None
    try:
        with torch.no_grad():
            for s in range(0, n - (T - 3) + 1, R):
                x, masks, targets, seg = layout_input(rows[:, s:s + T - 3], seq_len=T,
                                                      reuse_len=R, a_len=a_len)
                out = model(x, masks=masks, target_mapping=targets, mems=mems,
                            segments=seg if segments else None, reuse_len=R)
                mems = out.mems
                logp = F.log_softmax(out.logits[..., :256].float(), -1)
                truth = x.gather(1, targets)
                bits -= logp.gather(-1, truth[..., None]).sum().item() / math.log(2)
                count += truth.numel()
    finally:
        model.train(was_training)
    return bits / count


def _source(kind, text, config, seed: int, batches: str):
    """The arm's batches: the xlnet kind's own source (as `minixl train` reads them), but
    ordered streams for the arm that has no memory yet reads in order."""
    if batches == "ordered streams" and not config.mem_len:
        return OrderedStreams(text, 16, config.seq_len)
    return kind.batches(text, 16, config, seed=seed)


@pins_threads
def xlnet_k_cost(ks: str = "1,2,4,6,8", rounds: int = 11, steps: int = 10, batch_size: int = 16,
                 threads: int = 1, device: str = "cpu") -> list[dict]:
    """Chapter 5.5: the cost of a training step against K (n_predict = seq_len // K) for the
    chapter's model (2 layers of width 64, sequences of 64), in interleaved rounds: each
    round times `steps` steps of every K once, in an order rotated from round to round, so
    that a slow spell of the machine falls on all K alike. One row per K: the fastest and the
    median round (seconds per step), each as a ratio to K = 1, beside the FLOPs of a step,
    split into the content stream (all positions, whatever K) and the query stream (the
    targets only), and their ratio to K = 1."""
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    k_list = int_list(ks, "ks", 1)
    T = SMALL["seq_len"]
    if 1 not in k_list or len({T // k for k in k_list}) < 2 or any(k > T for k in k_list):
        raise ValueError(f"--ks needs K = 1 (the ratios are to it) and another K up to "
                         f"seq_len {T} with fewer targets (n_predict = {T} // K); got {ks}")
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be >= 1, got {rounds} and {steps}")
    sizes = {k: v for k, v in SMALL.items() if k != "n_predict"}
    runs = {}
    for k in k_list:
        torch.manual_seed(0)
        model = KINDS["xlnet"].build(XLNetConfig(**sizes, n_predict=T // k)).to(device)
        runs[k] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randint(0, 256, (batch_size, T), generator=torch.Generator().manual_seed(0))
    x = x.to(device)

    def one_step(k):
        model, opt = runs[k]
        masks, targets = training_masks(batch_size, T, T // k, device=device)
        logits = model(x, masks=masks, target_mapping=targets).logits
        F.cross_entropy(logits.flatten(0, 1), x.gather(1, targets).flatten()).backward()
        opt.step()
        opt.zero_grad()

    def sync():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    for k in k_list:  # warm up: allocations, first-call overheads
        for _ in range(2):
            one_step(k)
    seconds = {k: [] for k in k_list}
    for r in range(rounds):
        order = k_list[r % len(k_list):] + k_list[:r % len(k_list)]
        for k in order:
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                one_step(k)
            sync()
            seconds[k].append((time.perf_counter() - t0) / steps)
    # FLOPs of a step: the kind's count (linear in the targets P), split at P = 0
    flops = {k: KINDS["xlnet"].flops_per_token(runs[k][0]) * batch_size * T for k in k_list}
    p = {k: T // k for k in k_list}
    k_b = max(k_list, key=lambda k: T - p[k])  # the fewest targets
    per_target = (flops[1] - flops[k_b]) / (p[1] - p[k_b])
    content = flops[1] - per_target * p[1]
    base = 1
    fastest = {k: min(v) for k, v in seconds.items()}
    median = {k: statistics.median(v) for k, v in seconds.items()}
    rows = []
    for k in k_list:
        keep_row(rows, dict(
            K=k, n_predict=p[k], batch_size=batch_size, seq_len=T, device=device,
            threads=threads, rounds=rounds, steps=steps,
            fastest_ms=round(1e3 * fastest[k], 3), median_ms=round(1e3 * median[k], 3),
            fastest_ratio=round(fastest[k] / fastest[base], 3),
            median_ratio=round(median[k] / median[base], 3),
            gflops=round(flops[k] / 1e9, 4), content_gflops=round(content / 1e9, 4),
            query_gflops=round(per_target * p[k] / 1e9, 4),
            flops_ratio=round(flops[k] / flops[base], 3)))
    return rows


# arm -> (objective kind, targets per sequence of 64)
OBJECTIVE_ARMS = {
    "causal, 64 targets": ("causal", 64),
    "XLNet, 11 targets": ("permutation", 11),  # K about 6, as in section 5.8
    "XLNet, 64 targets": ("permutation", 64),  # K = 1: the causal model's supervision
    "XLNet spans, 11 targets": ("spans", 11),
    "BERT-style, 11 targets": ("independent", 11),
}
# run by name only (--arms), for Chapter 5's exercise 5: XLNet at K = 2 and K = 4
MORE_OBJECTIVE_ARMS = {
    "XLNet, 32 targets": ("permutation", 32),
    "XLNet, 16 targets": ("permutation", 16),
}


@pins_threads
def xlnet_objectives(seeds: str = "0,1,2", steps: int = 500, arms: str | None = None,
                     eval_bytes: int = 16384, threads: int = 1,
                     corpus: str = "pydoc") -> list[dict]:
    """Chapter 5.8: which objective fills spans best, with the supervision equalised. Chapter
    5.8's model (2 layers of width 64, random windows of 64) trained by each objective for
    the same steps: causal (every position a target), XLNet at K about 6 and at K = 1 (as
    many targets as the causal model), XLNet with span targets (spans of 1 to 5, the paper's),
    and the BERT-style objective, each with its targets per window. One row per arm and
    seed: held-out bpc of spans of 8 in the middle of windows of 64 read left to right with
    both sides seen (infill, XLNet's reading), each byte from both sides alone (independent,
    BERT's), left to right up to the span's end (causal, a causal model's), and the windows
    read left to right (all-positions)."""

    import torch

    seed_list = int_list(seeds, "seeds", 0)
    table = {**OBJECTIVE_ARMS, **MORE_OBJECTIVE_ARMS}
    chosen = list(OBJECTIVE_ARMS) if arms is None else pick_arms(arms, table)
    T = SMALL["seq_len"]
    if steps < 1 or eval_bytes < 4 * T:
        raise ValueError(f"steps must be >= 1 and eval_bytes >= {4 * T}; got steps={steps}, "
                         f"eval_bytes={eval_bytes}")
    data, held = _held_out(corpus, eval_bytes)
    kind = KINDS["xlnet"]
    rows = []
    for seed in seed_list:
        for arm in chosen:
            objective, targets = table[arm]
            torch.manual_seed(seed)
            model = kind.build(kind.config(**{**SMALL, "n_predict": targets}))
            result, seconds = _train(model, RandomWindows(data.train, 16, T, seed=seed),
                                     objective, seed, steps)
            keep_row(rows, dict(
                arm=arm, objective=objective, targets=targets, seed=seed, steps=steps,
                bpc_infill=round(evaluate(model, held, kind.protocol("infill"), seq_len=T,
                                        kind=kind).bpc, 4),
                bpc_infill_independent=round(evaluate_infill(
                    model, held, seq_len=T, reading="independent"), 4),
                bpc_infill_causal=round(evaluate_infill(model, held, seq_len=T,
                                                        reading="causal"), 4),
                bpc_left_to_right=round(evaluate(model, held, kind.protocol("all-positions"),
                                                 seq_len=T, kind=kind).bpc, 4),
                last_train_bpc=round(result.history[-1]["train_bpc"], 4),
                train_seconds=round(seconds, 1)))
    return rows


# ---------------------------------------------------------------- the positive control (5.2)

# Eight pairs of bytes; the first byte of a pair names the second. A cue after the pair names
# the group of two pairs it came from: cue g allows PAIRS[2 g] and PAIRS[2 g + 1].
PAIRS = ("Aq", "Bw", "Ce", "Dr", "Et", "Fy", "Gu", "Hi")
CUES = "0123"
# Bits per pair, exact, for a model that has learned the records: with the cue and the other
# byte seen (joint), 1 bit; with the cue but each byte alone (independent), 1 + 1 bits; from
# the left side only (causal), 3 bits for the first byte and none for the second.
PAIR_BOUNDS = {"joint": 1.0, "independent": 2.0, "causal": 3.0}
# each arm's objective, and the reading that is its own
CONTROL_ARMS = {"permutation": "joint", "independent": "independent", "causal": "causal"}
READINGS = {"joint": "sequential", "independent": "independent", "causal": "causal"}


def pair_records(n: int, *, seed: int):
    """n records '|', a, b, cue, one after another as a byte tensor [4 n]: the pair ab drawn
    uniformly from PAIRS, the cue after it naming the pair's group of two."""
    import torch

    g = torch.Generator().manual_seed(seed)
    table = torch.tensor([[ord("|"), ord(a), ord(b), ord(CUES[i // 2])]
                          for i, (a, b) in enumerate(PAIRS)])
    return table[torch.randint(len(PAIRS), (n,), generator=g)].flatten()


def pair_control(seeds: str = "0,1,2", steps: int = 500, records: int = 4, n_predict: int = 6,
                 batch_size: int = 16, lr: float = 5e-3, eval_windows: int = 256,
                 threads: int = 1, **sizes) -> list[dict]:
    """Chapter 5's positive control: one small XLNet trained three ways on the same records
    and steps, by the permutation objective, by independent (BERT-style) prediction and
    causally, each with windows of `records` records and (but the causal arm, which predicts
    every byte) n_predict targets. Each is scored on the pair of a record in the middle of
    held-out windows in three readings (span_bits): joint (the cue and the pair's first byte
    seen when the second is predicted), independent (the cue seen, neither byte the other),
    causal (the left side only). One row per arm and seed: bits per pair in each reading."""
    import torch

    seed_list = int_list(seeds, "seeds", 0)
    if steps < 1 or records < 3 or eval_windows < 1:
        raise ValueError(f"need steps >= 1, records >= 3 and eval_windows >= 1; got "
                         f"steps={steps}, records={records}, eval_windows={eval_windows}")
    T = 4 * records
    sizes = sizes or dict(n_layer=2, d_model=32, n_head=2, d_inner=128)
    with torch_threads(threads):
        train_bytes = pair_records(4096, seed=1000)
        held = pair_records(eval_windows * records, seed=2000).view(eval_windows, T)
        start = 4 * (records // 2) + 1  # the pair of the middle record
        rows = []
        for seed in seed_list:
            for arm in CONTROL_ARMS:
                torch.manual_seed(seed)
                model = XLNet(XLNetConfig(**sizes, seq_len=T, n_predict=n_predict))
                train(model, TrainConfig(steps=steps, batch_size=batch_size, lr=lr,
                                         warmup=min(50, steps // 10), seed=seed),
                      batches=RandomWindows(train_bytes, batch_size, T, seed=seed),
                      objective=PermutationObjective(arm), progress=False)
                row = {"arm": arm, "seed": seed, "steps": steps}
                model.eval()
                with torch.no_grad():
                    for name, reading in READINGS.items():
                        bits = span_bits(model, held, start, 2, reading=reading)
                        row[f"bits_{name}"] = round(bits.sum(1).mean().item(), 4)
                rows.append(row)
        return rows
