"""The bench of every mechanism: every contestant at matched compute, on text and on the reach
task, each read under its own protocol and under one common protocol.

Hand-written (not generated). `bench_all` plans every contestant (`minixl.planner`: one
parameter count, and each budget of training FLOPs at each window length), trains it on the
corpus and reads the held-out text twice: under its kind's own default protocol, and under the
common one, `read_left_to_right` (every byte predicted in order from all the context the
model carries: a window's earlier bytes, a memory of past segments). Then it trains each
contestant again, at the largest budget and length, on the reach task (`minixl.reach`) and
scores its answers by band of distance under the common protocol, marking before it trains the
distances the model cannot reach by construction.

It writes the quality rows to its CSV (`--csv`, default book/bench/quality.csv) and plan.csv
and reach.csv beside it, each point as soon as it is done, so a run stopped half-way picks up
where it was: the points already written are kept (when they were made with the same
settings and the same plan) and only the others run; more seeds, lengths or models may be
added to a finished run the same way. Nothing here names a model:
the contestants are the kinds' bench arms, and `--models` may add a kind of your own
(MODULE:NAME).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import torch

from . import int_list, torch_threads, write_csv

__all__ = ["read_left_to_right", "contestants", "bench_all", "QUALITY_COLUMNS",
           "REACH_COLUMNS"]

QUALITY_COLUMNS = ("arm", "kind", "length", "budget", "seed", "params", "steps", "train_flops",
                   "own_protocol", "own_bpc", "common_bpc", "train_seconds", "settings")
REACH_COLUMNS = ("arm", "kind", "length", "budget", "seed", "band", "low", "high", "cases",
                 "accuracy", "bits", "reach", "reachable", "settings")


@torch.no_grad()
def read_left_to_right(model, data: torch.Tensor, *, segment: int,
                       answers: torch.Tensor | None = None) -> tuple[float, torch.Tensor | None]:
    """The common protocol: data [N] read as one stream, left to right, `segment` bytes per
    call of the model protocol (``logits, state = model.step(tokens, state)``) with the state
    carried, so each byte is predicted from all the context the model keeps (a window's
    earlier bytes, a memory). Returns the bits per byte over bytes 1..N-1, and the
    log-probabilities [A, V] at the positions `answers` (increasing, each in 1..N-1) if
    given, in their order."""
    if segment < 1 or len(data) < 2:
        raise ValueError(f"need segment >= 1 and at least 2 bytes, got {segment} and "
                         f"{len(data)}")
    if answers is not None and len(answers) and (
            int(answers.min()) < 1 or int(answers.max()) > len(data) - 1
            or bool((answers[1:] <= answers[:-1]).any())):
        raise ValueError(f"answers must be increasing positions in 1..{len(data) - 1} (each "
                         "is predicted from the bytes before it)")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x = data.long().to(device)
    nll, kept = 0.0, []
    want = None if answers is None else answers.to(device)
    state = None
    try:
        for start in range(0, len(x) - 1, segment):
            tokens = x[start:start + segment][None]
            target = x[start + 1:start + 1 + segment]
            logits, state = model.step(tokens, state)
            logp = logits[0, :len(target)].float().log_softmax(-1)
            nll -= logp.gather(1, target[:, None]).sum().item()
            if want is not None:  # the positions predicted here: start + 1 .. start + len
                inside = want[(want > start) & (want <= start + len(target))]
                kept.append(logp[inside - start - 1].cpu())
    finally:
        model.train(was_training)
    bits = nll / (len(x) - 1) / math.log(2)
    return bits, (torch.cat(kept) if want is not None else None)


def contestants(models: str | None = None) -> dict:
    """{arm name: (kind, BenchArm)}: every registered kind's arms, or those `models` names
    (comma-separated kind names, arm names, or MODULE:NAME for a kind of your own)."""
    from ..planner import bench_arms
    from ..plugins import kind_named

    everyone = bench_arms()
    if not models:
        return everyone
    chosen: dict = {}
    for item in (m.strip() for m in models.split(",") if m.strip()):
        if item in everyone:  # an arm
            pairs = {item: everyone[item]}
        elif ":" in item or item in _kind_names():  # every arm of a kind
            pairs = bench_arms([kind_named(item)])
        else:
            raise ValueError(f"--models: {item!r} is neither a bench arm "
                             f"({', '.join(everyone)}), a model kind "
                             f"({', '.join(_kind_names())}) nor MODULE:NAME")
        for name, pair in pairs.items():
            if name in chosen and chosen[name][0] is not pair[0]:
                raise ValueError(f"--models: two bench arms are called {name!r} (--model "
                                 f"{chosen[name][0].name} and --model {pair[0].name})")
            chosen[name] = pair
    return chosen


def _kind_names() -> list[str]:
    from ..kinds import KINDS

    return list(KINDS)


def _settings(**values) -> str:
    return json.dumps(values, sort_keys=True)


def _done(path: Path, settings: str) -> list[dict]:
    """The rows a stopped run wrote, refused when they were made with other settings."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "settings" not in rows[0]:
        raise ValueError(f"{path} is not a file bench_all wrote (no settings column): give "
                         "another --csv")
    other = {r["settings"] for r in rows} - {settings}
    if other:
        raise ValueError(f"{path} holds a run with other settings ({sorted(other)[0]}), not "
                         f"these ({settings}): give another --csv, or delete its folder's "
                         "plan.csv, quality.csv and reach.csv to start over")
    return rows


