"""The bench's cost against length: for every contestant, sized as the bench sizes it
(`minixl.planner`: one parameter count) at `--shape-length`, and kept at that width and depth
at every length, the time and peak memory per byte of training, of reading a stream and of
generating it byte by byte, each used on a text as its mechanism is meant to be:

- a model that reads a window reads the whole length as one window;
- a model that carries a memory (Transformer-XL: its kind reads ordered streams) reads the
  text in segments of its length at `--shape-length`, its memory grown with the length (to
  the length, for XL's memory as long as its segment): a step at 16,384 bytes is a segment
  of 256 attending over a memory of 16,384 states, not one window of 16,384, which no user
  of Transformer-XL would run.

(Sized again at each length instead, a model with a position table per layer, Chapter 1's,
would spend its parameters on the table and be one layer of width 12 at 16,384 bytes: its
cost would be that of another model.) Each row names its segments (`train_segment`, the bytes
a training step reads: the length, for a window; `segment`, those of a reading call), its
memory and its kernel
(`ModelKind.kernel`: what runs the attention, and what a one-byte call reuses). A control
arm (`BenchArm.control`: XL with no memory) is left out unless `--models` names it.

Hand-written (not generated). For each arm and length:

- **training memory**: the training steps (forward, backward, AdamW: the trainer's own
  `train_step`) over one row of `length` random bytes in its segments, then one more
  segment, each step with the state the one before leaves (a window model: two steps of
  the window; XL: its memory filled to `length` states before the last step), in a fresh
  process whose address space is capped at `--memory-limit-gb` above what it holds before
  them; the peak resident memory they add (VmHWM, reset before them; Linux). A point that does not fit under the
  cap is written as such ("does not fit": the allocation that failed), it does not crash
  the run; any other error does;
- **training time** per byte: the last of those steps, timed in this process, divided by
  its segment;
- **reading** per byte: the model protocol (``model.step``) carried over `length` bytes as
  `read_left_to_right` reads them (a window kind in quarters of its window, a memory kind a
  segment at a time), then one more call timed, divided by the bytes it reads;
- **generating** per byte: after that, `--gen-bytes` calls of one byte each, timed.

It writes its rows to `--csv` (default book/bench/cost.csv) and a figure beside it (the
same name, .png), and prints how each arm's costs grow at the top of the range (`report`);
where the file is called cost.csv and the bench's quality.csv is beside it, the decision
table there is written again (when these rows cover every contestant of quality.csv), its
streaming-generation and training-memory rows from these. Times are the fastest of `--rounds` interleaved rounds (each round runs every arm at every
length once; the slowest round is kept too, so a reader sees the noise). Each point's row
says what the step ran on: the machine, the threads and torch. Everything is on the CPU: this
is the cost on the machine a reader has.
"""

from __future__ import annotations

import functools
from dataclasses import replace
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..device import peak_rss_mb
from ..experiments import int_list, torch_threads, write_csv
from ..planner import at_length, bench_arms, plan_bench
from ..training import ModelWithLoss, TrainConfig, make_optimizer, train_step
from .bench_all import contestants, read_rows, reading_segment, write_decisions

__all__ = ["COST_COLUMNS", "bench_cost", "cost_arms", "left_out", "memory_point", "report",
           "plot_cost"]

COST_COLUMNS = ("arm", "kind", "length", "shape", "params", "train_segment", "segment",
                "memory", "kernel", "fits", "train_peak_mb",
                "train_ms_per_byte", "train_ms_slowest", "read_ms_per_byte",
                "read_ms_slowest", "generate_ms_per_byte", "generate_ms_slowest", "note",
                "rounds", "threads", "cpus", "machine", "torch")


@functools.lru_cache(maxsize=None)
def _plan(arm: str, length: int, params: int, shape_length: int):
    """(kind, plan: config, objective options, parameters, segment): the arm sized by the
    planner to `params` at `shape_length`, then given `length` at that width and depth (what
    grows with the length, a position table, grows; a memory keeps its ratio to the length).
    A kind that reads ordered streams keeps its segment at `shape_length` (or `length`, where
    shorter) and reads the text in segments. Cached: the width search runs once per point,
    not once per round."""
    from types import SimpleNamespace

    arms = contestants(arm)
    (row,) = plan_bench(budget=1e12, params=params, length=shape_length, batch_size=1,
                        arms=arms)
    kind, spec = arms[row.arm]
    config, weights, _ = at_length(kind, spec, row, length)
    if kind.reads_streams(config):  # a memory carries the text: segments, not one window
        config = replace(config, **{kind.length: min(length, shape_length)})
    return kind, SimpleNamespace(config=config, objective=row.objective, params=weights,
                                 segment=getattr(config, kind.length),
                                 memory=getattr(config, "mem_len", 0)
                                 if kind.reads_streams(config) else 0)


