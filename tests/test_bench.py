"""The benchmark: training tokens/s of any model kind, timed on the trainer's own step with the
trainer's own optimiser, its FLOP counts, the GPU peak table, and the suite of every kind.
(The numbers themselves are the benchmark's to report, not the tests'.)"""

import dataclasses
import math

import pytest
import torch

from conftest import TINY_CONFIGS
import minixl.bench
from minixl import training
from minixl.bench import bench as bench_one, models_suite, peak_tflops
from minixl.cli import main
from minixl.kinds import KINDS

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def test_peaks_by_device_name():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # the SXM part's dense bf16 peak
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H100 NVL") == 835.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA L40S") == 362.0
    assert peak_tflops("NVIDIA L40") is None  # neither the L4 nor the L40S
    assert peak_tflops("Some Future GPU") is None


@pytest.mark.parametrize("kind", ["char", "xl"])
def test_bench_on_the_cpu_reports_throughput_without_mfu(kind):
    r = bench_one(kind, "tiny", model_settings=TINY_CONFIGS[kind], batch_size=2, steps=2,
                  warmup=1, device="cpu")
    assert r["tokens_per_s"] > 0 and r["tflops"] > 0 and r["device"] == "cpu"
    assert r["mfu"] is None and r["peak_tflops"] is None
    assert r["seq_len"] == (32 if kind == "char" else 16) and r["batch_size"] == 2


def test_bench_times_the_loops_own_step_with_the_loops_own_optimiser(monkeypatch):
    """One step function for both: the benchmark calls minixl.training.train_step on an
    optimiser made as a `minixl train` run makes it (weight decay on the matrices, with the
    kind's own tables left alone), once per warm-up and timed step."""
    steps, made = [], []
    real_step, real_make = training.train_step, training.make_optimizer

    def counted(*args, **kw):
        steps.append(1)
        return real_step(*args, **kw)

    def spied(modules, cfg, device, **kw):
        opt = real_make(modules, cfg, device, **kw)
        made.append((cfg.weight_decay_on, kw.get("no_decay"), opt))
        return opt

    # the benchmark's own names are the trainer's functions, not copies
    assert minixl.bench.train_step is real_step and minixl.bench.make_optimizer is real_make
    monkeypatch.setattr(minixl.bench, "train_step", counted)
    monkeypatch.setattr(minixl.bench, "make_optimizer", spied)
    bench_one("char", "tiny", model_settings=TINY_CONFIGS["char"], batch_size=2, steps=3,
              warmup=2, device="cpu")
    assert len(steps) == 5
    [(on, no_decay, opt)] = made
    assert on == "matrices" and no_decay == KINDS["char"].no_decay == ("pos",)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]


def test_the_xlnet_flop_count_is_the_one_torch_counts(capsys):
    """`minixl bench --model xlnet` runs, and its FLOP count (which MFU divides by the peak)
    is within a few percent of torch's own count of a training step's matrix products."""
    from torch.utils.flop_counter import FlopCounterMode

    from conftest import TINY

    assert main(["bench", *TINY["xlnet"], "--batch-size", "2", "--steps", "1", "--device",
                 "cpu"]) == 0
    out = capsys.readouterr().out
    assert "model: xlnet" in out and "batch 2 x 32" in out and "train tokens/s: " in out
    kind = KINDS["xlnet"]
    cfg, _ = kind.preset("tiny")
    model = kind.build(cfg)
    objective = kind.build_objective(cfg, kind.objective_options("tiny"))
    x = torch.randint(0, 256, (16, cfg.seq_len))
    with FlopCounterMode(display=False) as counter:
        objective(model, x, x)[0]["loss"].backward()
    counted = counter.get_total_flops() / x.numel()
    assert abs(kind.flops_per_token(model) / counted - 1) < 0.03, (kind.flops(model), counted)


def test_the_bench_counts_what_the_objective_adds():
    """t12 trains with Chapter 2's losses: their readouts and extra classifier run in the step
    that is timed, so TFLOP/s (and MFU) count them too."""
    losses = {"aux_losses": "positions,layers,targets", "aux_targets": 1}
    r = bench_one("char", "tiny", objective_options=losses, batch_size=2, steps=1, warmup=0,
                  device="cpu")
    kind = KINDS["char"]
    cfg, _ = kind.preset("tiny")
    model = kind.build(cfg)
    objective = kind.build_objective(cfg, kind.objective_options("tiny", losses))
    counted = kind.training_flops_per_token(model, objective)
    assert counted > 1.05 * kind.flops_per_token(model)
    assert math.isclose(r["tflops"], counted * r["tokens_per_s"] / 1e12, rel_tol=1e-9)


def test_a_kind_without_a_count_is_charged_six_flops_per_weight():
    from dataclasses import replace

    plain = replace(KINDS["segtree"], flops=None)
    model = plain.build(plain.config(**TINY_CONFIGS["segtree"]))
    assert plain.flops_per_token(model) == 6 * sum(p.numel() for p in model.parameters())


