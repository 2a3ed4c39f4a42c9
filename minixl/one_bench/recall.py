"""A recall task that can be learned: multi-query associative recall (MQAR) in bytes, with
every query at a distance the task sets.

Hand-written (not generated). Arora et al.'s multi-query associative recall ("Zoology:
Measuring and Improving Recall in Efficient Language Models", 2023) writes key-value pairs and
then asks for many of them, so that every query is a case to learn from; a small attention
model learns it, and mechanisms differ by how far back they can find a key. Here the stream
is a run of items of `key + 2` bytes each: a key of `key` bytes (from `KEY_BYTES`, the 228
bytes that are neither a value nor a marker), then '=' and a value (an uppercase letter) when
the item writes a pair, or '?' and the value written with that key when it asks for one.
Each write is asked for at most once, `d` bytes later, d drawn from the distances given
(each a whole number of items; a draw whose slot is taken, or that falls past the end, is
dropped), so the answer byte sits exactly d bytes after its source; a key is not written
again while a query for it is pending, so every query has one answer: the value of the
latest write of its key, as in an induction head's lookup. Only the answers need reach: the
keys and the markers are random or fixed, and a model that cannot read d bytes back guesses
among 26 values (log2 26 bits).

A distance can be one number of bytes or a band of them. With one distance a band, a model
can answer the band without reading a key at all: the answer is the byte d back, so counting
back d bytes (a relative position, Shaw et al.'s or XL's) is enough, and a model that learns
that trick looks like one that recalls. The bench therefore draws each query's distance from
a band of whole numbers of items (`edges=True`, the bands `recall_bands`), so that only
finding the key answers it, as in Zoology, where the queries come in random order.

`recall_records` makes the stream and says where the answers are and how far back each one's
source is, in the same `ReachRecords` as the reach task of `minixl.reach`, so
`minixl.reach.score_reach` scores it by band of distance and `minixl.reach.unreachable`
names the distances a model cannot reach before it trains. `RecallWindows` is its batch
source, the loss on the answers only (as Zoology trains); `answers_only` puts any kind's own
batch source (windows, or ordered streams with a memory) on the same footing.

`bench_recall` is the task at length: every contestant sized once (`minixl.planner`, at one
shape length), given the same training FLOPs at each context length, trained on the stream,
read left to right under the bench's common protocol and scored by band of distance, each
band marked before training as in, partly in or out of the model's reach (`band_reach`).
Each run carries its positive control: a dense-attention arm, in the nearest band of
distance, which lies inside every window, must reach
`control_accuracy`, or the run says that it concludes nothing (`control_verdict`, printed at
the end of every run).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..data import Batch, step_seed
from ..experiments import int_list, torch_threads, write_csv
from ..planner import (BENCH_FLOP_POLICY, FLOPS_TOLERANCE, at_length, matched_steps,
                       plan_bench, policy_settings)
from ..reach import ReachRecords, score_reach, unreachable
from .bench_all import (_done, _reachable, _settings, contestants, control_verdict,
                        read_left_to_right, read_rows, reading_segment, recall_need, train_arm,
                        write_decisions)

__all__ = ["VALUES", "KEY_BYTES", "recall_records", "recall_bands", "answer_mask",
           "RecallWindows", "answers_only", "RECALL_COLUMNS", "plan_lengths", "bench_recall",
           "point_row", "band_reach", "control_verdict", "recall_need",
           "plot_recall"]

VALUES = 26  # the values are the uppercase letters: a uniform guess is right 1 time in 26
WRITE, ASK = ord("="), ord("?")
# the bytes a key is made of: every byte that is neither a value nor a marker (228 of them)
KEY_BYTES = torch.tensor([b for b in range(256) if not (ord("A") <= b < ord("A") + VALUES)
                          and b not in (WRITE, ASK)])


def recall_records(n_items: int, distances, *, key: int = 2, seed: int = 0,
                   edges: bool = False, near: float | None = None) -> ReachRecords:
    """A stream of n_items items of key + 2 bytes (data [n_items * (key + 2)] uint8), the
    position of each query's answer byte (`answers` [A], increasing) and how many bytes back
    its source is (`distance` [A]). Each write is asked for at most once, at a distance
    drawn from `distances` (bytes; each a positive multiple of key + 2); an item no query
    claims is a write. Seeded by `seed`. Raises ValueError where as many pairs wait for their
    query as there are keys of `key` bytes (228 ** key): a longer key or nearer distances fix
    that.

    edges: `distances` are instead the edges of bands, e_0 < e_1 < ... < e_n (any bytes), and
    each query's distance is drawn uniformly among the whole numbers of items in one band
    [e_i, e_{i+1} - 1], the band drawn first, uniformly (`recall_bands` names them). With one
    distance a band, a model can answer the band by counting back a fixed number of bytes,
    without reading the key; with several, only finding the key answers it.

    near: with edges, the share of draws in the nearest band (the others share the rest
    equally) instead of 1 / n: a training stream rich in queries that every window can
    answer, so that the lookup can be learned at all. A draw whose slot is already asked
    for is dropped, more often near, so the share asked is a little lower (at bench_recall's
    default bands, 0.64 for 0.7 and 0.43 for 0.5)."""
    size = key + 2
    distances = sorted({int(d) for d in distances})
    if n_items < 2 or key < 1:
        raise ValueError(f"need n_items >= 2 and key >= 1, got {n_items} and {key}")
    if edges:
        choices = [list(range(-(-low // size), (high - 1) // size + 1))
                   for low, high in zip(distances, distances[1:])]
        if len(distances) < 2 or distances[0] < 1 or any(len(c) < 2 for c in choices):
            raise ValueError(f"band edges {distances} must be at least two positive distances, "
                             f"each band [e_i, e_(i+1) - 1] holding at least two whole numbers of "
                             f"items ({size} bytes each), so that no one count back answers it")
    elif not distances or distances[0] < size or any(d % size for d in distances):
        raise ValueError(f"each distance must be a positive multiple of the item size, key + 2 "
                         f"= {size} bytes (an answer sits a whole number of items after its "
                         f"source), got {distances}")
    else:
        choices = [[d // size] for d in distances]
    if near is not None and not (edges and len(choices) > 1 and 0 < near < 1):
        raise ValueError(f"near (the nearest band's share of the draws) needs band edges, "
                         f"at least two bands and 0 < near < 1, got {near}")
    codes = len(KEY_BYTES) ** key
    g = torch.Generator().manual_seed(seed)
    asks: dict[int, int] = {}  # item -> the item it asks for
    keys, values = torch.zeros(n_items, key, dtype=torch.long), torch.zeros(n_items, dtype=torch.long)
    marker = torch.full((n_items, 1), WRITE)
    pending: set[int] = set()  # the keys of the writes still to be asked for
    drawn: dict[int, int] = {}  # item -> its key's number, for the writes asked for
    answers, far = [], []
    for i in range(n_items):
        if i in asks:  # a query: the key and value of the write it asks for
            source = asks.pop(i)
            keys[i], values[i], marker[i] = keys[source], values[source], ASK
            pending.discard(drawn.pop(source))
            answers.append(i * size + size - 1)
            far.append((i - source) * size)
            continue
        if len(pending) >= codes:
            raise ValueError(f"keys of {key} byte(s) give {codes} keys, too few for the "
                             f"{len(pending)} pairs waiting for their query at item {i}: "
                             "use a longer key or nearer distances (in bench_recall, whose "
                             "keys are one byte: nearer --distances)")
        while True:  # a key that no pending query asks for: one write of it till then
            code = int(torch.randint(codes, (1,), generator=g))
            if code not in pending:
                break
        keys[i] = torch.tensor([(code // len(KEY_BYTES) ** k) % len(KEY_BYTES)
                                for k in range(key)])
        values[i] = int(torch.randint(VALUES, (1,), generator=g))
        if near is None:
            band = choices[int(torch.randint(len(choices), (1,), generator=g))]
        elif float(torch.rand((), generator=g)) < near:
            band = choices[0]
        else:
            band = choices[1 + int(torch.randint(len(choices) - 1, (1,), generator=g))]
        d = band[int(torch.randint(len(band), (1,), generator=g))] if len(band) > 1 else band[0]
        if i + d < n_items and i + d not in asks:
            asks[i + d] = i
            pending.add(code)
            drawn[i] = code
    data = torch.cat([KEY_BYTES[keys], marker, (values + ord("A"))[:, None]], dim=1)
    return ReachRecords(data.reshape(-1).to(torch.uint8), torch.tensor(answers, dtype=torch.long),
                        torch.tensor(far, dtype=torch.long))


def recall_bands(edges, size: int = 1) -> list[tuple[int, int]]:
    """The bands [low, high] of distance that `edges` e_0 < ... < e_n set (with
    recall_records(..., edges=True)), n of them: the nearest and farthest distance a query
    of band i can have, the whole numbers of items of `size` bytes in [e_i, e_{i+1} - 1] (so
    that a band marked in or out of reach is marked on the distances really drawn)."""
    es = sorted({int(e) for e in edges})
    if len(es) < 2 or size < 1:
        raise ValueError(f"need at least two band edges and size >= 1, got {es} and {size}")
    return [(-(-low // size) * size, (high - 1) // size * size) for low, high in zip(es, es[1:])]


def answer_mask(records: ReachRecords) -> torch.Tensor:
    """[n] bool, True at the answer bytes: the only positions whose loss the task counts."""
    mask = torch.zeros(len(records.data), dtype=torch.bool)
    mask[records.answers] = True
    return mask


class RecallWindows:
    """Batch source: batch(step) -> B random windows of `length` bytes of the stream, the
    targets -100 (ignored by cross-entropy) except at the answer bytes, so the next-byte loss
    counts the answers only. Seeded by (seed, step), as `minixl.data.RandomWindows`."""

    def __init__(self, records: ReachRecords, batch_size: int, length: int, *, seed: int = 0):
        if len(records.data) < length + 1:
            raise ValueError(f"{len(records.data):,} bytes are too few for windows of {length}")
        self.data, self.batch_size, self.length, self.seed = records.data, batch_size, length, seed
        self.targets = torch.full((len(records.data),), -100, dtype=torch.long)
        self.targets[records.answers] = records.data[records.answers].long()

    def __call__(self, step: int) -> Batch:
        gen = torch.Generator().manual_seed(step_seed(self.seed, step))
        starts = torch.randint(len(self.data) - self.length, (self.batch_size,), generator=gen)
        rows = starts[:, None] + torch.arange(self.length)  # (B, T)
        return Batch(self.data[rows].long(), self.targets[rows + 1], True)


def answers_only(batches):
    """A batch source like `batches` (step -> Batch), its targets -100 (ignored by the loss)
    except the byte after each query marker '?': the answer. A batch whose targets are not
    the next bytes (XLNet's pretraining streams put each row's direction there) is passed
    through as it is, and an objective that reads no targets (XLNet's permutation objective
    predicts its own inputs) still trains on every byte."""
    def source(step: int) -> Batch:
        b = batches(step)
        if b.y.shape != b.x.shape or not bool((b.y[:, :-1] == b.x[:, 1:]).all()):
            return b
        return b._replace(y=torch.where(b.x == ASK, b.y, torch.full_like(b.y, -100)))
    return source


# bytes of a key in the bench's stream: one, as each of Zoology's keys is one token (items of
# 3 bytes). Finding a one-byte key is one induction-head lookup; a key of 3 letters must first
# be gathered from 3 positions, and on this CPU's budgets Shaw's model did not learn it.
KEY = 1
MIN_LENGTH = 32  # 0.2 % of 32-byte windows of the default stream hold no answer (5 % at 16)

RECALL_COLUMNS = ("arm", "kind", "length", "budget", "seed", "params", "steps", "band", "low",
                  "high", "cases", "accuracy", "bits", "reach", "reachable", "train_seconds",
                  "settings")


def plan_lengths(arms: dict, lengths, *, budget: float, params: int, batch_size: int,
                 shape_length: int, flop_policy: str = BENCH_FLOP_POLICY) -> dict:
    """{(arm, length): PlanRow}: each arm sized once by the planner, to `params` at
    `shape_length`, then kept at that width and depth at every length (what grows with the
    length, a position table, grows; a memory keeps its ratio to the length), with the steps
    that `budget` buys at that length, every count under `flop_policy`."""
    plans = {}
    for row in plan_bench(budget=budget, params=params, length=shape_length,
                          batch_size=batch_size, arms=arms, flop_policy=flop_policy):
        kind, spec = arms[row.arm]
        for length in lengths:
            config, weights, flops = at_length(kind, spec, row, length)
            steps = matched_steps(budget, flops, batch_size=batch_size, length=length)
            per_step = flops * batch_size * length
            why = f"sized at length {shape_length}: {row.why}"
            if abs(steps * per_step / budget - 1) > FLOPS_TOLERANCE:
                why += (f"; one step is {per_step:.3g} FLOPs, {per_step / budget:.1%} of the "
                        "budget: raise --budget")
            plans[row.arm, length] = replace(
                row, config=config, length=length, params=weights,
                params_off=weights / params - 1, flops_per_byte=flops, steps=steps,
                train_flops=steps * per_step, flops_off=steps * per_step / budget - 1, why=why)
    return plans


def bench_recall(budget: float = 1.5e13, params: int = 100_000, seeds: str = "0,1,2",
                 models: str | None = None, lengths: str = "64",
                 shape_length: int = 64,
                 distances: str = "4,32,64,128,256", batch_size: int = 16,
                 train_bytes: int = 1 << 20, near: float = 0.7, eval_items: int = 2000,
                 lr: float = 3e-3,
                 control: str = "shaw", control_accuracy: float = 0.95,
                 csv: str = "book/bench/recall/recall.csv", device: str = "cpu",
                 threads: int = 1, flop_policy: str = BENCH_FLOP_POLICY) -> list[dict]:
    """Recall at length (see the module docstring): one row per contestant, length, seed
    and band of distance, written to `csv` as each point is done (a stopped run resumes;
    its settings must match). Every contestant is planned at `params` parameters and
    `budget` training FLOPs at each length, trains on `train_bytes` of the stream with the
    loss on the answers (a share `near` of its draws of distance in the nearest band, see
    `recall_records`), and is read on `eval_items` held-out items a seed, its bands drawn
    equally. Each contestant is sized once, at `shape_length` (`plan_lengths`): the same
    model at every length.
    `distances` are the edges of the bands of distance (`recall_bands`: each band is named by
    the nearest and farthest distance its queries can have). The control is the
    arm `control` (a dense attention model) in the nearest band, which lies inside every
    length's window; `control_verdict` reads it. Both the control and its bar are stored in
    the rows' settings, so the decision table (`recall_judge`) judges the run by them.
    flop_policy: how every arm's training FLOPs are counted (FLOP_POLICIES; stored in the
    settings unless it is 'kernel': a run that names none counted by the kernel)."""
    length_list = int_list(lengths, "lengths", 2)
    distance_list = sorted(set(int_list(distances, "distances", 1)))
    seed_list = int_list(seeds, "seeds", 0)
    if (not budget > 0 or params < 1 or batch_size < 1 or eval_items < 2 or shape_length < 2
            or not 0 < control_accuracy <= 1 or not 0 < near < 1):
        raise ValueError(f"need --budget > 0, --params >= 1, --batch-size >= 1, --eval-items "
                         f">= 2, --shape-length >= 2, 0 < --control-accuracy <= 1 and "
                         f"0 < --near < 1; got {budget}, {params}, {batch_size}, {eval_items}, "
                         f"{shape_length}, {control_accuracy} and {near}")
    if min(length_list) < MIN_LENGTH:
        raise ValueError(f"each length must be at least {MIN_LENGTH} bytes, got "
                         f"{min(length_list)}: a shorter window may hold no answer, and a batch "
                         "without one has no loss")
    if len(distance_list) < 3 or distance_list[1] - 1 > min(length_list) // 2:
        raise ValueError(f"--distances are band edges, at least three (two bands: the "
                         f"control's and one more, which --near leaves the other queries to); "
                         f"the first band ({'-'.join(map(str, distance_list[:2]))}) is the "
                         f"control's: it must lie well inside the shortest length "
                         f"({min(length_list)}), its far edge at most half of it; got "
                         f"{distance_list}")
    arms = contestants(models)
    if control not in arms:
        raise ValueError(f"--control {control!r} is not among the contestants "
                         f"({', '.join(arms)}): the run needs its positive control")
    items = train_bytes // (KEY + 2)
    if train_bytes // batch_size < max(length_list) + 1:
        raise ValueError(f"--train-bytes {train_bytes:,} is too few: {batch_size} streams of "
                         f"segments of {max(length_list):,} need at least "
                         f"{batch_size * (max(length_list) + 1):,}")
    path = Path(csv)
    settings = _settings(budget=budget, params=params, batch_size=batch_size,
                         shape_length=shape_length, train_bytes=train_bytes,
                         eval_items=eval_items, lr=lr, edges=distance_list, near=near,
                         control=control, control_accuracy=control_accuracy,
                         **policy_settings(flop_policy))
    rows = _done(path, settings, writer="bench_recall", files=path.name)
    done = {(r["arm"], int(r["length"]), int(r["seed"])) for r in rows}
    bands = recall_bands(distance_list, KEY + 2)
    points = [(a, n, s) for s in seed_list for n in length_list for a in arms]
    count = sum(p in done for p in points)
    with torch_threads(threads):
        plans = plan_lengths(arms, length_list, budget=budget, params=params,
                             batch_size=batch_size, shape_length=shape_length,
                             flop_policy=flop_policy)
        stream = recall_records(items, distance_list, key=KEY, seed=0, edges=True, near=near)
        for name, length, seed in points:
            if (name, length, seed) in done:
                continue
            kind, plan = arms[name][0], plans[name, length]
            far = unreachable(kind, plan.config, [low for low, _ in bands])  # before training
            most = kind.reach(plan.config)[0] if kind.reach else None
            segment = reading_segment(kind, plan.config, length)
            model, seconds = train_arm(kind, plan, stream.data, seed=seed, lr=lr,
                                       device=device, wrap=answers_only)
            test = recall_records(eval_items, distance_list, key=KEY, seed=10_000 + seed,
                                  edges=True)
            _, logp = read_left_to_right(model, test.data, segment=segment,
                                         answers=test.answers)
            for band in score_reach(logp, test.data[test.answers].long(), test.distance, bands):
                rows.append(point_row(name, kind, plan, band, budget=budget, seed=seed,
                                      most=most, segment=segment, far=far, seconds=seconds,
                                      settings=settings))
            write_csv(rows, path)
            count += 1
            print(f"bench_recall [{count}/{len(points)}] {name}, length {length}, seed {seed}: "
                  f"{plan.steps} steps in {seconds:.1f} s", flush=True)
    rows = _done(path, settings, writer="bench_recall", files=path.name)  # as stored
    plot_recall(rows, path.with_suffix(".png"), control_accuracy)
    print("bench_recall:", control_verdict(rows, control, control_accuracy)[1], flush=True)
    bench = path.parent.parent  # a bench_all run's folder holds its recall run in recall/
    if path.parent.name == "recall" and path.name == "recall.csv" and (
            bench / "quality.csv").exists():
        print("bench_recall: the decision table, with this run's rows:",
              write_decisions(bench, read_rows(bench / "quality.csv"),
                              read_rows(bench / "reach.csv")), flush=True)
    return rows


def point_row(name: str, kind, plan, part: dict, *, budget: float, seed: int,
              most: int | None, segment: int, far: dict, seconds: float, settings: str) -> dict:
    """One row of a bench at length (recall's bands, context's contexts): the arm, its plan
    at this length, the scores of `part` (with its low and high: a band of distance or of
    context), and how that band stands to the model's reach (`band_reach`)."""
    return {"arm": name, "kind": kind.name, "length": plan.length, "budget": budget,
            "seed": seed, "params": plan.params, "steps": plan.steps, **part, "reach": most,
            "reachable": band_reach(part["low"], part["high"], most, segment, far),
            "train_seconds": round(seconds, 2), "settings": settings}


