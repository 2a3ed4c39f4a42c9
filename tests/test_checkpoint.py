"""Checkpoints: atomic saves, clear errors for files that are not one, the resume check and
the folder rules, and checkpoints written by earlier versions of minixl (tests/data), which
must still resume and end as the code that wrote them ended."""

import csv
import hashlib
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import train_args
from minixl import CharTransformer, CharTransformerConfig
from minixl.checkpoint import (FORMAT, CheckpointError, check_resume, load_checkpoint,
                               save_checkpoint)
from minixl.cli import main
from minixl.training import TrainConfig

DATA = Path(__file__).resolve().parent / "data"

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def _steps_logged(run: Path) -> list[int]:
    return [int(line.split(",")[0]) for line in (run / "metrics.csv").read_text().splitlines()[1:]]


# ---------------------------------------------------------------- checkpoints

def test_save_is_atomic_and_removes_stale_parts(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"format": FORMAT, "x": torch.ones(2)})
    stale = tmp_path / "checkpoint.pt.abc123.part"  # what SIGKILL during a save leaves
    stale.write_bytes(b"half a file")
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        save_checkpoint(path, {"format": FORMAT, "x": lambda: 0})  # cannot be pickled
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    save_checkpoint(path, {"format": FORMAT, "x": torch.zeros(3)})
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


@pytest.mark.parametrize("content,message", [
    (None, "no checkpoint at"),
    (b"", "is empty (0 bytes)"),
    (b"not a checkpoint at all", "cannot be read as a minixl checkpoint"),
    ({"weights": 1}, "is not a minixl-checkpoint-2 file"),
    ({"format": "minixl-checkpoint-1"}, "written by an older minixl"),
    ({"format": FORMAT, "step": 1, "model_config": {}, "meta": {}}, "has no 'model' entry"),
])
def test_unreadable_checkpoints_fail_clearly(tmp_path, content, message):
    path = tmp_path / "c.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(CheckpointError, match=re.escape(message)) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)
    assert "weights_only" not in str(err.value)  # no advice to load untrusted pickles


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "x": Path("/")}, path)  # any object that is not plain data
    with pytest.raises(CheckpointError, match="cannot be read as a minixl checkpoint"):
        load_checkpoint(path)


def test_a_checkpoint_without_training_state_cannot_be_resumed(tmp_path, char_run):
    ckpt = load_checkpoint(char_run / "checkpoint.pt")
    del ckpt["train_config"]
    torch.save(ckpt, tmp_path / "c.pt")
    load_checkpoint(tmp_path / "c.pt")  # enough to evaluate and sample
    with pytest.raises(CheckpointError, match="has no 'train_config' entry.*for --resume"):
        load_checkpoint(tmp_path / "c.pt", for_resume=True)


def test_check_resume_lists_every_change_and_honours_allow():
    saved = {"model.d_model": 32, "lr": 1e-3, "seed": 0}
    with pytest.raises(CheckpointError) as err:
        check_resume(saved, {"model.d_model": 64, "lr": 2e-3, "seed": 0},
                     fixed={"model.d_model"}, allow=set())
    assert "model.d_model: 32 -> 64" in str(err.value) and "lr: 0.001 -> 0.002" in str(err.value)
    assert "seed" not in str(err.value)  # unchanged settings are not listed
    assert "model.d_model cannot change on resume" in str(err.value)
    assert "--allow-change lr" in str(err.value)
    changes = check_resume(saved, {**saved, "lr": 2e-3}, fixed={"model.d_model"}, allow={"lr"})
    assert changes == {"lr": (1e-3, 2e-3)}
    assert check_resume(saved, saved, fixed={"model.d_model"}, allow=set()) == {}
    with pytest.raises(CheckpointError, match="model.d_model cannot change"):  # allow or not
        check_resume(saved, {**saved, "model.d_model": 64}, fixed={"model.d_model"},
                     allow={"lr"})
    for name in ("colour", "model.d_model"):  # unknown, or part of the model
        with pytest.raises(ValueError, match="not a setting a resumed run can change"):
            check_resume(saved, saved, fixed={"model.d_model"}, allow={name})


# ---------------------------------------------------------------- the run's identity on resume

def _resume(run, corpus, *extra, steps=8):
    return main(train_args("char", run, steps, "--corpus", str(corpus), "--resume", *extra))


