"""Text at length (minixl.one_bench.context): the same held-out bytes scored with each context,
each block read from a fresh state, the batched reader equal to the common protocol's, the
gains paired by seed, and the tiny bench through its command line."""

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from minixl.one_bench.bench_all import read_left_to_right
from minixl.one_bench.context import (CONTEXT_COLUMNS, bits_by_context, context_gains,
                                      read_blocks)

ROOT = Path(__file__).resolve().parent.parent


class Counter(nn.Module):
    """A model whose confidence grows with the bytes it has read, up to a window: it predicts
    byte + 1 (the stream counts up), with logit `rate * min(seen, window) * (1 + v % 7)`,
    where seen is the context of the predicted byte and v its value (so which bytes are
    scored matters too). Its loss at each context is known in closed form."""

    def __init__(self, rate: float, window: int):
        super().__init__()
        self.rate, self.window = rate, window
        self.dummy = nn.Parameter(torch.zeros(1))

    def step(self, tokens, state=None):
        seen = 0 if state is None else state
        B, T = tokens.shape
        context = seen + 1 + torch.arange(T)  # bytes read when byte j + 1 is predicted
        logits = torch.zeros(B, T, 256)
        guess = (tokens + 1) % 256
        strength = self.rate * context.clamp(max=self.window).float() * (1 + guess % 7)
        logits.scatter_(2, guess[..., None], strength[..., None].float())
        return logits, seen + T


def _nll(rate, window, c, value):  # nats for the byte `value` predicted from c bytes
    s = rate * min(c, window) * (1 + value % 7)
    return -(s - math.log(math.exp(s) + 255))


