"""Chapter 2: auxiliary losses, their schedule, and the two evaluation protocols."""

import csv
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import train_args

from minixl import (AuxLossConfig, AuxLosses, AuxObjective, CharTransformer,
                    CharTransformerConfig, evaluate_bpc, evaluate_bpc_sliding, intermediate_weight,
                    layer_weights, next_byte_loss, sliding_windows)
from minixl.checkpoint import load_checkpoint
from minixl.cli import main
from minixl.data import load_corpus, pydoc_text
from minixl.aux_losses.kind import parse_aux_losses
from minixl.kinds import model_from_checkpoint

SMALL = CharTransformerConfig(n_layer=3, d_model=32, n_head=2, d_inner=64, block_size=16)


def ce(z, t):
    return F.cross_entropy(z.flatten(0, 1), t.flatten())


@pytest.mark.parametrize("n", [2, 4, 16, 64])
def test_schedule_edges(n):
    for l in range(1, n):
        stop = l / (2 * n)
        assert intermediate_weight(l, n, 0.0) == pytest.approx(l / n)
        assert intermediate_weight(l, n, stop / 2) == pytest.approx(l / (2 * n))
        assert intermediate_weight(l, n, stop * (1 - 1e-9)) > 0  # still on just before its stop
        assert intermediate_weight(l, n, stop) == 0.0
        assert intermediate_weight(l, n, 0.5) == 0.0 and intermediate_weight(l, n, 1.0) == 0.0
    assert layer_weights(n, 0.5) == [0.0] * (n - 1) + [1.0] == layer_weights(n, 1.0)
    weights = layer_weights(n, 0.1)
    assert weights == sorted(weights)  # lower layers never weigh more


def test_schedule_uses_real_division():
    # Integer division would make l // (2n) = 0: every layer off from the first step.
    assert intermediate_weight(1, 4, 0.1) == pytest.approx(0.25 * (1 - 0.1 / 0.125))


@pytest.mark.parametrize("args", [(0, 4, 0.0), (4, 4, 0.0), (1, 4, -0.1), (1, 4, 1.5)])
def test_schedule_rejects_bad_input(args):
    with pytest.raises(ValueError):
        intermediate_weight(*args)


def setup_model(aux_cfg, seed=0):
    torch.manual_seed(seed)
    model = CharTransformer(SMALL)
    aux = AuxLosses(aux_cfg, n_layer=SMALL.n_layer, d_model=SMALL.d_model)
    x = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(seed))
    y = torch.roll(x, -1, 1)
    logits, hidden = model(x, return_hidden=True)
    return model, aux, logits, hidden, y


def test_multiple_targets_weigh_one_half():
    model, aux, logits, hidden, y = setup_model(AuxLossConfig(targets=2))
    parts = aux(logits, hidden, y, progress=0.3, readout=model.readout)
    h = hidden[-1]
    want = sum(0.5 * ce(aux.target_heads[j - 1](h[:, :16 - j]), y[:, j:]) for j in (1, 2))
    torch.testing.assert_close(parts["targets"], want)
    torch.testing.assert_close(parts["loss"], ce(logits, y) + want)
    other = AuxLosses(AuxLossConfig(targets=2, target_weight=0.25), n_layer=3, d_model=32)
    other.load_state_dict(aux.state_dict())
    torch.testing.assert_close(other(logits, hidden, y, progress=0.3,
                                     readout=model.readout)["targets"], want / 2)


def test_ahead_pairs_meet_position_t_with_byte_t_plus_one_plus_j():
    from minixl import ahead_pairs
    x = torch.randint(0, 256, (2, 11))
    h, y = x[:, :-1, None].float(), x[:, 1:]  # h[t] carries byte t, y[t] is byte t + 1
    for j in range(4):
        kept_h, kept_y = ahead_pairs(h, y, j)
        assert kept_h.shape == (2, 10 - j, 1) and kept_y.shape == (2, 10 - j)
        assert torch.equal(kept_y, x[:, 1 + j:])  # byte t + 1 + j for position t = 0..T-1-j
        assert torch.equal(kept_h[..., 0].long(), x[:, :10 - j])
    with pytest.raises(ValueError, match="needs 0 <= j < T=10"):
        ahead_pairs(h, y, 10)


