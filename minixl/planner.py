"""The matched-compute planner of the bench of every mechanism: each contestant sized to one
parameter count and trained for one budget of FLOPs.

Hand-written glue (not generated). The contestants are the registered kinds' bench arms
(`ModelKind.bench`, `BenchArm`: the book's kinds declare theirs; any other kind enters with
its defaults), so nothing here names a model. For each arm `plan_bench`

- starts from the kind's bench preset with the arm's settings and the bench's window length
  (fields the arm names in `per_length` keep their ratio to the length: a memory, the bytes
  XLNet predicts);
- picks the width (d_model in steps of n_head; d_inner keeps its ratio to d_model, d_head is
  d_model / n_head) whose parameter count, the model's and its objective's, is nearest the
  target, and the depth too when no width at the preset's depth comes within 10 %;
- counts training FLOPs per byte with the kind's own count (`ModelKind.flops_per_token`)
  under one FLOP policy for every arm (`FLOP_POLICIES`: 'causal', the default
  (`BENCH_FLOP_POLICY`), charges each query only the keys it may read; 'kernel' charges a
  dense window's masked half too, what an eager kernel computes)
  plus what its objective adds (`Objective.flops`), and picks the steps of batch_size x
  length bytes that come nearest the budget (`matched_steps`, Chapter 7.2);
- says how far each match is off and why it cannot be exact.

Models are built on PyTorch's meta device: nothing is allocated, any size plans in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from .kinds import KINDS, kind_of
from .model_kind import BenchArm, ModelKind, check_flop_policy

__all__ = ["PARAMS_TOLERANCE", "FLOPS_TOLERANCE", "PlanRow", "matched_steps", "bench_arms",
           "arm_config", "sized_config", "count_arm", "at_length", "plan_arm", "plan_bench",
           "policy_settings", "BENCH_FLOP_POLICY"]

PARAMS_TOLERANCE = 0.10  # parameters within 10 % of the target
FLOPS_TOLERANCE = 0.05  # training FLOPs within 5 % of the budget
# The policy every bench plans with unless told otherwise: what each arm's causal model needs,
# so that no arm is charged for work its mask throws away (a dense window's masked half).
BENCH_FLOP_POLICY = "causal"


def matched_steps(budget: float, flops_per_byte: float, *, batch_size: int, length: int) -> int:
    """The number of training steps, each of batch_size x length bytes, whose training FLOPs
    come nearest `budget` (at least one): the bench's matched-compute rule."""
    if budget <= 0 or flops_per_byte <= 0 or batch_size < 1 or length < 1:
        raise ValueError(f"need budget > 0, flops_per_byte > 0, batch_size >= 1 and "
                         f"length >= 1; got {budget}, {flops_per_byte}, {batch_size} and "
                         f"{length}")
    return max(1, round(budget / (flops_per_byte * batch_size * length)))


@dataclass(frozen=True)
class PlanRow:
    """One contestant's plan: its config, objective options and steps, and how far its
    parameters and training FLOPs are from the targets (fractions: +0.03 is 3 % over)."""

    arm: str
    kind: str
    config: object
    objective: dict
    batch_size: int
    length: int
    params: int
    params_off: float
    flops_per_byte: float
    steps: int
    train_flops: float
    flops_off: float
    why: str
    flop_policy: str  # how flops_per_byte was counted (FLOP_POLICIES)

    @property
    def matched(self) -> bool:
        return (abs(self.params_off) <= PARAMS_TOLERANCE
                and abs(self.flops_off) <= FLOPS_TOLERANCE)

    def as_row(self) -> dict:
        """A CSV row: the sizes that were chosen, the counts and the misses."""
        c = self.config
        return {"arm": self.arm, "kind": self.kind,
                **{k: getattr(c, k) for k in ("n_layer", "d_model", "n_head", "d_inner")
                   if hasattr(c, k)},
                "length": self.length, "batch_size": self.batch_size, "params": self.params,
                "params_off": round(self.params_off, 4),
                "flops_per_byte": self.flops_per_byte, "steps": self.steps,
                "train_flops": self.train_flops, "flops_off": round(self.flops_off, 4),
                "matched": self.matched, "why": self.why,
                # named only when not "kernel", so that the stored kernel plans keep their
                # columns; one plan has one policy, so its rows share their columns
                **({} if self.flop_policy == "kernel" else {"flop_policy": self.flop_policy})}