@pytest.mark.parametrize("segment,window", [(1, 1000), (3, 20), (16, 12)])
def test_each_context_scores_the_same_bytes_from_a_fresh_state(segment, window):
    data = (torch.arange(3000) % 256).to(torch.uint8)
    model = Counter(0.05, window)
    contexts, block, targets = [1, 4, 16, 64], 8, 200
    rows = bits_by_context(model, data, segment=segment, contexts=contexts, block=block,
                           targets=targets)
    assert [r["context"] for r in rows] == contexts
    blocks = targets // block
    for r, c in zip(rows, contexts):
        # byte j of block i: data position 64 + 8 i + j (the same at every c), read with c + j
        # bytes before it; a state carried over from an earlier block, a context other than
        # c, or other bytes scored give other numbers
        want = sum(_nll(0.05, window, c + j, (64 + block * i + j) % 256)
                   for i in range(blocks) for j in range(block)) / (blocks * block) / math.log(2)
        assert r["bpc"] == pytest.approx(want, rel=1e-6)
        assert (r["low"], r["high"], r["bytes"]) == (c, c + block - 1, 200 // 8 * 8)
    with pytest.raises(ValueError, match="too few"):
        bits_by_context(model, data[:100], segment=4, contexts=[64], block=8, targets=64)
    with pytest.raises(ValueError, match="contexts of at least 1 byte"):
        bits_by_context(model, data, segment=4, contexts=[0, 8], block=8, targets=64)


@pytest.mark.parametrize("kind_name", ["char", "shaw", "xl", "xlnet", "segtree"])
def test_the_batched_reader_is_the_common_protocol_block_by_block(kind_name):
    from minixl.kinds import KINDS
    from minixl.one_bench.bench_all import reading_segment

    kind = KINDS[kind_name]
    config = kind.config(**{kind.length: 32})
    torch.manual_seed(0)
    model = kind.build(config)
    segment = reading_segment(kind, config, 32)
    chunks = torch.randint(0, 256, (3, 85), dtype=torch.uint8)
    got = read_blocks(model, chunks, segment=segment, first=77)
    assert got.shape == (3, 8)
    for row, nll in zip(chunks, got):
        _, logp = read_left_to_right(model, row, segment=segment, answers=torch.arange(77, 85))
        want = -logp.gather(1, row[77:].long()[:, None])[:, 0]
        assert torch.allclose(nll, want, atol=1e-4), kind_name


def test_the_gains_are_paired_differences_of_the_same_model_and_bytes():
    mark = {16: "yes", 32: "partly: read in segments", 64: "a prediction reads at most 40",
            128: "a prediction reads at most 40", 256: "yes"}

    def row(seed, c, bpc, arm="xl"):
        return {"arm": arm, "length": 128, "seed": seed, "context": c, "bpc": bpc,
                "reachable": mark[c]}
    rows = [row(0, 16, 3.0), row(0, 32, 2.8), row(0, 64, 2.75), row(0, 128, 2.75),
            row(1, 16, 3.2), row(1, 32, 3.1), row(1, 64, 3.15), row(1, 128, 3.15),
            row(1, 256, 3.0)]  # read in one seed only: left out
    gains = context_gains(rows)
    assert [(g["from"], g["to"]) for g in gains] == [(16, 32), (32, 64), (64, 128)]
    assert gains[0]["seeds"] == pytest.approx([0.2, 0.1])
    assert gains[0]["gain"] == pytest.approx(0.15)
    assert gains[1]["seeds"] == pytest.approx([0.05, -0.05])  # the sign in every seed
    # marked by the longer context while the shorter is read, by the shorter once it is out
    assert [g["reachable"] for g in gains] == [mark[32], mark[64], mark[64]]


def test_the_tiny_context_bench_marks_reach_before_training_and_resumes(tmp_path):
    from minixl.kinds import KINDS
    from minixl.one_bench.bench_all import contestants
    from minixl.one_bench.recall import plan_lengths

    out = tmp_path / "context" / "context.csv"
    with open(tmp_path / "quality.csv", "w", newline="") as f:  # a bench_all run's folder
        f.write("arm,length,budget,seed,common_bpc,own_protocol,own_bpc\n"
                "char,32,1000000000.0,0,5.0,window,5.0\n")
    tiny = ["bench_context", "--budget", "1e9", "--params", "20000", "--seeds", "0",
            "--models", "char,xl", "--lengths", "32,64", "--shape-length", "32",
            "--contexts", "8,32,128", "--block", "8", "--targets", "64", "--batch-bytes", "128",
            "--csv", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "minixl.experiments", *tiny, *extra],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)

    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CONTEXT_COLUMNS
    assert [(x["arm"], x["length"], x["context"]) for x in rows] == [
        (a, n, c) for n in ("32", "64") for a in ("char", "xl") for c in ("8", "32", "128")]
    assert all(int(x["bytes"]) == 64 for x in rows)
    plans = {**plan_lengths(contestants("char,xl"), [32], budget=1e9, params=20000,
                            batch_size=4, shape_length=32),
             **plan_lengths(contestants("char,xl"), [64], budget=1e9, params=20000,
                            batch_size=2, shape_length=32)}  # 128 bytes a step
    for x in rows:  # marked from the config, before training
        plan = plans[x["arm"], int(x["length"])]
        most = KINDS[x["kind"]].reach(plan.config)[0]
        assert int(x["reach"]) == most and int(x["steps"]) == plan.steps
        if int(x["low"]) > most:
            assert x["reachable"].startswith(f"a prediction reads at most {most} bytes back")
    mark = {(x["arm"], x["length"], x["context"]): x["reachable"] for x in rows}
    assert mark["char", "32", "128"].startswith("a prediction reads at most 32 bytes back")
    assert mark["xl", "32", "128"] != mark["char", "32", "128"]  # a memory reaches past it
    gains = [line for line in r.stdout.splitlines()
             if line.startswith("bench_context: ") and " bpc gained " in line]
    assert (out.parent / "context.png").stat().st_size > 1000  # the figure, beside the CSV
    assert len(gains) == 4 * 2 and gains[0].startswith(
        "bench_context: char, trained at 32, context 8 -> 32: ")
    table = (tmp_path / "decisions.md").read_text()  # the run's row in the bench's table
    assert ("| long context on a small budget | budget 1e+09 FLOPs, trained at 64, read with "
            "128 bytes of context, 1 seed, 20,000 parameters, batch 2, steps (corpus passes) "
            f"char {plans['char', 64].steps} (") in table  # 128 bytes a step: 2 windows of 64
    assert f"xl {plans['xl', 64].steps} (" in table
    assert ("FLOPs counted as causal, learning rate 0.002 for every arm |") in table  # default
    assert "bench_context: the decision table, with this run's row: " in r.stdout
    again = run()
    assert again.returncode == 0 and "bench_context [" not in again.stdout
    with open(out, newline="") as f:
        assert list(csv.DictReader(f)) == rows
    other = run("--block", "4")
    assert other.returncode == 2 and "delete its folder's context.csv" in other.stderr
    bad = run("--targets", "4")
    assert bad.returncode == 2 and "--targets at least one block" in bad.stderr
    bad = run("--batch-bytes", "32")
    assert bad.returncode == 2 and "--batch-bytes at least the longest length (64)" in bad.stderr


