"""The training loop: the weights of Chapter 1's hand-written loop, the run folder, weight-decay
groups, gradient accumulation, batches where the data is, and a model state of any shape."""

import dataclasses
import math
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import TINY_CONFIGS, first_quick, near_uniform, train_args
from minixl import CharTransformer, CharTransformerConfig, lr_at
from minixl.checkpoint import FORMAT, load_checkpoint
from minixl.cli import main
from minixl.data import OrderedStreams, RandomWindows, step_seed
from minixl.kinds import KINDS
from minixl.training import TrainConfig, TrainingInterrupted, train
from minixl.training import state as states

TINY = CharTransformerConfig(n_layer=2, d_model=32, n_head=4, d_inner=64, block_size=32)
STREAM = torch.randint(0, 256, (4 * 8 * 5 + 1,), generator=torch.Generator().manual_seed(1)).byte()

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


# ---------------------------------------------------------------- the book's loop

@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_train_gives_the_weights_of_the_books_loop(dropout):
    """Chapter 1's loop, written out: the trainer must reproduce it bit for bit. Settings
    other than the defaults, so that each must reach the loop; the trainer seeds each step's
    dropout masks from the run's seed and the step."""
    config = replace(TINY, dropout=dropout)
    data = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0)).byte()
    steps, B, seed = 12, 4, 7
    hp = dict(lr=3e-3, warmup=4, min_lr_frac=0.3)
    weight_decay, clip = 0.05, 0.5
    torch.manual_seed(0)
    model = CharTransformer(config)
    train(model, TrainConfig(steps=steps, batch_size=B, weight_decay=weight_decay,
                             grad_clip=clip, seed=seed, device="cpu", **hp),
          batches=RandomWindows(data, B, 32, seed=seed), progress=False)

    torch.manual_seed(0)
    ref = CharTransformer(config)
    opt = torch.optim.AdamW(ref.parameters(), lr=hp["lr"], weight_decay=weight_decay)
    batches, clipped = RandomWindows(data, B, 32, seed=seed), 0
    for step in range(steps):
        x, y, _ = batches(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, **hp)
        torch.manual_seed(step_seed(seed, step, stream=1))  # this step's dropout masks
        logits, _ = ref.step(x, None)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clipped += float(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)) > clip
        opt.step()
    assert clipped, "the clip never acted: this test would not notice a trainer without it"
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_run_folder(char_run):
    assert {p.name for p in char_run.iterdir()} == {"checkpoint.pt", "metrics.csv", "loss.png"}
    rows = (char_run / "metrics.csv").read_text().splitlines()
    header, rows = rows[0].split(","), [r.split(",") for r in rows[1:]]
    assert header[:4] == ["step", "train_bpc", "valid_bpc", "loss"]
    assert [int(r[0]) for r in rows] == [2, 4, 6, 8]  # --log-every 2 --steps 8
    valid = header.index("valid_bpc")
    assert [bool(r[valid]) for r in rows] == [False, True, False, True]  # --eval-every 4
    assert all(near_uniform(float(r[1])) for r in rows)  # bits, 8 steps from a fresh start
    assert (char_run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ckpt = load_checkpoint(char_run / "checkpoint.pt", for_resume=True)
    assert ckpt["format"] == FORMAT and ckpt["step"] == 8 and ckpt["meta"]["kind"] == "char"
    assert ckpt["train_config"]["steps"] == 8 and ckpt["state"] is None
    assert len(ckpt["meta"]["corpus"]["sha256"]) == 64


def test_divergence_of_a_new_run_writes_no_checkpoint(tmp_path, small_corpus, capsys):
    out = tmp_path / "run"
    assert main(train_args("char", out, 8, "--corpus", str(small_corpus), "--lr", "1e30")) == 3
    err = capsys.readouterr().err
    assert "training diverged" in err and "none (no checkpoint was written)" in err
    assert not (out / "checkpoint.pt").exists()


def test_training_config_refuses_non_finite_and_out_of_range_values():
    for bad in (dict(lr=float("inf")), dict(lr=float("nan")), dict(lr=0.0), dict(steps=0),
                dict(batch_size=0), dict(grad_clip=-1.0), dict(min_lr_frac=2.0),
                dict(weight_decay=float("nan")), dict(eval_bytes=1), dict(warmup=-1)):
        with pytest.raises(ValueError):
            TrainConfig(**bad)
    TrainConfig(lr=1e-3, grad_clip=0.0, eval_bytes=None)  # 0 = no clipping, None = all


# ---------------------------------------------------------------- weight decay groups

def _tiny(kind, **extra):
    """A tiny model of `kind` (conftest's TINY_CONFIGS), and its objective with every weight
    it can have."""
    k = KINDS[kind]
    cfg = k.config(**{**TINY_CONFIGS[kind], **extra})
    torch.manual_seed(0)
    model = k.build(cfg)
    aux = dict(aux_losses="positions,layers,targets", aux_targets=2) if k.objective and \
        k.objective.options else {}
    return model, k.build_objective(cfg, k.objective_options("tiny", aux))


LAYER_NORMS = ["ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"]
NOT_DECAYED = {  # every tensor that weight_decay_on="matrices" leaves alone, per book kind
    "char": ["pos", *(f"blocks.0.{n}" for n in LAYER_NORMS + [
        "attn.qkv.bias", "attn.out.bias", "ff.0.bias", "ff.2.bias"]), "ln_f.weight", "ln_f.bias"],
    "shaw": [*(f"blocks.0.{n}" for n in LAYER_NORMS + [
        "attn.w_k", "attn.w_v", "attn.qkv.bias", "attn.out.bias", "ff.0.bias", "ff.2.bias"]),
        "ln_f.weight", "ln_f.bias"],
    "xl": ["out_bias", "layers.0.dec_attn.r_w_bias", "layers.0.dec_attn.r_r_bias",
           "layers.0.dec_attn.layer_norm.weight", "layers.0.dec_attn.layer_norm.bias",
           "layers.0.pos_ff.CoreNet.0.bias", "layers.0.pos_ff.CoreNet.3.bias",
           "layers.0.pos_ff.layer_norm.weight", "layers.0.pos_ff.layer_norm.bias"],
    "xlnet": ["mask_emb", "lm_bias", "attn.0.r_w_bias", "attn.0.r_r_bias", "attn.0.r_s_bias",
              "attn.0.seg_embed", "attn.0.layer_norm.weight", "attn.0.layer_norm.bias",
              "ff.0.layer_1.bias", "ff.0.layer_2.bias", "ff.0.layer_norm.weight",
              "ff.0.layer_norm.bias"],
    "segtree": [*(f"blocks.0.{n}" for n in LAYER_NORMS + [
        "attn.rel_k", "attn.qkv.bias", "attn.proj.bias", "ff.0.bias", "ff.2.bias"]),
        "ln_f.weight", "ln_f.bias"],
}
AUX_NOT_DECAYED = [f"aux.target_heads.{i}.{n}" for i in (0, 1)
                   for n in ("0.weight", "0.bias", "1.bias")]  # a layer norm and a bias each


@pytest.mark.parametrize("kind", list(KINDS))
def test_decay_groups_leave_biases_norms_u_v_and_position_tables_alone(kind):
    from minixl.training import decay_groups, decays

    model, objective = _tiny(kind)
    own = objective if objective is not None else torch.nn.Module()
    named, no_decay = dict(model.named_parameters()), KINDS[kind].no_decay
    kept_names = sorted(n for n, p in named.items() if not decays(n, p, no_decay))
    own_named = dict(own.named_parameters())
    if kind in NOT_DECAYED:  # the book's kinds, by name; a kind added later by the rules below
        assert kept_names == sorted(NOT_DECAYED[kind])
        assert sorted(n for n, p in own_named.items() if not decays(n, p, no_decay)) == (
            sorted(AUX_NOT_DECAYED) if kind in ("char", "shaw") else [])

    params = [p for m in (model, own) for p in m.parameters()]
    [every] = decay_groups([model, own], 0.1, on="all")  # Chapter 1's loop: one group
    assert every["weight_decay"] == 0.1
    assert [id(p) for p in every["params"]] == [id(p) for p in params]
    decayed, kept = decay_groups([model, own], 0.1, on="matrices", no_decay=no_decay)
    assert (decayed["weight_decay"], kept["weight_decay"]) == (0.1, 0.0)
    assert sorted(map(id, decayed["params"] + kept["params"])) == sorted(map(id, params))
    assert all(p.dim() >= 2 for p in decayed["params"])  # and the tables of NOT_DECAYED are 2-D+
    assert {id(named[n]) for n in kept_names} <= set(map(id, kept["params"]))
    with pytest.raises(ValueError, match="on must be one of all, matrices"):
        decay_groups([model], 0.1, on="biases")


def test_weight_decay_on_matrices_decays_only_the_matrices(tmp_path):
    """One step of two runs that differ only in weight decay (0 and 10; the same gradients):
    with weight_decay_on="matrices" the tensors of the second group end as in the run without
    decay, every matrix does not."""
    data = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0)).byte()
    ends = []
    for wd in (0.0, 10.0):
        torch.manual_seed(0)
        model = CharTransformer(replace(TINY, pos="per_layer"))
        cfg = TrainConfig(steps=1, batch_size=4, warmup=0, weight_decay=wd,
                          weight_decay_on="matrices", device="cpu")
        train(model, cfg, batches=RandomWindows(data, 4, 32), progress=False,
              no_decay=KINDS["char"].no_decay)
        ends.append(dict(model.named_parameters()))
    from minixl.training import decays
    no_decay = KINDS["char"].no_decay
    for name, p in ends[0].items():
        same = torch.equal(p, ends[1][name])
        assert same == (not decays(name, p, no_decay)), name
    assert not decays("pos", ends[0]["pos"], no_decay)
    assert decays("tok.weight", ends[0]["tok.weight"], no_decay)