def test_intermediate_layers_follow_the_schedule():
    model, aux, logits, hidden, y = setup_model(AuxLossConfig(layers=2.0))
    for p in (0.0, 0.1, 0.2, 0.5):
        parts = aux(logits, hidden, y, progress=p, readout=model.readout)
        want = sum(2.0 * intermediate_weight(l, 3, p) * ce(model.readout(hidden[l - 1]), y)
                   for l in (1, 2))
        torch.testing.assert_close(parts["layers"], torch.as_tensor(want, dtype=torch.float32))
    assert parts["layers"] == 0 and parts["loss"] == parts["final"]


def test_last_position_only_and_defaults():
    model, aux, logits, hidden, y = setup_model(AuxLossConfig(positions=False))
    parts = aux(logits, hidden, y, progress=0.0, readout=model.readout)
    torch.testing.assert_close(parts["loss"], F.cross_entropy(logits[:, -1], y[:, -1]))
    model, aux, logits, hidden, y = setup_model(AuxLossConfig())
    parts = aux(logits, hidden, y, progress=0.0, readout=model.readout)
    torch.testing.assert_close(parts["loss"], ce(logits, y))
    assert list(aux.parameters()) == []


def test_gradients_reach_lower_layers_only_while_their_loss_is_on():
    model, aux, logits, hidden, y = setup_model(AuxLossConfig(layers=1.0))
    # Gradient of the auxiliary part alone w.r.t. layer 1's output.
    early = aux(logits, hidden, y, progress=0.0, readout=model.readout)["layers"]
    assert torch.autograd.grad(early, hidden[0], retain_graph=True)[0].abs().sum() > 0
    late = aux(logits, hidden, y, progress=0.4, readout=model.readout)["layers"]
    assert not late.requires_grad or torch.autograd.grad(
        late, hidden[0], allow_unused=True)[0] is None


def test_works_with_any_model_exposing_hidden_states():
    class TwoLayerMLP(nn.Module):  # causal: each position sees only its own byte
        def __init__(self):
            super().__init__()
            self.emb, self.l1, self.l2 = nn.Embedding(256, 8), nn.Linear(8, 8), nn.Linear(8, 8)
            self.out = nn.Linear(8, 256)

        def forward(self, x, *, return_hidden=False):
            h1 = torch.tanh(self.l1(self.emb(x)))
            h2 = torch.tanh(self.l2(h1))
            return (self.readout(h2), [h1, h2]) if return_hidden else self.readout(h2)

        def readout(self, h):
            return self.out(h)

    model = TwoLayerMLP()
    aux = AuxLosses(AuxLossConfig(layers=1.0, targets=1), n_layer=2, d_model=8)
    x = torch.randint(0, 256, (2, 5))
    logits, hidden = model(x, return_hidden=True)
    parts = aux(logits, hidden, x, progress=0.0, readout=model.readout)
    parts["loss"].backward()
    assert model.l1.weight.grad.abs().sum() > 0 and parts["layers"] > 0


def test_aux_errors_are_clear():
    model, aux, logits, hidden, y = setup_model(AuxLossConfig(layers=1.0))
    with pytest.raises(ValueError, match="all 3 layers"):
        aux(logits, hidden[:2], y, progress=0.0, readout=model.readout)
    with pytest.raises(ValueError, match="targets"):
        AuxLossConfig(targets=-1)
    with pytest.raises(ValueError, match=">= 0"):
        AuxLossConfig(layers=-1.0)
    big = AuxLosses(AuxLossConfig(targets=16), n_layer=3, d_model=32)
    with pytest.raises(ValueError, match="longer than 16"):
        big(logits, hidden, y, progress=0.0, readout=model.readout)
    with pytest.raises(ValueError, match="agree"):
        next_byte_loss(logits, y[:, :3])


