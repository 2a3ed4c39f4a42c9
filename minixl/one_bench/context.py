"""Text at length: how many bits each mechanism gains from more context.

Hand-written (not generated). Dai et al. ("Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context", 2019, section 4.2) ask how much context a model actually uses by
growing the context it is given at evaluation and reading what each increase buys on the
same bytes (their relative effective context length). Here the same reading serves every
kind alike: the held-out text gives targets // block blocks of `block` bytes to predict,
and for each context c of `contexts` every block is read from a fresh state (no window or
memory of what came before) starting c bytes before it, under the bench's common protocol
(`read_left_to_right`; all blocks as one batch: `read_blocks`); byte k of a block is then
predicted from c + k bytes of context, or from as many as the model keeps (`bits_by_context`).
The same bytes are scored at every c, so the difference between two contexts is a paired
one: what a doubling of context buys (`context_gains`, paired by seed too). A window model
cannot gain past its window, by construction (each context is marked from the model's
config before training, as the recall task marks its bands); Transformer-XL can through its
memory, the tree through its span. Past a window, what a window model keeps depends on
where the block falls in the segments the protocol reads (between the window less a segment
and the window): such a context is marked 'partly' or out of reach, never 'yes'.

Unlike Dai et al., the context here stops where the model's training config puts it (a
window's length, XL's memory as trained): each contestant is trained at two lengths
(`bench_context`, 128 and 512 by default), the same model at both (sized once, as
`minixl.one_bench.recall.plan_lengths` does) with the steps the same FLOPs buy, and the two
curves say what training at the longer length bought.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from ..data import load_corpus
from ..experiments import int_list, torch_threads, write_csv
from ..planner import BENCH_FLOP_POLICY, policy_settings
from ..reach import unreachable
from .bench_all import (_done, _settings, contestants, read_rows, reading_segment, train_arm,
                        write_decisions)
from .recall import arm_line, length_panels, plan_lengths, point_row, save_figure

__all__ = ["bits_by_context", "read_blocks", "CONTEXT_COLUMNS", "bench_context",
           "context_gains", "plot_context"]

CONTEXT_COLUMNS = ("arm", "kind", "length", "budget", "seed", "params", "steps", "context",
                   "low", "high", "bytes", "bpc", "reach", "reachable", "train_seconds",
                   "settings")


def bits_by_context(model, data: torch.Tensor, *, segment: int, contexts, block: int,
                    targets: int) -> list[dict]:
    """Held-out bits per byte against the context given (see the module docstring): the
    targets // block * block bytes after the first max(contexts) of data [N], in blocks of
    `block`, each block read from a fresh state from c bytes before it, `segment` bytes a
    call, for each c of `contexts` (each at least 1). One row per c: context (c), low and
    high (the context of the block's first and last byte: c and c + block - 1), bytes
    (scored) and bpc."""
    cs = sorted({int(c) for c in contexts})
    if not cs or cs[0] < 1 or block < 1 or targets < block or segment < 1:
        raise ValueError(f"need contexts of at least 1 byte, block >= 1, targets >= block and "
                         f"segment >= 1; got {cs}, {block}, {targets} and {segment}")
    blocks = targets // block
    if cs[-1] + blocks * block > len(data):
        raise ValueError(f"{len(data):,} held-out bytes are too few: the longest context "
                         f"({cs[-1]:,}) and {blocks * block:,} targets need "
                         f"{cs[-1] + blocks * block:,}")
    rows = []
    begin = cs[-1] + block * torch.arange(blocks)  # each block's first byte, at every c
    for c in cs:
        chunks = data[begin[:, None] + torch.arange(-c, block)]  # [blocks, c + block]
        nll = float(read_blocks(model, chunks, segment=segment, first=c).sum())
        rows.append({"context": c, "low": c, "high": c + block - 1, "bytes": blocks * block,
                     "bpc": nll / (blocks * block) / math.log(2)})
    return rows


@torch.no_grad()
def read_blocks(model, chunks: torch.Tensor, *, segment: int, first: int) -> torch.Tensor:
    """`read_left_to_right` for a batch: chunks [B, n] each read from a fresh state, left to
    right, `segment` bytes a call; returns the negative log-likelihood (nats) [B, n - first]
    of bytes first..n-1 of each chunk, each predicted from the bytes before it."""
    if segment < 1 or not 1 <= first < chunks.size(1):
        raise ValueError(f"need segment >= 1 and 1 <= first < {chunks.size(1)}, got {segment} "
                         f"and {first}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x = chunks.long().to(device)
    out, state = [], None
    try:
        for start in range(0, x.size(1) - 1, segment):
            tokens = x[:, start:start + segment]
            target = x[:, start + 1:start + 1 + segment]
            logits, state = model.step(tokens, state)
            logp = logits[:, :target.size(1)].float().log_softmax(-1)
            nll = -logp.gather(2, target[..., None])[..., 0]  # bytes start+1 .. start+len
            keep = max(0, first - start - 1)
            if keep < nll.size(1):
                out.append(nll[:, keep:].cpu())
    finally:
        model.train(was_training)
    return torch.cat(out, 1)


def bench_context(budget: float = 5e11, params: int = 200_000, seeds: str = "0,1,2",
                  models: str | None = None, lengths: str = "128,512", shape_length: int = 128,
                  contexts: str = "32,64,128,256,512,1024", block: int = 32,
                  targets: int = 2048, batch_bytes: int = 1024, lr: float = 2e-3,
                  csv: str = "book/bench/context/context.csv", device: str = "cpu",
                  threads: int = 1, flop_policy: str = BENCH_FLOP_POLICY) -> list[dict]:
    """Text at length (see the module docstring): every contestant sized once, at
    `shape_length` and `params`, trained at each of `lengths` on the `pydoc` corpus with
    `budget` training FLOPs and `batch_bytes` bytes a step (batch_bytes // length windows or
    streams: the same bytes a step at every length, so that a longer context costs more
    FLOPs a byte, not a smaller batch), then read on its validation split with each of `contexts`
    (`bits_by_context`: `targets` bytes in blocks of `block`). One row per contestant,
    length, seed and context, written to `csv` as each point is done (a stopped run resumes;
    its settings must match); what each doubling buys is printed at the end
    (`context_gains`). Where `csv` is FOLDER/context/context.csv and FOLDER holds a
    bench_all run (its quality.csv), FOLDER's decision table is written again with this
    run's row, "long context on a small budget" (`write_decisions`). flop_policy: how every
    arm's training FLOPs are counted (minixl.model_kind.FLOP_POLICIES)."""
    length_list = int_list(lengths, "lengths", 2)
    context_list = sorted(set(int_list(contexts, "contexts", 1)))
    seed_list = int_list(seeds, "seeds", 0)
    if not budget > 0 or params < 1 or shape_length < 2 or batch_bytes < max(length_list):
        raise ValueError(f"need --budget > 0, --params >= 1, --shape-length >= 2 and "
                         f"--batch-bytes at least the longest length ({max(length_list)}); got "
                         f"{budget}, {params}, {shape_length} and {batch_bytes}")
    if block < 1 or targets < block:
        raise ValueError(f"need --block >= 1 and --targets at least one block; got --block "
                         f"{block} and --targets {targets}")
    arms = contestants(models)
    path = Path(csv)
    settings = _settings(budget=budget, params=params, batch_bytes=batch_bytes,
                         shape_length=shape_length, contexts=context_list, block=block,
                         targets=targets, lr=lr, **policy_settings(flop_policy))
    rows = _done(path, settings, writer="bench_context", files=path.name)
    done = {(r["arm"], int(r["length"]), int(r["seed"])) for r in rows}
    points = [(a, n, s) for s in seed_list for n in length_list for a in arms]
    count = sum(p in done for p in points)
    corpus = load_corpus("pydoc")
    held = corpus.valid[:context_list[-1] + targets // block * block]
    if len(held) < context_list[-1] + targets // block * block:
        raise ValueError(f"the validation split holds {len(corpus.valid):,} bytes: too few for "
                         f"a context of {context_list[-1]:,} and {targets:,} targets")
    with torch_threads(threads):
        plans = {}
        for length in length_list:
            plans.update(plan_lengths(arms, [length], budget=budget, params=params,
                                      batch_size=batch_bytes // length,
                                      shape_length=shape_length, flop_policy=flop_policy))
        try:
            for name, length, seed in points:
                if (name, length, seed) in done:
                    continue
                kind, plan = arms[name][0], plans[name, length]
                most = kind.reach(plan.config)[0] if kind.reach else None
                segment = reading_segment(kind, plan.config, length)
                far = unreachable(kind, plan.config, context_list)  # marked before training
                model, seconds = train_arm(kind, plan, corpus.train, seed=seed, lr=lr,
                                           device=device)
                for at in bits_by_context(model, held, segment=segment, contexts=context_list,
                                          block=block, targets=targets):
                    rows.append(point_row(name, kind, plan, at, budget=budget, seed=seed,
                                          most=most, segment=segment, far=far,
                                          seconds=seconds, settings=settings))
                write_csv(rows, path)
                count += 1
                print(f"bench_context [{count}/{len(points)}] {name}, length {length}, seed "
                      f"{seed}: {plan.steps} steps in {seconds:.1f} s", flush=True)
        except KeyboardInterrupt:
            print(f"bench_context: stopped; {count} of {len(points)} points are written in "
                  f"{path}: the same command goes on from there", file=sys.stderr)
            raise SystemExit(130) from None
    rows = _done(path, settings, writer="bench_context", files=path.name)  # as stored
    plot_context(rows, path.with_suffix(".png"))
    for gain in context_gains(rows):
        print(f"bench_context: {gain['arm']}, trained at {gain['length']}, context "
              f"{gain['from']} -> {gain['to']}: {gain['gain']:+.3f} bpc gained (seeds "
              f"{', '.join(f'{g:+.3f}' for g in gain['seeds'])}; {gain['reachable']})",
              flush=True)
    bench = path.parent.parent  # a bench_all run's folder holds its context run in context/
    if path.parent.name == "context" and path.name == "context.csv" and (
            bench / "quality.csv").exists():
        print("bench_context: the decision table, with this run's row:",
              write_decisions(bench, read_rows(bench / "quality.csv"),
                              read_rows(bench / "reach.csv")), flush=True)
    return rows


def context_gains(rows: list[dict]) -> list[dict]:
    """What each doubling of context buys, from bench_context's rows: for each arm, training
    length and pair of neighbouring contexts, the bits per byte the longer context saves on
    the same bytes, in each seed (a paired difference: the same model, the same bytes) and
    their mean. `from` and `to` name the two contexts; `reachable` is the shorter one's mark
    where it is already out of reach (the gain is then nothing by construction), else the
    longer one's. Only contexts read in every seed count."""
    by: dict[tuple, dict[int, dict[int, dict]]] = {}
    for r in rows:
        key = (r["arm"], int(r["length"]))
        by.setdefault(key, {}).setdefault(int(r["seed"]), {})[int(r["context"])] = r
    out = []
    for (arm, length), seeds in by.items():
        cs = sorted(set.intersection(*(set(s) for s in seeds.values())))
        for a, b in zip(cs, cs[1:]):
            diffs = [float(s[a]["bpc"]) - float(s[b]["bpc"]) for _, s in sorted(seeds.items())]
            first = next(iter(seeds.values()))
            shorter, longer = first[a]["reachable"], first[b]["reachable"]
            out.append({"arm": arm, "length": length, "from": a, "to": b,
                        "gain": sum(diffs) / len(diffs), "seeds": diffs,
                        "reachable": longer if _within(shorter) else shorter})
    return out


def _within(mark: str) -> bool:
    """Whether a context's mark says the model reads it, wholly or in part."""
    return mark == "yes" or mark.startswith("partly")


def plot_context(rows: list[dict], path) -> Path:
    """A figure of bench_context's rows at `path`: held-out bpc against the context read
    (bytes, log scale), a line per contestant (mean of its seeds, bars: half their range), a
    panel per training length; a filled marker where the context is within the model's reach,
    a hollow one where it is partly or wholly out of it."""
    fig, axes, lengths, arms = length_panels(rows, "bench_context")
    for ax, length in zip(axes, lengths):
        for i, arm in enumerate(arms):
            by: dict[int, list[float]] = {}
            mark: dict[int, str] = {}
            for r in rows:
                if r["arm"] == arm and int(r["length"]) == length:
                    by.setdefault(int(r["context"]), []).append(float(r["bpc"]))
                    mark[int(r["context"])] = r["reachable"]
            arm_line(ax, sorted(by), by, mark, f"C{i}", arm)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context read (bytes)")
        ax.set_title(f"trained at {length} bytes", fontsize=9)
    axes[0].set_ylabel("held-out bpc")
    axes[0].legend(fontsize=7, ncol=2)
    return save_figure(fig, path)
