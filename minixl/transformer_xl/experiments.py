"""Chapter 4's experiments: evaluation speed with memory, data order against memory, and minixl's
Transformer-XL against Hugging Face's.

Hand-written (not generated): entries of the registry of runs (`minixl.experiments`); the
chapter plots the stored CSV and names the command that made it. The registry imports this
module only when one of its entries runs.
"""

from __future__ import annotations

from ..aux_losses import evaluate_bpc_sliding
from ..data import OrderedStreams, RandomWindows, load_corpus
from ..device import autocast, resolve_device
from ..experiments import int_list, keep_row, pins_threads
from ..kinds import kind_of, resolve_preset, with_overrides
from ..transformer_xl import TransformerXL, TransformerXLConfig, evaluate_bpc_xl

__all__ = ["eval_flops_per_byte", "xl_eval_speed", "xl_order", "hf_xl", "hf_transfoxl", "HF_VERSION"]


def eval_flops_per_byte(protocol: str, A: int, *, n_layer: int, d_model: int, n_head: int,
                        d_head: int, d_inner: int, vocab_size: int = 256, tgt_len: int = 32
                        ) -> float:
    """Multiply-adds per predicted byte of one evaluation protocol at attention length A.

    "sliding": one window of A bytes per predicted byte, every position recomputed (the
    vanilla protocol); "states": Transformer-XL's hidden-state memory, segments of tgt_len
    with A - tgt_len cached states that every segment projects into keys, values (and
    distances) again; "kv": the key/value cache, only the segment's own bytes projected.
    Counts what the eager code computes: the projections, both score products, the values,
    the output projection, the feed-forward and the output layer, for every position passed.
    """
    if protocol not in ("sliding", "states", "kv"):
        raise ValueError(f"protocol must be 'sliding', 'states' or 'kv', got {protocol!r}")
    if not 1 <= tgt_len <= A:
        raise ValueError(f"need 1 <= tgt_len <= A, got tgt_len={tgt_len}, A={A}")
    C, HD = d_model, n_head * d_head
    per_query = HD * C + 2 * C * d_inner  # output projection and feed-forward, per position
    if protocol == "sliding":  # a forward pass over A positions, one prediction kept
        n_q, n_k, projected = A, A, A
    else:  # a segment of tgt_len queries against A keys, per predicted byte below
        n_q, n_k = tgt_len, A
        projected = A if protocol == "states" else tgt_len
    layer = projected * 3 * C * HD + n_k * C * HD * (protocol != "kv")  # qkv_net and r_net
    layer += 3 * n_q * n_k * HD + n_q * per_query  # two score products, values; rest
    total = n_layer * layer + n_q * C * vocab_size
    return total / (1 if protocol == "sliding" else tgt_len)