def test_the_suite_reads_each_kind_at_its_paper_scale_preset():
    book = {"char": "t12", "shaw": "base", "xl": "xl-base", "xlnet": "xlnet-base",
            "segtree": "segtree-base"}
    assert {name: KINDS[name].scale_preset for name in book} == book
    for kind in KINDS.values():  # the rule, for any kind: its first paper-scale preset,
        papers = [n for n, p in kind.presets.items() if p.paper]  # else base, else its last
        assert kind.scale_preset == (papers[0] if papers else "base" if "base" in kind.presets
                                     else list(kind.presets)[-1]), kind.name
    mine = dataclasses.replace(KINDS["char"], name="mine", presets={
        "tiny": KINDS["char"].presets["tiny"], "small": KINDS["char"].presets["small"]})
    assert mine.scale_preset == "small"  # no paper-scale preset and no base: the last


@pytest.mark.slow
def test_models_suite_measures_each_model_in_its_own_process():
    rows = models_suite(preset="tiny", batch_size=2, steps=1, warmup=0, device="cpu",
                        models="char,xl")
    assert [r["model"] for r in rows] == ["char", "xl"]
    for r in rows:
        kind = KINDS[r["model"]]
        model = kind.build(kind.preset("tiny")[0])
        assert r["params"] == sum(p.numel() for p in model.parameters())
        assert r["tokens_per_s"] > 0 and r["seq_len"] == getattr(model.config, kind.length)
        # TFLOP/s is the model's FLOPs per token times tokens/s
        assert math.isclose(r["tflops"], kind.flops_per_token(model) * r["tokens_per_s"] / 1e12,
                            rel_tol=1e-9)
        assert r["mfu"] is None and r["device"] == "cpu"  # no peak for a CPU
        assert r["peak_mb"] > 50 and r["memory"] == "peak RSS of the process"
        assert r["torch"] == torch.__version__ and r["batch_size"] == 2


