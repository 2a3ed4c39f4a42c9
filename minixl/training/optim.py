"""The optimiser: AdamW over two groups of weights, and its state carried across a resume.

Hand-written shared machinery (not generated); a reader of the loop can skip it.

Weight decay pulls every decayed weight towards zero at each step. That suits the matrices
that multiply activations (the linear layers and the token embeddings): the layer norms undo
their scale, and decay keeps it from growing. It does not suit what is added to the
activations, or what encodes where a byte is: biases and norm gains (the only tensors with
fewer than 2 dimensions), and the tables a model kind names in its `no_decay` (position
tables, learned offsets), each row of which decay would wash out (a distance or a tree edge
that is rarely seen would drift to zero).
"""

from __future__ import annotations

from typing import Collection

import torch
import torch.nn as nn

__all__ = ["DECAY_ON", "decays", "decay_groups", "make_optimizer", "load_optimizer_state"]

DECAY_ON = ("all", "matrices")


def decays(name: str, param: torch.Tensor, no_decay: Collection[str] = ()) -> bool:
    """Whether weight_decay_on="matrices" decays the parameter `name` (as named_parameters
    names it): a matrix (2 or more dimensions) whose last name part is not in no_decay. Tied
    weights (the token embedding and the output layer) are one matrix."""
    return param.dim() >= 2 and name.rsplit(".", 1)[-1] not in no_decay


def decay_groups(modules: list[nn.Module], weight_decay: float, on: str = "matrices", *,
                 no_decay: Collection[str] = ()) -> list[dict]:
    """AdamW parameter groups of the trainable parameters of `modules` (the model, and the
    objective's own weights), in the order of their parameters() either way.

    on="all": one group, every tensor decayed (Chapter 1's loop, TrainConfig's default).
    on="matrices": [the tensors `decays` picks, at weight_decay; the rest, at 0] (the
    grouping of nanoGPT's configure_optimizers, with the model kind's no_decay tables added).
    """
    if on not in DECAY_ON:
        raise ValueError(f"on must be one of {', '.join(DECAY_ON)}, got {on!r}")
    named = [(n, p) for m in modules for n, p in m.named_parameters() if p.requires_grad]
    if on == "all":
        return [{"params": [p for _, p in named], "weight_decay": weight_decay}]
    keep = [decays(n, p, no_decay) for n, p in named]
    return [{"params": [p for (_, p), k in zip(named, keep) if k], "weight_decay": weight_decay},
            {"params": [p for (_, p), k in zip(named, keep) if not k], "weight_decay": 0.0}]


def _group_decays(weight_decay: float, on: str) -> list[float]:
    """The weight decay of each group decay_groups makes."""
    return [weight_decay] if on == "all" else [weight_decay, 0.0]


def make_optimizer(modules: list[nn.Module], cfg, device: torch.device, *,
                   no_decay: Collection[str] = (), on: str | None = None) -> torch.optim.AdamW:
    """AdamW over decay_groups (cfg: a TrainConfig): the fused kernel on CUDA, and on the CPU
    when cfg.fused (`minixl train` asks for it); else on the CPU the foreach kernels, which
    update all tensors in a few calls and give PyTorch's default updates bit for bit (those
    of Chapter 1's loop; the fused kernel rounds otherwise)."""
    groups = decay_groups(modules, cfg.weight_decay, on or cfg.weight_decay_on,
                          no_decay=no_decay)
    kernel = {"fused": True} if device.type == "cuda" or cfg.fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, **kernel)


def load_optimizer_state(opt: torch.optim.AdamW, saved: dict, saved_on: str,
                         modules: list[nn.Module], cfg, device: torch.device, *,
                         no_decay: Collection[str] = ()) -> None:
    """Put a checkpoint's optimiser state into opt: this device's kernel, this run's weight
    decay, and, when the grouping changed on purpose (saved_on is not cfg.weight_decay_on),
    each tensor's moments carried into its new group."""
    kernel = [{k: g[k] for k in ("fused", "foreach", "capturable") if k in g}
              for g in opt.param_groups]  # this device's AdamW, not the saved one's
    if saved_on == cfg.weight_decay_on:
        opt.load_state_dict(saved)
    else:
        old = make_optimizer(modules, cfg, device, no_decay=no_decay, on=saved_on)
        old.load_state_dict(saved)
        for p, s in old.state.items():
            opt.state[p] = s
    for group, kept, wd in zip(opt.param_groups, kernel,
                               _group_decays(cfg.weight_decay, cfg.weight_decay_on)):
        group.update(kept)
        group["weight_decay"] = wd  # an allowed change of weight decay holds
    # each step counter where this optimiser's kernel wants it (on the parameter's device
    # for the fused kernel, on the CPU otherwise)
    for group in opt.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            s = opt.state.get(p, {})
            if isinstance(s.get("step"), torch.Tensor):
                s["step"] = s["step"].to(p.device if on_device else "cpu", torch.float32)
