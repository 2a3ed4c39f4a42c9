"""A small mutation run over the core of minixl (`make mutate`; not part of `make test`).

Each mutant is one hand-written, one-line bug in the attention variants, the masks, the tree,
the objectives, the training loop's resume or the book's number check. It is applied to a
fresh copy of the repository, never to this one, and the tests that cover it run there (the
slow tier included, as `make test` runs them), stopping at the first failure. A mutant is
killed when a test fails, and survives when they all pass. The score and each survivor are
written to tests/MUTATION.md; a survivor is either killed by a new test or named there as
equivalent (a change no user could see).

    python -m tools.mutate               # every mutant
    python -m tools.mutate causal-self   # some, by name (the file is not rewritten)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "tests" / "MUTATION.md"
COPIED = ("minixl", "tests", "tools", "book", "nbs", "docs", "README.md", "pyproject.toml",
          "Makefile")
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository
    old: str  # must occur exactly once in the file
    new: str
    breaks: str  # what the bug does, in a few words
    tests: tuple[str, ...]  # the pytest arguments that cover it
    equivalent: str = ""  # why no user could see it, for a survivor that cannot be killed


CHAR = ("tests/test_attention.py", "tests/test_model.py", "tests/test_layers.py")
TRAINING = ("tests/test_training.py", "tests/test_checkpoint.py")

MUTANTS = (
    Mutant("causal-self", "minixl/char_transformer/__init__.py",
           "return j <= (klen - qlen) + i", "return j < (klen - qlen) + i",
           "a query no longer reads its own position", CHAR),
    Mutant("causal-leak", "minixl/char_transformer/__init__.py",
           "return j <= (klen - qlen) + i", "return j <= (klen - qlen) + i + 1",
           "a query reads the next byte", CHAR),
    Mutant("attention-scale", "minixl/char_transformer/__init__.py",
           "scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))",
           "scores = q @ k.transpose(-2, -1) / q.size(-1)",
           "scores divided by D, not sqrt(D)", CHAR),
    Mutant("sinusoid-halves", "minixl/char_transformer/__init__.py",
           "return torch.cat([angles.sin(), angles.cos()], dim=-1)",
           "return torch.cat([angles.cos(), angles.sin()], dim=-1)",
           "the position table's halves swapped", CHAR),
    Mutant("warmup-off-by-one", "minixl/char_transformer/__init__.py",
           "return lr * (step + 1) / warmup", "return lr * step / warmup",
           "the first warm-up step at rate 0", CHAR + TRAINING),
    Mutant("cosine-sign", "minixl/char_transformer/__init__.py",
           "(1 + math.cos(math.pi * progress))", "(1 - math.cos(math.pi * progress))",
           "the cosine schedule rises instead of falling", CHAR + TRAINING),
    Mutant("bpc-in-nats", "minixl/char_transformer/__init__.py",
           "return total / (len(data) - 1) / math.log(2)", "return total / (len(data) - 1)",
           "Chapter 1's evaluate_bpc reports nats", CHAR + ("tests/test_aux_losses.py",)),
    Mutant("aux-schedule-stop", "minixl/aux_losses/__init__.py",
           "stop = layer / (2 * n_layer)", "stop = layer / n_layer",
           "an intermediate loss lives twice as long", ("tests/test_aux_losses.py",)),
    Mutant("sliding-last-step", "minixl/aux_losses/__init__.py",
           "step = min(stride, n - 1 - end)", "step = stride",
           "the last sliding window scores past the end", ("tests/test_aux_losses.py",)),
    Mutant("sliding-keep", "minixl/aux_losses/__init__.py",
           "keep = torch.arange(L) >= L - torch.tensor(",
           "keep = torch.arange(L) > L - torch.tensor(",
           "each window scores one position too few", ("tests/test_aux_losses.py",)),
    Mutant("shaw-direction", "minixl/relative_attention/__init__.py",
           "return (j - i).clamp(-max_relative, max_relative) + max_relative",
           "return (i - j).clamp(-max_relative, max_relative) + max_relative",
           "Shaw's distances read backwards", ("tests/test_relative_attention.py",)),
    Mutant("shaw-clip-short", "minixl/relative_attention/__init__.py",
           "return (j - i).clamp(-max_relative, max_relative) + max_relative",
           "return (j - i).clamp(-max_relative, max_relative - 1) + max_relative",
           "the farthest distance on the right shares its neighbour's vector",
           ("tests/test_relative_attention.py",)),
    Mutant("streams-never-reset", "minixl/data.py",
           "return Batch(self.x[:, cols].long(), self.y[:, cols].long(), segment == 0)",
           "return Batch(self.x[:, cols].long(), self.y[:, cols].long(), False)",
           "ordered streams never empty the memory at a new pass",
           ("tests/test_data.py",) + TRAINING),
    Mutant("rel-shift-pad", "minixl/transformer_xl/__init__.py",
           "padded = F.pad(x, (1, 0))", "padded = F.pad(x, (0, 1))",
           "the relative shift pads the wrong side", ("tests/test_transformer_xl.py",)),
    Mutant("xl-memory-length", "minixl/transformer_xl/__init__.py",
           "drop = max(0, m.size(1) + h.size(1) - mem_len)",
           "drop = max(0, m.size(1) + h.size(1) - mem_len - 1)",
           "the memory keeps one row too many", ("tests/test_transformer_xl.py",)),
    Mutant("content-sees-itself", "minixl/xlnet/__init__.py",
           "return rank[..., None, :] <= rank[..., :, None], rank[..., None, :] < rank[...",
           "return rank[..., None, :] < rank[..., :, None], rank[..., None, :] < rank[...",
           "the content stream no longer reads its own token", ("tests/test_xlnet.py",)),
    Mutant("query-sees-itself", "minixl/xlnet/__init__.py",
           "rank[..., None, :] < rank[..., :, None]\n",
           "rank[..., None, :] <= rank[..., :, None]\n",
           "the query stream reads the token it predicts", ("tests/test_xlnet.py",)),
    Mutant("empty-row-uniform", "minixl/xlnet/__init__.py",
           "return torch.softmax(scores, dim=-1) * mask.any(-1, keepdim=True)",
           "return torch.softmax(scores, dim=-1)",
           "a query with nothing to see reads every key uniformly", ("tests/test_xlnet.py",)),
    Mutant("segment-vectors-swapped", "minixl/xlnet/__init__.py",
           "torch.where(seg_same[:, None], ef[..., :1], ef[..., 1:])",
           "torch.where(seg_same[:, None], ef[..., 1:], ef[..., :1])",
           "s+ across segments and s- within", ("tests/test_xlnet.py",)),
    Mutant("tree-first-neighbour", "minixl/segtree/__init__.py",
           "        if lo > 0:  # step 0: the neighbouring leaves",
           "        if lo > 1:  # step 0: the neighbouring leaves",
           "leaf 1 loses its left neighbour", ("tests/test_segtree.py",)),
    Mutant("tree-right-edge", "minixl/segtree/__init__.py",
           "hi = min(hi + (1 << level), n)", "hi = hi + (1 << level)",
           "the right cover runs past the last leaf", ("tests/test_segtree.py",),
           equivalent="hi is read after this line only as `hi < n`, which is false both "
           "for hi = n and for any hi past it: the same nodes, the same loop"),
    Mutant("tree-backward-dropout", "minixl/segtree/__init__.py",
           "dwl, wdl = dwl * dl, wl * dl", "dwl, wdl = dwl, wl * dl",
           "the internal nodes' backward ignores the dropout mask", ("tests/test_segtree.py",)),
    Mutant("progress-ahead", "minixl/training/loop.py",
           "progress=step / cfg.steps,", "progress=(step + 1) / cfg.steps,",
           "the objective is told one step ahead", TRAINING + ("tests/test_aux_losses.py",)),
    Mutant("memory-kept-on-new-streams", "minixl/training/run_folder.py",
           'if state is not None and changed.keys() & {"batch_size", "corpus"}:',
           'if False and state is not None and changed.keys() & {"batch_size", "corpus"}:',
           "a resume on other streams reads the old memory", TRAINING),
    Mutant("resume-step", "minixl/training/run_folder.py",
           'return ckpt["step"], state', 'return ckpt["step"] - 1, state',
           "a resumed run repeats its last step", TRAINING),
    Mutant("no-clip", "minixl/training/loop.py",
           "grad_clip=cfg.grad_clip,", "grad_clip=0.0,",
           "gradients are never clipped", TRAINING),
    Mutant("number-one-decimal-fewer", "tools/book/numbers.py",
           "return any(p + scale >= max(places, 0)", "return any(p + scale + 1 >= max(places, 0)",
           "a quote is supported by a number printed with one decimal fewer",
           ("tests/test_book.py", "-k", "number or quoted or readme or pages")),
    Mutant("number-rounding", "tools/book/numbers.py",
           "return abs(y - v) <= 0.5 * 10 ** -places + 1e-12",
           "return abs(y - v) <= 10 ** -places",
           "a quote one unit off in its last digit passes",
           ("tests/test_book.py", "-k", "number or quoted or readme or pages")),
)


def _copy(into: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.egg-info")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, into / name, ignore=ignore)
        else:
            shutil.copy2(src, into / name)


def run_mutant(m: Mutant) -> tuple[bool, str, float]:
    """(killed, the first failing test or '', seconds) for one mutant, in a fresh copy."""
    with tempfile.TemporaryDirectory(prefix="minixl-mutant-") as tmp:
        copy = Path(tmp)
        _copy(copy)
        target = copy / m.path
        text = target.read_text()
        if text.count(m.old) != 1:
            raise ValueError(f"mutant {m.name}: {m.old!r} occurs {text.count(m.old)} times in "
                             f"{m.path}, not once: update the mutant to today's code")
        target.write_text(text.replace(m.old, m.new))
        env = dict(os.environ, PYTHONPATH=str(copy), OMP_NUM_THREADS="1")
        began = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                                "no:cacheprovider", *m.tests], cwd=copy, env=env,
                               capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # (a mutant that makes a test loop for ever is caught, as mutation tools count it)
            return True, f"(timed out after {TIMEOUT_S} s)", time.perf_counter() - began
        seconds = time.perf_counter() - began
        failed = [line.split(" ")[1] for line in r.stdout.splitlines()
                  if line.startswith(("FAILED ", "ERROR "))]
        if r.returncode not in (0, 1):  # not a verdict: bad arguments, nothing selected, ...
            raise RuntimeError(f"mutant {m.name}: pytest {' '.join(m.tests)} ended with exit "
                               f"code {r.returncode}, neither a pass nor a failure:\n"
                               f"{r.stdout[-1500:]}{r.stderr[-1500:]}")
        return r.returncode == 1, failed[0] if failed else "", seconds


def report(results: list[tuple[Mutant, bool, str, float]]) -> str:
    """tests/MUTATION.md: the score over the mutants that can be killed (an equivalent one,
    named with its reason, is not counted), each mutant's fate and the survivors."""
    killed = sum(k for _, k, _, _ in results)
    counted = [r for r in results if not r[0].equivalent or r[1]]
    lines = ["# Mutation score of minixl's core", "",
             "Written by `make mutate` (`python -m tools.mutate`): each mutant is a one-line bug",
             "applied to a fresh copy of the repository, and the tests that cover it run there",
             "(slow tier included), stopping at the first failure. Not run by `make test`.", "",
             f"**{killed} of {len(counted)} mutants killed "
             f"({100 * killed / len(counted):.0f} %)**, "
             f"{len(results) - len(counted)} more named equivalent.", "",
             "| mutant | file | the bug | killed by | seconds |", "| --- | --- | --- | --- | --- |"]
    for m, k, test, seconds in results:
        fate = (f"`{test}`" if k else f"equivalent: {m.equivalent}" if m.equivalent
                else "**survived**")
        lines.append(f"| {m.name} | `{m.path}` | {m.breaks} | {fate} | {seconds:.0f} |")
    survivors = [m for m, k, _, _ in results if not k and not m.equivalent]
    lines += ["", "Survivors not named equivalent: " + (
        ", ".join(m.name for m in survivors) if survivors else "none.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or m.name in argv]
    unknown = sorted(set(argv) - {m.name for m in MUTANTS})
    if unknown:
        print(f"unknown mutant(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    results = []
    for m in chosen:
        killed, test, seconds = run_mutant(m)
        results.append((m, killed, test, seconds))
        print(f"{m.name}: {'killed by ' + test if killed else 'SURVIVED'} ({seconds:.0f} s)",
              flush=True)
    if not argv:
        REPORT.write_text(report(results))
        print(f"written to {REPORT.relative_to(ROOT)}")
    return 0 if all(k or m.equivalent for m, k, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