def test_resume_refuses_changed_settings_with_a_diff(tmp_path, char_run, small_corpus, capsys):
    run = Path(shutil.copytree(char_run, tmp_path / "run"))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    other = tmp_path / "other.txt"
    other.write_bytes(small_corpus.read_bytes()[::-1])  # same size, other text
    sha = load_checkpoint(run / "checkpoint.pt")["meta"]["corpus"]["sha256"]
    from minixl.data import load_corpus
    other_sha = load_corpus(str(other)).sha256
    cases = [(("--lr", "0.01"), ["lr: 0.002 -> 0.01"]), (("--seed", "1"), ["seed: 0 -> 1"]),
             (("--d-model", "64"), ["model.d_model: 32 -> 64"]),
             (("--aux-losses", "none"), ["objective: 'positions targets=1' -> 'none targets=1'"])]
    for extra, diff in cases:
        assert _resume(run, small_corpus, *extra, steps=10) == 2
        err = capsys.readouterr().err
        assert all(d in err for d in diff) and "Traceback" not in err, err
    assert _resume(run, other, steps=10) == 2
    err = capsys.readouterr().err
    assert "corpus: " in err and sha in err and other_sha in err and "--allow-change" in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # refusals change nothing

    assert _resume(run, small_corpus) == 2  # the run is finished
    assert "--allow-change steps" in capsys.readouterr().err
    assert _resume(run, small_corpus, "--lr", "0.001", "--allow-change", "lr", steps=10) == 2
    assert "steps: 8 -> 10" in capsys.readouterr().err  # steps is part of the identity too
    assert _resume(run, small_corpus, "--lr", "0.001", "--allow-change", "lr,steps",
                   steps=10) == 0
    assert "resuming with lr changed: 0.002 -> 0.001" in capsys.readouterr().out
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    assert ckpt["step"] == 10 and ckpt["train_config"]["lr"] == 0.001
    assert _steps_logged(run) == [2, 4, 6, 8, 10]