def bench_arms(kinds=None) -> dict[str, tuple[ModelKind, BenchArm]]:
    """{arm name: (kind, arm)} of the given kinds (names or ModelKind objects; default every
    registered kind), in registry order. Two arms of one name are an error."""
    arms: dict[str, tuple[ModelKind, BenchArm]] = {}
    for kind in KINDS.values() if kinds is None else kinds:
        kind = kind_of(kind) if isinstance(kind, str) else kind
        for name, arm in kind.bench_arms.items():
            if name in arms:
                raise ValueError(f"two bench arms are called {name!r} (--model "
                                 f"{arms[name][0].name} and --model {kind.name}): rename one")
            arms[name] = (kind, arm)
    return arms


def arm_config(kind: ModelKind, arm: BenchArm, length: int):
    """The arm's config before sizing: its preset, its settings, the bench's length."""
    base, _ = kind.preset(kind.bench_preset(arm))
    names = {f.name for f in fields(base)}
    wrong = sorted(set(arm.model) - names)
    if wrong:
        raise ValueError(f"bench arm of --model {kind.name}: {', '.join(wrong)} "
                         f"{'is not a field' if len(wrong) == 1 else 'are not fields'} of "
                         f"{type(base).__name__}")
    base = replace(base, **arm.model)  # per_length keeps the arm's own ratio where it sets one
    was = getattr(base, kind.length)
    scaled = {f: max(1, round(getattr(base, f) * length / was)) if getattr(base, f) else 0
              for f in arm.per_length}
    return replace(base, **scaled, **{kind.length: length})


def sized_config(config, width: int | None, depth: int | None):
    """config at d_model = width (d_inner keeping its ratio, d_head = width / n_head) and
    n_layer = depth; None keeps a field."""
    changes, names = {}, {f.name for f in fields(config)}
    if width is not None:
        changes["d_model"] = width
        if "d_inner" in names:
            changes["d_inner"] = max(1, round(config.d_inner * width / config.d_model))
        if "d_head" in names:
            changes["d_head"] = width // config.n_head
    if depth is not None:
        changes["n_layer"] = depth
    return replace(config, **changes)


def at_length(kind: ModelKind, arm: BenchArm, row: PlanRow,
              length: int) -> tuple[object, int, float]:
    """(config, parameters, training FLOPs per byte) of a planned contestant at another
    length: the arm's config at `length`, at the width and depth the planner chose for `row`
    (what grows with the length, a position table, grows; a memory keeps its ratio to it),
    the FLOPs counted under the row's policy."""
    config = arm_config(kind, arm, length)
    if hasattr(config, "d_model") and hasattr(config, "n_layer"):
        config = sized_config(config, row.config.d_model, row.config.n_layer)
    weights, flops = count_arm(kind, config, row.objective, policy=row.flop_policy)
    return config, weights, flops


def count_arm(kind: ModelKind, config, objective_options: dict, *,
              policy: str = BENCH_FLOP_POLICY) -> tuple[int, float]:
    """(parameters of the model and its objective, training FLOPs per byte under `policy`),
    built on the meta device."""
    with torch.device("meta"):
        model = kind.build(config)
        objective = kind.build_objective(config, objective_options)
    weights = sum(p.numel() for p in model.parameters())
    if isinstance(objective, torch.nn.Module):
        weights += sum(p.numel() for p in objective.parameters())
    return weights, kind.training_flops_per_token(model, objective, policy)


def policy_settings(policy: str) -> dict:
    """What a bench stores of its FLOP policy in its settings: nothing for 'kernel' (the
    default until the bench counted causally: the stored kernel runs keep their settings and
    resume), else {"flop_policy": policy}, so that a stopped run never resumes under the
    other policy."""
    check_flop_policy(policy)
    return {} if policy == "kernel" else {"flop_policy": policy}