# ---------------------------------------------------------------- gradient accumulation

def _accumulated(kind, grad_accum, steps=3):
    """Weights and memory after `steps` steps of batch 4 in grad_accum micro-batches."""
    torch.manual_seed(0)
    common = dict(n_layer=2, d_model=32, n_head=2, d_inner=64)
    model_cfg = (CharTransformerConfig(block_size=8, **common) if kind == "char" else
                 KINDS["xl"].config(d_head=16, tgt_len=8, mem_len=8, **common))
    model = KINDS[kind].build(model_cfg)
    seen = []
    source = KINDS[kind].batches(STREAM, 4, model_cfg, seed=3)

    def batches(step):  # xl: 5 segments per pass, so the memory is carried in every step here
        return source(step)

    def objective(m, x, y, state, progress):
        parts, state = training.next_byte_objective(m, x, y, state, progress)
        seen.append(state)
        return parts, state

    from minixl import training
    # A small lr: a few weights (the keys' biases) have a gradient that is 0 but for float
    # noise, which Adam scales up to steps of about lr whatever the order of additions.
    cfg = TrainConfig(steps=steps, batch_size=4, grad_accum=grad_accum, lr=3e-4, warmup=1,
                      device="cpu")
    train(model, cfg, batches=batches, objective=objective, progress=False)
    memory = torch.cat([s[0] for s in seen[-grad_accum:]]) if kind == "xl" else None
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}  # of the last step
    return model.state_dict(), grads, memory


