"""--dtype: bf16 autocast on a CPU or a GPU, fp32, and the `auto` rule that picks between them
(minixl.device.resolve_dtype); weights, optimiser state and checkpoints stay fp32."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minixl import device as dev
from minixl.checkpoint import load_checkpoint
from minixl.kinds import kind_of

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


@pytest.fixture
def probe_cache(tmp_path, monkeypatch):
    """The probe's cache in a folder of the test's own, and no answer remembered in-process."""
    monkeypatch.setenv("MINIXL_CACHE", str(tmp_path / "cache"))
    dev.cpu_bf16_speedup.cache_clear()
    yield tmp_path / "cache" / "bf16_probe.json"
    dev.cpu_bf16_speedup.cache_clear()


def test_fp32_and_bf16_are_taken_as_asked_and_a_wrong_name_is_refused():
    assert dev.resolve_dtype("fp32", CPU, kind=kind_of("char")) == ("fp32", "as asked")
    assert dev.resolve_dtype("bf16", CPU, kind=kind_of("xl")) == ("bf16", "as asked")
    with pytest.raises(ValueError, match="--dtype 'fp16': expected one of fp32, bf16, auto"):
        dev.resolve_dtype("fp16", CPU)


def test_auto_keeps_fp32_on_a_cpu_for_a_library_caller_and_an_unmeasured_kind():
    assert dev.resolve_dtype("auto", CPU)[0] == "fp32"
    dtype, why = dev.resolve_dtype("auto", CPU, kind=kind_of("segtree"))
    assert dtype == "fp32" and "not measured for --model segtree" in why


def test_auto_never_picks_bf16_on_a_cpu_without_bf16_instructions(probe_cache, monkeypatch):
    monkeypatch.setattr(dev, "_cpu_flags", lambda: {"sse2", "avx2", "fma"})
    dtype, why = dev.resolve_dtype("auto", CPU, kind=kind_of("char"))
    assert dtype == "fp32" and "no bf16 instructions" in why
    assert not probe_cache.exists()  # nothing was probed


def test_auto_follows_the_measured_speedup_cached_for_the_machine(probe_cache, monkeypatch):
    monkeypatch.setattr(dev, "_cpu_flags", lambda: {"avx512_bf16"})
    speedup = dev.cpu_bf16_speedup()  # measured once, then read back from the file
    key, stored = next(iter(json.loads(probe_cache.read_text()).items()))
    assert f"threads={torch.get_num_threads()}" in key and stored == round(speedup, 3)
    for value, want in ((1.2, "fp32"), (2.5, "bf16")):
        probe_cache.write_text(json.dumps({key: value}))
        dev.cpu_bf16_speedup.cache_clear()
        dtype, why = dev.resolve_dtype("auto", CPU, kind=kind_of("char"))
        assert dtype == want and f"{value:.1f}x" in why, why


def _train(dtype: str, steps: int = 30, **run):
    from minixl.char_transformer import CharTransformer, CharTransformerConfig
    from minixl.data import RandomWindows, load_corpus
    from minixl.training import TrainConfig, train

    torch.manual_seed(0)
    model = CharTransformer(CharTransformerConfig(n_layer=2, d_model=64, n_head=4, d_inner=256,
                                                  block_size=64))
    data = load_corpus("pydoc").train
    result = train(model, TrainConfig(steps=steps, batch_size=8, lr=3e-3, warmup=3,
                                      device="cpu", dtype=dtype, eval_every=10 ** 6,
                                      log_every=10 ** 6, ckpt_every=10 ** 6),
                   batches=RandomWindows(data, 8, 64, seed=0), progress=False, **run)
    return model, result


def test_a_bf16_run_ends_close_to_the_fp32_one_and_keeps_fp32_weights():
    fp32, r32 = _train("fp32")
    bf16, r16 = _train("bf16")
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    pairs = [(a, b) for a, b in zip(fp32.parameters(), bf16.parameters()) if a.dim() == 2]
    assert any(not torch.equal(a, b) for a, b in pairs)  # bf16 autocast did run
    for a, b in pairs:  # ... and led each matrix where fp32 leads it
        assert (a - b).norm() < 0.1 * a.norm()
    x = torch.randint(0, 256, (4, 64))
    with torch.no_grad():
        l32, l16 = (torch.log_softmax(m(x), -1) for m in (fp32, bf16))
    assert (l32 - l16).abs().mean() < 0.1


def test_the_fused_attention_of_chapter_one_stays_fp32_under_cpu_autocast():
    """Its forward and backward equal fp32 attention given the same bf16-rounded inputs."""
    from minixl.char_transformer import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(2, 16, 32)
    seen = []
    hook = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.dtype, torch.is_autocast_enabled("cpu")))
        return hook(q, k, v, **kw)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mha(x).sum().backward()
    finally:
        torch.nn.functional.scaled_dot_product_attention = hook
    assert seen == [(torch.float32, False)]


@pytest.mark.slow  # over 1.5 s: the quick loop stays well under a minute
def test_minixl_train_says_its_dtype_resumes_with_it_and_evaluates_in_either(tmp_path):
    out = tmp_path / "run"
    base = [sys.executable, "-m", "minixl", "train", "--model", "char", "--preset", "tiny",
            "--n-layer", "1", "--d-model", "32", "--block-size", "32", "--batch-size", "4",
            "--steps", "4", "--eval-every", "2", "--ckpt-every", "2", "--eval-bytes", "256",
            "--no-progress", "--out", str(out)]
    r = subprocess.run([*base, "--dtype", "bf16"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert ", bf16 (as asked), run folder" in r.stdout.splitlines()[0]
    ckpt = load_checkpoint(out / "checkpoint.pt", for_resume=True)
    assert ckpt["train_config"]["dtype"] == "bf16"
    states = [v for s in ckpt["optimizer"]["state"].values() for v in s.values()
              if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert {t.dtype for t in [*ckpt["model"].values(), *states]} == {torch.float32}
    r = subprocess.run([*base, "--steps", "6", "--resume", "--allow-change", "steps"],
                       capture_output=True, text=True,
                       cwd=ROOT)  # no --dtype: the checkpoint's is kept
    assert r.returncode == 0, r.stderr
    assert ", bf16 (kept from the checkpoint), run folder" in r.stdout.splitlines()[0]
    assert load_checkpoint(out / "checkpoint.pt")["train_config"]["dtype"] == "bf16"
    for dtype in ("fp32", "bf16"):
        r = subprocess.run([sys.executable, "-m", "minixl", "eval", "--checkpoint",
                            str(out / "checkpoint.pt"), "--max-bytes", "512", "--dtype", dtype],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0 and " bpc (512 bytes" in r.stdout, r.stderr


def test_a_checkpoint_from_before_the_setting_resumes_as_it_trained(tmp_path):
    """A checkpoint whose settings have no dtype (written before it existed, on a CPU: fp32)
    resumes from Python with TrainConfig's default, auto, in fp32, and records it."""
    out = tmp_path / "run"
    _train("auto", steps=4, out=out)
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["train_config"]["dtype"] == "fp32"  # auto, resolved on this CPU without a kind
    del ckpt["train_config"]["dtype"]
    torch.save(ckpt, out / "checkpoint.pt")
    _train("auto", steps=6, out=out, resume=True, allow_change=("steps",))
    assert load_checkpoint(out / "checkpoint.pt")["train_config"]["dtype"] == "fp32"