def test_the_decision_table_answers_long_context_from_the_context_rows():
    from minixl.one_bench.bench_all import decisions

    def row(arm, length, seed, c, bpc):
        return {"arm": arm, "length": length, "seed": seed, "context": c, "bpc": bpc,
                "budget": 1e12, "reachable": "yes"}
    context = []
    for seed, (a, b) in enumerate([(0.0, 0.02), (0.01, 0.0), (0.02, 0.01)]):
        context += [row("xl", 512, seed, 1024, 2.60 + a), row("xl", 512, seed, 2048, 2.50 + a),
                    row("shaw", 512, seed, 1024, 2.70 + b), row("shaw", 512, seed, 2048, 2.70 + b),
                    row("xl", 128, seed, 2048, 2.00)]  # trained shorter: another question
    quality = [{"arm": "xl", "length": 128, "budget": 1e12, "seed": 0, "common_bpc": 3.0,
                "own_protocol": "window", "own_bpc": 3.0}]
    table = {r["need"]: r for r in decisions(quality, [], None, context)}
    need = table["long context on a small budget"]
    assert need["choice"] == "xl" and need["runner_up"] == "shaw (2.710)"
    assert need["setting"] == ("budget 1e+12 FLOPs, trained at 512, read with 2048 bytes of "
                               "context, 3 seeds, kernels: xl, shaw eager, FLOPs counted as "
                               "kernel")  # no settings stored: no size, batch or rate
    assert need["reason"] == ("held-out 2.510 bpc; xl, context 1024 -> 2048 bytes: +0.100 bpc "
                              "(seeds +0.100, +0.100, +0.100)")
    assert need["margin"] == pytest.approx(0.2)
    close = [r for r in context if not (r["arm"] == "shaw" and r["context"] == 2048)]
    close += [row("shaw", 512, seed, 2048, 2.52 + 0.1 * seed) for seed in range(3)]
    need = {r["need"]: r for r in decisions(quality, [], None, close)}[
        "long context on a small budget"]
    assert need["choice"] == "no winner at this scale (best xl, within the seeds' spread)"
    assert need["reason"].startswith("held-out 2.510 bpc; xl, context 1024 -> 2048 bytes: "
                                     "+0.100 bpc")  # the gain of the best, winner or not
    without = {r["need"]: r for r in decisions(quality, [], None)}
    assert without["long context on a small budget"]["choice"] == "not measured"
    # the best reads 4096 bytes of context it cannot reach: its reason is the gain over
    # the contexts it reads, from the shortest to the longest (out of reach gains nothing)
    far = [dict(r, reachable="yes") for r in context if r["length"] == 512]
    for seed in range(3):
        far += [dict(row("xl", 512, seed, 4096, 2.45), reachable="a prediction reads at "
                     "most 2048 bytes back"), row("shaw", 512, seed, 4096, 2.70)]
    need = {r["need"]: r for r in decisions(quality, [], None, far)}[
        "long context on a small budget"]
    assert need["choice"] == "xl" and need["setting"].startswith(
        "budget 1e+12 FLOPs, trained at 512, read with 4096 bytes")
    assert need["reason"] == ("held-out 2.450 bpc; xl, context 1024 -> 2048 bytes, 4096 out of "
                              "its reach: +0.100 bpc (seeds +0.100, +0.100, +0.100)")


