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
added to a finished run the same way. With `--lrs` each arm first trains at every rate given,
at the smallest budget and length on the smallest seed, and is scored left to right on the
training split's last bytes (held out of those runs, never the held-out text the tables
read); the best rate is the arm's for every point (lr.csv, and plan.csv's lr column). A
finished or stopped tuned run may be given a wider grid (every rate it had, and more): it
tunes each arm at the new rates only and trains again the arms whose best rate moved.
Nothing here names a model: the contestants are the kinds' bench arms, and `--models` may
add a kind of your own (MODULE:NAME).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

import torch

from ..data import load_corpus
from ..evaluation import evaluate
from ..experiments import int_list, torch_threads, write_csv
from ..kinds import KINDS
from ..planner import BENCH_FLOP_POLICY, arm_config, bench_arms, plan_bench, policy_settings
from ..plugins import kind_named
from ..reach import (LETTERS, ReachRecords, distance_bands, reach_records, score_reach,
                     unreachable)
from ..training import TrainConfig, train

__all__ = ["read_left_to_right", "reading_segment", "train_arm", "contestants", "bench_all",
           "chosen_rates", "tuning_split", "TUNE_COLUMNS",
           "QUALITY_COLUMNS", "REACH_COLUMNS", "read_rows", "NEEDS", "decisions", "decisions_markdown", "write_decisions",
           "plot_bench", "merge_runs", "control_verdict", "recall_need", "reach_training"]

QUALITY_COLUMNS = ("arm", "kind", "length", "budget", "seed", "params", "steps", "train_flops",
                   "own_protocol", "own_bpc", "common_bpc", "train_seconds", "settings")
TUNE_COLUMNS = ("arm", "kind", "length", "budget", "seed", "lr", "params", "steps", "tune_bpc",
                "train_seconds", "chosen", "settings")
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
    return list(KINDS)


def _settings(**values) -> str:
    return json.dumps(values, sort_keys=True)


def _done(path: Path, settings: str, *, writer: str = "bench_all",
          files: str = "plan.csv, lr.csv, quality.csv and reach.csv") -> list[dict]:
    """The rows a stopped run wrote, refused when they were made with other settings (the
    message names the entry that writes the file and the files to delete to start over)."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "settings" not in rows[0]:
        raise ValueError(f"{path} is not a file {writer} wrote (no settings column): give "
                         "another --csv")
    other = {r["settings"] for r in rows} - {settings}
    if other:
        raise ValueError(f"{path} holds a run with other settings ({sorted(other)[0]}), not "
                         f"these ({settings}): give another --csv, or delete its folder's "
                         f"{files} to start over")
    return rows


def train_arm(kind, plan, data, *, seed: int, lr: float, device: str, wrap=None):
    """(model, seconds): one bench arm's plan trained on data [N] from `seed`, with a tenth
    of its steps as warm-up and no held-out scores or checkpoints on the way. wrap, if
    given, wraps the kind's batch source (the recall task's answers_only, say)."""
    torch.manual_seed(seed)
    model = kind.build(plan.config)
    objective = kind.build_objective(plan.config, plan.objective)
    cfg = TrainConfig(steps=plan.steps, batch_size=plan.batch_size, lr=lr,
                      warmup=max(1, plan.steps // 10), seed=seed, device=device,
                      eval_every=10 ** 9, eval_bytes=None, log_every=10 ** 9,
                      ckpt_every=10 ** 9)
    batches = kind.batches(data, plan.batch_size, plan.config, seed=seed)
    if wrap is not None:
        batches = wrap(batches)
    result = train(model, cfg, batches=batches, objective=objective, progress=False,
                   no_decay=kind.no_decay)
    return result.model, result.seconds


def reading_segment(kind, config, length: int) -> int:
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


def reach_training(distances) -> ReachRecords:
    """The reach task's training stream at `distances` (seeded 0, the same in every run with
    them): as many records a distance as 40,000 bytes hold at the longest, at least 64."""
    distances = list(distances)
    return reach_records(max(64, 40_000 // max(distances)) * len(distances), distances, seed=0)


@functools.lru_cache(maxsize=8)
def _reach_train_bytes(distances: tuple) -> int:
    return int(reach_training(distances).data.numel())


def _float_list(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated numbers, e.g. 5e11,1e12; got "
                         f"{text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"--{name} needs at least one number, each > 0; got {text!r}")
    return values


def chosen_rates(rows: list[dict]) -> dict[str, float]:
    """{arm: its learning rate} from lr.csv's rows: the rate of the lowest tuning bpc (a tie
    goes to the smaller rate; a score that is not a number, a run that diverged, loses)."""
    best: dict[str, tuple[float, float]] = {}
    for r in rows:
        bpc = float(r["tune_bpc"])
        key = (bpc if math.isfinite(bpc) else math.inf, float(r["lr"]))
        if r["arm"] not in best or key < best[r["arm"]]:
            best[r["arm"]] = key
    return {arm: rate for arm, (_, rate) in best.items()}


def tuning_split(train: torch.Tensor, eval_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(what the learning-rate runs train on, what scores them): the training split less its
    last min(eval_bytes, a tenth of it) bytes, and those bytes."""
    cut = max(2, min(eval_bytes, len(train) // 10))
    return train[:-cut], train[-cut:]


def _log_run(folder: Path, points: int, seconds: float, *, threads: int, device: str) -> None:
    """One row per invocation in runs.csv: when, how long, how many points it ran, on what
    (the machine, the threads, torch)."""
    path = folder / "runs.csv"
    rows = []
    if path.exists():
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    rows.append({"ended": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(seconds, 1),
                 "points_run": points, "device": device, "threads": threads,
                 "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
                 "torch": torch.__version__})
    write_csv(rows, path)


def bench_all(budgets: str = "5e11,1e12,2e12", params: int = 200_000, seeds: str = "0,1,2",
              models: str | None = None, lengths: str = "128,512",
              distances: str = "16,64,256,1024,4096", batch_size: int = 8,
              eval_bytes: int = 32768, reach_eval: int = 200, lr: float = 2e-3,
              csv: str = "book/bench/quality.csv", device: str = "cpu",
              threads: int = 1, reach_only: bool = False,
              flop_policy: str = BENCH_FLOP_POLICY, lrs: str | None = None,
              corpus: str | None = None) -> list[dict]:
    """Run the bench (see the module docstring) and return the quality rows (written to
    `csv` too, plan.csv and reach.csv beside it). The reach task trains at the longest
    length and the largest budget. reach_only: the reach task alone (a control of it, say,
    at other distances: its own folder, since the distances are part of the settings), `csv`
    then names its reach.csv, and its rows are returned. flop_policy: how every arm's
    training FLOPs are counted (minixl.model_kind.FLOP_POLICIES). lrs: comma-separated
    learning rates, each arm's chosen among them first (the module docstring); lr is then
    unused. corpus: the text the arms train on and are scored on, any corpus `minixl train`
    takes (None: pydoc); its name, digest and training bytes join the run's settings when it
    is not pydoc."""
    policy = policy_settings(flop_policy)
    lr_list = sorted(set(_float_list(lrs, "lrs"))) if lrs else None
    if lr_list is not None and len(lr_list) < 3:
        raise ValueError(f"--lrs needs at least three different learning rates, so that the "
                         f"best can have one on each side; got {lrs!r}")
    budget_list = _float_list(budgets, "budgets")
    length_list = int_list(lengths, "lengths", 2)
    distance_list = int_list(distances, "distances", 8)
    seed_list = int_list(seeds, "seeds", 0)
    if params < 1 or batch_size < 1 or eval_bytes < 2 or reach_eval < 1:
        raise ValueError(f"need --params >= 1, --batch-size >= 1, --eval-bytes >= 2 and "
                         f"--reach-eval >= 1; got {params}, {batch_size}, {eval_bytes} and "
                         f"{reach_eval}")
    arms = contestants(models)
    began, ran = time.perf_counter(), 0
    if reach_only and Path(csv).name != "reach.csv":
        raise ValueError(f"with --reach-only, --csv names the reach task's CSV, a file called "
                         f"reach.csv (in a folder of its own); got {csv}")
    quality_csv = Path(csv).with_name("quality.csv") if reach_only else Path(csv)
    folder = quality_csv.parent
    rate = {"lrs": lr_list} if lr_list else {"lr": lr}
    text = load_corpus(corpus or "pydoc")  # its errors first: a name or a path, not a file
    if not reach_only and len(text.valid) < max(length_list) + 1:
        raise ValueError(f"the valid split of {text.name!r} has {len(text.valid):,} bytes, "
                         f"too few for one window of {max(length_list)}: use more text or "
                         "shorter --lengths")
    # pydoc's runs stored no corpus: their settings stay as they were
    own = {} if (corpus or "pydoc") == "pydoc" else {
        "corpus": text.name, "corpus_sha256": text.sha256[:16],
        "corpus_train_bytes": int(text.train.numel())}
    settings = _settings(params=params, batch_size=batch_size,
                         eval_bytes=eval_bytes, reach_eval=reach_eval, **rate,
                         distances=distance_list, **policy, **own)
    if lr_list:
        _widen(folder, settings, arms, reach_only=reach_only)
    quality = _done(quality_csv, settings)
    reach_rows = _done(folder / "reach.csv", settings)
    with torch_threads(threads):
        plans = {}
        for length in length_list:
            for budget in budget_list:
                for r in plan_bench(budget=budget, params=params, length=length,
                                    batch_size=batch_size, arms=arms, flop_policy=flop_policy):
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
                                 "plan.csv, lr.csv, quality.csv and reach.csv to start over")
            if lr_list:  # a tuned run's plan names each arm's rate, once it is chosen
                row["lr"] = "" if old is None else old.get("lr", "")
            planned[name, length, budget] = row
        write_csv(list(planned.values()), folder / "plan.csv")
        rates = {name: lr for name in arms}

        def rate_of(name: str) -> dict:  # a tuned run's rows name their arm's rate
            return {"lr": rates[name]} if lr_list else {}
        held = text.valid[:eval_bytes]
        reach_length, reach_budget = max(length_list), max(budget_list)
        train_reach = reach_training(distance_list)
        bands = distance_bands(distance_list)
        points = [] if reach_only else [(a, n, b, s) for s in seed_list for n in length_list
                                        for b in budget_list for a in arms]
        total = len(points) + len(seed_list) * len(arms)

        def tally():  # (quality points done, reach points done, how many of `total`)
            def keys(rows):
                return {(r["arm"], int(r["length"]), float(r["budget"]), int(r["seed"]))
                        for r in rows}
            done_q, done_r = keys(quality), keys(reach_rows)
            return done_q, done_r, (sum(p in done_q for p in points)
                                    + sum((a, reach_length, reach_budget, s) in done_r
                                          for s in seed_list for a in arms))
        done_q, done_r, count = tally()
        try:
            if lr_list:  # its trainings are lr.csv's rows, not points of runs.csv
                rates = _tune(arms, plans, planned, text, folder, settings, lr_list,
                              length=min(length_list), budget=min(budget_list),
                              seed=min(seed_list), eval_bytes=eval_bytes, device=device)
                if not reach_only:  # (a reach-only run trains no quality point again)
                    quality = _rechosen(quality, rates, quality_csv)
                reach_rows = _rechosen(reach_rows, rates, folder / "reach.csv")
                done_q, done_r, count = tally()
            for name, length, budget, seed in points:
                if (name, length, budget, seed) in done_q:
                    continue
                kind, plan = arms[name][0], plans[name, length, budget]
                model, seconds = train_arm(kind, plan, text.train, seed=seed,
                                           lr=rates[name], device=device)
                own = evaluate(model, held, kind.protocol(), kind=kind, seq_len=length)
                common, _ = read_left_to_right(model, held,
                                               segment=reading_segment(kind, plan.config, length))
                quality.append({"arm": name, "kind": kind.name, "length": length,
                                "budget": budget, "seed": seed,
                                "params": plan.params, "steps": plan.steps,
                                "train_flops": plan.train_flops, "own_protocol": own.protocol,
                                "own_bpc": own.bpc, "common_bpc": common,
                                "train_seconds": seconds,
                                **rate_of(name), "settings": settings})
                write_csv(quality, quality_csv)
                count, ran = count + 1, ran + 1
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
                    segment = reading_segment(kind, plan.config, reach_length)
                    model, seconds = train_arm(kind, plan, train_reach.data, seed=seed,
                                               lr=rates[name], device=device)
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
                                           **rate_of(name),
                                           "settings": settings})
                    write_csv(reach_rows, folder / "reach.csv")
                    count, ran = count + 1, ran + 1
                    print(f"bench_all [{count}/{total}] reach, {name}, seed {seed}: "
                          f"{plan.steps} steps in {seconds:.1f} s"
                          + (f"; cannot reach {', '.join(map(str, sorted(far)))}" if far else ""),
                          flush=True)
        except KeyboardInterrupt:
            print(f"bench_all: stopped; {count} of {total} points are written in {folder}: the "
                  "same command goes on from there", file=sys.stderr)
            raise SystemExit(130) from None
        _log_run(folder, ran, time.perf_counter() - began, threads=threads, device=device)
        stored = _done(quality_csv, settings), _done(folder / "reach.csv", settings)
        write_decisions(folder, *stored)
        plot_bench(folder, *stored)
    return stored[1] if reach_only else quality