def band_reach(low: int, high: int, most: int | None, segment: int, far: dict) -> str:
    """How a band [low, high] of distance stands to a model that reads at most `most` bytes
    back, read in segments of `segment`: why not where even its nearest distance is out of
    reach (`far`, from `minixl.reach.unreachable`, keyed by `low`), 'partly' where only part
    of it is (its far end beyond `most`, or, early in a segment, beyond what the segment's
    first bytes read), else 'yes'."""
    if most is None or low in far:
        return _reachable(low, most, segment, far)
    if high > most:
        return (f"partly: the band runs to {high:,} bytes back, and a prediction reads at "
                f"most {most:,}")
    return _reachable(high, most, segment, far)


def length_panels(rows: list[dict], what: str):
    """(figure, axes, lengths, arms): the figure a bench at length draws, a panel per length
    of `rows` side by side (one y axis), the contestants in the order they ran; refuses no
    rows, naming `what` should have written them. A Figure of its own, not pyplot's: drawing
    it leaves a notebook's backend, and its figures, alone."""
    if not rows:
        raise ValueError(f"no rows to draw: {what} wrote none")
    from matplotlib.figure import Figure

    lengths = sorted({int(r["length"]) for r in rows})
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig = Figure(figsize=(5 * len(lengths), 3.6), dpi=72)
    axes = fig.subplots(1, len(lengths), sharey=True, squeeze=False)
    return fig, axes[0], lengths, arms


