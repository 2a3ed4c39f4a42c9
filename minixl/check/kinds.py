"""The checks every model kind must pass: `minixl.check.kind(my_kind)` runs them on a kind of
your own (the tests run them on the book's five).

Hand-written (not generated). Each check prints PASS or FAIL with what is wrong, as the
exercises' checkers do; `kind` returns True when every one passes. They build the kind's
model at its tiny preset (or the config fields you pass) and read it the way the trainer, the
checkpoints and the evaluation protocols will:

1. the model protocol: ``logits, state = model.step(tokens, state)``, logits [B, T, V];
2. the state it carries (a kind that trains on streams): batch-first tensors (the trainer
   splits them by rows for --grad-accum and across processes), unchanged through a
   checkpoint (the trainer detaches it between steps: a model need not);
3. no leakage: where the kind is causal, no logit changes when a later byte does;
4. sampling reads the window the model was trained on: a prompt as long as the model's
   window fed through ``step`` piece by piece (its first half, then one byte at a time, as
   `generate` feeds what it samples) gives the logits of one pass over it, within float
   rounding (Hugging Face tests incremental decoding against a full pass the same way); a
   model whose state forgets the bytes it read fails it;
5. each evaluation protocol it declares scores a short random text;
6. a tiny run stopped at its checkpoint and resumed ends bit-exactly as one never stopped.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import is_dataclass
from pathlib import Path

import torch

from ..evaluation import evaluate
from ..model_kind import ModelKind
from ..training import TrainConfig, train
from ..training import state as states

__all__ = ["kind"]


def kind(model_kind, *, config: dict | None = None, steps: int = 4) -> bool:
    """Run the checks on a ModelKind (registered or not); True when all pass.

    config: config fields that replace the tiny preset's (keep the model small: the checks
    train it for `steps` steps on the CPU)."""
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an integer of at least 2 (a run stopped half-way and "
                         f"resumed), got {steps!r}")
    if not isinstance(model_kind, ModelKind):
        print(f"FAIL kind: expected a minixl.kinds.ModelKind, got {type(model_kind).__name__}")
        return False
    k = model_kind
    preset = "tiny" if "tiny" in k.presets else next(iter(k.presets))
    fields = {**k.presets[preset].model, **(config or {})}

    def build():
        torch.manual_seed(0)
        return k.build(k.config(**fields))

    try:
        model = build()
    except Exception as err:  # a student's code may raise anything: report it
        print(f"FAIL kind {k.name}: building it from {k.config.__name__}(**{fields}) raised "
              f"{type(err).__name__}: {err}")
        return False
    checks = [("model protocol", _protocol), ("state", _state), ("no leakage", _leakage),
              ("sampling through the window", _sampling), ("evaluation protocols", _protocols),
              ("resume", _resume)]
    ok = True
    for name, check in checks:
        try:
            problem = check(k, model, build, preset, steps)
        except Exception as err:  # the check's own calls into the student's code
            problem = f"raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if problem == "skip":
            print(f"SKIP {k.name}, {name}: does not apply to this kind")
            continue
        print(f"PASS {k.name}, {name}" if problem is None else f"FAIL {k.name}, {name}: {problem}")
        ok &= problem is None
    return ok


B = 6  # rows of the batches the checks read (micro-batches of 3: unlike a layer count)


def _tokens(model, k, seed: int = 0) -> torch.Tensor:
    length = getattr(model.config, k.length)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (B, length), generator=g)  # bytes


def _protocol(k, model, build, preset, steps):
    if not is_dataclass(getattr(model, "config", None)):
        return "the model keeps no dataclass config as model.config (a checkpoint saves it)"
    x = _tokens(model, k)
    model.eval()
    with torch.no_grad():
        out = model.step(x, None)
        if not (isinstance(out, tuple) and len(out) == 2):
            return "model.step(tokens, state) must return (logits, state)"
        logits, state = out
        if (not torch.is_tensor(logits) or logits.dim() != 3 or logits.shape[:2] != x.shape
                or logits.size(2) < 256):
            return (f"logits for tokens of shape {tuple(x.shape)} must have shape "
                    f"{(*x.shape, 'V')}, V >= 256 (one score per byte), got "
                    f"{tuple(logits.shape) if torch.is_tensor(logits) else type(logits).__name__}")
        if k.reads_streams(model.config) or k.batch_source:
            model.step(_tokens(model, k, 1), state)  # the next segment reads the state
    return None


def _state(k, model, build, preset, steps):
    model.train()
    _, state = model.step(_tokens(model, k), None)
    if state is None:
        return "skip"
    leaves, _ = states.flatten(state)
    try:  # the trainer's own rule (it splits a state by rows for --grad-accum and processes)
        states.check_rows(state, B, where="step()")
    except states.StateError as err:
        return str(err)
    back = states.decode(states.encode(states.to_device(state, "cpu")))
    again, _ = states.flatten(back)
    if len(again) != len(leaves) or not all(
            torch.equal(a, b) if torch.is_tensor(a) and torch.is_tensor(b) else a == b
            for a, b in zip(again, leaves)):
        return "the state is not the same after a checkpoint's encode and decode"
    return None


def _leakage(k, model, build, preset, steps):
    if not k.causal:
        return "skip"
    model.eval()
    x = _tokens(model, k)
    t = x.size(1) // 2
    y = x.clone()
    y[:, t:] = (y[:, t:] + 1) % 256
    with torch.no_grad():
        a, _ = model.step(x, None)
        b, _ = model.step(y, None)
    moved = (a[:, :t] - b[:, :t]).abs().amax(dim=(0, 2))
    if moved.max() > 1e-5:
        first = int((moved > 1e-5).nonzero()[0])
        return (f"the logits at position {first} change (by {moved[first]:.2g}) when only "
                f"bytes {t} on change: the model reads the future (a causal mask missing, or "
                "a kind that is not causal should say causal=False)")
    return None


def _sampling(k, model, build, preset, steps):
    if not k.causal:  # it reads both ways: one pass is not what left-to-right sampling sees
        return "skip"
    model.eval()
    x = _tokens(model, k)[:2]
    W, half = x.size(1), x.size(1) // 2
    with torch.no_grad():
        whole, _ = model.step(x, None)
        logits, state = model.step(x[:, :half], None)
        parts = [logits]
        for i in range(half, W):
            logits, state = model.step(x[:, i:i + 1], state)
            parts.append(logits)
    pieces = torch.cat(parts, dim=1).float()
    if pieces.shape != whole.shape:
        return (f"fed piece by piece, step() gave logits for {pieces.size(1)} positions of a "
                f"{W}-byte prompt (one per byte fed, {W}, expected)")
    gap = (pieces - whole.float()).abs().amax(dim=(0, 2))
    tol = 1e-4 * max(1.0, whole.float().abs().amax().item())
    if gap.max() > tol:
        first = int((gap > tol).nonzero()[0])
        return (f"the logits of byte {first} of a {W}-byte prompt fed to step() piece by piece "
                f"(the first {half} bytes, then one at a time, as generate feeds its samples) "
                f"differ by {gap[first]:.2g} from one pass over the prompt: the state does not "
                "carry what the model reads in one pass, so sampling does not read the window "
                "the model trained on (a model without memory must carry its last bytes, as "
                "CharTransformer.step does; a memory shorter than the window, or positions "
                "that restart at every call, fail too)")
    return None


def _protocols(k, model, build, preset, steps):
    length = getattr(model.config, k.length)
    text = torch.randint(0, 256, (64 * length + 1,), generator=torch.Generator().manual_seed(2),
                         dtype=torch.uint8)
    for p in k.protocol_objects():
        bpc = evaluate(model, text, p, seq_len=length, batch_size=B, kind=k).bpc
        if not (math.isfinite(bpc) and bpc > 0):
            return f"the {p.name} protocol scored {bpc} bits per byte on random text"
    return None


def _resume(k, model, build, preset, steps):
    length = getattr(model.config, k.length)
    data = torch.randint(0, 256, (200 * length,), generator=torch.Generator().manual_seed(3),
                         dtype=torch.uint8)
    cfg = TrainConfig(steps=steps, batch_size=B, grad_accum=2, lr=1e-3, warmup=1, log_every=1,
                      eval_every=10**6, ckpt_every=steps // 2, device="cpu")
    options = k.objective_options(preset)
    meta = {"kind": k.name}
    half = steps // 2
    with tempfile.TemporaryDirectory() as tmp:
        whole, part = Path(tmp) / "whole", Path(tmp) / "part"
        source = k.batches(data, B, model.config, seed=0)

        def batches(step):  # the unbroken run, copied as it stands after its first save
            if step == half:
                shutil.copytree(whole, part)
            return source(step)

        a = build()
        train(a, cfg, batches=batches, objective=k.build_objective(a.config, options),
              out=whole, meta=meta, progress=False, no_decay=k.no_decay)
        b = build()
        train(b, cfg, batches=k.batches(data, B, b.config, seed=0),
              objective=k.build_objective(b.config, options), out=part, resume=True,
              meta=meta, progress=False, no_decay=k.no_decay)
    wa, wb = a.state_dict(), b.state_dict()
    differ = [n for n in wa if not torch.equal(wa[n], wb[n])]
    if differ:
        return (f"trained {steps} steps unbroken, and {half} then resumed from the checkpoint "
                f"for {steps - half}, the weights differ ({', '.join(differ[:3])}): something "
                "the model carries or draws is not in the checkpoint (a state it keeps on "
                "itself, a random generator of its own?)")
    return None