@pins_threads
def xl_eval_speed(lengths: str = "64,128,256,512,1024,2048", streams: int = 4,
                  tgt_len: int = 32, n_layer: int = 3, d_model: int = 64, n_head: int = 4,
                  d_head: int = 16, d_inner: int = 256, passes: int = 8, seed: int = 0,
                  threads: int = 1, preset: str | None = None, device: str = "cpu"
                  ) -> list[dict]:
    """Chapter 4.9: seconds per predicted byte of the sliding window, the hidden-state memory
    and the key/value cache at each attention length A, batched alike (`streams` rows per
    forward pass), beside the multiply-adds per byte that eval_flops_per_byte predicts.

    The model is an untrained TransformerXL (speed does not depend on the weights), of the
    sizes given or of a --model xl preset (preset="xl-base": the paper's base model). The
    sliding window times forward passes of [streams, A] (one byte predicted per row); the
    memory protocols fill a memory of A - tgt_len, then time segments against it. Each time
    is the median of `passes` passes, on `threads` CPU threads (or on a GPU, in bf16).
    """
    import time

    import torch

    A_list = int_list(lengths, "lengths")
    if min(streams, tgt_len, passes) < 1 or min(A_list) < tgt_len:
        raise ValueError(f"streams, tgt_len and passes must be positive and every length >= "
                         f"tgt_len; got streams={streams}, tgt_len={tgt_len}, passes={passes}, "
                         f"lengths={lengths}")
    sizes = dict(n_layer=n_layer, d_model=d_model, n_head=n_head, d_head=d_head,
                 d_inner=d_inner)
    if preset is not None:
        shape = kind_of("xl").preset(preset)[0]
        sizes = {k: getattr(shape, k) for k in sizes}
    dev = resolve_device(device)
    torch.manual_seed(seed)
    model = TransformerXL(TransformerXLConfig(**sizes, tgt_len=tgt_len, mem_len=0)).to(dev).eval()
    g = torch.Generator().manual_seed(seed)

    def median_time(run) -> float:  # the median pass: robust to a busy machine
        times = []
        for _ in range(passes):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            run()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    rows = []
    with torch.no_grad(), autocast(dev):
        for A in A_list:
            x = torch.randint(0, 256, (streams, A), generator=g).to(dev)
            model(x, mem_len=0)  # warm up
            sliding = median_time(lambda: model(x, mem_len=0)) / streams
            memory = {}
            for protocol, kv in (("states", False), ("kv", True)):
                seg = torch.randint(0, 256, (streams, tgt_len), generator=g).to(dev)
                state = None
                for _ in range(-(-A // tgt_len)):  # fill the memory to A - tgt_len
                    _, state = model.step(seg, state, kv_cache=kv, mem_len=A - tgt_len)
                full = state  # every timed segment starts from the same full memory
                memory[protocol] = median_time(lambda: model.step(
                    seg, full, kv_cache=kv, mem_len=A - tgt_len)) / (streams * tgt_len)
            flops = {p: eval_flops_per_byte(p, A, **sizes, tgt_len=tgt_len)
                     for p in ("sliding", "states", "kv")}
            keep_row(rows, dict(
                A=A, tgt_len=tgt_len, streams=streams,
                sliding_us=round(1e6 * sliding, 2), states_us=round(1e6 * memory["states"], 2),
                kv_us=round(1e6 * memory["kv"], 2),
                measured_states=round(sliding / memory["states"], 2),
                measured_kv=round(sliding / memory["kv"], 2),
                predicted_states=round(flops["sliding"] / flops["states"], 2),
                predicted_kv=round(flops["sliding"] / flops["kv"], 2)))
    return rows


@pins_threads
def xl_order(seeds: str = "0,1,2", steps: int = 250, eval_bytes: int = 8192,
             threads: int = 1, corpus: str = "pydoc") -> list[dict]:
    """Chapter 4.8: why recurrence did not help. Four arms of Chapter 4's 3 x 64 model on
    segments of 32, trained by one loop that differs only in data order and memory:
    ordered streams with the carried (stale) memory, ordered streams without memory, random
    windows of 64 whose first 32 bytes are run through the current weights as a fresh memory
    (no gradient, loss on the last 32), and random windows of 32 without memory. One row per
    arm and seed: held-out bpc at attention length 64 (memory 32, or windows of 64 moved 32
    at a time) and at 32 (no memory, windows of 32).
    """
    import math

    import torch
    import torch.nn.functional as F

    seed_list = int_list(seeds, "seeds", 0)
    if min(steps, eval_bytes) < 64:
        raise ValueError(f"steps and eval_bytes must be >= 64; got steps={steps}, "
                         f"eval_bytes={eval_bytes}")
    data = load_corpus(corpus)
    held = data.valid[:eval_bytes + 1]
    small = dict(n_layer=3, d_model=64, n_head=4, d_head=16, d_inner=256, tgt_len=32,
                 pre_lnorm=True)
    B, T, lr, warmup = 16, 32, 2e-3, 30
    arms = ["ordered, stale memory", "ordered, no memory", "random, fresh memory",
            "random, no memory"]
    rows = []
    for seed in seed_list:
        for arm in arms:
            torch.manual_seed(seed)
            memory = "no memory" not in arm
            model = TransformerXL(TransformerXLConfig(**small, mem_len=T if memory else 0))
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / warmup) * (
                0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
            if arm.startswith("ordered"):
                source = OrderedStreams(data.train, B, T)
            else:
                source = RandomWindows(data.train, B, 2 * T if memory else T, seed=seed)
            mems = None
            model.train()
            for step in range(steps):
                batch = source(step)
                x, y = batch.x.long(), batch.y.long()
                if arm == "random, fresh memory":
                    with torch.no_grad():
                        _, mems = model(x[:, :T])  # the first half, by the current weights
                    x, y = x[:, T:], y[:, T:]
                elif arm == "ordered, stale memory" and batch.reset_state:
                    mems = None
                logits, new = model(x, mems if memory else None)
                if arm == "ordered, stale memory":
                    mems = new
                loss = F.cross_entropy(logits.transpose(1, 2), y)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
            model.eval()
            if memory:
                at64 = evaluate_bpc_xl(model, held, mem_len=T, batch_size=8)
            else:
                at64 = evaluate_bpc_sliding(model, held, seq_len=2 * T, stride=T)
            at32 = evaluate_bpc_xl(model, held, mem_len=0, batch_size=8)
            keep_row(rows, dict(arm=arm, seed=seed, steps=steps, bpc_at_64=round(at64, 4),
                             bpc_at_32=round(at32, 4), last_train_bpc=round(
                                 loss.item() / math.log(2), 4)))
    return rows


# ---------------------------------------------------------------- against Hugging Face

HF_VERSION = "4.37"  # the last transformers release line whose TransfoXL runs
HF_INSTALL = ("pip install 'minixl[hf-transfoxl]' (transformers==4.37.2) in an environment of "
              "its own: the dev extra needs transformers>=5")


def _transfoxl():
    """Hugging Face's TransfoXL classes, or a clear error when transformers 4.37.x is absent."""
    try:
        import transformers
    except ImportError:
        raise ValueError(f"hf-xl needs transformers {HF_VERSION}.x, which is not "
                         f"installed: {HF_INSTALL}") from None
    if not transformers.__version__.startswith(HF_VERSION + "."):
        raise ValueError(f"hf-xl needs transformers {HF_VERSION}.x (TransfoXL was "
                         f"removed later), found {transformers.__version__}: {HF_INSTALL}")
    import warnings

    with warnings.catch_warnings():  # TransfoXL is deprecated in 4.37: it says so on import
        warnings.simplefilter("ignore")
        from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    return TransfoXLConfig, TransfoXLLMHeadModel


def hf_transfoxl(cfg):
    """Hugging Face's TransfoXLLMHeadModel at a minixl TransformerXLConfig: bytes (vocab 256),
    no adaptive softmax or embedding (cutoffs [], div_val 1), the same dropout and norm."""
    TransfoXLConfig, TransfoXLLMHeadModel = _transfoxl()
    hf = TransfoXLConfig(
        vocab_size=cfg.vocab_size, cutoffs=[], div_val=1, adaptive=False, d_model=cfg.d_model,
        d_embed=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, d_inner=cfg.d_inner,
        n_layer=cfg.n_layer, tgt_len=cfg.tgt_len, mem_len=cfg.mem_len,
        clamp_len=cfg.clamp_len or -1, dropout=cfg.dropout, dropatt=cfg.dropatt,
        pre_lnorm=cfg.pre_lnorm, same_length=False, attn_type=0, tie_word_embeddings=True)
    return TransfoXLLMHeadModel(hf)


def hf_xl(preset: str = "xl-base", batch_size: int | None = None, steps: int = 10,
          warmup: int = 3, rounds: int = 3, device: str = "auto", **overrides) -> list[dict]:
    """Forward + backward tokens/s of minixl's TransformerXL and of Hugging Face's TransfoXL
    at the same config (a --model xl preset, with config overrides from Python), device and
    precision (bf16 autocast on CUDA), each carrying its memory from step to step: `rounds`
    rounds of `steps` steps of each, interleaved, after `warmup` steps of each. One row:
    both throughputs and their ratio (minixl / HF)."""
    import time
    import warnings

    import torch
    import torch.nn.functional as F

    _transfoxl()  # the clear error first
    kind, preset = resolve_preset("xl", preset)
    cfg, train_kw = kind.preset(preset)
    cfg = with_overrides(cfg, **overrides)
    batch_size = train_kw["batch_size"] if batch_size is None else batch_size
    if min(steps, rounds, batch_size) < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1, rounds >= 1 and warmup >= 0, got {steps}, {rounds} "
                         f"and {warmup}")
    dev = resolve_device(device)
    torch.manual_seed(0)
    ours, theirs = kind.build(cfg).to(dev).train(), hf_transfoxl(cfg).to(dev).train()
    T = cfg.tgt_len
    tokens = torch.randint(0, cfg.vocab_size, (batch_size, T + 1), device=dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    state = {"ours": None, "hf": None}

    def step_ours():
        with autocast(dev):
            logits, state["ours"] = ours.step(x, state["ours"])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()

    def step_hf():  # labels shifted inside: T inputs score T - 1 next bytes (tokens/s: T)
        with autocast(dev):
            out = theirs(input_ids=x, labels=x, mems=state["hf"])
            loss = out.losses.float().mean() if out.loss is None else out.loss
        loss.backward()
        state["hf"] = [m.detach() for m in out.mems]

    def timed(fn, n):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    seconds = {"ours": 0.0, "hf": 0.0}
    with warnings.catch_warnings():  # TransfoXL warns about its output format at every call
        warnings.simplefilter("ignore")
        timed(step_ours, warmup), timed(step_hf, warmup)
        for _ in range(rounds):
            seconds["ours"] += timed(step_ours, steps)
            seconds["hf"] += timed(step_hf, steps)
    n_tokens = rounds * steps * batch_size * T
    import transformers

    ours_tps, hf_tps = n_tokens / seconds["ours"], n_tokens / seconds["hf"]
    return [{"preset": preset, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
             else "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
             "dtype": "bf16 autocast" if dev.type == "cuda" else "fp32",
             "n_layer": cfg.n_layer, "d_model": cfg.d_model, "tgt_len": T, "mem_len": cfg.mem_len,
             "batch_size": batch_size, "minixl_params": sum(p.numel() for p in ours.parameters()),
             "hf_params": sum(p.numel() for p in theirs.parameters()),
             "minixl_tokens_per_s": ours_tps, "hf_tokens_per_s": hf_tps,
             "ratio": ours_tps / hf_tps}]