@pytest.mark.parametrize("kind", ["char", "xl"])
def test_gradient_accumulation_gives_the_weights_of_one_batch(kind):
    """A batch of 4 in 2 micro-batches of 2 (xl: each with its own rows of the memory) has
    the gradients of the whole batch at once (the mean loss, not the sum) and ends with its
    weights and memory, up to the order of float additions."""
    one, grad_one, mem_one = _accumulated(kind, 1)
    two, grad_two, mem_two = _accumulated(kind, 2)
    for name in grad_one:
        torch.testing.assert_close(grad_two[name], grad_one[name], rtol=1e-4, atol=1e-6,
                                   msg=name)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-6, msg=name)
    if kind == "xl":
        assert mem_one.shape == mem_two.shape == (4, 8, 32)
        torch.testing.assert_close(mem_two, mem_one, rtol=0, atol=1e-6)


def test_gradient_accumulation_must_divide_the_batch(monkeypatch):
    with pytest.raises(ValueError, match="batch_size 6 does not split into grad_accum 4 equal "
                       "micro-batches: use a batch size that is a multiple of 4"):
        TrainConfig(batch_size=6, grad_accum=4)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would, for 2 processes
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"batch_size 4 does not split into 2 processes x 4 "
                       r"micro-batches \(grad_accum\): use a batch size that is a multiple of 8"):
        train(CharTransformer(TINY), TrainConfig(batch_size=4, grad_accum=4, device="cpu"),
              batches=None, progress=False)