@pytest.mark.parametrize("n,L,s", [(2, 4, 1), (5, 4, 1), (11, 4, 1), (11, 4, 3), (11, 4, 4),
                                   (100, 7, 5), (9, 16, 2), (65, 64, 64), (200, 16, 1)])
def test_sliding_windows_score_every_byte_exactly_once(n, L, s):
    width = min(L, n - 1)
    scored = [t for start, k in sliding_windows(n, L, s)
              for t in range(start + width - k + 1, start + width + 1)]
    assert sorted(scored) == list(range(1, n))  # each of bytes 1..n-1, once
    assert all(start + width <= n - 1 for start, _ in sliding_windows(n, L, s))


@pytest.mark.parametrize("args", [(1, 4, 1), (10, 4, 0), (10, 4, 5), (10, 0, 1)])
def test_sliding_windows_reject_bad_input(args):
    with pytest.raises(ValueError):
        sliding_windows(*args)


def test_batched_sliding_equals_the_definition_and_ignores_aux_heads():
    torch.manual_seed(0)
    model = CharTransformer(SMALL).eval()
    data = torch.randint(0, 256, (57,), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    with torch.no_grad():
        nll = [F.cross_entropy(model(data[max(0, t - 16):t].long()[None])[0, -1], data[t].long())
               for t in range(1, len(data))]
    want = torch.stack(nll).mean().item() / math.log(2)
    for batch in (7, 64):  # batches that split the windows unevenly, and one batch
        got = evaluate_bpc_sliding(model, data, seq_len=16, stride=1, batch_size=batch)
        assert got == pytest.approx(want, abs=1e-5)
    # stride = seq_len on whole windows is Chapter 1's estimate
    assert evaluate_bpc_sliding(model, data[:49], seq_len=16, stride=16) == pytest.approx(
        evaluate_bpc(model, data[:49], seq_len=16), abs=1e-5)


def test_objective_trains_the_losses_and_logs_the_next_byte_loss():
    torch.manual_seed(0)
    model = CharTransformer(SMALL)
    x = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, 1)
    aux = AuxLosses(AuxLossConfig(positions=False, layers=1.0, targets=1), n_layer=3, d_model=32)
    objective = AuxObjective(aux)
    parts, state = objective(model, x, y, None, 0.0)
    assert state is None and set(parts) == {"loss", "next_byte", "aux_layers", "aux_targets"}
    logits, hidden = model(x, return_hidden=True)
    want = aux(logits, hidden, y, progress=0.0, readout=model.readout)
    torch.testing.assert_close(parts["loss"], want["loss"])
    # the plain objective trains the last position only, but the log shows every position's
    torch.testing.assert_close(parts["next_byte"], ce(logits, y))
    assert parts["loss"].requires_grad and not parts["next_byte"].requires_grad
    assert [n for n, _ in objective.named_parameters()][0].startswith("aux.target_heads.0")


def test_parse_aux_losses_spec():
    c = parse_aux_losses("positions,layers=0.5,targets", targets=2)
    assert (c.positions, c.layers, c.targets, c.target_weight) == (True, 0.5, 2, 0.5)
    assert parse_aux_losses("none") == AuxLossConfig(positions=False)
    assert parse_aux_losses("positions") == AuxLossConfig()
    assert parse_aux_losses("layers").positions is False
    for bad, msg in [("position", "unknown auxiliary loss"), ("layers=x", "not a number"),
                     ("positions=2", "no weight")]:
        with pytest.raises(ValueError, match=msg):
            parse_aux_losses(bad)
    with pytest.raises(ValueError, match="--aux-targets"):
        parse_aux_losses("targets", targets=0)