TUNED_FILES = ("plan.csv", "quality.csv", "reach.csv", "lr.csv")  # lr.csv last: it marks
# the widening as done (a run stopped half-way through it finds lr.csv as it was, and goes on)


def _widen(folder: Path, settings: str, arms, *, reach_only: bool = False) -> None:
    """Where `folder` holds a tuned run whose settings differ from `settings` only in a
    narrower grid of rates (every stored rate among the new ones), take it as this run:
    every row of its TUNED_FILES is given the new settings, so that the run resumes, tunes
    each arm at the new rates only, and then trains again only the arms whose choice moved
    (`_rechosen`); the rest of its rows are what this run would compute (the same plan,
    seed and rate). A stored grid that is not inside the new one, or any other setting
    changed, is left alone, and resuming refuses it as before (`_done`). A widening must
    train every arm the folder tuned (`arms`) and every point (not `reach_only`): else the
    rows of an arm it does not run would claim a grid they were never tuned on."""
    new = json.loads(settings)
    tuning = read_rows(folder / "lr.csv")
    stored = {r["settings"] for r in tuning if r.get("settings")}
    if len(stored) != 1 or stored == {settings}:
        return
    old = json.loads(stored.pop())
    if ({k: v for k, v in old.items() if k != "lrs"} != {k: v for k, v in new.items()
                                                         if k != "lrs"}
            or not set(old.get("lrs") or ()) < set(new.get("lrs") or ())):
        return
    left = [a for a in dict.fromkeys(r["arm"] for r in tuning) if a not in arms]
    if left or reach_only:
        raise ValueError(f"{folder} was tuned on {', '.join(f'{g:g}' for g in old['lrs'])}: "
                         f"widening its grid re-tunes every arm it holds and trains again "
                         f"those whose rate moves, so it needs "
                         + (f"--models to name every one ({', '.join(left)} left out)"
                            if left else "a full run, not --reach-only"))
    for name in TUNED_FILES:
        rows = read_rows(folder / name)
        if rows:
            write_csv([{**r, "settings": settings} if r.get("settings")
                       and json.loads(r["settings"]) == old else r for r in rows], folder / name)
    added = sorted(set(new["lrs"]) - set(old["lrs"]))
    print(f"bench_all: widening the stored grid of rates in {folder} by "
          f"{', '.join(f'{g:g}' for g in added)}: each arm is tuned at those, and an arm whose "
          f"best rate moves is trained again at every point", flush=True)