def _train(kind, plan, data, *, seed: int, lr: float, device: str):
    from ..training import TrainConfig, train

    torch.manual_seed(seed)
    model = kind.build(plan.config)
    objective = kind.build_objective(plan.config, plan.objective)
    cfg = TrainConfig(steps=plan.steps, batch_size=plan.batch_size, lr=lr,
                      warmup=max(1, plan.steps // 10), seed=seed, device=device,
                      eval_every=10 ** 9, eval_bytes=None, log_every=10 ** 9,
                      ckpt_every=10 ** 9)
    batches = kind.batches(data, plan.batch_size, plan.config, seed=seed)
    result = train(model, cfg, batches=batches, objective=objective, progress=False,
                   no_decay=kind.no_decay)
    return result.model, result.seconds


def _segment(kind, config, length: int) -> int:
    """The common protocol's segment: the training length for a kind that carries a memory
    (its state), a quarter of it for one whose state is the window's earlier bytes (each
    byte then sees at least three quarters of a window)."""
    return length if kind.reads_streams(config) else max(1, length // 4)


def _reachable(distance: int, most: int | None, segment: int, far: dict) -> str:
    """'yes' where every answer at this distance is within reach under the common protocol,
    'partly' where only answers late in their segment are (the first byte of a segment is
    read with segment - 1 fewer bytes before it than the last), else why not."""
    if most is None:
        return "not stated by its kind"
    if distance in far:
        return far[distance]
    if distance > most - segment + 1:
        return (f"partly: read in segments of {segment}, a prediction early in its segment "
                f"reads as few as {most - segment + 1} bytes back")
    return "yes"


def _float_list(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated numbers, e.g. 5e11,1e12; got "
                         f"{text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"--{name} needs at least one number, each > 0; got {text!r}")
    return values


def bench_all(budgets: str = "5e11,1e12,2e12", params: int = 200_000, seeds: str = "0,1,2",
              models: str | None = None, lengths: str = "128,512",
              distances: str = "16,64,256,1024,4096", batch_size: int = 8,
              eval_bytes: int = 32768, reach_eval: int = 200, lr: float = 2e-3,
              csv: str = "book/bench/quality.csv", device: str = "cpu",
              threads: int = 1) -> list[dict]:
    """Run the bench (see the module docstring) and return the quality rows (written to
    `csv` too, plan.csv and reach.csv beside it). The reach task trains at the longest
    length and the largest budget."""
    from ..data import load_corpus
    from ..evaluation import evaluate
    from ..planner import plan_bench
    from ..reach import distance_bands, reach_records, score_reach, unreachable

    budget_list = _float_list(budgets, "budgets")
    length_list = int_list(lengths, "lengths", 2)
    distance_list = int_list(distances, "distances", 8)
    seed_list = int_list(seeds, "seeds", 0)
    if params < 1 or batch_size < 1 or eval_bytes < 2 or reach_eval < 1:
        raise ValueError(f"need --params >= 1, --batch-size >= 1, --eval-bytes >= 2 and "
                         f"--reach-eval >= 1; got {params}, {batch_size}, {eval_bytes} and "
                         f"{reach_eval}")
    arms = contestants(models)
    quality_csv = Path(csv)
    folder = quality_csv.parent
    settings = _settings(params=params, batch_size=batch_size,
                         eval_bytes=eval_bytes, reach_eval=reach_eval, lr=lr,
                         distances=distance_list)
    quality = _done(quality_csv, settings)
    reach_rows = _done(folder / "reach.csv", settings)
    done_q = {(r["arm"], int(r["length"]), float(r["budget"]), int(r["seed"])) for r in quality}
    done_r = {(r["arm"], int(r["length"]), float(r["budget"]), int(r["seed"]))
              for r in reach_rows}
    with torch_threads(threads):
        plans = {}
        for length in length_list:
            for budget in budget_list:
                for r in plan_bench(budget=budget, params=params, length=length,
                                    batch_size=batch_size, arms=arms):
                    plans[r.arm, length, budget] = r
        planned = {(r["arm"], int(r["length"]), float(r["budget"])): r
                   for r in _done(folder / "plan.csv", settings)}
        for (name, length, budget), plan in plans.items():
            row = dict(plan.as_row(), budget=budget, settings=settings)
            old = planned.get((name, length, budget))
            if old is not None and (int(old["params"]), int(old["steps"])) != (plan.params,
                                                                               plan.steps):
                raise ValueError(f"the plan of {name} at length {length} and budget {budget:g} "
                                 f"has changed since "
                                 f"{folder / 'plan.csv'} was written ({old['params']} "
                                 f"parameters, {old['steps']} steps; now {plan.params}, "
                                 f"{plan.steps}): give another --csv, or delete its folder's "
                                 "plan.csv, quality.csv and reach.csv to start over")
            planned[name, length, budget] = row
        write_csv(list(planned.values()), folder / "plan.csv")
        corpus = load_corpus("pydoc")
        held = corpus.valid[:eval_bytes]
        reach_length, reach_budget = max(length_list), max(budget_list)
        train_reach = reach_records(max(64, 40_000 // max(distance_list)) * len(distance_list),
                                    distance_list, seed=0)
        bands = distance_bands(distance_list)
        points = [(a, n, b, s) for s in seed_list for n in length_list for b in budget_list
                  for a in arms]
        total = len(points) + len(seed_list) * len(arms)
        count = (sum(p in done_q for p in points)
                 + sum((a, reach_length, reach_budget, s) in done_r for s in seed_list
                       for a in arms))
        try:
            for name, length, budget, seed in points:
                if (name, length, budget, seed) in done_q:
                    continue
                kind, plan = arms[name][0], plans[name, length, budget]
                model, seconds = _train(kind, plan, corpus.train, seed=seed, lr=lr, device=device)
                own = evaluate(model, held, kind.protocol(), kind=kind, seq_len=length)
                common, _ = read_left_to_right(model, held,
                                               segment=_segment(kind, plan.config, length))
                quality.append({"arm": name, "kind": kind.name, "length": length,
                                "budget": budget, "seed": seed,
                                "params": plan.params, "steps": plan.steps,
                                "train_flops": plan.train_flops, "own_protocol": own.protocol,
                                "own_bpc": own.bpc, "common_bpc": common,
                                "train_seconds": seconds, "settings": settings})
                write_csv(quality, quality_csv)
                count += 1
                print(f"bench_all [{count}/{total}] {name}, length {length}, budget "
                      f"{budget:g}, seed {seed}: "
                      f"{plan.steps} steps in {seconds:.1f} s, {own.protocol} {own.bpc:.3f} bpc, "
                      f"left to right {common:.3f} bpc", flush=True)
            for seed in seed_list:
                test = reach_records(reach_eval, distance_list, seed=10_000 + seed)
                for name, (kind, _) in arms.items():
                    if (name, reach_length, reach_budget, seed) in done_r:
                        continue
                    plan = plans[name, reach_length, reach_budget]
                    far = unreachable(kind, plan.config, distance_list)
                    segment = _segment(kind, plan.config, reach_length)
                    model, seconds = _train(kind, plan, train_reach.data, seed=seed, lr=lr,
                                            device=device)
                    _, logp = read_left_to_right(model, test.data, segment=segment,
                                                 answers=test.answers)
                    targets = test.data[test.answers].long()
                    most = kind.reach(plan.config)[0] if kind.reach else None
                    for row in score_reach(logp, targets, test.distance, bands):
                        reach_rows.append({"arm": name, "kind": kind.name, "length": reach_length,
                                           "budget": reach_budget, "seed": seed, **row,
                                           "reach": most,
                                           "reachable": _reachable(row["low"], most, segment,
                                                                   far),
                                           "settings": settings})
                    write_csv(reach_rows, folder / "reach.csv")
                    count += 1
                    print(f"bench_all [{count}/{total}] reach, {name}, seed {seed}: "
                          f"{plan.steps} steps in {seconds:.1f} s"
                          + (f"; cannot reach {', '.join(map(str, sorted(far)))}" if far else ""),
                          flush=True)
        except KeyboardInterrupt:
            print(f"bench_all: stopped; {count} of {total} points are written in {folder}: the "
                  "same command goes on from there", file=sys.stderr)
            raise SystemExit(130) from None
    return quality
