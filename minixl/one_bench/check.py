"""Checkers for Chapter 7's exercises (every mechanism on one bench): matched_compute, reach,
contestant and winner, compared with the kinds' own counts, the planner (minixl.planner) and
the decision table's rule (minixl.one_bench.bench_all). Hand-written (not generated).
"""

from __future__ import annotations

import numbers
from dataclasses import replace
from typing import Callable

import torch

from ..data import load_corpus
from .bench_all import _pick, read_left_to_right, reading_segment, train_arm
from ..kinds import KINDS, kind_of
from ..model_kind import ModelKind, check_flop_policy
from ..planner import bench_arms, count_arm, matched_steps, plan_bench
from ..check.verdicts import call, verdict


def _number(value) -> float | None:
    """value as a float when it is one number (an int, a float, a NumPy or 0-d tensor
    scalar), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value.item()) if getattr(value, "numel", lambda: 0)() == 1 else None
    except (TypeError, ValueError, AttributeError):
        return None


def _char_configs():
    kind = kind_of("char")
    base = kind.presets["tiny"].model
    shapes = [dict(n_layer=2, d_model=32, n_head=4, d_inner=128, block_size=16),
              dict(n_layer=4, d_model=56, n_head=4, d_inner=224, block_size=128),
              dict(n_layer=3, d_model=48, n_head=2, d_inner=96, block_size=64),
              dict(n_layer=1, d_model=16, n_head=1, d_inner=16, block_size=7)]
    return kind, [kind.config(**{**base, **s}) for s in shapes]


def matched_compute(flops_fn: Callable, steps_fn: Callable, policy: str = "causal") -> bool:
    """Check flops_fn(config) -> training FLOPs per byte of Chapter 1's model under `policy`
    (6 per weight that multiplies, position tables excluded, plus the attention scores and
    weighted sums: 6 N (T + 1) C under 'causal', the book's bench, where each query is
    charged the (T + 1) / 2 keys it may read on average; 12 N T C under 'kernel', every key
    of the window), and steps_fn(budget, flops_per_byte, batch_size, length) -> the bench's
    matched step count."""
    check_flop_policy(policy)
    kind, configs = _char_configs()
    n_checks = len(configs)
    for c in configs:
        with torch.device("meta"):
            model = kind.build(c)
        want = kind.flops_per_token(model, policy)
        weights = sum(p.numel() for n, p in model.named_parameters() if n != "pos")
        table = model.pos.numel() if getattr(model, "pos", None) is not None else 0
        full = 12 * c.n_layer * c.block_size * c.d_model  # every key of the window
        scores = full if policy == "kernel" else 6 * c.n_layer * (c.block_size + 1) * c.d_model
        got, err = call(flops_fn, c)
        where = (f"for n_layer={c.n_layer}, d_model={c.d_model}, d_inner={c.d_inner}, "
                 f"block_size={c.block_size}")
        if err:
            return verdict("matched_compute", f"{where}: {err}", n_checks)
        value = _number(got)
        if value is None or abs(value - want) > 1e-6 * want:
            slips = {2 * weights + scores / 3: "counts the forward pass only: training costs "
                                               "2 FLOPs per weight forward and 4 backward, 6",
                     want + 6 * table: "counts the position tables: they are added to the "
                                       "input, not multiplied, so they cost no 6 per weight",
                     want - scores: "leaves out the attention scores: q.k and the weighted "
                                    "sum of the values, forward and backward"}
            if policy == "causal":
                slips[want - scores + full] = (
                    "charges every key of the window, T a query: the causal count charges a "
                    "query only the keys it may read, (T + 1) / 2 on average (the kernel "
                    "count, what an eager kernel computes, is the other policy)")
                slips[want - scores + full / 2] = (
                    "charges T / 2 keys a query: the first query reads 1 key and the last T, "
                    "so the mean is (T + 1) / 2")
            else:
                slips[want - scores / 2] = ("halves the attention scores: the kernel count "
                                            "charges every key of the window, the masked "
                                            "half included")
                slips[want - scores + 6 * c.n_layer * (c.block_size + 1) * c.d_model] = (
                    "charges the causal mean, (T + 1) / 2 keys a query: the kernel count "
                    "charges every key of the window, T, as an eager kernel computes them")
            hint = next((why for slip, why in slips.items()
                         if value is not None and abs(value - slip) < 1e-6 * want),
                        f"returned {got!r}, expected {want:,.0f} (6 x {weights:,} weights + "
                        f"{scores:,} for the scores, {policy} count)")
            return verdict("matched_compute", f"{where}: {hint}", n_checks)
    reference = matched_steps
    cases = [(8e11, 1.35e6, 8, 128), (2e10, 3.1e5, 8, 32), (1e9, 2.0e5, 4, 64),
             (5e8, 1.0e6, 8, 128), (3e11, 7.7e5, 16, 256), (1e12, 4.4e5, 1, 1024)]
    for budget, fpb, b, t in cases:
        want = reference(budget, fpb, batch_size=b, length=t)
        got, err = call(steps_fn, budget, fpb, b, t)
        where = f"for budget {budget:g}, {fpb:g} FLOPs per byte, batch {b}, length {t}"
        if err:
            return verdict("matched_compute", f"{where}: {err}", n_checks + len(cases))
        value = _number(got)
        if value != want:
            exact = budget / (fpb * b * t)
            slips = {round(budget / (fpb * t)): "forgets the batch: a step reads batch_size "
                                                "windows",
                     round(budget / (fpb * b)): "forgets the window: a step reads length bytes "
                                                "in each row",
                     int(exact): f"floors {exact:.2f} to {int(exact)}: the planner takes the "
                                 "nearest count, so the FLOPs miss the budget by at most half "
                                 "a step either way",
                     0: "returns 0 where a step costs more than the budget: a contestant "
                        "trains at least one step (the plan then says the budget is too small)"}
            hint = next((why for slip, why in slips.items() if value == slip),
                        f"returned {got!r}, expected {want}")
            return verdict("matched_compute", f"{where}: {hint}", n_checks + len(cases))
    return verdict("matched_compute", None, n_checks + len(cases))


def reach(fn: Callable) -> bool:
    """Check fn(kind_name, config) -> how many bytes back from the byte predicted a prediction
    can read, for the kinds char, shaw and segtree (windows) and xl (segments and a memory),
    against the kinds' own `reach`."""
    cases = [("char", dict(block_size=32)), ("shaw", dict(block_size=128)),
             ("segtree", dict(block_size=64)), ("xl", dict(tgt_len=32, mem_len=0, n_layer=2)),
             ("xl", dict(tgt_len=32, mem_len=32, n_layer=3)),
             ("xl", dict(tgt_len=16, mem_len=32, n_layer=3)),
             ("xl", dict(tgt_len=32, mem_len=16, n_layer=2)),
             ("xl", dict(tgt_len=8, mem_len=20, n_layer=4))]
    for name, fields in cases:
        kind = kind_of(name)
        config = kind.config(**{**kind.presets["tiny"].model, **fields})
        want = kind.reach(config)[0]
        where = f"for {name} with {', '.join(f'{k}={v}' for k, v in fields.items())}"
        got, err = call(fn, name, config)
        if err:
            return verdict("reach", f"{where}: {err}", len(cases))
        value = _number(got)
        if value == want:
            continue
        if name != "xl":
            hint = ("a window of T reads T bytes back from the byte after it (its last "
                    "position predicts the next byte from all T)"
                    if value == want - 1 else f"returned {got!r}, expected {want}")
        else:
            t, m, n = fields["tgt_len"], fields["mem_len"], fields["n_layer"]
            hint = {t + m: "counts the memory in one layer only: each layer's memory holds "
                           "states of the layer below, which read their own memory, so each "
                           "of the N layers adds its reach",
                    n * t: "takes Dai et al.'s O(N x L) literally: the reach grows by the "
                           "memory, not the segment, at each layer",
                    t + n * m: "adds N memories to the segment: right when the memory is a whole "
                               "number of segments, but a state read from the memory reads "
                               "back from its own segment's start, not from itself"
                    }.get(value, f"returned {got!r}, expected {want}")
        return verdict("reach", f"{where}: {hint}", len(cases))
    return verdict("reach", None, len(cases))


