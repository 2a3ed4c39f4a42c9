"""A run's metrics: the loss meter the loop adds each step to, the rows of metrics.csv, and
loss.png.

Hand-written shared machinery (not generated); a reader of the loop can skip it.

- `LossMeter` sums the logged losses on the device between rows (no host sync per step) and
  makes each row, stopping the run when a loss or gradient norm is not finite;
- `format_row` is how a row is written; `metrics_up_to` reads a metrics.csv back to a
  checkpoint's step, dropping lines that are not rows of it (a killed run's last line);
- `draw_loss` draws loss.png from it.

The run folder (`run_folder.py`) does the writing, the cutting back and the error handling.
"""

from __future__ import annotations

import contextlib
import csv
import math
import re
import time
from pathlib import Path

import torch

__all__ = ["LossMeter", "TrainingDiverged", "format_row", "metrics_up_to", "draw_loss"]


class TrainingDiverged(Exception):
    """The loss or the gradient norm stopped being finite."""

    exit_code = 3  # `minixl train`'s exit code

    def __init__(self, step: int, lr: float, last_good: str):
        self.step = step
        super().__init__(f"training diverged: the loss or gradient norm was not finite at step "
                         f"{step}; nothing was saved after it, and the last good checkpoint is "
                         f"{last_good}. Try a smaller --lr (this run: {lr:g})")


class LossMeter:
    """Sums of the logged losses since the last row, kept on the device (no sync per step).

    Distributed, a row's losses are the means over the processes and a non-finite loss or
    gradient norm of any process stops all of them at the same step: both are settled when a
    row is made or a checkpoint saved, never per step. `tokens` counts the whole batch.
    A row's tokens_per_s is of training time alone (see `paused`); its mfu, that rate times
    flops_per_token over the device's peak, is None where either is unknown (on a CPU)."""

    def __init__(self, lr: float, ranks, *, flops_per_token: float | None = None,
                 peak_tflops: float | None = None):
        self.sums, self.n, self.tokens, self.t, self.lr = {}, 0, 0, time.perf_counter(), lr
        self.ranks, self.flops, self.peak = ranks, flops_per_token, peak_tflops
        self.bad_step = None  # first step (1-based) whose loss or gradient norm was not finite

    @contextlib.contextmanager
    def paused(self, device: torch.device):
        """Leave the block's time (held-out evaluation, a checkpoint) out of tokens/s and MFU.
        On CUDA the steps queued before it are waited for first, so they count as training."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.t += time.perf_counter() - start

    def add(self, step: int, parts: dict, norm: torch.Tensor, tokens: int) -> None:
        for key, value in {**parts, "grad_norm": norm}.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.detach().float()
        bad = ~torch.isfinite(parts["loss"].detach().float() + norm.float())
        first = torch.where(bad, step + 1, 0)
        self.bad_step = first if self.bad_step is None else torch.where(
            self.bad_step > 0, self.bad_step, first)
        self.n, self.tokens = self.n + 1, self.tokens + tokens

    def check_finite(self, run) -> None:
        """Raise TrainingDiverged if any step so far had a non-finite loss or gradient norm."""
        if self.bad_step is None:
            return
        bad = self.ranks.first_bad(self.bad_step)
        if bad > 0:
            last = (f"{run.ckpt} (step {run.saved})" if run and run.saved else
                    "none (no checkpoint was written)" if run else "none (no output folder)")
            raise TrainingDiverged(bad, self.lr, last)

    def row(self, done: int, valid: float | None, *, lr: float, t0: float, run) -> dict:
        """The metrics row of step `done` (losses in bits per byte); resets the sums."""
        self.check_finite(run)
        now, ln2 = time.perf_counter(), math.log(2)
        keys = list(self.sums)
        sums = self.ranks.mean(torch.stack([self.sums[k] for k in keys])).tolist()
        mean = {k: v / self.n for k, v in zip(keys, sums)}
        row = {"step": done, "train_bpc": mean.get("next_byte", mean["loss"]) / ln2,
               "valid_bpc": valid, "loss": mean["loss"] / ln2}
        row |= {k: v / ln2 for k, v in mean.items()
                if k not in ("loss", "next_byte", "final", "grad_norm")}
        tokens_per_s = self.tokens / (now - self.t)
        mfu = (tokens_per_s * self.flops / (self.peak * 1e12)
               if self.flops and self.peak else None)
        row |= {"grad_norm": mean["grad_norm"], "lr": lr, "tokens_per_s": tokens_per_s,
                "mfu": mfu, "elapsed_s": now - t0}
        self.sums, self.n, self.tokens, self.t = {}, 0, 0, now
        return row


def format_row(row: dict) -> dict:
    """A metrics row as metrics.csv writes it: losses to 4 decimals, rates to 4 digits,
    elapsed seconds to one decimal, steps as integers, a missing value empty."""
    return {k: "" if v is None else v if isinstance(v, int) else f"{v:.4g}" if k in (
        "grad_norm", "lr", "tokens_per_s", "mfu") else f"{v:.1f}" if k == "elapsed_s" else f"{v:.4f}"
        for k, v in row.items()}


def metrics_up_to(data: bytes, step: int) -> tuple[bytes, list[int], bool]:
    """metrics.csv's bytes cut to the rows of steps <= `step`: (the bytes to keep, the
    numbers of the damaged lines dropped, whether the header itself was damaged). A last
    line without its newline (a row a killed run was writing) is dropped, not damaged."""
    lines = data.splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines.pop()
    if not lines:
        return b"", [], False
    names = lines[0].decode("utf-8", "replace").rstrip("\r\n").split(",")
    if (names[:2] != ["step", "train_bpc"] or "valid_bpc" not in names
            or not all(re.fullmatch(r"[a-z_]+", n) for n in names) or len(set(names)) < len(names)):
        return b"", [1], True  # nothing below can be read without it
    keep, bad = [lines[0]], []
    for i, line in enumerate(lines[1:], start=2):
        fields = line.decode("utf-8", "replace").rstrip("\r\n").split(",")
        if (len(fields) != len(names) or not (fields[0].isascii() and fields[0].isdigit())
                or not all(map(_number, fields[1:]))):
            bad.append(i)
        elif int(fields[0]) <= step:
            keep.append(line)
    return b"".join(keep), bad, False


def _number(field: str) -> bool:
    """A metrics.csv field: empty (not measured at that step) or a number."""
    if field == "":
        return True
    try:
        float(field)
    except ValueError:
        return False
    return True


def draw_loss(metrics: Path, png: Path, *, title: str) -> None:
    """Draw training and held-out bits per byte against the step, read from a metrics.csv,
    into png (on a figure of its own, so that a notebook's plotting is left as it was)."""
    from matplotlib.figure import Figure

    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.subplots()
    ax.plot([int(r["step"]) for r in rows], [float(r["train_bpc"]) for r in rows],
            label="train")
    held = [r for r in rows if r["valid_bpc"]]
    ax.plot([int(r["step"]) for r in held], [float(r["valid_bpc"]) for r in held],
            "o-", label="held-out")
    ax.set(xlabel="step", ylabel="bits per byte", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, format="png")