def _off(value: float, target: float) -> float:
    return value / target - 1


def plan_arm(name: str, kind: ModelKind, arm: BenchArm, *, budget: float, params: int,
             length: int, batch_size: int, objective: dict | None = None,
             flop_policy: str = BENCH_FLOP_POLICY) -> PlanRow:
    """One contestant's plan (see the module docstring), its FLOPs counted under
    `flop_policy`."""
    check_flop_policy(flop_policy)
    options = kind.objective_options(kind.bench_preset(arm), {**arm.objective,
                                                             **(objective or {})})
    start = arm_config(kind, arm, length)
    notes = []
    names = {f.name for f in fields(start)}
    if {"d_model", "n_head"} <= names:
        def best_width(depth):
            """(|log off|, config, params, flops) of the width nearest the target."""
            best, refused = None, None
            for m in range(1, (1 << 15) // start.n_head + 1):
                config = sized_config(start, m * start.n_head, depth)
                try:
                    weights, flops = count_arm(kind, config, options, policy=flop_policy)
                except ValueError as err:  # a width the kind refuses (too narrow, say)
                    refused = err
                    continue
                score = abs(math.log(weights / params))
                if best is None or score < best[0]:
                    best = (score, config, weights, flops)
                if weights > 2 * params:
                    break
            if best is None:
                raise ValueError(f"bench arm {name!r}: no width of --model {kind.name} builds "
                                 f"at length {length} (the last refusal: {refused})")
            return best

        chosen = best_width(None)
        if abs(_off(chosen[2], params)) > PARAMS_TOLERANCE and "n_layer" in names:
            for depth in range(1, 2 * start.n_layer + 1):  # the other depths too
                other = best_width(depth)
                if other[0] < chosen[0]:
                    chosen = other
            if chosen[1].n_layer != start.n_layer:
                notes.append(f"no width at the preset's {start.n_layer} layers came within "
                             f"10 %: {chosen[1].n_layer} layers")
        _, config, weights, flops = chosen
        if abs(_off(weights, params)) > PARAMS_TOLERANCE:
            notes.append(f"the width moves in steps of n_head = {start.n_head}: the nearest "
                         f"count is {weights:,}")
    else:
        config = start
        weights, flops = count_arm(kind, config, options, policy=flop_policy)
        notes.append("no d_model and n_head fields: its preset's size, not resized")
    per_step = flops * batch_size * length
    steps = matched_steps(budget, flops, batch_size=batch_size, length=length)
    if abs(_off(steps * per_step, budget)) > FLOPS_TOLERANCE:
        notes.append(f"one step is {per_step:.3g} FLOPs, {per_step / budget:.1%} of the "
                     f"budget: raise --budget")
    six_n = 6 * weights
    notes.append(f"{flops / six_n:.2f} x 6N per byte ({kind.flops_note(flop_policy)})")
    return PlanRow(name, kind.name, config, options, batch_size, length, weights,
                   _off(weights, params), flops, steps, steps * per_step,
                   _off(steps * per_step, budget), "; ".join(notes), flop_policy)


def plan_bench(*, budget: float, params: int, length: int, batch_size: int,
               arms: dict[str, tuple[ModelKind, BenchArm]] | None = None,
               flop_policy: str = BENCH_FLOP_POLICY) -> list[PlanRow]:
    """Every contestant's plan for one budget of training FLOPs and one parameter count, at
    windows (or segments) of `length` bytes, batch_size of them a step, every arm's FLOPs
    counted under one `flop_policy`."""
    check_flop_policy(flop_policy)
    for value, what in ((budget, "budget"), (params, "params"), (length, "length"),
                        (batch_size, "batch_size")):
        if not value > 0:
            raise ValueError(f"{what} must be positive, got {value}")
    arms = bench_arms() if arms is None else arms
    return [plan_arm(name, kind, arm, budget=budget, params=params, length=length,
                     batch_size=batch_size, flop_policy=flop_policy)
            for name, (kind, arm) in arms.items()]