def _setup(arm: str, length: int, params: int, shape_length: int, seed: int = 0):
    """The model, its trainer and one row of random bytes to train on, as the bench builds
    them: `length` bytes and one segment more (a window model: two windows)."""
    kind, plan = _plan(arm, length, params, shape_length)
    torch.manual_seed(seed)
    model = kind.build(plan.config)
    net = ModelWithLoss(model, kind.build_objective(plan.config, plan.objective))
    opt = make_optimizer([model, net.objective_weights], TrainConfig(steps=1, batch_size=1),
                         torch.device("cpu"), no_decay=kind.no_decay)
    data = torch.randint(0, 256, (1, length + plan.segment + 1),
                         generator=torch.Generator().manual_seed(seed))
    return kind, plan, model, net, opt, data


def _train_steps(net, opt, data, segment: int) -> float:
    """Training steps over `data` in segments of `segment` bytes in order, each with the
    state the one before leaves (the first also makes AdamW's state; a Transformer-XL's
    memory fills, so that the last step attends over a full memory and its segment, as in
    training on a long text). Returns the seconds of the last."""
    state, seconds = None, 0.0
    for start in range(0, data.size(1) - 1, segment):
        x, y = data[:, start:start + segment], data[:, start + 1:start + segment + 1]
        t0 = time.perf_counter()
        _, state, _ = train_step(net, opt, x, y, state)
        seconds = time.perf_counter() - t0
    return seconds


_OUT_OF_MEMORY = ("can't allocate memory", "Cannot allocate memory", "std::bad_alloc",
                  "out of memory")


def memory_point(arm: str, length: int, params: int, shape_length: int,
                 limit_gb: float) -> dict:
    """Two training steps of `arm` at `length` in this process (`_train_steps`), under an
    address-space cap of `limit_gb` GiB above its size before them: {'fits': True,
    'train_peak_mb': the most resident memory they added, MiB} or {'fits': False, 'note':
    the allocation that failed}. Any other error is raised. Linux (it reads /proc). Run it in
    a fresh process (the command does): the cap stays on."""
    _, plan, _, net, opt, data = _setup(arm, length, params, shape_length)
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    cap = size + int(limit_gb * 2 ** 30)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    before = peak_rss_mb(reset=True)
    try:
        _train_steps(net, opt, data, plan.segment)
    except (RuntimeError, MemoryError) as err:
        text = str(err).strip()
        if not isinstance(err, MemoryError) and not any(m in text for m in _OUT_OF_MEMORY):
            raise
        first = text.splitlines()[0] if text else type(err).__name__
        return {"fits": False,
                "note": f"does not fit in {limit_gb:g} GiB: {first[:160]}"}
    return {"fits": True, "train_peak_mb": round(peak_rss_mb() - before, 1)}


