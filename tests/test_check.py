import torch

import minixl
from minixl import check


def test_checkers_pass_the_reference(capsys):
    assert check.causal_mask(minixl.causal_mask)
    assert check.attention(minixl.attention)
    assert check.sinusoid_positions(minixl.sinusoid_positions)
    assert capsys.readouterr().out.count("PASS") == 3


def test_causal_mask_checker_explains_memory_and_inversion(capsys):
    assert not check.causal_mask(lambda q, k: torch.ones(q, k).tril().bool())
    assert "the first 4 keys are memory" in capsys.readouterr().out
    assert not check.causal_mask(lambda q, k: ~minixl.causal_mask(q, k))
    assert "inverted" in capsys.readouterr().out
    assert not check.causal_mask(lambda q, k: minixl.causal_mask(q, k).float())
    assert "torch.bool" in capsys.readouterr().out
    assert not check.causal_mask(lambda q, k: 1 / 0)
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_attention_checker_names_the_bug(capsys):
    def unscaled(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1)
        return (s if mask is None else s.masked_fill(~mask, -torch.inf)).softmax(-1) @ v

    def maskless(q, k, v, mask=None):
        return minixl.attention(q, k, v)

    def over_queries(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
        return (s if mask is None else s.masked_fill(~mask, -torch.inf)).softmax(-2).nan_to_num() @ v

    for fn, words in [(unscaled, "sqrt(D)"), (maskless, "mask is ignored"),
                      (over_queries, "over queries")]:
        assert not check.attention(fn)
        assert words in capsys.readouterr().out


def test_sinusoid_checker_spots_interleaving(capsys):
    def interleaved(length, d):
        t = minixl.sinusoid_positions(length, d)
        return torch.stack([t[:, : d // 2], t[:, d // 2:]], -1).reshape(length, d)

    assert not check.sinusoid_positions(interleaved)
    assert "interleaved" in capsys.readouterr().out