AUX = ["--n-layer", "2", "--aux-losses", "positions,layers,targets"]


@pytest.fixture(scope="module")
def aux_run(tmp_path_factory):
    """An 8-step 2-layer char run with every auxiliary loss, on a small local text (its
    held-out split is about 1 kB, so the run's final evaluation is quick)."""
    folder = tmp_path_factory.mktemp("aux")
    corpus = folder / "text.txt"
    corpus.write_bytes(pydoc_text()[:20_000])
    out = folder / "run"
    assert main(train_args("char", out, 8, "--corpus", str(corpus), *AUX)) == 0
    return out, corpus


def test_aux_run_logs_parts_and_checkpoints_the_objective_apart(aux_run):
    out, _ = aux_run
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert float(rows[0]["aux_layers"]) > 0 and float(rows[0]["aux_targets"]) > 0
    assert float(rows[-1]["aux_layers"]) == 0  # all intermediate losses off after half-way
    assert all(float(r["loss"]) > float(r["train_bpc"]) for r in rows)  # targets always add
    ckpt = load_checkpoint(out / "checkpoint.pt")
    assert ckpt["objective"] and all(k.startswith("aux.target_heads.0.")
                                     for k in ckpt["objective"])
    assert ckpt["meta"]["objective"] == "positions,layers,targets targets=1"
    # Evaluation needs the model alone: it loads strictly without the auxiliary heads.
    model = model_from_checkpoint(ckpt)
    assert not any("target" in k for k in model.state_dict())


def test_cli_sliding_eval_of_an_aux_run_is_the_chapter_protocol(aux_run, capsys):
    out, corpus = aux_run
    model = model_from_checkpoint(out / "checkpoint.pt")
    want = evaluate_bpc_sliding(model, load_corpus(str(corpus)).valid[:500], seq_len=32,
                                stride=1)
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out / "checkpoint.pt"), "--protocol", "sliding",
                 "--max-bytes", "500", "--device", "cpu"]) == 0
    assert f"{want:.4f} bpc" in capsys.readouterr().out


def test_resuming_with_other_aux_losses_is_refused_with_the_diff(aux_run, capsys):
    out, corpus = aux_run
    before = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    assert main(train_args("char", out, 8, "--corpus", str(corpus), "--n-layer", "2",
                           "--aux-losses", "positions", "--resume")) == 2
    err = capsys.readouterr().err
    assert "trained with other settings" in err
    assert "objective: 'positions,layers,targets targets=1' -> 'positions targets=1'" in err
    assert (out / "checkpoint.pt").read_bytes() == before


