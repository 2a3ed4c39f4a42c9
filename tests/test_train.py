import csv
import math

import pytest
import torch

from minixl import CharTransformerConfig
from minixl import train as T

MODEL = CharTransformerConfig(n_layer=2, d_model=32, n_head=4, d_inner=64, block_size=32)


def cfg(tmp_path, **kw):
    args = dict(out=str(tmp_path / "run"), steps=12, batch_size=4, eval_every=6, ckpt_every=4,
                log_every=2, eval_batches=2, device="cpu")
    return T.TrainConfig(**{**args, **kw})


def test_run_folder_metrics_plot_and_checkpoint(tmp_path):
    r = T.train(MODEL, cfg(tmp_path), progress=False)
    out = tmp_path / "run"
    assert {p.name for p in out.iterdir()} == {"checkpoint.pt", "metrics.csv", "loss.png"}
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8, 10, 12]
    assert [bool(r["valid_bpc"]) for r in rows] == [False, False, True, False, False, True]
    assert 0 < r["valid_bpc"] < 8.5
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 12 and not any(k.startswith("_orig_mod.") for k in ckpt["model"])


def test_resume_continues_exactly_where_the_run_stopped(tmp_path):
    whole = T.train(MODEL, cfg(tmp_path / "a"), progress=False)["model"]
    T.train(MODEL, cfg(tmp_path / "b", steps=8), progress=False)
    # Continue the 8-step run to 12 steps: same schedule as the uninterrupted run.
    part = T.model_from_checkpoint(tmp_path / "b" / "run" / "checkpoint.pt")
    assert not all(torch.equal(a, b) for a, b in zip(part.parameters(), whole.parameters()))
    resumed = T.train(MODEL, cfg(tmp_path / "b"), resume=True, progress=False)["model"]
    for a, b in zip(resumed.state_dict().values(), whole.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6)
    rows = list(csv.DictReader(open(tmp_path / "b" / "run" / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8, 10, 12]


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    T.train(MODEL, cfg(tmp_path, steps=4), progress=False)
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        T.train(MODEL, cfg(tmp_path, steps=4), progress=False)
    with pytest.raises(ValueError, match="no checkpoint at"):
        T.train(MODEL, cfg(tmp_path / "none"), resume=True, progress=False)
    with pytest.raises(ValueError, match="already trained 4 steps"):
        T.train(MODEL, cfg(tmp_path, steps=4), resume=True, progress=False)
    other = CharTransformerConfig(n_layer=1, d_model=32, n_head=4, d_inner=64, block_size=32)
    with pytest.raises(T.CheckpointError, match="same preset and flags"):
        T.train(other, cfg(tmp_path, steps=8), resume=True, progress=False)


def test_a_crash_keeps_the_last_checkpoint_and_saves_progress(tmp_path, monkeypatch):
    T.train(MODEL, cfg(tmp_path, steps=4), progress=False)
    real = T.random_windows
    calls = {"n": 0}

    def crash_on_seventh(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(T, "random_windows", crash_on_seventh)
    with pytest.raises(KeyboardInterrupt):
        T.train(MODEL, cfg(tmp_path, steps=12), overwrite=True, progress=False)
    ckpt = T.load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ckpt["step"] == 6  # six finished steps, saved on the way out


def test_compiled_training_saves_plain_keys(tmp_path, monkeypatch):
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real(m, backend="eager"))
    T.train(MODEL, cfg(tmp_path, steps=4, compile=True), progress=False)
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert not any("_orig_mod" in k for k in ckpt["model"])
    T.model_from_checkpoint(ckpt)


def test_corrupt_and_mismatched_checkpoints_fail_clearly(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(T.CheckpointError, match="corrupt"):
        T.load_checkpoint(bad)
    with pytest.raises(T.CheckpointError, match="no checkpoint at"):
        T.load_checkpoint(tmp_path / "missing.pt")
    T.train(MODEL, cfg(tmp_path, steps=4), progress=False)
    ckpt = T.load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    ckpt["model_config"]["d_inner"] = 128
    with pytest.raises(T.CheckpointError, match="do not match"):
        T.model_from_checkpoint(ckpt)
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(T.CheckpointError, match="not a minixl checkpoint"):
        T.load_checkpoint(tmp_path / "other.pt")


def test_atomic_save_leaves_old_checkpoint_when_saving_fails(tmp_path):
    path = tmp_path / "c.pt"
    T.save_checkpoint(path, {"format": T.FORMAT, "x": torch.ones(2)})
    with pytest.raises(Exception):
        T.save_checkpoint(path, {"format": T.FORMAT, "x": lambda: 0})  # not picklable
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_corpus_too_short_for_the_window_fails_before_training(tmp_path):
    f = tmp_path / "short.txt"
    f.write_bytes(b"x" * 400)  # valid split: 20 bytes, less than block_size=32
    with pytest.raises(ValueError, match="valid split .* too few for windows"):
        T.train(MODEL, cfg(tmp_path, corpus=str(f)), progress=False)
    assert not (tmp_path / "run").exists()


def test_lr_schedule_edges():
    c = T.TrainConfig(steps=100, warmup=10, lr=1.0, min_lr_frac=0.1)
    assert T.lr_at(0, c) == pytest.approx(0.1)
    assert T.lr_at(9, c) == pytest.approx(1.0)
    assert T.lr_at(10, c) == pytest.approx(1.0)
    assert T.lr_at(55, c) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert T.lr_at(100, c) == pytest.approx(0.1)


def test_presets_and_device_errors():
    with pytest.raises(ValueError, match="unknown preset 'huge'.*tiny, small, base"):
        T.preset("huge")
    for name in T.PRESETS:
        T.preset(name)
    assert T.resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            T.resolve_device("cuda")


def test_peak_table_knows_hopper_and_admits_ignorance():
    assert T.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert T.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert T.peak_tflops("NVIDIA H200") == 989.0
    assert T.peak_tflops("NVIDIA L40") is None  # not the L4, not the L40S
    assert T.peak_tflops("NVIDIA L4") == 121.0
    assert T.peak_tflops("Some Future GPU") is None


def test_bench_on_cpu_reports_throughput_without_mfu():
    r = T.bench(MODEL, batch_size=2, steps=2, warmup=1, device="cpu")
    assert r["tokens_per_s"] > 0 and r["mfu"] is None and r["device"] == "cpu"
    r = T.bench(MODEL, batch_size=2, steps=2, warmup=1, device="cpu", peak=1.0)
    assert r["mfu"] == pytest.approx(r["tflops"] / 1.0)