def contestant(kind, *, budget: float = 1e10, params: int = 20_000, length: int = 32,
               batch_size: int = 8, steps: int = 30) -> bool:
    """Check a model kind as a new contestant of the bench: its name and its arms' names are
    free, it counts its own FLOPs (attention included) and states its reach, the planner
    matches each arm to the budget and the parameters (the live bench's of Chapter 7.4 by
    default), and each arm, trained `steps` steps, reads held-out text left to right better
    than before training. Prints a line per check; True when all pass."""
    if not isinstance(kind, ModelKind):
        print(f"FAIL contestant: expected a minixl.model_kind.ModelKind, got "
              f"{type(kind).__name__}")
        return False
    problems = []
    other = KINDS.get(kind.name)
    problems.append(("kind name", None if other is None or other == kind else
                     f"{kind.name!r} is the name of a registered kind already: give yours "
                     "another (replace(..., name=...))"))
    book = {name: k for name, (k, _) in bench_arms().items() if k != kind}
    taken = [f"{name!r} (--model {book[name].name})" for name in kind.bench_arms
             if name in book]
    problems.append(("arm names", f"taken by another kind's arm: {', '.join(taken)}; name "
                     "yours apart" if taken else None))
    problems.append(("reach", None if kind.reach else
                     "not stated: the bench cannot mark the distances it cannot reach before "
                     "training; give the kind reach= (exercise 2)"))
    arms = {name: (kind, arm) for name, arm in kind.bench_arms.items()}
    plans, kernel = [], {}
    try:
        plans = plan_bench(budget=budget, params=params, length=length,
                           batch_size=batch_size, arms=arms)
        # the kernel count too: a kind's causal_flops may count the attention that its
        # flops (the kernel count) leaves out, or the other way round
        kernel = {p.arm: count_arm(kind, p.config, p.objective, policy="kernel")[1]
                  for p in plans}
        missed = [f"{p.arm}: {p.why}" for p in plans if not p.matched]
        problems.append(("plan", f"not matched ({'; '.join(missed)})" if missed else None))
    except Exception as err:  # the student's kind may fail to build: report it
        problems.append(("plan", f"the planner raised {type(err).__name__}: {err}"))
    flat = [p.arm for p in plans
            if min(p.flops_per_byte, kernel.get(p.arm, p.flops_per_byte)) <= 6 * p.params]
    problems.insert(2, ("FLOP count", None if kind.flops and not flat else
                        ("none given" if not kind.flops else f"{', '.join(flat)} counts no "
                         f"more than 6 per weight at a window of {length}")
                        + ": attention left out, so at a matched budget it would get more steps "
                          "than the book's arms, which count their attention scores; give the "
                          "kind a flops= that counts them"))
    corpus = load_corpus("pydoc")
    held = corpus.valid[:2048]
    for p in plans:
        try:
            segment = reading_segment(kind, p.config, length)
            torch.manual_seed(0)
            before, _ = read_left_to_right(kind.build(p.config), held, segment=segment)
            model, _ = train_arm(kind, replace(p, steps=steps), corpus.train,
                              seed=0, lr=1e-2, device="cpu")
            after, _ = read_left_to_right(model, held, segment=segment)
            ok = after < before - 0.5
            problems.append((f"training {p.arm}", None if ok else
                             f"{steps} steps took its held-out bpc from {before:.2f} to "
                             f"{after:.2f}, less than half a bit: does its objective train "
                             "what `step` predicts?"))
            reach_now = f", reaches {kind.reach(p.config)[0]} bytes back" if kind.reach else ""
            print(f"     {p.arm}: {p.params:,} parameters, {p.steps} steps at {budget:g} FLOPs"
                  f"{reach_now}; {steps} steps: {before:.2f} -> {after:.2f} bpc")
        except Exception as err:  # the student's model may raise anything: report it
            problems.append((f"training {p.arm}", f"raised {type(err).__name__}: {err}"))
    for name, problem in problems:
        print(f"PASS {kind.name}, {name}" if problem is None
              else f"FAIL {kind.name}, {name}: {problem}")
    return all(problem is None for _, problem in problems)


