"""minixl.check.kind, the checks every model kind must pass: the book's five pass them, a
student's GRU kind passes them, and each check fails, saying what is wrong, on a kind that
breaks its rule (a state not batch-first, a model that reads the future, a state that forgets
the bytes read, a random generator the checkpoint does not keep)."""

from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn as nn

from conftest import TINY_CONFIGS, first_quick
from minixl import check
from minixl.kinds import ModelKind, Preset
from minixl.kinds import KINDS


@pytest.mark.parametrize("name", first_quick(list(KINDS), list(KINDS)))
def test_the_books_kinds_pass_every_check(name, capsys):
    assert check.kind(KINDS[name], config=TINY_CONFIGS[name]), capsys.readouterr().out
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.count("PASS") + out.count("SKIP") == 6, out


@dataclass
class RecurrentConfig:
    vocab_size: int = 256
    block_size: int = 8
    d: int = 8
    batch_first: bool = True  # the state as the trainer needs it: rows along dim 0
    detach: bool = True
    peek: bool = False  # read the next byte too (a leak)
    forget: bool = False  # start every call afresh: the state it is given goes unread
    noise: bool = False  # dropout-like noise from a generator of its own


class Recurrent(nn.Module):
    """A GRU whose state is its hidden vector, as a student writes one."""

    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(256, config.d)
        self.gru = nn.GRU(config.d, config.d, batch_first=True)
        self.out = nn.Linear(config.d, 256)
        self.gen = torch.Generator().manual_seed(0)  # not in any checkpoint

    def step(self, tokens, state=None):
        h = None if state is None or self.config.forget else \
            state.transpose(0, 1).contiguous() if self.config.batch_first else state
        x = self.emb(tokens)
        if self.config.peek:
            x = x + self.emb(tokens.roll(-1, dims=1))
        if self.config.noise and self.training:
            x = x + 0.1 * torch.randn(x.shape, generator=self.gen)
        y, h = self.gru(x, h)  # h: [layers, batch, d]
        h = h.transpose(0, 1) if self.config.batch_first else h
        return self.out(y), h.detach() if self.config.detach else h


GRU = ModelKind("gru", "a GRU (a test's own)", RecurrentConfig, Recurrent, "block_size",
                {"tiny": Preset({}, {})}, streams=True)


def test_a_students_recurrent_kind_passes(capsys):
    assert check.kind(GRU), capsys.readouterr().out


@pytest.mark.parametrize("change, says", [
    ({"batch_first": False}, "gru, state: step() returned a state tensor of shape [1, 6, 8] "
                             "for an input of 6 rows: every tensor of a state must have the "
                             "batch as its first dimension"),
    ({"peek": True}, "gru, no leakage: the logits at position 3 change"),
    ({"forget": True}, "gru, sampling through the window: the logits of byte 4 of a 8-byte "
                       "prompt fed to step() piece by piece (the first 4 bytes, then one at a "
                       "time, as generate feeds its samples) differ by"),
    ({"noise": True}, "gru, resume: trained 4 steps unbroken, and 2 then resumed from the "
                      "checkpoint for 2, the weights differ"),
])
def test_each_check_fails_on_a_kind_that_breaks_its_rule(change, says, capsys):
    assert not check.kind(GRU, config=change)
    out = capsys.readouterr().out
    assert f"FAIL {says}" in out, out


def test_a_state_still_attached_to_its_graph_passes_the_trainer_detaches_it(capsys):
    assert check.kind(GRU, config={"detach": False}), capsys.readouterr().out


def test_a_kind_that_says_it_is_not_causal_skips_the_leakage_check(capsys):
    assert check.kind(replace(GRU, causal=False), config={"peek": True})
    assert "SKIP gru, no leakage" in capsys.readouterr().out


def test_a_state_with_plain_values_beside_its_tensors_passes(capsys):
    class Counted(Recurrent):
        def step(self, tokens, state=None):
            logits, h = super().step(tokens, None if state is None else state["h"])
            return logits, {"h": h, "seen": 0 if state is None else state["seen"] + 1}

    assert check.kind(replace(GRU, build=Counted)), capsys.readouterr().out


def test_an_unregistered_kind_with_a_protocol_of_its_own_is_checked_by_its_own_list(capsys):
    from minixl.evaluation import PROTOCOLS, Protocol

    last = Protocol("all-again", PROTOCOLS["all-positions"].score, "the same, renamed")
    mine = replace(KINDS["char"], name="mine", protocols=(last, "all-positions"))
    assert check.kind(mine, config=TINY_CONFIGS["char"]), capsys.readouterr().out


@pytest.mark.parametrize("name", first_quick(["xl", "xlnet"], ["xl", "xlnet"]))
def test_the_memory_kinds_without_their_memory_sample_through_their_window(name, capsys):
    """--mem-len 0: no memory to carry, so the state must carry the last bytes (a
    Transformer-XL that kept nothing sampled each byte from one byte of context)."""
    assert check.kind(KINDS[name], config={**TINY_CONFIGS[name], "mem_len": 0}), \
        capsys.readouterr().out