def arm_line(ax, xs: list, by: dict, mark: dict, colour: str, label: str) -> None:
    """One contestant's line on `ax`: at each x, the mean of its seeds' values `by[x]` (bars:
    half their range), its marker filled where `mark[x]` is 'yes' (in reach, marked before
    training), hollow where the point is partly or wholly out of reach."""
    means = [sum(by[x]) / len(by[x]) for x in xs]
    half = [(max(by[x]) - min(by[x])) / 2 for x in xs]
    ax.errorbar(xs, means, yerr=half, color=colour, capsize=2, lw=1, label=label)
    for x, m in zip(xs, means):
        ax.plot([x], [m], "o", ms=4, color=colour,
                markerfacecolor=colour if mark[x] == "yes" else "white")


def save_figure(fig, path) -> Path:
    """`fig` laid out and written to `path` (no software stamp, so a rerun writes the same
    bytes)."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, metadata={"Software": None})
    return path


def plot_recall(rows: list[dict], path, control_accuracy: float = 0.95) -> Path:
    """A figure of bench_recall's rows at `path`: accuracy against the distance to the
    answer's source (each band at the geometric middle of its distances, log scale), a line
    per contestant (mean of its seeds, bars: half their range), a panel per length; a filled
    marker where the band is in the model's reach (marked before training), a hollow one
    where it is partly or wholly out of it; chance (1 in 26) and the control's bar drawn."""
    fig, axes, lengths, arms = length_panels(rows, "bench_recall")
    for ax, length in zip(axes, lengths):
        here = [r for r in rows if int(r["length"]) == length]
        middle = {r["band"]: (int(r["low"]) * int(r["high"])) ** 0.5 for r in here}
        for i, arm in enumerate(arms):
            by: dict[str, list[float]] = {}
            mark: dict[str, str] = {}
            for r in here:
                if r["arm"] == arm and r["accuracy"] not in (None, ""):
                    by.setdefault(middle[r["band"]], []).append(float(r["accuracy"]))
                    mark[middle[r["band"]]] = r["reachable"]
            if by:
                arm_line(ax, sorted(by), by, mark, f"C{i}", arm)
        bands = sorted(middle, key=middle.get)
        ax.set_xscale("log")
        ax.set_xticks([middle[b] for b in bands], bands, fontsize=7)
        ax.minorticks_off()
        ax.axhline(1 / VALUES, color="gray", lw=0.8, ls=":")
        ax.axhline(control_accuracy, color="gray", lw=0.8, ls="--")
        ax.set_xlabel("distance to the answer's source (bytes)")
        ax.set_title(f"windows (or segments) of {length} bytes", fontsize=9)
    first = axes[0]
    first.set_ylabel("accuracy on the answers")
    first.set_ylim(0, 1.02)
    first.text(first.get_xlim()[0], 1 / VALUES + 0.02, " chance (1 in 26)", fontsize=7,
               color="gray")
    first.text(first.get_xlim()[0], control_accuracy - 0.07, " control's bar", fontsize=7,
               color="gray")
    first.legend(fontsize=7, ncol=2, loc="center right")
    return save_figure(fig, path)