def _rechosen(rows: list[dict], rates: dict[str, float], path: Path) -> list[dict]:
    """`rows` less those trained at a rate other than their arm's chosen one (a grid widened
    since, `_widen`), `path` written again without them, and the arms named."""
    def stale(r):
        return (r.get("lr") not in (None, "") and r["arm"] in rates
                and float(r["lr"]) != rates[r["arm"]])
    moved = sorted({r["arm"] for r in rows if stale(r)})
    if not moved:
        return rows
    kept = [r for r in rows if not stale(r)]
    print(f"bench_all: {len(rows) - len(kept)} rows of {path.name} were trained at a rate no "
          f"longer chosen ({', '.join(f'{a} now {rates[a]:g}' for a in moved)}): they are "
          "trained again", flush=True)
    if kept:
        write_csv(kept, path)
    else:
        path.unlink()
    return kept


def _tune(arms, plans, planned, corpus, folder, settings, lr_list, *, length, budget, seed,
          eval_bytes, device) -> dict[str, float]:
    """Each arm trained at each rate of lr_list at (length, budget), from `seed` (the
    smallest), on the training split less its last bytes, and read left to right on those
    (`tuning_split`); lr.csv written a row at a time (a stopped run resumes), and plan.csv's
    lr column filled in. A row of lr.csv tuned elsewhere (another length, budget or seed, a
    plan of other parameters or steps) is refused. Returns {arm: chosen rate}."""
    path = folder / "lr.csv"
    rows = _done(path, settings)
    for r in rows:
        plan = plans.get((r["arm"], length, budget))
        here = (length, budget, seed) + ((plan.params, plan.steps) if plan else ())
        found = (int(r["length"]), float(r["budget"]), int(r["seed"])) + (
            (int(r["params"]), int(r["steps"])) if plan else ())
        if found != here:
            raise ValueError(f"{path} tuned {r['arm']} at length, budget, seed"
                             f"{', params, steps' if plan else ''} {found}, not at this run's "
                             f"{here}: every arm's rate is chosen at one point; delete "
                             f"{path.name} (and plan.csv, quality.csv, reach.csv) to start over")
    done = {(r["arm"], float(r["lr"])) for r in rows}
    train_part, held = tuning_split(corpus.train, eval_bytes)
    todo = [(name, rate) for name in arms for rate in lr_list if (name, rate) not in done]
    ran = 0
    for name, rate in todo:
        kind, plan = arms[name][0], plans[name, length, budget]
        model, seconds = train_arm(kind, plan, train_part, seed=seed, lr=rate, device=device)
        bpc, _ = read_left_to_right(model, held, segment=reading_segment(kind, plan.config,
                                                                         length))
        rows.append({"arm": name, "kind": kind.name, "length": length, "budget": budget,
                     "seed": seed, "lr": rate, "params": plan.params, "steps": plan.steps,
                     "tune_bpc": bpc, "train_seconds": seconds, "chosen": False,
                     "settings": settings})
        chosen = chosen_rates(rows)
        whole = {a for a in chosen  # an arm's rate is chosen once all its rates are scored
                 if {float(r["lr"]) for r in rows if r["arm"] == a} >= set(lr_list)}
        for r in rows:
            r["chosen"] = r["arm"] in whole and float(r["lr"]) == chosen[r["arm"]]
        write_csv(rows, path)
        ran += 1
        print(f"bench_all [rate {ran}/{len(todo)}] {name} at lr {rate:g}: {plan.steps} steps in "
              f"{seconds:.1f} s, {bpc:.3f} bpc on the tuning bytes", flush=True)
    chosen = chosen_rates(rows)
    edge = [f"{a} ({chosen[a]:g})" for a in arms if chosen[a] in (lr_list[0], lr_list[-1])]
    if edge:
        print(f"bench_all: the best rate is at the edge of --lrs for {', '.join(edge)}: a rate "
              "beyond it may be better", flush=True)
    for key, row in planned.items():
        row["lr"] = chosen.get(key[0], row.get("lr", ""))
    write_csv(list(planned.values()), folder / "plan.csv")
    return {name: chosen[name] for name in arms}


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV the bench wrote (none when the file does not exist yet)."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def merge_runs(folders: list, out) -> tuple[list[dict], list[dict]]:
    """Join bench runs made apart into one folder `out`: on a GPU with room for many, one
    process per arm and seed (each `bench_all --models ARM --seeds S --csv FOLDER/quality.csv`
    with the same other options) finishes in the time of the slowest. Their plan, quality and
    reach rows are written to `out` in the order one process would have written them, runs.csv
    keeps every process's row (with its folder), and the decision table and figure are written
    from the joined rows as `bench_all` writes them (where an arm's rows stop short, a
    process stopped early, the table's rows say which contestants they leave out). Refuses
    folders made with other settings, lengths, budgets or devices, and a plan or point found
    twice. A tuned run's lr.csv rows are joined too; an arm tuned in two folders is refused
    (tune each arm in one process). Returns the quality and reach rows."""
    folders = [Path(f) for f in folders]
    out = Path(out)
    plan, quality, reach, runs, grids, tuned = {}, {}, {}, [], {}, {}
    for folder in folders:
        rows = read_rows(folder / "quality.csv")
        if not rows:
            raise ValueError(f"{folder} holds no quality.csv rows: not a bench_all folder, or a "
                             "run that wrote no point")
        planned = read_rows(folder / "plan.csv")
        grids[folder] = sorted({(int(r["length"]), float(r["budget"])) for r in planned})
        for r in planned:
            key = (r["arm"], int(r["length"]), float(r["budget"]))
            if key in plan and plan[key] != r:
                raise ValueError(f"two different plans of {key[0]} at length {key[1]} and "
                                 f"budget {key[2]:g}: one in {folder}")
            plan[key] = r
        for name, table, found in (("quality", quality, rows),
                                   ("reach", reach, read_rows(folder / "reach.csv"))):
            for r in found:
                key = (r["arm"], int(r["length"]), float(r["budget"]), int(r["seed"]),
                       r.get("band"))
                if key in table:
                    raise ValueError(f"the {name} point {key[:4]} is in two folders (one is "
                                     f"{folder}): give each process its own arms or seeds")
                table[key] = r
        runs += [dict(r, folder=str(folder)) for r in read_rows(folder / "runs.csv")]
        for r in read_rows(folder / "lr.csv"):  # a tuned run's rates: one process an arm
            key = (r["arm"], float(r["lr"]))
            if key in tuned and tuned[key] != r:
                raise ValueError(f"{r['arm']} was tuned at lr {key[1]:g} in two folders (one "
                                 f"is {folder}): give each arm's seeds one process, or tune "
                                 "every arm in one run first")
            tuned[key] = r
    settings = {r["settings"] for r in [*quality.values(), *reach.values(), *plan.values()]}
    if len(settings) != 1:
        raise ValueError(f"the folders were run with different settings: {sorted(settings)}")
    if len({tuple(g) for g in grids.values()}) > 1:
        raise ValueError("the folders were run at different lengths or budgets: "
                         + "; ".join(f"{f}: {g}" for f, g in grids.items()))
    devices = {r.get("device") for r in runs}
    if len(devices) > 1:
        raise ValueError(f"the folders were run on different devices: {sorted(devices)}")
    known = list(contestants())  # the bench's own order; arms it does not know after them
    order = known + sorted({r["arm"] for r in plan.values()} - set(known))
    plan_rows = sorted(plan.values(), key=lambda r: (
        int(r["length"]), float(r["budget"]), order.index(r["arm"])))
    quality_rows = sorted(quality.values(), key=lambda r: (
        int(r["seed"]), int(r["length"]), float(r["budget"]), order.index(r["arm"])))
    reach_rows = sorted(reach.values(), key=lambda r: (
        int(r["seed"]), order.index(r["arm"]), int(r["low"])))
    out.mkdir(parents=True, exist_ok=True)
    write_csv(plan_rows, out / "plan.csv")
    write_csv(quality_rows, out / "quality.csv")
    if reach_rows:
        write_csv(reach_rows, out / "reach.csv")
    if runs:
        write_csv(runs, out / "runs.csv")
    if tuned:
        write_csv(sorted(tuned.values(), key=lambda r: (order.index(r["arm"]), float(r["lr"]))),
                  out / "lr.csv")
    write_decisions(out, quality_rows, reach_rows)
    plot_bench(out, quality_rows, reach_rows)
    return quality_rows, reach_rows


# ---------------------------------------------------------------- the decision table