def test_the_folder_rules(tmp_path, small_corpus, capsys):
    out = tmp_path / "run"
    base = train_args("char", out, 2, "--corpus", str(small_corpus))
    assert main([*base, "--allow-change", "lr"]) == 2
    assert "--allow-change applies to --resume only" in capsys.readouterr().err
    assert main([*base, "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert not out.exists()  # the refusals made no folder
    assert main(base) == 0
    first = (out / "checkpoint.pt").read_bytes()
    assert main(base) == 2  # a run is there
    assert "pass --resume to continue it, --overwrite" in capsys.readouterr().err
    assert main([*base, "--resume", "--overwrite"]) == 2
    assert "not both" in capsys.readouterr().err
    assert (out / "checkpoint.pt").read_bytes() == first


@pytest.mark.slow  # over 1.5 s: the quick loop stays well under a minute
def test_compiled_training_saves_plain_keys(tmp_path, monkeypatch, small_corpus):
    real, calls = torch.compile, []

    def eager(fn, **kw):
        calls.append(fn)
        return real(fn, backend="eager")

    monkeypatch.setattr(torch, "compile", eager)
    out = tmp_path / "run"
    assert main(train_args("char", out, 2, "--corpus", str(small_corpus), "--compile")) == 0
    assert calls, "--compile did not compile the model"
    # and Chapter 2's stacked losses, outside the model's forward, are compiled too
    assert any(getattr(fn, "__name__", "") == "stacked" for fn in calls), calls
    keys = load_checkpoint(out / "checkpoint.pt")["model"]
    plain = CharTransformer(CharTransformerConfig(n_layer=1, d_model=32, n_head=2, d_inner=64,
                                                  block_size=32)).state_dict()
    assert list(keys) == list(plain)


def _old_checkpoint(run: Path) -> None:
    """Make run's checkpoint one written before weight_decay_on and grad_accum existed."""
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    for name in ("weight_decay_on", "grad_accum"):
        del ckpt["train_config"][name]
    save_checkpoint(run / "checkpoint.pt", ckpt)


def test_a_checkpoint_from_before_decay_groups_resumes_decaying_everything(tmp_path,
                                                                          small_corpus, capsys):
    run = tmp_path / "run"
    args = train_args("char", run, 4, "--corpus", str(small_corpus))
    assert main([*args, "--weight-decay-on", "all"]) == 0
    _old_checkpoint(run)
    assert main(train_args("char", run, 8, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps")) == 0
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    assert ckpt["step"] == 8 and ckpt["train_config"]["weight_decay_on"] == "all"
    assert len(ckpt["optimizer"]["param_groups"]) == 1
    assert "weight_decay_on" not in capsys.readouterr().out  # no change was reported

    _old_checkpoint(run)  # asking for the groups is a change of what is learned ...
    assert main(train_args("char", run, 10, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps", "--weight-decay-on", "matrices")) == 2
    assert "weight_decay_on: 'all' -> 'matrices'" in capsys.readouterr().err
    before = load_checkpoint(run / "checkpoint.pt", for_resume=True)["optimizer"]["state"]
    assert main(train_args("char", run, 10, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps,weight_decay_on", "--weight-decay-on",
                           "matrices")) == 0  # ... made on purpose: the moments carry over
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    groups = ckpt["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    assert all(int(s["step"]) == 10 for s in ckpt["optimizer"]["state"].values())
    assert len(ckpt["optimizer"]["state"]) == len(before)


def test_a_checkpoint_from_before_attention_impl_resumes(tmp_path, small_corpus, capsys):
    """A model setting added since a checkpoint was written takes its default there: an XL
    run saved before attention_impl existed resumes as eager, and asking for another is a
    change of the model, refused."""
    run = tmp_path / "run"
    assert main(train_args("xl", run, 4, "--corpus", str(small_corpus))) == 0
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    del ckpt["model_config"]["attention_impl"]
    save_checkpoint(run / "checkpoint.pt", ckpt)
    assert main(train_args("xl", run, 6, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps")) == 0
    assert "attention_impl" not in capsys.readouterr().out
    assert main(train_args("xl", run, 8, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps", "--attention-impl", "sdpa")) == 2
    assert "model.attention_impl: 'eager' -> 'sdpa'" in capsys.readouterr().err


def test_a_new_command_line_run_decays_only_the_matrices(char_run):
    ckpt = load_checkpoint(char_run / "checkpoint.pt", for_resume=True)
    assert ckpt["train_config"]["weight_decay_on"] == "matrices"
    assert [g["weight_decay"] for g in ckpt["optimizer"]["param_groups"]] == [0.01, 0.0]
    assert TrainConfig().weight_decay_on == "all"  # the library's default: Chapter 1's loop




# ---------------------------------------------------------------- written by an earlier minixl

OLD = DATA / "main-c7b8fe5"
SIZES = ["--n-layer", "1", "--d-model", "8", "--n-head", "2", "--d-inner", "16"]
OLD_RUNS = {"char": ["--block-size", "16"], "xl": ["--d-head", "4", "--tgt-len", "8",
                                                    "--mem-len", "8"]}


def _old_corpus(folder: Path) -> None:
    """The corpus the old runs trained on: 2,000 lines of SHA-256 hex digits."""
    (folder / "corpus.txt").write_bytes(b"".join(
        hashlib.sha256(str(i).encode()).hexdigest().encode() + b"\n" for i in range(2000)))


@pytest.mark.parametrize("kind", list(OLD_RUNS))
def test_a_checkpoint_written_before_the_training_package_resumes_as_it_would_have(
        kind, tmp_path, monkeypatch):
    """A run of 8 steps stopped by Ctrl-C after step 4 by minixl at c7b8fe5 (--model xl: its
    memory in the checkpoint, and the objective tag every old checkpoint carries): resumed by
    today's minixl it ends with the old uninterrupted run's losses and weights."""
    monkeypatch.chdir(tmp_path)  # the old runs named their corpus "corpus.txt"
    _old_corpus(tmp_path)
    run = tmp_path / f"part-{kind}"
    run.mkdir()
    shutil.copy(OLD / f"{kind}-step4.pt", run / "checkpoint.pt")
    argv = ["train", "--model", kind, *SIZES, *OLD_RUNS[kind], "--batch-size", "4", "--steps",
            "8", "--eval-every", "4", "--eval-bytes", "512", "--ckpt-every", "4", "--log-every",
            "1", "--device", "cpu", "--no-progress", "--sample-len", "0", "--corpus",
            "corpus.txt", "--out", run.name, "--seed", "3", "--dropout", "0.1", "--resume"]
    assert main(argv) == 0
    with open(OLD / f"{kind}-metrics.csv") as f:
        old = {int(r["step"]): r for r in csv.DictReader(f)}
    with open(run / "metrics.csv") as f:
        new = {int(r["step"]): r for r in csv.DictReader(f)}
    assert list(new) == [5, 6, 7, 8]  # the old run's metrics were not copied: only what ran
    # The old run was made on another CPU, whose matrix kernels round differently: the
    # same steps agree to float noise (about 1e-9 here), not bit for bit; a resume that
    # lost the optimiser state, the data position or the memory is off by orders more.
    # (Bit-exact resume on one machine is asserted by the tests above.)
    for step in new:
        assert abs(float(new[step]["train_bpc"]) - float(old[step]["train_bpc"])) <= 2e-4, step
    # (the held-out score after the last step now reads the whole split, not 512 bytes)
    weights = torch.load(OLD / f"{kind}-step8-weights.pt", weights_only=True)
    ended = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    assert ended["step"] == 8 and ended["meta"]["kind"] == kind
    assert ended["model"].keys() == weights.keys()
    for name, t in weights.items():
        torch.testing.assert_close(ended["model"][name], t, rtol=0, atol=1e-6, msg=name)


def test_the_documented_metadata_is_what_a_run_writes(char_run, xl_run):
    """minixl.checkpoint's docstring names every key a run's meta holds (and no other)."""
    import minixl.checkpoint

    text = minixl.checkpoint.__doc__
    meta = text[text.index("    meta "):text.index("    train_config ")]
    documented = set(re.findall(r'"(\w+)" \(', meta))
    written = set()
    for run in (char_run, xl_run):
        ckpt = load_checkpoint(run / "checkpoint.pt")
        written |= set(ckpt["meta"])
        assert set(ckpt["meta"]["corpus"]) == {"source", "sha256"}
        assert '{"source": ' in meta and '"sha256": ' in meta
    assert written <= documented == {"kind", "kind_source", "objective", "corpus"}
    assert "objective" in load_checkpoint(char_run / "checkpoint.pt")["meta"]
    assert "objective" not in load_checkpoint(xl_run / "checkpoint.pt")["meta"]