def _rule(values: dict[str, list[float]]) -> str | None:
    """The decision table's verdict on bits per byte by seed (lower is better): the winning
    arm, or None where it names none."""
    row = _pick(values, lower=True, what="", unit="")
    return row["choice"] if row["choice"] in values else None


def _slips(values: dict[str, list[float]]) -> list[tuple[str | None, str]]:
    """What the usual slips answer on values, each with what it gets wrong."""
    means = {a: sum(v) / len(v) for a, v in values.items()}
    several = len(values) > 1 and min(len(v) for v in values.values()) > 1
    order = sorted(means, key=means.get)
    best, second = (order + [None])[:2]
    up = sorted(means, key=means.get, reverse=True)
    return [
        (best if several and max(values[best]) <= min(values[second]) else None,
         "counts a tie as a win: the best's worst seed must be strictly better than the "
         "runner-up's best"),
        (best if len(values) > 1 and not several else None,
         "names a winner from one seed: one seed has no spread, so nothing tells a lead "
         "from noise"),
        (best if len(values) == 1 else None, "names a winner with one contestant: there is "
                                             "nothing to beat"),
        (best if several and max(values[best]) < max(values[second]) else None,
         "compares the best's worst seed with the runner-up's worst: it must beat the "
         "runner-up's best seed, or the two arms' seeds overlap"),
        (min(values, key=lambda a: min(values[a])) if several else None,
         "picks the arm with the best single seed: the bench ranks arms by their mean"),
        (best, "names the best mean whatever its seeds: a winner's worst seed must beat the "
               "runner-up's best one"),
        (up[0] if several and min(values[up[0]]) > max(values[up[1]]) else None,
         "ranks the highest bits per byte first: fewer bits per byte is better"),
    ]