def _memory_in_fresh_process(arm: str, length: int, params: int, shape_length: int,
                             limit_gb: float, threads: int) -> dict:
    code = ("import json, sys, torch; torch.set_num_threads(int(sys.argv[6])); "
            "from minixl.one_bench.bench_cost import memory_point; "
            "print('COST ' + json.dumps(memory_point(sys.argv[1], int(sys.argv[2]), "
            "int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))))")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    r = subprocess.run([sys.executable, "-c", code, arm, str(length), str(params),
                        str(shape_length), str(limit_gb), str(threads)],
                       capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("COST "):
            return json.loads(line[5:])
    if r.returncode == -9:  # SIGKILL: the kernel's out-of-memory killer, most likely
        return {"fits": False, "note": "does not fit: the process was killed (SIGKILL, the "
                                       "kernel's out-of-memory killer?)"}
    raise RuntimeError(f"the memory point of {arm} at {length} failed (exit {r.returncode}): "
                       f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}")


@torch.no_grad()
def _read_and_generate(kind, plan, model, data, length: int, gen_bytes: int):
    """(segment, seconds per byte of one call reading a segment, seconds per generated byte)
    after reading `length` bytes as the common protocol does."""
    segment = reading_segment(kind, plan.config, plan.segment)
    model.eval()
    stream = torch.randint(0, 256, (1, length + segment + gen_bytes),
                           generator=torch.Generator().manual_seed(1))
    state = None
    for start in range(0, length, segment):
        _, state = model.step(stream[:, start:start + segment], state)
    t0 = time.perf_counter()
    _, state = model.step(stream[:, length:length + segment], state)
    read = (time.perf_counter() - t0) / segment
    t0 = time.perf_counter()
    for i in range(gen_bytes):  # one byte a call, as a sampler runs it
        at = length + segment + i
        _, state = model.step(stream[:, at:at + 1], state)
    generate = (time.perf_counter() - t0) / max(1, gen_bytes)
    model.train()
    return segment, read, generate


def cost_arms(models: str | None = None) -> list[str]:
    """The arms the sweep measures: those `models` names (controls included), else every
    registered arm that is not a control (`BenchArm.control`)."""
    return [name for name, (_, spec) in contestants(models).items()
            if models or not spec.control]


def bench_cost(params: int = 200_000, lengths: str = "256,1024,4096,16384",
               shape_length: int = 256, models: str | None = None, rounds: int = 2,
               gen_bytes: int = 4,
               memory_limit_gb: float = 8.0, csv: str = "book/bench/cost.csv",
               threads: int = 1) -> list[dict]:
    """Rows of COST_COLUMNS, one per arm and length (see the module docstring): the memory
    points first, each in a fresh process, then `rounds` interleaved rounds of the times of
    the points that fit."""
    length_list = int_list(lengths, "lengths", 8)
    if params < 1 or rounds < 1 or gen_bytes < 1 or memory_limit_gb <= 0 or shape_length < 8:
        raise ValueError(f"need --params >= 1, --rounds >= 1, --gen-bytes >= 1, "
                         f"--memory-limit-gb > 0 and --shape-length >= 8; got {params}, "
                         f"{rounds}, {gen_bytes}, {memory_limit_gb} and {shape_length}")
    arms = cost_arms(models)
    ragged = [f"{arm} at {length}" for length in length_list for arm in arms
              for kind, plan in [_plan(arm, length, params, shape_length)]
              if kind.reads_streams(plan.config) and length % plan.segment]
    if ragged:  # its last step would be a part segment, timed as a whole one
        raise ValueError(f"--lengths: a model that reads ordered streams reads the text in "
                         f"whole segments of --shape-length {shape_length} bytes, and "
                         f"{', '.join(ragged)} would end in part of one: give lengths that are "
                         f"multiples of {shape_length} (or shorter than it)")
    rows = {}
    for length in length_list:
        for arm in arms:
            kind, plan = _plan(arm, length, params, shape_length)
            point = _memory_in_fresh_process(arm, length, params, shape_length,
                                             memory_limit_gb, threads)
            c = plan.config
            rows[arm, length] = {
                "arm": arm, "kind": kind.name, "length": length,
                "shape": f"{getattr(c, 'n_layer', '?')} x {getattr(c, 'd_model', '?')}",
                "params": plan.params, "segment": None,
                "train_segment": plan.segment if kind.reads_streams(c) else length,
                "memory": plan.memory, "kernel": kind.kernel_note(c), "fits": point["fits"],
                "train_peak_mb": point.get("train_peak_mb"), "note": point.get("note", ""),
                "rounds": rounds, "threads": threads, "cpus": os.cpu_count(),
                "machine": platform.processor() or platform.machine(),
                "torch": torch.__version__}
            print(f"bench_cost memory: {arm} at {length}: "
                  + (f"{point['train_peak_mb']:.0f} MB" if point["fits"] else point["note"]),
                  flush=True)
    times: dict = {}
    with torch_threads(threads):
        for r in range(rounds):
            for length in length_list:
                for arm in arms:
                    if not rows[arm, length]["fits"]:
                        continue
                    kind, plan, model, net, opt, data = _setup(arm, length, params,
                                                               shape_length)
                    train = _train_steps(net, opt, data, plan.segment) / plan.segment
                    segment, read, generate = _read_and_generate(kind, plan, model, data,
                                                                 length, gen_bytes)
                    rows[arm, length]["segment"] = segment
                    times.setdefault((arm, length), []).append((train, read, generate))
                    print(f"bench_cost round {r + 1}/{rounds}: {arm} at {length}: train "
                          f"{train * 1e3:.3f}, read {read * 1e3:.3f}, generate "
                          f"{generate * 1e3:.3f} ms per byte", flush=True)
    for key, ts in times.items():
        for i, name in enumerate(("train", "read", "generate")):
            rows[key][f"{name}_ms_per_byte"] = round(min(t[i] for t in ts) * 1e3, 4)
            rows[key][f"{name}_ms_slowest"] = round(max(t[i] for t in ts) * 1e3, 4)
    out = [{c: row.get(c) for c in COST_COLUMNS} for row in rows.values()]
    path = Path(csv)
    write_csv(out, path)
    plot_cost(out, path.with_suffix(".png"))
    if path.name == "cost.csv" and (path.parent / "quality.csv").exists():
        quality = read_rows(path.parent / "quality.csv")
        missing = left_out(quality, arms)
        if missing:  # a table over some contestants only would name a false winner
            print(f"bench_cost: the decision table in {path.parent} is not written again: "
                  f"these rows leave out {', '.join(missing)}", flush=True)
        else:  # the bench's own folder: its table again, with these rows
            write_decisions(path.parent, quality, read_rows(path.parent / "reach.csv"))
    return out


def _top_two(rows: list[dict], arm: str, key: str):
    """The two longest lengths at which `arm` has a value of `key`: ((n1, v1), (n2, v2))."""
    have = sorted((int(r["length"]), float(r[key])) for r in rows
                  if r["arm"] == arm and r.get(key) not in (None, ""))
    return have[-2:] if len(have) >= 2 else None


def report(rows: list[dict]) -> str:
    """Per arm, how its training time per byte and the memory its step adds grow with the
    length, as an exponent fitted over the two longest lengths it fits at (the top of the
    range, where fixed costs no longer hide it): time per byte ~ n^a (a = 1: quadratic
    attention; a = 0: linear), memory ~ n^b; and the lengths it does not fit at."""
    import math

    lines = ["growth over the two longest lengths each fits at (per byte time ~ n^a, the "
             "step's memory ~ n^b):"]
    for arm in dict.fromkeys(r["arm"] for r in rows):
        parts = []
        for key, name in (("train_ms_per_byte", "a"), ("train_peak_mb", "b")):
            top = _top_two(rows, arm, key)
            if top and min(top[0][1], top[1][1]) > 0:
                (n1, v1), (n2, v2) = top
                parts.append(f"{name} = {math.log(v2 / v1) / math.log(n2 / n1):.2f} "
                             f"({n1}-{n2})")
        out = [r["length"] for r in rows if r["arm"] == arm and str(r["fits"]) != "True"]
        lines.append(f"  {arm}: " + (", ".join(parts) or "fewer than two lengths fit")
                     + (f"; does not fit at {', '.join(map(str, out))}" if out else ""))
    return "\n".join(lines)


def plot_cost(rows: list[dict], path) -> Path:
    """cost.png: training time and memory per byte, and generation time per byte, against
    the length, a line per arm (points that do not fit are left out)."""
    from matplotlib.figure import Figure  # not pyplot: a notebook's backend is left alone

    panels = (("train_ms_per_byte", "training, ms per byte"),
              ("train_peak_mb", "training step's memory, MB"),
              ("generate_ms_per_byte", "generation, ms per byte"))
    fig = Figure(figsize=(11, 3.4), dpi=72)
    axes = fig.subplots(1, 3)
    for ax, (key, title) in zip(axes, panels):
        for arm in dict.fromkeys(r["arm"] for r in rows):
            pts = sorted((int(r["length"]), float(r[key])) for r in rows
                         if r["arm"] == arm and r.get(key) not in (None, ""))
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=arm)
        ax.set(xscale="log", yscale="log", xlabel="length (bytes)", title=title)
        ax.minorticks_off()
    lengths = sorted({int(r["length"]) for r in rows})
    for ax in axes:
        ax.set_xticks(lengths, [str(n) for n in lengths])
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, metadata={"Software": None})
    return path


def left_out(quality: list[dict], arms) -> list[str]:
    """The contestants of the bench's quality rows that a sweep of `arms` leaves out, a
    control arm (`BenchArm.control`, which the sweep leaves out unless named) excepted: the
    sweep writes the decision table again only where this is empty, for a table over some
    contestants only would name a false winner."""
    controls = {a for a, (_, arm) in bench_arms().items() if arm.control}
    return sorted({r["arm"] for r in quality} - set(arms) - controls)