@pytest.mark.slow
def test_models_suite_from_the_command_line(tmp_path, capsys):
    """One paper-scale preset names one model: the suite measures only that one (here at a
    batch of 1 and 1 step: t12 on the CPU is slow but small)."""
    import csv

    out = tmp_path / "m.csv"
    assert main(["bench", "--suite", "models", "--preset", "t12", "--batch-size", "1",
                 "--steps", "1", "--warmup", "0", "--device", "cpu", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [(r["model"], r["preset"]) for r in rows] == [("char", "t12")]
    assert float(rows[0]["tokens_per_s"]) > 0 and rows[0]["mfu"] == ""
    printed = capsys.readouterr().out
    assert printed.startswith("| model | preset |") and "| char | t12 | cpu |" in printed


def test_train_logs_mfu_with_the_benchs_flop_count(tmp_path, small_corpus):
    """metrics.csv's mfu is the row's tokens/s times the FLOPs per token `minixl bench`
    counts (the objective's readouts and classifier included) over the peak; on a CPU, with
    no peak given, the column is there and empty, and tokens/s is logged all the same."""
    import csv

    from conftest import train_args
    from minixl.checkpoint import load_checkpoint
    from minixl.kinds import model_from_checkpoint

    losses = {"aux_losses": "positions,layers,targets"}
    out = tmp_path / "run"
    assert main(train_args("char", out, 4, "--corpus", str(small_corpus), "--aux-losses",
                           losses["aux_losses"], "--peak-tflops", "0.001")) == 0
    model = model_from_checkpoint(load_checkpoint(out / "checkpoint.pt"))
    kind = KINDS["char"]
    objective = kind.build_objective(model.config, kind.objective_options("tiny", losses))
    flops = kind.training_flops_per_token(model, objective)
    assert flops > 1.05 * kind.flops_per_token(model)  # the objective's part is in
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert rows
    for r in rows:  # 0.001 TFLOP/s = 1e9 FLOP/s; both columns are written to 4 digits
        assert math.isclose(float(r["mfu"]), float(r["tokens_per_s"]) * flops / 1e9,
                            rel_tol=2e-3)
    plain = tmp_path / "plain"
    assert main(train_args("char", plain, 2, "--corpus", str(small_corpus))) == 0
    rows = list(csv.DictReader(open(plain / "metrics.csv")))
    assert all(r["mfu"] == "" and float(r["tokens_per_s"]) > 0 for r in rows)


def test_a_rows_tokens_per_s_leaves_out_held_out_evaluation():
    """Every step is evaluated here by a held-out measure that takes a second; the rows'
    tokens/s is the rate of the training steps alone (64 tokens a step of a tiny model:
    thousands a second), not 64 tokens over more than a second."""
    import time

    from minixl import CharTransformer, CharTransformerConfig
    from minixl.data import RandomWindows
    from minixl.training import TrainConfig, train

    def slow_held_out(model, n_bytes):
        time.sleep(1.0)
        return 8.0

    torch.manual_seed(0)
    model = CharTransformer(CharTransformerConfig(n_layer=1, d_model=32, n_head=2, d_inner=64,
                                                  block_size=16))
    data = torch.randint(0, 256, (2000,), dtype=torch.uint8)
    result = train(model, TrainConfig(steps=3, batch_size=4, warmup=0, eval_every=1,
                                      log_every=1, device="cpu"),
                   batches=RandomWindows(data, 4, 16), held_out=slow_held_out, progress=False)
    rates = [row["tokens_per_s"] for row in result.history]
    assert len(rates) == 3 and min(rates) > 10 * 64, rates
    assert all(row["mfu"] is None for row in result.history)  # no peak on a CPU


def test_profile_names_the_top_operators_of_a_training_step(tmp_path):
    """The profile command (the GPU's is the same with --device cuda --compile) on the CPU:
    for each preset its top operators by self time, in order, with shares of the step that
    add up to at most 1 and the step's matrix products among them."""
    import csv

    from minixl.experiments import main as experiments_main

    out = tmp_path / "profile.csv"
    assert experiments_main(["profile", "--presets", "char/tiny,xl/tiny", "--batch-size", "2",
                             "--steps", "1", "--warmup", "1", "--top", "8", "--device", "cpu",
                             "--csv", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    for preset, model in (("char/tiny", "char"), ("xl/tiny", "xl")):
        mine = [r for r in rows if r["preset"] == preset]
        assert [int(r["rank"]) for r in mine] == list(range(1, 9)) and mine[0]["model"] == model
        shares = [float(r["share"]) for r in mine]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-6
        assert all(float(r["ms_per_step"]) > 0 and float(r["calls_per_step"]) >= 1 for r in mine)
        whole = float(mine[0]["all_ms_per_step"])
        assert math.isclose(float(mine[0]["ms_per_step"]), shares[0] * whole, rel_tol=1e-3)
        assert {"aten::mm", "aten::addmm", "aten::bmm"} & {r["name"] for r in mine}
    with pytest.raises(ValueError, match="steps >= 1"):
        minixl.bench.profile("char/tiny", steps=0, device="cpu")


def test_the_bench_command_takes_the_objectives_options(capsys):
    """`minixl bench --preset t12 --aux-losses positions` is t12 with the loss at every
    position only (the comparison issue 67 asks for): the option reaches the objective, so a
    bad one is refused by name; the warm-up's time (its compiling, compiled) is printed."""
    assert main(["bench", "--model", "char", "--preset", "tiny", "--aux-losses", "positions",
                 "--batch-size", "1", "--steps", "1", "--warmup", "1", "--device", "cpu"]) == 0
    assert "warm-up: 1 steps in " in capsys.readouterr().out
    assert main(["bench", "--model", "char", "--preset", "tiny", "--aux-losses", "bogus",
                 "--steps", "1", "--warmup", "0", "--device", "cpu"]) == 2
    assert "unknown auxiliary loss 'bogus'" in capsys.readouterr().err


def test_the_commands_owed_on_a_gpu_parse():
    """book/gpu/README.md lists the commands a GPU session owes, to be run as written on a
    machine where nothing can be fixed: each one's flags must be ones its parser takes."""
    import re
    import shlex
    from pathlib import Path

    from minixl.cli import build_parser
    from minixl.experiments import build_parser as experiments_parser

    text = (Path(__file__).parents[1] / "book" / "gpu" / "README.md").read_text()
    owed = text[text.index("## Owed on a GPU for the issue on GPU speed"):]
    block = re.search(r"```bash\n(.*?)```", owed, re.S).group(1)
    parsed = 0
    for line in block.splitlines():
        words = shlex.split(line.split(">")[0])
        if "python3" not in words:
            continue
        argv = words[words.index("python3") + 1:]
        assert argv[:2] in (["-m", "minixl"], ["-m", "minixl.experiments"]), line
        parser = build_parser() if argv[1] == "minixl" else experiments_parser()
        parser.parse_args([w.replace("$", "") for w in argv[2:]])  # exits on a bad flag
        parsed += 1
    assert parsed == 8


def test_a_profiles_events_count_each_microsecond_once():
    """On CUDA an operator's self device time is the time of the kernels it launched, which
    are events of their own, and an annotated range (a compiled graph's call) spans others: a
    step's time is its GPU events', annotations left out. On a CPU, the operators'."""
    from types import SimpleNamespace as Event

    from torch.autograd import DeviceType

    from minixl.bench import step_events

    def event(key, device, cpu_us, gpu_us, annotation=False, count=1):
        return Event(key=key, device_type=device, self_cpu_time_total=cpu_us,
                     self_device_time_total=gpu_us, is_user_annotation=annotation, count=count)

    events = [event("aten::mm", DeviceType.CPU, 30, 500, count=2),  # launched the gemm
              event("sm90_gemm", DeviceType.CUDA, 0, 500, count=2),
              event("## Call CompiledFxGraph ##", DeviceType.CUDA, 0, 900, annotation=True),
              event("triton_fused_add", DeviceType.CUDA, 0, 200),
              event("aten::add", DeviceType.CPU, 10, 0)]
    assert step_events(events, cuda=True) == [("sm90_gemm", 500, 2), ("triton_fused_add", 200, 1)]
    assert step_events(events, cuda=False) == [("aten::mm", 30, 2), ("aten::add", 10, 1)]