def test_cli_eval_flag_errors(char_run, capsys):
    ck = str(char_run / "checkpoint.pt")
    for argv, msg in [
        (["--stride", "2"], "--stride applies to --protocol sliding"),
        (["--seq-len", "64"], "block_size=32"),
        (["--protocol", "memory"], "use all-positions or sliding"),
        (["--mem-len", "64"], "--mem-len applies to --model xl"),
        (["--model", "xl"], "holds a --model char checkpoint"),
        (["--max-bytes", "1"], "--max-bytes must be at least 2"),
    ]:
        assert main(["eval", "--checkpoint", ck, "--device", "cpu", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, (argv, err)
    assert main(["train", "--aux-losses", "layer", "--out", str(char_run.parent / "x")]) == 2
    assert "unknown auxiliary loss 'layer'" in capsys.readouterr().err


def _losses_and_grads(aux_cls, aux_cfg, progress, n_layer=4, compile_with=None, bf16=False):
    """The losses of aux_cls on a fixed model and batch, and the gradients of every weight
    (model and extra classifiers; None where none flows)."""
    torch.manual_seed(0)
    config = CharTransformerConfig(n_layer=n_layer, d_model=32, n_head=2, d_inner=64,
                                   block_size=16)
    model = CharTransformer(config)
    aux = aux_cls(aux_cfg, n_layer=n_layer, d_model=32)
    if compile_with is not None:
        aux.compile_losses(backend=compile_with)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (3, 16), generator=g), torch.randint(0, 256, (3, 16), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # as on a GPU
        logits, hidden = model(x, return_hidden=True)
        parts = aux(logits, hidden, y, progress=progress, readout=model.readout)
    parts["loss"].backward()
    return parts, [p.grad for p in [*model.parameters(), *aux.parameters()]]


def _same_grads(got, want, **tolerance):
    for a, b in zip(got, want, strict=True):
        if a is None or b is None:  # a weight only one of them reached must get nothing
            assert (b if a is None else a).abs().max() == 0
        else:
            torch.testing.assert_close(a, b, **tolerance)


@pytest.mark.parametrize("positions", [True, False])
@pytest.mark.parametrize("layers,targets", [(0.0, 0), (1.0, 0), (0.0, 1), (1.0, 1), (0.3, 2)])
def test_stacked_losses_equal_the_loop_in_values_and_gradients(positions, layers, targets):
    from minixl.aux_losses import StackedAuxLosses
    aux_cfg = AuxLossConfig(positions=positions, layers=layers, targets=targets)
    # 4 layers switch off at p = 1/8, 2/8 and 3/8: all on, some off, all off, the end
    for progress in (0.0, 0.05, 0.2, 0.3, 0.4, 1.0):
        want, want_grads = _losses_and_grads(AuxLosses, aux_cfg, progress)
        got, got_grads = _losses_and_grads(StackedAuxLosses, aux_cfg, progress)
        assert got.keys() == want.keys()
        for key in want:
            torch.testing.assert_close(got[key], want[key], msg=f"{key} at p={progress}")
        _same_grads(got_grads, want_grads)


def test_stacked_losses_compile_to_two_graphs_a_run_without_breaks():
    """The schedule changes the weights every step; compiled, the losses are one graph while
    an intermediate loss is on and a second after the last one turns off (p = 3/8 here)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    from minixl.aux_losses import StackedAuxLosses
    aux_cfg = AuxLossConfig(layers=1.0, targets=1)
    torch._dynamo.reset()
    counters.clear()
    try:
        counter, graphs = CompileCounter(), []
        for progress in (0.0, 0.01, 0.1, 0.2, 0.3, 0.37, 0.38, 0.5, 0.9):
            got, got_grads = _losses_and_grads(StackedAuxLosses, aux_cfg, progress,
                                               compile_with=counter)
            graphs.append(counter.frame_count)
            want, want_grads = _losses_and_grads(AuxLosses, aux_cfg, progress)
            torch.testing.assert_close(got["loss"], want["loss"])
            _same_grads(got_grads, want_grads)
        assert graphs == [1] * 6 + [2] * 3, graphs
        assert not counters["graph_break"], dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("n_layer,bf16", [(1, False), (3, True)])
def test_stacked_losses_equal_the_loop_with_one_layer_and_under_bf16(n_layer, bf16):
    """One layer (no intermediate loss: only the top layer's classifier), and under bf16
    autocast as a GPU trains (bf16 readouts, float32 losses; bf16's tolerance)."""
    from minixl.aux_losses import StackedAuxLosses
    aux_cfg = AuxLossConfig(layers=1.0, targets=1)
    tolerance = dict(rtol=2e-2, atol=2e-3) if bf16 else {}
    for progress in (0.0, 0.2, 0.9):
        want, want_grads = _losses_and_grads(AuxLosses, aux_cfg, progress, n_layer, bf16=bf16)
        got, got_grads = _losses_and_grads(StackedAuxLosses, aux_cfg, progress, n_layer,
                                           bf16=bf16)
        for key in want:
            torch.testing.assert_close(got[key], want[key], **tolerance)
        _same_grads(got_grads, want_grads, **tolerance)