def test_which_weights_get_no_gradient():
    """Every weight gets a gradient in every step, but XLNet's segment bias and encodings
    (a language model's window is one segment): this is why DistributedDataParallel runs
    with find_unused_parameters (without it, XLNet's second step would fail)."""
    from minixl.training import next_byte_objective
    for kind in KINDS:
        model, objective = _tiny(kind)
        objective = objective or next_byte_objective
        length = getattr(model.config, KINDS[kind].length)
        x = torch.randint(0, 256, (2, length))
        parts, _ = objective(model, x, x.roll(-1, 1), None, 0.5)
        parts["loss"].backward()
        own = objective.parameters() if isinstance(objective, torch.nn.Module) else []
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        missing += [n for n, p in (objective.named_parameters() if own else []) if p.grad is None]
        assert missing == (["attn.0.r_s_bias", "attn.0.seg_embed"] if kind == "xlnet" else []), (
            kind, missing)


# ---------------------------------------------------------------- batches where the data is

def test_batch_sources_give_the_same_batches_and_keep_them_on_the_datas_device():
    """RandomWindows and OrderedStreams cut a step's batch where the data lives (on a GPU
    when `minixl train` put the corpus there): the same batches as gathering on the host
    (reference below), and on the meta device the batch stays on it, never read back."""
    data = torch.randint(0, 256, (3001,), generator=torch.Generator().manual_seed(2)).byte()
    windows, streams = RandomWindows(data, 4, 16, seed=5), KINDS["xl"].batches(
        data, 4, KINDS["xl"].config(n_layer=1, tgt_len=16, mem_len=16), seed=5)
    n = (len(data) - 1) // 4
    xs, ys = data[:n * 4].long().view(4, n), data[1:n * 4 + 1].long().view(4, n)
    for step in (0, 1, 7, 46, 47):
        gen = torch.Generator().manual_seed(step_seed(5, step))
        starts = torch.randint(len(data) - 16, (4,), generator=gen)
        ref = torch.stack([data[s:s + 17] for s in starts.tolist()]).long()
        x, y, fresh = windows(step)
        assert torch.equal(x, ref[:, :-1]) and torch.equal(y, ref[:, 1:]) and fresh
        assert x.dtype == torch.long
        seg = step % (n // 16)
        x, y, fresh = streams(step)
        assert torch.equal(x, xs[:, seg * 16:(seg + 1) * 16]) and fresh == (seg == 0)
        assert torch.equal(y, ys[:, seg * 16:(seg + 1) * 16]) and x.dtype == torch.long
    meta = data.to("meta")
    for source in (RandomWindows(meta, 4, 16, seed=5), KINDS["xl"].batches(
            meta, 4, KINDS["xl"].config(n_layer=1, tgt_len=16, mem_len=16), seed=5)):
        x, y, _ = source(3)
        assert x.device.type == y.device.type == "meta" and x.shape == y.shape == (4, 16)




# ---------------------------------------------------------------- a state of any shape

@dataclasses.dataclass
class Carried:
    """A state as a model of one's own might carry it: a dataclass holding a tensor, a dict
    of tensors, a named tuple and a plain value."""

    last: torch.Tensor  # [B, 1], the last byte read
    totals: dict  # {"sum": [B], "count": [B]}
    span: "Span"
    unit: str = "bytes"


class Span(NamedTuple):
    first: torch.Tensor  # [B]
    length: int


@dataclasses.dataclass
class RunningConfig:
    block_size: int = 8


class RunningMean(nn.Module):
    """A bigram table plus a term in the running mean of every byte read so far: its logits
    depend on the state, so a wrong split or join of the state changes the loss."""

    def __init__(self, config: RunningConfig):
        super().__init__()
        self.config = config
        self.table = nn.Embedding(256, 256)
        self.mix = nn.Linear(1, 256)

    def step(self, tokens: torch.Tensor, state: Carried | None = None):
        B, T = tokens.shape
        if state is None:
            state = Carried(tokens[:, :1], {"sum": torch.zeros(B), "count": torch.zeros(B)},
                            Span(tokens[:, 0].float(), 0))
        sums = state.totals["sum"][:, None] + tokens.float().cumsum(1)  # (B, T)
        counts = state.totals["count"][:, None] + torch.arange(1, T + 1)
        logits = self.table(tokens) + self.mix((sums / counts / 256)[..., None])  # (B, T, V)
        new = Carried(tokens[:, -1:], {"sum": sums[:, -1], "count": counts[:, -1].float()},
                      Span(state.span.first, state.span.length + T), state.unit)
        return logits, new


def test_a_state_of_any_shape_is_split_joined_moved_and_saved():
    state = Carried(torch.arange(4.0)[:, None], {"sum": torch.arange(4.0), "count": torch.ones(4)},
                    Span(torch.zeros(4), 3))
    halves = [states.rows(state, slice(0, 2)), states.rows(state, slice(2, 4))]
    assert halves[1].last.tolist() == [[2.0], [3.0]] and halves[1].span.length == 3
    joined = states.cat_rows(halves)
    assert isinstance(joined, Carried) and isinstance(joined.span, Span)
    assert torch.equal(joined.totals["sum"], state.totals["sum"]) and joined.unit == "bytes"
    saved = states.encode(states.to_device(state, "cpu"))
    buffer = __import__("io").BytesIO()
    torch.save(saved, buffer)  # what a checkpoint holds, read back as a checkpoint is read
    buffer.seek(0)
    back = states.decode(torch.load(buffer, weights_only=True))
    assert isinstance(back, Carried) and isinstance(back.span, Span) and back.span.length == 3
    assert torch.equal(back.last, state.last) and torch.equal(back.totals["count"], torch.ones(4))
    assert states.encode([torch.ones(2)])[0].shape == (2,)  # a list of tensors stays as it is
    with pytest.raises(states.StateError, match="plain value of the state differs"):
        states.cat_rows([Span(torch.zeros(1), 1), Span(torch.zeros(1), 2)])
    for bad, name in (({"x": {1, 2}}, "set"), ([object()], "object")):
        with pytest.raises(states.StateError, match=f"this one holds a {name}: make step"):
            states.rows(bad, slice(0, 1))


def _running_run(out, *, steps=8, grad_accum=1, resume=False, stop_at=None):
    torch.manual_seed(0)
    model = RunningMean(RunningConfig())
    source = OrderedStreams(STREAM, 4, 8)

    def batches(step):
        if step == stop_at:
            __import__("os").kill(__import__("os").getpid(), __import__("signal").SIGINT)
        return source(step)

    cfg = TrainConfig(steps=steps, batch_size=4, grad_accum=grad_accum, lr=1e-2, seed=1,
                      log_every=1, eval_every=100, ckpt_every=100, device="cpu")
    return train(model, cfg, batches=batches, out=out, resume=resume, progress=False)


def test_a_dataclass_state_trains_in_micro_batches_and_resumes_exactly(tmp_path):
    """The state of RunningMean (a dataclass of a tensor, a dict and a named tuple) is cut
    into micro-batches, joined, saved in the checkpoint and read back on resume."""
    whole = _running_run(tmp_path / "whole")
    halves = _running_run(tmp_path / "halves", grad_accum=2)
    for (name, a), b in zip(whole.model.state_dict().items(),
                            halves.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    with pytest.raises(TrainingInterrupted):
        _running_run(tmp_path / "part", stop_at=3)
    saved = load_checkpoint(tmp_path / "part" / "checkpoint.pt", for_resume=True)
    assert saved["step"] == 4 and saved["state"]["minixl.state.class"].endswith(":Carried")
    resumed = _running_run(tmp_path / "part", resume=True)
    for (name, a), b in zip(whole.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in whole.history[4:]]
    ends = [load_checkpoint(tmp_path / run / "checkpoint.pt", for_resume=True)["state"]
            for run in ("part", "whole")]
    # 5 segments of 8 a pass: steps 6 to 8 read the second pass, from a fresh state
    assert [e["fields"]["span"]["fields"]["length"] for e in ends] == [24, 24]
    assert torch.equal(ends[0]["fields"]["totals"]["sum"], ends[1]["fields"]["totals"]["sum"])


@dataclasses.dataclass
class Tallied:
    seen: torch.Tensor  # [B, 2]
    steps: int = dataclasses.field(default=0, init=False)  # set by the model, not __init__
    last: torch.Tensor | None = dataclasses.field(default=None, init=False)  # [B]


def test_a_dataclass_state_keeps_its_fields_that_init_does_not_take():
    """A field with init=False goes through a split, a join and the trainer's detach as it
    was, tensors cut by rows like the others (rebuilding from __init__ alone would reset it)."""
    state = Tallied(torch.arange(8.0, requires_grad=True).view(4, 2) * 1)
    state.steps, state.last = 5, torch.arange(4.0, requires_grad=True) * 1
    half = states.rows(state, slice(2, 4))
    assert half.steps == 5 and torch.equal(half.last, torch.tensor([2.0, 3.0]))
    again = states.cat_rows([states.rows(state, slice(0, 2)), half])
    assert again.steps == 5 and torch.equal(again.last, state.last)
    cut = states.map_tensors(torch.Tensor.detach, state)
    assert cut.steps == 5 and not cut.last.requires_grad and not cut.seen.requires_grad
    bad = Tallied(torch.zeros(3, 2))
    bad.last = torch.zeros(4)  # the non-init field is checked too
    with pytest.raises(states.StateError, match=r"shape \[4\] for an input of 3 rows"):
        states.check_rows(bad, 3)


def test_a_state_the_trainer_cannot_split_is_one_clear_error(tmp_path):
    class Opaque(RunningMean):
        def step(self, tokens, state=None):
            logits, _ = super().step(tokens, None)
            return logits, {"seen": {int(tokens[0, 0])}}  # a set: not a tensor container

    torch.manual_seed(0)
    cfg = TrainConfig(steps=2, batch_size=4, grad_accum=2, device="cpu")
    with pytest.raises(states.StateError, match="this one holds a set"):
        train(Opaque(RunningConfig()), cfg, batches=OrderedStreams(STREAM, 4, 8),
              progress=False)


def test_the_optimisers_kernel_on_the_cpu(char_run):
    """By default the foreach kernels (Chapter 1's updates, bit for bit: the first test); a
    run set up by `minixl train` asks for the fused kernel, which is faster and rounds
    otherwise; the kernel is no part of a run's identity (a resume may change it)."""
    from minixl.training import make_optimizer
    from minixl.training.run_folder import CHANGEABLE_ON_RESUME

    model = CharTransformer(TINY)
    cpu = torch.device("cpu")
    [group] = make_optimizer([model], TrainConfig(), cpu).param_groups
    assert group["foreach"] and not group["fused"]
    [group] = make_optimizer([model], TrainConfig(fused=True), cpu).param_groups
    assert group["fused"]
    groups = load_checkpoint(char_run / "checkpoint.pt", for_resume=True)["optimizer"]
    assert [g["fused"] for g in groups["param_groups"]] == [True, True] and "fused" in CHANGEABLE_ON_RESUME


class Reading(RunningMean):
    """RunningMean that notes, at each call of step, whether it was handed a state."""

    def __init__(self, config: RunningConfig):
        super().__init__(config)
        self.handed = []

    def step(self, tokens, state=None):
        self.handed.append(state is not None)
        return super().step(tokens, state)


def _reading_run(out, *, steps, batch_size=4, resume=False, allow=(), corpus="a",
                 stop_at=None):
    """A RunningMean run on ordered streams (5 segments of 8 a pass, from a fresh state
    each pass); (the model, the progress its objective was told at each step)."""
    torch.manual_seed(0)
    model, told = Reading(RunningConfig()), []
    source = OrderedStreams(STREAM, batch_size, 8)

    def objective(net, x, y, state, progress):
        told.append(progress)
        if len(told) == stop_at:  # a real Ctrl-C: the run ends after this step, saved
            os.kill(os.getpid(), signal.SIGINT)
        logits, state = net.step(x, state)
        return {"loss": F.cross_entropy(logits.flatten(0, 1), y.flatten())}, state

    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=1e-2, seed=1, log_every=1,
                      eval_every=100, ckpt_every=100, device="cpu")
    train(model, cfg, batches=source, objective=objective, out=out, resume=resume,
          allow_change=allow, meta={"corpus": {"source": corpus}}, progress=False)
    return model, told


def test_the_objective_is_told_each_steps_progress():
    """progress = step / steps, from 0 (Chapter 2's schedule turns its losses off by it: a
    progress one step ahead shortens every loss's life by a step)."""
    assert _reading_run(None, steps=8)[1] == [k / 8 for k in range(8)]


@pytest.mark.slow
def test_a_resumed_run_is_told_the_progress_an_unbroken_one_is(tmp_path):
    """Stopped by a Ctrl-C after its third step and resumed, the objective is told what an
    unbroken run's is, step for step."""
    _, whole = _reading_run(tmp_path / "whole", steps=8)
    with pytest.raises(TrainingInterrupted):
        _reading_run(tmp_path / "part", steps=8, stop_at=3)
    _, rest = _reading_run(tmp_path / "part", steps=8, resume=True)
    assert whole == [k / 8 for k in range(8)] and rest == whole[3:]


@pytest.mark.parametrize("change", first_quick(["corpus", "batch_size"]))
def test_a_resumed_run_on_other_streams_starts_from_an_empty_memory(tmp_path, change, capsys):
    """The memory a checkpoint keeps belongs to the streams it read: resumed with another
    corpus or batch size (--allow-change) the model is handed no state at its first step,
    and the run says so; resumed with only more steps, it is handed the saved one (so the
    test can see a state go through)."""
    _reading_run(tmp_path / "kept", steps=3)
    model, _ = _reading_run(tmp_path / "kept", steps=4, resume=True, allow=("steps",))
    assert model.handed == [True]  # step 3 of 5 in a pass: the memory goes on
    other = dict(corpus="b") if change == "corpus" else dict(batch_size=2)
    _reading_run(tmp_path / "other", steps=3)
    capsys.readouterr()
    model, _ = _reading_run(tmp_path / "other", steps=4, resume=True,
                            allow=("steps", change), **other)
    assert model.handed == [False]
    assert "resuming with an empty state (memory): it belonged to other streams" in \
        capsys.readouterr().out


def test_the_schedule_warms_up_then_falls_by_half_a_cosine_to_its_floor():
    """lr_at written out (the trainer's weights are checked against a loop that calls it, so
    the schedule itself needs its own check): a linear warm-up to the peak, then half a
    cosine, the midpoint half-way between peak and floor, the floor after the last step."""
    hp = dict(lr=2.0, warmup=4, min_lr_frac=0.1)
    rates = [lr_at(s, 24, **hp) for s in range(25)]
    assert rates[:5] == [0.5, 1.0, 1.5, 2.0, 2.0]  # step 4 starts the cosine at its top
    assert all(a > b for a, b in zip(rates[4:], rates[5:]))  # falling, never rising
    assert abs(rates[14] - (0.2 + 2.0) / 2) < 1e-12  # progress 1/2: cos(pi/2) = 0
    assert abs(rates[9] - (0.2 + 0.9 * (1 + math.cos(math.pi / 4)))) < 1e-12
    assert abs(rates[24] - 0.2) < 1e-12