def winner(fn: Callable) -> bool:
    """Check fn(values) -> the winning arm or None, where values is {arm: [bits per byte of
    each seed]} (lower is better), against the decision table's rule: the arm with the best
    mean wins only if its worst seed beats the runner-up's best seed, and with two seeds or
    more; else None."""
    cases = [
        {"tree": [2.30, 2.32, 2.31], "shaw": [2.40, 2.41, 2.42], "char": [2.60, 2.61, 2.62]},
        {"tree": [2.30, 2.31, 2.46], "shaw": [2.20, 2.44, 2.45]},  # best mean, seeds meet
        {"tree": [2.20, 2.50, 2.51], "shaw": [2.36, 2.37, 2.38]},  # best seed, worse mean
        {"tree": [2.30, 2.45, 2.32], "shaw": [2.40, 2.41, 2.42]},  # means apart, seeds meet
        {"tree": [2.30, 2.36], "shaw": [2.33, 2.35]},  # best mean, the worse worst seed
        {"tree": [2.30], "shaw": [2.50]},  # one seed: no spread, no winner
        {"xl": [3.10, 3.12, 3.11], "xl-nomem": [3.20, 3.21, 3.22]},
        {"a": [2.0, 2.1], "b": [2.1, 2.2]},  # the best's worst ties the runner-up's best
        {"a": [1.90, 1.91, 1.92]},  # one contestant: nothing to beat
    ]
    for values in cases:
        want = _rule(values)
        got, err = call(fn, {a: list(v) for a, v in values.items()})
        where = f"for {values}"
        if err:
            return verdict("winner", f"{where}: {err}", len(cases))
        if got == want:
            continue
        hint = next((why for answer, why in _slips(values)
                     if answer is not None and got == answer),
                    f"names no winner where {want}'s worst seed beats every seed of the "
                    "runner-up" if got is None else f"returned {got!r}, expected {want!r}")
        return verdict("winner", f"{where}: {hint}", len(cases))
    return verdict("winner", None, len(cases))