NEEDS = ("best bpc at fixed compute", "long context on a small budget", "infilling",
         "exact recall at a distance", "streaming generation", "training memory at 16k",
         "best bpc at fixed training time")


def _by_arm(rows: list[dict], key: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        if r.get(key) not in (None, ""):
            out.setdefault(r["arm"], []).append(float(r[key]))
    return out


def _pick(values: dict[str, list[float]], *, lower: bool, what: str, unit: str,
          chance: float | None = None, cases: int | None = None) -> dict:
    """The arm whose mean over seeds is best, the runner-up, the margin between their means and
    the spread of the two (half the range of each one's seeds, added): no winner where the
    ranges of their seeds meet (the best's worst seed is not better than the runner-up's best
    one), or where there are fewer than two seeds or two contestants; and none at all where
    the best's worst seed is no better than `chance` (a uniform guess), or, given the number
    of answers each accuracy counts (`cases`, the fewest), no more than two standard
    deviations of a guess's accuracy beyond it (above it, or below it where `lower`)."""
    means = {a: sum(v) / len(v) for a, v in values.items()}
    order = sorted(means, key=lambda a: means[a] if lower else -means[a])
    half = {a: (max(v) - min(v)) / 2 for a, v in values.items()}
    seeds = min(len(v) for v in values.values())
    best = order[0]
    row = {"choice": best, "reason": f"{what} {means[best]:.3f} {unit}".strip(),
           "runner_up": "", "margin": None, "spread": None}
    worst = {a: (max(v) if lower else min(v)) for a, v in values.items()}
    top = {a: (min(v) if lower else max(v)) for a, v in values.items()}
    bar, noise = chance, ""
    if chance is not None and cases:
        sd = (chance * (1 - chance) / cases) ** 0.5
        bar = chance - 2 * sd if lower else chance + 2 * sd
        noise = (f"; the bar {bar:.3f} {'takes' if lower else 'adds'} two standard deviations "
                 f"of a guess over {cases} answers")
    if chance is not None and not (worst[best] < bar if lower else worst[best] > bar):
        row["choice"] = f"none learned it (the best, {best}, is no better than chance, " \
                        f"{chance:.3f}{noise})"
        return row
    if len(order) < 2:
        row["choice"] = f"only {best} measured"
        return row
    second = order[1]
    margin, spread = abs(means[second] - means[best]), half[best] + half[second]
    row.update(runner_up=f"{second} ({means[second]:.3f})", margin=round(margin, 4),
               spread=round(spread, 4))
    if seeds < 2:
        row["choice"] = f"no winner at this scale (one seed, no spread; best {best})"
    elif (worst[best] >= top[second]) if lower else (worst[best] <= top[second]):
        row["choice"] = f"no winner at this scale (best {best}, within the seeds' spread)"
    return row


def _missing(rows: list[dict], every: list[str]) -> str:
    """', k of N contestants (no ARM, ...)' where the rows leave some of `every` out (a
    process stopped, say), else ''."""
    have = {r["arm"] for r in rows}
    gone = [a for a in every if a not in have]
    return (f", {len(every) - len(gone)} of {len(every)} contestants (no {', '.join(gone)})"
            if gone else "")


def _run_settings(rows: list[dict]) -> dict:
    """The settings the run that wrote `rows` stored (its first row's), or {} (rows built by
    hand, or none)."""
    return json.loads(rows[0].get("settings") or "{}") if rows else {}


@functools.lru_cache(maxsize=1)
def _train_bytes() -> int:
    """The bytes of the training split the bench reads (pydoc's: its size depends a little
    on the Python version, `minixl.data`)."""
    return int(load_corpus("pydoc").train.numel())


def kernel_label(arm: str, length: int = 128) -> str | None:
    """The first clause of an arm's kernel line (`ModelKind.kernel_note` on the arm's config
    at `length`: 'eager', "PyTorch's fused causal attention", ...), or None for an arm no
    registered kind has or a kind that states no kernel."""
    pair = bench_arms().get(arm)
    if pair is None or pair[0].kernel is None:
        return None
    return _first_clause(pair[0].kernel_note(arm_config(*pair, length)))


def _first_clause(line: str) -> str:
    return re.split(r"[(:;]", line, maxsplit=1)[0].strip()


def _grouped_kernels(labels) -> str:
    """', kernels: A, B LABEL; C LABEL' for (arm, label) pairs (arms of one label grouped, in
    the order first seen; an empty label left out), or '' where none has one."""
    groups: dict[str, list[str]] = {}
    for arm, label in labels:
        if label:
            groups.setdefault(label, []).append(arm)
    return ("" if not groups else
            ", kernels: " + "; ".join(f"{', '.join(a)} {label}" for label, a in groups.items()))


def _kernels(arms, length: int = 128) -> str:
    """', kernels: A, B LABEL; C LABEL' for the arms (`kernel_label` at `length`), or ''
    where no arm states its kernel."""
    return _grouped_kernels((a, kernel_label(a, length)) for a in arms)


def _scale(rows: list[dict], *, passes: bool = True, steps_too: bool = True,
           train_bytes: int | None = None, over: str = "corpus passes") -> str:
    """', P parameters, batch B, steps (corpus passes) ARM N (p), ..., kernels: ...' for the
    rows of one budget and length: the parameter count every arm was sized to and the batch
    (the run's settings, where its rows carry them: `batch_size` windows, or `batch_bytes`
    bytes, a step); each arm's steps (one number where its seeds agree, as they do in one
    plan; else the range) and, with `passes`, how many times those steps read the training
    data (steps x batch x length bytes over `train_bytes`; where None, the run's corpus's
    training split as its settings name it, or pydoc's: `_train_bytes`; `over` names them), unless not `steps_too` (a reading at fixed time, whose steps
    vary); and each arm's kernel (`kernel_label`)."""
    settings = _run_settings(rows)
    steps: dict[str, set[int]] = {}
    length = {}
    for r in rows:
        if steps_too and r.get("steps") not in (None, ""):
            steps.setdefault(r["arm"], set()).add(int(r["steps"]))
            length[r["arm"]] = int(r["length"])
    at = int(rows[0]["length"]) if rows else 128
    batch = settings.get("batch_size") or (settings["batch_bytes"] // at
                                           if settings.get("batch_bytes") else None)
    parts = []
    if "params" in settings:
        parts.append(f"{settings['params']:,} parameters")
    if batch:
        parts.append(f"batch {batch}")
    counted = passes and bool(batch)
    corpus = train_bytes or settings.get("corpus_train_bytes") or (_train_bytes() if counted
                                                                    else 0)

    def told(a, n):
        text = f"{a} {min(n)}" if len(n) == 1 else f"{a} {min(n)}-{max(n)}"
        if counted:
            ends = dict.fromkeys(f"{k * batch * length[a] / corpus:.1f}"
                                 for k in (min(n), max(n)))
            text += f" ({'-'.join(ends)})"
        return text
    if steps:
        parts.append(f"steps{f' ({over})' if counted else ''} "
                     + ", ".join(told(a, n) for a, n in steps.items()))
    return "".join(f", {p}" for p in parts) + _kernels(
        dict.fromkeys(r["arm"] for r in rows), at)


def _counted(rows: list[dict]) -> str:
    """', FLOPs counted as POLICY' for rows of one run (the policy its settings name; a run
    that names none counted by the kernel, the default before the bench counted causally). Rows of one run share a policy, for a
    stopped run never resumes under the other; rows that mix them are refused, for a row of
    the decision table compares their budgets."""
    policies = {json.loads(r["settings"]).get("flop_policy", "kernel") if r.get("settings")
                else "kernel" for r in rows}
    if len(policies) > 1:
        raise ValueError(f"these rows counted training FLOPs under different policies "
                         f"({', '.join(sorted(policies))}): one row of the decision table "
                         f"cannot compare their budgets; run them again with one --flop-policy")
    return f", FLOPs counted as {policies.pop() if policies else 'kernel'}{_tuned(rows)}"


def _tuned(rows: list[dict]) -> str:
    """', learning rate chosen per arm from A, B, C (ARM RATE, ...)' for the rows of a run
    with --lrs (they name their rate), else ', learning rate R for every arm' (the settings'
    one rate), or '' where the rows carry no settings."""
    rates = {r["arm"]: float(r["lr"]) for r in rows if r.get("lr") not in (None, "")}
    settings = _run_settings(rows)
    if not rates:
        return (f", learning rate {settings['lr']:g} for every arm" if "lr" in settings
                else "")
    grid = settings.get("lrs")
    return (", learning rate chosen per arm" + (f" from {', '.join(f'{g:g}' for g in grid)}"
                                                if grid else "")
            + f" ({', '.join(f'{a} {v:g}' for a, v in rates.items())})")


def _with_steps(rows: list[dict], plan: list[dict] | None) -> list[dict]:
    """`rows` (the reach task's, which do not store their steps), each given the steps its
    arm was planned at its length and budget in `plan` (the run's plan.csv rows) where it has
    none and the plan has them; the rows as they are without a plan."""
    steps = {(p["arm"], int(p["length"]), float(p["budget"])): p["steps"]
             for p in plan or () if p.get("budget") not in (None, "")}
    return [r if r.get("steps") not in (None, "") else
            {**r, "steps": steps.get((r["arm"], int(r["length"]), float(r["budget"])), "")}
            for r in rows]


def _top_reach(reach: list[dict]) -> list[dict]:
    """The reach rows at the largest budget, and at its longest length (a rerun that adds a
    budget or a length trains the task again there and keeps the old rows)."""
    if not reach:
        return reach
    budget = max(float(r["budget"]) for r in reach)
    length = max(int(r["length"]) for r in reach if float(r["budget"]) == budget)
    return [r for r in reach if float(r["budget"]) == budget and int(r["length"]) == length]


MEMORY_LENGTH = 16384  # the length of the need "training memory at 16k"
MEMORY_MARGIN = 0.10  # a memory winner needs the runner-up to take 10 % more


def _fits(cost: list[dict]) -> list[dict]:
    return [r for r in cost if str(r["fits"]) == "True"]


def _cost_scale(at: list[dict], *, calls: bool = False) -> str:
    """', untrained weights on random bytes (...), depth x width (parameters at this
    length) ARM SHAPE (P), ..., T thread(s) of C cores, an ARCH CPU, torch V, kernels: ...'
    for bench_cost's rows at one length: each arm's depth x width and its parameters at this length (a position table
    grows with it), what the run ran on, and each arm's kernel (the first clause of its row's
    `kernel`); with `calls`, also which arms' one-byte calls read cached keys and values and
    which read their window again."""
    sizes = ", ".join(f"{r['arm']} {r['shape']} ({int(r['params']):,})" for r in at
                      if r.get("shape") and r.get("params") not in (None, ""))
    text = (", untrained weights on random bytes (no corpus; the learning rate does not "
            "change a cost)")
    if sizes:
        text += f", depth x width (parameters at this length) {sizes}"
    def told(key):  # one value, or every value the rows hold
        return "/".join(dict.fromkeys(str(r[key]) for r in at if r.get(key) not in (None, "")))
    if told("threads"):
        text += (f", {told('threads')} thread{'s' if told('threads') != '1' else ''}"
                 + (f" of {told('cpus')} cores" if told("cpus") else "")
                 + (f", an {told('machine')} CPU" if told("machine") else "")
                 + (f", torch {told('torch')}" if told("torch") else ""))
    kernels = _grouped_kernels((r["arm"], _first_clause(r.get("kernel") or "")) for r in at)
    text += kernels
    if calls and kernels:
        cached = [r["arm"] for r in at if "cached keys and values" in (r.get("kernel") or "")]
        again = [r["arm"] for r in at if r["arm"] not in cached and r.get("kernel")]
        said = ([f"{', '.join(cached)} read{'s' * (len(cached) == 1)} cached keys and values"]
                if cached else []) + (
            [f"{', '.join(again)} "
             + ("reads its window" if len(again) == 1 else "read their windows") + " again"]
            if again else [])
        text += ", a one-byte call: " + "; ".join(said)
    return text


def _memory_need(cost: list[dict]) -> dict:
    """The training-memory row from bench_cost's rows at MEMORY_LENGTH: the arm whose
    training steps add the least memory. One fresh process per point and no seeds: a winner
    only where the runner-up takes MEMORY_MARGIN more."""
    length = MEMORY_LENGTH
    at = [r for r in cost if int(r["length"]) == length]
    fit = sorted((r for r in _fits(at) if r.get("train_peak_mb") not in (None, "")),
                 key=lambda r: float(r["train_peak_mb"]))
    out = ", ".join(r["arm"] for r in at if str(r["fits"]) != "True")
    setting = f"training steps, one row of {length} bytes, a fresh process each"
    def remembers(r):
        return str(r.get("memory") or 0) not in ("0", "")
    if any(r.get("train_segment") not in (None, "") for r in at):
        carried = [f"{r['arm']} in segments of {r['train_segment']}"
                   + (f" with a memory of {r['memory']}" if remembers(r) else ", no memory")
                   for r in at if r.get("train_segment") not in (None, "")
                   and int(r["train_segment"]) < length]
    else:  # rows of before the column: a row with a memory, by its reading segment (the
        # same as its training one)
        carried = [f"{r['arm']} in segments of {r['segment']} with a memory of {r['memory']}"
                   for r in at if remembers(r) and r.get("segment") not in (None, "")]
    if carried:
        setting += " (" + "; ".join(carried) + ")"
    setting += _cost_scale(at)
    if not fit:
        return {"setting": setting, "choice": "none fits", "reason": f"none fits ({out})",
                "runner_up": "", "margin": None, "spread": None}
    best = fit[0]
    row = {"setting": setting, "choice": best["arm"],
           "reason": f"adds {float(best['train_peak_mb']):.0f} MB"
                     + (f"; does not fit: {out}" if out else ""),
           "runner_up": "", "margin": None, "spread": None}
    if len(fit) < 2:
        row["choice"] = f"only {best['arm']} fits"
        return row
    second = fit[1]
    a, b = float(best["train_peak_mb"]), float(second["train_peak_mb"])
    row.update(runner_up=f"{second['arm']} ({b:.0f} MB)", margin=round(b - a, 1))
    if b < a * (1 + MEMORY_MARGIN):
        row["choice"] = (f"no winner at this scale (best {best['arm']}, within "
                         f"{MEMORY_MARGIN:.0%} of the runner-up)")
    return row


def _generation_need(cost: list[dict]) -> dict | None:
    """The streaming-generation row: the fastest arm per generated byte (one byte a call,
    after a window's worth of bytes) at the longest of the lengths where the most arms were
    measured (a model whose training step does not fit at a length is not timed there, and
    must not drop out of the comparison by that); its rounds play the part of seeds (a
    winner only where its slowest round beats the runner-up's fastest)."""
    fit = [r for r in _fits(cost) if r.get("generate_ms_per_byte") not in (None, "")]
    count = {n: sum(int(r["length"]) == n for r in fit) for n in {int(r["length"]) for r in fit}}
    if not count or max(count.values()) < 2:
        return None
    length = max(n for n in count if count[n] == max(count.values()))
    at = [r for r in fit if int(r["length"]) == length]
    rounds = int(at[0]["rounds"])
    fast = {r["arm"]: float(r["generate_ms_per_byte"]) for r in at}
    slow = {r["arm"]: float(r["generate_ms_slowest"]) for r in at}
    best, second = sorted(fast, key=fast.get)[:2]
    picked = {"choice": best, "reason": f"{fast[best]:.3f} ms per generated byte (fastest "
                                        f"round)",
              "runner_up": f"{second} ({fast[second]:.3f})",
              "margin": round(fast[second] - fast[best], 4),
              "spread": round((slow[best] - fast[best]) / 2 + (slow[second] - fast[second]) / 2,
                              4)}
    if rounds < 2:
        picked["choice"] = f"no winner at this scale (one round, no spread; best {best})"
    elif slow[best] >= fast[second]:
        picked["choice"] = f"no winner at this scale (best {best}, within the rounds' spread)"
    return {"setting": f"after {length} bytes, one byte a call, {rounds} rounds"
                       f"{_cost_scale(at, calls=True)}", **picked}


def _at_time(points: list[tuple[float, float]], seconds: float) -> float:
    """The value at `seconds` on the line through (seconds, value) points, straight in the
    logarithm of the seconds between the two that bracket it (the budgets double, so their
    times are about evenly spaced in log time)."""
    points = sorted(points)
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if s0 <= seconds <= s1:
            if s1 == s0:
                return v0
            w = math.log(seconds / s0) / math.log(s1 / s0)
            return v0 + w * (v1 - v0)
    raise ValueError(f"{seconds} s lies outside the points' {points[0][0]}-{points[-1][0]} s")


def _untimed(runs: list[dict], trainings: int) -> str:
    """Why the run's training times are not each arm's own, from its runs.csv rows (one a
    process: when it ended, how many seconds it ran, how many points it trained), or '' where
    they are: the rows must account for all `trainings` (a process that was stopped writes
    none, so its points ran unrecorded), and no process may have trained while another did
    (1.5 s of slack: the clock is kept to the second)."""
    from datetime import datetime, timedelta

    spans, ran = [], 0
    for r in runs:
        if r.get("seconds") in (None, "") or r.get("ended") in (None, ""):
            return "a process in runs.csv has no time on record"
        end = datetime.strptime(r["ended"], "%Y-%m-%d %H:%M:%S")
        spans.append((end - timedelta(seconds=float(r["seconds"])), end))
        ran += int(float(r.get("points_run") or 0))
    if ran < trainings:
        return (f"runs.csv records {ran} of the {trainings} trainings, so whether each arm "
                f"trained alone is not on record")
    slack = timedelta(seconds=1.5)
    both = sum(any(a < d - slack and c < b - slack for j, (c, d) in enumerate(spans) if j != i)
               for i, (a, b) in enumerate(spans))
    if both:
        return (f"{both} of the run's {len(spans)} processes trained while another did "
                f"(runs.csv), so no training time is an arm's own")
    return ""


def _time_need(quality: list[dict], every: list[str]) -> dict:
    """Best bpc at fixed training time, from the same rows as fixed compute: each arm's
    held-out bpc (read left to right) at one training time, interpolated in each seed
    between the budgets that bracket it (`_at_time`), then `_pick` over the seeds. The time
    is the shortest of every arm's and seed's longest training time, so no arm is read beyond
    its measured points. An arm or seed timed at fewer than two budgets is left out and
    named. An arm whose smallest budget took longer than that time is left out too, and
    named with its bpc at its smallest budget: where every seed of it is worse there than
    every seed of the pick at the time, it is ruled out on the assumption (not measured:
    each budget is a run with its own schedule) that a shorter run does no better; else the
    choice says it is not ruled out. The times are the run's own (`train_seconds`: the
    training steps alone), and the reason says whether the fixed-compute reading (the same
    rows as that row reads) names the same arm."""
    none = {"runner_up": "", "margin": None, "spread": None}
    length = max(int(r["length"]) for r in quality)
    at_length = [r for r in quality if int(r["length"]) == length]
    curves: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    for r in at_length:
        if r.get("train_seconds") not in (None, ""):
            curves.setdefault(r["arm"], {}).setdefault(str(r["seed"]), []).append(
                (float(r["train_seconds"]), float(r["common_bpc"]), float(r["budget"])))
    timed = {a: {s: v for s, v in by.items() if len({f for _, _, f in v}) >= 2}
             for a, by in curves.items()}
    timed = {a: by for a, by in timed.items() if by}
    short = [a for a in dict.fromkeys(r["arm"] for r in at_length)
             if len(timed.get(a, {})) < len({str(r["seed"]) for r in at_length if r["arm"] == a})]
    if not timed:
        return {"setting": "", "choice": "not measured",
                "reason": "no arm has training times at two budgets", **none}
    seconds = min(max(t for t, _, _ in v) for by in timed.values() for v in by.values())
    first = {a: max(min(t for t, _, _ in v) for v in by.values()) for a, by in timed.items()}
    late = [a for a in timed if first[a] > seconds]
    values: dict[str, list[float]] = {}
    spent: dict[str, list[float]] = {}
    for arm, by in timed.items():
        if arm in late:
            continue
        for v in by.values():
            values.setdefault(arm, []).append(_at_time([(t, b) for t, b, _ in v], seconds))
            spent.setdefault(arm, []).append(math.exp(_at_time(
                [(t, math.log(f)) for t, _, f in v], seconds)))
    seeds = max((len(v) for v in values.values()), default=0)
    setting = (f"{seconds:.1f} s of training each, as the run timed them, length {length}, "
               f"{seeds} seed{'s' if seeds != 1 else ''}, read left to right, interpolated "
               f"between budgets in log time{_scale(at_length, steps_too=False)}"
               f"{_counted(quality)}")
    if short:
        setting += f", timed at one budget only (left out): {', '.join(short)}"
    if not values:
        return {"setting": setting, "choice": "not measured",
                "reason": "every arm's smallest budget took longer than the fastest arm's "
                          "largest", **none}
    picked = _pick(values, lower=True, what="held-out", unit="bpc")
    means = {a: sum(v) / len(v) for a, v in values.items()}
    best = min(means, key=means.get)
    order = sorted(means, key=means.get)[:2]
    picked["reason"] += "; a run of that time would spend about " + ", ".join(
        f"{sum(spent[a]) / len(spent[a]):.1e} FLOPs for {a}" for a in order)
    open_ = []
    for arm in late:
        low = min(f for v in timed[arm].values() for _, _, f in v)
        at_low = [b for v in timed[arm].values() for _, b, f in v if f == low]
        ruled = min(at_low) > max(values[best])
        open_ += [] if ruled else [arm]
        picked["reason"] += (
            f"; {arm} left out: its smallest budget took {first[arm]:.1f} s and reads "
            f"{sum(at_low) / len(at_low):.3f} bpc, "
            + ("worse in every seed than every seed of the pick, and a shorter run is assumed "
               "no better (not measured: each budget is a run with its own schedule)"
               if ruled else "not ruled out"))
    if open_:
        picked["choice"] += f" ({', '.join(open_)} not ruled out)"
    top = max(float(r["budget"]) for r in at_length)
    by_flops = _by_arm([r for r in at_length if float(r["budget"]) == top], "common_bpc")
    flop_best = min(by_flops, key=lambda a: sum(by_flops[a]) / len(by_flops[a]))
    named = (_pick(by_flops, lower=True, what="", unit="")["choice"] == flop_best,
             picked["choice"] == best)
    if flop_best not in values:
        said = f"the best is {flop_best}, left out here"
    else:
        said = f"the best is {flop_best}" + (", the same" if flop_best == best
                                             else ": the readings disagree")
        said += {(True, True): "", (False, False): " (neither names a winner)",
                 (True, False): " (no winner at fixed time)",
                 (False, True): " (no winner at fixed compute)"}[named]
    picked["reason"] += f"; at fixed compute ({top:g} FLOPs) {said}"
    return {"setting": setting + _missing(at_length, every), **picked}


def _context_need(context: list[dict]) -> dict:
    """Long context on a small budget, from bench_context's rows: held-out bpc of the same
    bytes read with the longest context, by the models trained at the longest length, the
    best by the mean of its seeds (`_pick`); the reason names what the best arm (by its
    mean, winner or not) gained from the shortest context to the longest it can read (marked
    in or partly in its reach before training), paired by seed: a context out of its reach
    would gain nothing by construction, and the reason says so where the longest is."""
    length = max(int(r["length"]) for r in context)
    contexts = sorted({int(r["context"]) for r in context if int(r["length"]) == length})
    longest = contexts[-1]
    rows = [r for r in context if int(r["length"]) == length and int(r["context"]) == longest]
    values = _by_arm(rows, "bpc")
    picked = _pick(values, lower=True, what="held-out", unit="bpc")
    best = min(values, key=lambda a: sum(values[a]) / len(values[a]))
    mine = [r for r in context if r["arm"] == best and int(r["length"]) == length]
    bpc = {(int(r["seed"]), int(r["context"])): float(r["bpc"]) for r in mine}
    readable = sorted({int(r["context"]) for r in mine if r["reachable"] == "yes"
                       or r["reachable"].startswith("partly")})
    seeds = sorted(seed for seed, c in bpc if c == longest)
    first, last = (readable[0], readable[-1]) if readable else (None, None)
    if first != last and all((seed, c) in bpc for seed in seeds for c in (first, last)):
        gains = [bpc[seed, first] - bpc[seed, last] for seed in seeds]
        beyond = "" if last == longest else f", {longest} out of its reach"
        picked["reason"] += (f"; {best}, context {first} -> {last} bytes{beyond}: "
                             f"{sum(gains) / len(gains):+.3f} bpc (seeds "
                             f"{', '.join(f'{g:+.3f}' for g in gains)})")
    budget = float(rows[0]["budget"])
    n_seeds = len({r["seed"] for r in rows})
    return {"setting": f"budget {budget:g} FLOPs, trained at {length}, read with {longest} "
                       f"bytes of context, {n_seeds} seed{'s' * (n_seeds > 1)}"
                       f"{_scale(rows)}{_counted(context)}", **picked}


def control_verdict(rows: list[dict], control: str = "shaw",
                    control_accuracy: float = 0.95) -> tuple[bool, str]:
    """(passed at every length, what it says): the control arm's accuracy in the nearest
    band of distance, which lies inside every window, at each length, in every seed, against
    `control_accuracy`. Where it fails, the run concludes nothing at that length: a
    mechanism that scores chance there may be untrained, not unable (the same FLOPs buy
    fewer steps at a longer length)."""
    mine = [r for r in rows if r["arm"] == control]
    if not mine:
        return False, (f"no positive control: the arm {control!r} did not run, so nothing here "
                       "says the task was learnable at this budget")
    low = min(int(r["low"]) for r in mine)
    said, passed = [], True
    for length in sorted({int(r["length"]) for r in mine}):
        got = sorted(float(r["accuracy"]) for r in mine
                     if int(r["length"]) == length and int(r["low"]) == low
                     and r["accuracy"] not in (None, ""))
        if got and got[0] >= control_accuracy:
            said.append(f"length {length}: passed ({', '.join(f'{a:.3f}' for a in got)})")
            continue
        passed = False
        said.append(f"length {length}: FAILED ("
                    + (", ".join(f"{a:.3f}" for a in got) if got else "no case")
                    + "), so the run concludes nothing about reach at this length")
    band = next(r["band"] for r in mine if int(r["low"]) == low)
    return passed, (f"positive control, {control} recalling {band} bytes back, accuracy "
                    f"{control_accuracy:g} in every seed: " + "; ".join(said))


def recall_need(rows: list[dict], control: str = "shaw",
                control_accuracy: float = 0.95) -> list[dict]:
    """The decision table's rows for exact recall at a distance, from bench_recall's rows:
    first the positive control's row (`control_verdict`), then one row a band of distance at
    the longest length where the control passed, the best arm by its mean accuracy over
    seeds among those that can reach the band (marked in or partly in reach before
    training), against chance and two standard deviations of a guess over the band's answers
    (`_pick`). Where no arm can reach a band, the row says so and
    why; where the control failed at every length, the control's row is the only one, for
    nothing else here says what a mechanism cannot learn."""
    need = NEEDS[3]
    if not rows:
        return [{"need": f"{need}: positive control", "setting": "",
                 "choice": "FAILED: the recall rows conclude nothing",
                 "reason": "no recall rows: bench_recall wrote none", "runner_up": "",
                 "margin": None, "spread": None}]
    passed_at = [n for n in sorted({int(r["length"]) for r in rows})
                 if control_verdict([r for r in rows if int(r["length"]) == n], control,
                                    control_accuracy)[0]]
    passed, said = control_verdict(rows, control, control_accuracy)
    length = passed_at[-1] if passed_at else max(int(r["length"]) for r in rows)
    at = [r for r in rows if int(r["length"]) == length]
    seeds = len({r["seed"] for r in at})
    stream = _run_settings(at).get("train_bytes")
    setting = (f"recall task, budget {float(at[0]['budget']):g}, length {length}, {seeds} seed"
               + ("s" if seeds > 1 else "")
               + _scale(at, passes=bool(stream), train_bytes=stream,
                        over="passes over its stream") + _counted(at))
    mine = [r for r in at if r["arm"] == control]
    low = min((int(r["low"]) for r in mine), default=None)
    got = [float(r["accuracy"]) for r in mine if int(r["low"]) == low]
    table = [{"need": f"{need}: positive control", "setting": setting if mine else "",
              "choice": _control_choice(passed, passed_at),
              "reason": said.removeprefix("positive control, "),
              "runner_up": "", "margin": None, "spread": None}]
    if not got or not passed_at:
        return table
    every = list(dict.fromkeys(r["arm"] for r in rows))
    for low in sorted({int(r["low"]) for r in at}):
        band = next(r["band"] for r in at if int(r["low"]) == low)
        able = {r["arm"] for r in at if int(r["low"]) == low
                and (r["reachable"] == "yes" or r["reachable"].startswith("partly"))}
        here = [r for r in at if int(r["low"]) == low and r["arm"] in able
                and int(r["cases"] or 0) > 0]
        if not able:
            table.append({"need": f"{need}: {band} bytes", "setting": setting,
                          "choice": "none can reach it",
                          "reason": f"every contestant's config puts it out of reach at "
                                    f"length {length}",
                          "runner_up": "", "margin": None, "spread": None})
            continue
        if not here:
            table.append({"need": f"{need}: {band} bytes", "setting": setting,
                          "choice": "not measured",
                          "reason": f"no answer fell in this band at length {length}",
                          "runner_up": "", "margin": None, "spread": None})
            continue
        picked = _pick(_by_arm(here, "accuracy"), lower=False, what="accuracy", unit="",
                       chance=1 / LETTERS, cases=min(int(r["cases"]) for r in here))
        if picked["choice"].startswith("only ") and len(able) == 1 and len(able) < len(
                {r["arm"] for r in at if int(r["low"]) == low}):  # the others out of reach
            picked["choice"] = f"only {', '.join(sorted(able))} can reach it"
        table.append({"need": f"{need}: {band} bytes", "setting": setting + _missing(at, every),
                      **picked})
    return table


def recall_judge(rows: list[dict]) -> dict:
    """{'control': ..., 'control_accuracy': ...}: the positive control that the run which
    wrote `rows` named in its settings (bench_recall stores both there), else the defaults
    (a file written before they were stored, or rows built by hand)."""
    judge = {"control": "shaw", "control_accuracy": 0.95}
    stored = _run_settings(rows)
    judge.update({k: stored[k] for k in judge if k in stored})
    return judge


def _control_choice(passed: bool, passed_at: list[int]) -> str:
    if passed:
        return "passed"
    if passed_at:
        return f"passed at length {', '.join(map(str, passed_at))} only"
    return "FAILED: the recall rows conclude nothing"


def decisions(quality: list[dict], reach: list[dict], cost: list[dict] | None = None,
              context: list[dict] | None = None,
              recall: list[dict] | None = None, runs: list[dict] | None = None,
              plan: list[dict] | None = None) -> list[dict]:
    """The decision table from the bench's rows: for each of NEEDS, the contestant to use and
    the measured reason, the runner-up, the margin and the two's spread (of seeds; of rounds
    for a time, see `_generation_need`); 'no winner at this scale' where the spread covers
    the margin; 'not measured' where this run has nothing to say. The rows of bench_cost
    (`cost`), when given, answer streaming generation and training memory at 16k; those of
    bench_context (`context`), when given, answer long context on a small budget; those of
    bench_recall (`recall`), when given, answer exact recall at a distance in place of the
    reach task's rows, its positive control first (`recall_need`). Best bpc at fixed
    training time reads the quality rows' training times (`_time_need`), unless the run's
    processes (`runs`, its runs.csv rows) trained at the same time: then no time is an arm's
    own, and the row says so. The reach task's rows name each arm's steps from `plan` (the
    run's plan.csv rows), where given.
    """
    table = []

    def add(need, setting, picked):
        table.append({"need": need, "setting": setting, **picked})

    def unmeasured(need, why):
        add(need, "", {"choice": "not measured", "reason": why, "runner_up": "",
                       "margin": None, "spread": None})

    every = list(dict.fromkeys(r["arm"] for r in [*quality, *reach]))
    budgets = sorted({float(r["budget"]) for r in quality})
    lengths = sorted({int(r["length"]) for r in quality})
    length = lengths[-1] if lengths else None
    for need, budget in ((NEEDS[0], budgets[-1] if budgets else None),
                         (NEEDS[1], budgets[0] if budgets else None)):
        if need == NEEDS[1] and context:
            table.append({"need": need, **_context_need(context)})
            continue
        rows = [r for r in quality if float(r["budget"]) == budget and int(r["length"]) == length]
        if not rows:
            unmeasured(need, "no quality rows")
            if need == NEEDS[0]:
                unmeasured(NEEDS[6], "no quality rows")
            continue
        if need == NEEDS[1] and len(lengths) < 2:
            unmeasured(need, f"one length only ({length}): long context needs a longer one "
                       "beside it")
            continue
        add(need, f"budget {budget:g} FLOPs, length {length}, {len({r['seed'] for r in rows})} "
            f"seeds{_scale(rows)}, read left to right{_counted(quality)}"
            f"{_missing(rows, every)}", _pick(_by_arm(rows, "common_bpc"), lower=True,
                                                 what="held-out", unit="bpc"))
        if need == NEEDS[0]:
            untimed = runs and _untimed(runs, len(quality) + len(
                {(r["arm"], r["seed"], r["length"], r["budget"]) for r in reach}))
            if untimed:
                unmeasured(NEEDS[6], untimed)
            else:
                table.append({"need": NEEDS[6], **_time_need(quality, every)})
    infill = [r for r in quality if r["own_protocol"] == "infill" and budgets
              and float(r["budget"]) == budgets[-1] and int(r["length"]) == length]
    if infill:
        add(NEEDS[2], f"budget {budgets[-1]:g} FLOPs, length {length}{_scale(infill)}, its "
            f"own protocol{_counted(quality)}",
            _pick(_by_arm(infill, "own_bpc"), lower=True, what="infill", unit="bpc"))
    else:
        unmeasured(NEEDS[2], "no contestant's kind reads a span from both sides")
    if recall:
        table += recall_need(recall, **recall_judge(recall))
        reach = []
    reach = _top_reach(reach)
    for low in sorted({int(r["low"]) for r in reach}):
        rows = [r for r in reach if int(r["low"]) == low and int(r["cases"] or 0) > 0
                and (r["reachable"] == "yes" or r["reachable"].startswith("partly"))]
        band = next((r["band"] for r in reach if int(r["low"]) == low), str(low))
        if not rows:
            add(f"{NEEDS[3]}: {band} bytes", "", {
                "choice": "none can reach it", "reason": "every contestant's config puts it "
                "out of reach", "runner_up": "", "margin": None, "spread": None})
            continue
        rows = _with_steps(rows, plan)
        distances = _run_settings(rows).get("distances")
        stream = _reach_train_bytes(tuple(distances)) if distances else None
        scale = _scale(rows, passes=bool(stream), train_bytes=stream,
                       over="passes over its stream")
        add(f"{NEEDS[3]}: {band} bytes", f"reach task, budget {float(rows[0]['budget']):g}, "
            f"length {rows[0]['length']}{scale}{_counted(reach)}"
            f"{_missing(reach, every)}", _pick(_by_arm(rows, "accuracy"), lower=False,
                                                  what="accuracy", unit="",
                                                  chance=1 / LETTERS))
    generation = _generation_need(cost) if cost else None
    if generation is None:
        unmeasured(NEEDS[4], "generation speed is not part of this run")
    else:
        table.append({"need": NEEDS[4], **generation})
    if not cost or all(int(r["length"]) != MEMORY_LENGTH for r in cost):
        unmeasured(NEEDS[5], f"the cost-against-length sweep (bench_cost) did not measure "
                   f"{MEMORY_LENGTH} bytes")
    else:
        table.append({"need": NEEDS[5], **_memory_need(cost)})
    return table


def decisions_markdown(table: list[dict]) -> str:
    """The table as markdown, margins and spreads beside each choice."""
    lines = ["| need | measured on | use | why | runner-up | margin | spread |",
             "|---|---|---|---|---|---|---|"]
    for r in table:
        cells = [r["need"], r["setting"], r["choice"], r["reason"], r["runner_up"],
                 "" if r["margin"] is None else f"{r['margin']:.3f}",
                 "" if r["spread"] is None else f"{r['spread']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_decisions(folder: Path, quality: list[dict], reach: list[dict]) -> Path:
    """decisions.csv and decisions.md in `folder`, from the bench's rows (as read from its
    CSVs), bench_cost's cost.csv beside them, bench_context's context/context.csv and
    bench_recall's recall/recall.csv below them, where there are; returns the markdown
    file's path. Each row's setting names the FLOP policy its run counted under (`_counted`):
    the runs in one folder may differ, one row's rows may not."""
    folder = Path(folder)
    context = read_rows(folder / "context" / "context.csv")
    recall = read_rows(folder / "recall" / "recall.csv")
    table = decisions(quality, reach, read_rows(folder / "cost.csv") or None,
                      context or None, recall or None, read_rows(folder / "runs.csv") or None,
                      read_rows(folder / "plan.csv") or None)
    write_csv(table, folder / "decisions.csv")
    path = folder / "decisions.md"
    path.write_text(decisions_markdown(table) + "\n")
    return path


def plot_bench(folder: Path, quality: list[dict], reach: list[dict]) -> Path:
    """bench.png in `folder`: held-out bpc read left to right against training FLOPs, a line
    per contestant (mean of its seeds, bars: half their range), and the reach task's
    accuracy by distance at the largest budget, out-of-reach bands left out."""
    from matplotlib.figure import Figure  # not pyplot: a notebook's backend is left alone

    arms = list(dict.fromkeys(r["arm"] for r in [*quality, *reach]))
    length = max((int(r["length"]) for r in quality), default=None)
    reach = _top_reach(reach)
    fig = Figure(figsize=(10, 3.6), dpi=72)
    left, right = fig.subplots(1, 2)
    for arm in arms:
        by_budget: dict[float, list[float]] = {}
        for r in quality:
            if r["arm"] == arm and int(r["length"]) == length:
                by_budget.setdefault(float(r["budget"]), []).append(float(r["common_bpc"]))
        xs = sorted(by_budget)
        means = [sum(by_budget[b]) / len(by_budget[b]) for b in xs]
        half = [(max(by_budget[b]) - min(by_budget[b])) / 2 for b in xs]
        left.errorbar(xs, means, yerr=half, marker="o", ms=3, capsize=2, label=arm)
        bands = {}
        for r in reach:
            if r["arm"] == arm and (r["reachable"] == "yes"
                                    or r["reachable"].startswith("partly")):
                bands.setdefault(int(r["low"]), []).append(float(r["accuracy"]))
        if bands:
            ds = sorted(bands)
            right.plot(ds, [sum(bands[d]) / len(bands[d]) for d in ds], marker="o", ms=3,
                       label=arm)
    left.set(xscale="log", xlabel="training FLOPs", ylabel="held-out bpc, read left to right",
             title=f"quality against compute (windows of {length})" if length else
             "quality against compute (not in this run)")
    right.set(xscale="log", xlabel="distance to the answer's source (bytes)",
              ylabel="accuracy (mean of seeds)", ylim=(0, 1.02),
              title="reach task (only distances within reach)")
    distances = sorted({int(r["low"]) for r in reach})
    if distances:
        right.set_xticks(distances, [str(d) for d in distances])
        right.minorticks_off()
    right.axhline(1 / LETTERS, color="gray", lw=0.8, ls=":")
    right.text(right.get_xlim()[0], 1 / LETTERS + 0.02, " chance: a guess among 26 letters",
               fontsize=7, color="gray")
    left.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = folder / "bench.png"
    fig.savefig(path, metadata={"Software": None})
    return path