def test_the_written_decision_table_reads_the_context_run_below_the_bench(tmp_path):
    from minixl.experiments import write_csv
    from minixl.one_bench.bench_all import write_decisions

    quality = [{"arm": "xl", "length": 128, "budget": 1e12, "seed": 0, "common_bpc": 3.0,
                "own_protocol": "window", "own_bpc": 3.0}]
    path = write_decisions(tmp_path, quality, [])
    assert "| long context on a small budget |  | not measured |" in path.read_text()
    (tmp_path / "context").mkdir()
    write_csv([{"arm": arm, "length": 512, "seed": seed, "context": c, "bpc": bpc + 0.01 * seed,
                "budget": 1e12, "reachable": "yes"}
               for seed in range(2) for arm, c, bpc in (("xl", 1024, 2.6), ("xl", 2048, 2.5),
                                                        ("shaw", 1024, 2.7),
                                                        ("shaw", 2048, 2.7))],
              tmp_path / "context" / "context.csv")
    text = write_decisions(tmp_path, quality, []).read_text()
    assert ("| long context on a small budget | budget 1e+12 FLOPs, trained at 512, read with "
            "2048 bytes of context, 2 seeds, kernels: xl, shaw eager, FLOPs counted as kernel | "
            "xl | held-out 2.505 bpc;") in text
    assert "xl, context 1024 -> 2048 bytes: +0.100 bpc" in text
    with open(tmp_path / "decisions.csv", newline="") as f:
        assert "xl" in [r["choice"] for r in csv.DictReader(f)
                        if r["need"] == "long context on a small budget"]


def test_a_stopped_context_bench_goes_on_from_the_points_it_wrote(tmp_path):
    """Ctrl-C in the middle of the second point's training (a real SIGINT, sent by the
    process to itself at a fixed batch): it says where it stopped and exits 130; the same
    command then runs only the point not written, and every row equals an unstopped run's."""
    tiny = ["bench_context", "--budget", "1e9", "--params", "20000", "--seeds", "0",
            "--models", "char", "--lengths", "32,64", "--shape-length", "32",
            "--contexts", "8,32", "--block", "8", "--targets", "32", "--batch-bytes", "128"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    stop = """if True:
        import os, signal, sys
        # Ctrl-C as at a terminal (a runner started in the background hands SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from minixl import data
        calls = [0]
        def call(self, i, real=data.RandomWindows.__call__):
            calls[0] += 1
            if calls[0] == int(sys.argv[1]):
                os.kill(os.getpid(), signal.SIGINT)
            return real(self, i)
        data.RandomWindows.__call__ = call
        from minixl.experiments import main
        sys.exit(main(sys.argv[2:]))
    """
    whole, part = tmp_path / "whole" / "context.csv", tmp_path / "part" / "context.csv"

    def run(*args):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=600)

    r = run("-m", "minixl.experiments", *tiny, "--csv", str(whole))
    assert r.returncode == 0, r.stderr
    with open(whole, newline="") as f:
        full = list(csv.DictReader(f))
    first = int(full[0]["steps"])  # char at 32; the stop falls inside char at 64
    r = run("-c", stop, str(first + 5), *tiny, "--csv", str(part))
    assert r.returncode == 130, r.stdout + r.stderr
    assert f"bench_context: stopped; 1 of 2 points are written in {part}" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("-m", "minixl.experiments", *tiny, "--csv", str(part))
    assert r.returncode == 0 and "bench_context [2/2] char, length 64" in r.stdout
    assert "bench_context [1/2]" not in r.stdout
    with open(part, newline="") as f:
        resumed = list(csv.DictReader(f))
    drop = {"train_seconds"}  # the only column that is not a function of the settings
    assert ([{k: v for k, v in x.items() if k not in drop} for x in full]
            == [{k: v for k, v in x.items() if k not in drop} for x in resumed])
