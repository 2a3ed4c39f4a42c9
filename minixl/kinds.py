"""The registry of model kinds: which kinds `minixl train --model NAME`, `setup_run`, the
benchmark and `model_from_checkpoint` know, and the presets that pick one.

Hand-written glue (not generated). `KINDS` starts as the book's five, named by where each
is declared, in its chapter's home (`BOOK_HOMES`: `minixl.xlnet.kind` for `xlnet`), and
loaded on first use, like Hugging Face's auto registry: importing this module imports no
chapter, and `KINDS["xlnet"]` imports Chapter 5's home and what it needs, never the SegTree
model. `register` adds yours. The names a student uses are all here: `ModelKind`, `Preset`,
`Objective` and `BenchArm` (declared in `minixl.model_kind`), `register`, `kind_of`. A kind
in a module of your own that is not registered yet is loaded by ``--model MODULE:NAME``
(`minixl.plugins`, the layer above this one). The registry lives in this module's KINDS:
`importlib.reload(minixl.kinds)` would start it afresh, with the book's kinds only (reload
your own module instead: its kinds replace themselves).
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from dataclasses import MISSING, fields, replace
from importlib import import_module
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn

from .checkpoint import CheckpointError, load_checkpoint, saved_config
from .model_kind import BenchArm, ModelKind, Objective, Preset, not_for, with_overrides

__all__ = ["ModelKind", "Preset", "Objective", "BenchArm", "KINDS", "BOOK_HOMES", "Registry",
           "DEFAULT_MODEL", "register",
           "kind_of", "registered", "paper_presets", "resolve_preset", "model_fields",
           "with_overrides", "refuse_foreign", "model_from_checkpoint"]

# The book's kinds, in the registry's order: name -> "module:NAME", where it is declared. The
# char kind lives in Chapter 2's home: it is Chapter 1's model with Chapter 2's losses.
BOOK_HOMES = {"char": "minixl.aux_losses.kind:CHAR",
              "shaw": "minixl.relative_attention.kind:SHAW",
              "xl": "minixl.transformer_xl.kind:XL",
              "xlnet": "minixl.xlnet.kind:XLNET",
              "segtree": "minixl.segtree.kind:SEGTREE"}


class Registry(MutableMapping):
    """name -> ModelKind, where a kind may be given by where it is declared ("module:NAME")
    and is imported when it is first looked up. Listing the names (`in`, `list`, `len`)
    imports nothing; `values()` and `items()` import every kind."""

    def __init__(self, declared: dict[str, str]):
        self._where = dict(declared)  # the kinds not imported yet
        self._kinds: dict[str, ModelKind] = {}
        self._order = list(declared)

    def __getitem__(self, name: str) -> ModelKind:
        if name in self._where:
            module, _, attr = self._where[name].partition(":")
            kind = getattr(import_module(module), attr)
            if not isinstance(kind, ModelKind) or kind.name != name:
                raise TypeError(f"{self._where[name]} is not a ModelKind called {name!r}")
            self._kinds[name] = kind
            del self._where[name]
        return self._kinds[name]

    def __setitem__(self, name: str, kind: ModelKind) -> None:
        if name not in self:  # a new name goes last; a named one keeps its place
            self._order.append(name)
        self._where.pop(name, None)
        self._kinds[name] = kind

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._where.pop(name, None)
        self._kinds.pop(name, None)
        self._order.remove(name)

    def __contains__(self, name) -> bool:
        return name in self._kinds or name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def loaded(self) -> list[str]:
        """The names whose kinds have been imported (the rest are only named)."""
        return [n for n in self._order if n in self._kinds]

    def __repr__(self) -> str:
        return (f"Registry({', '.join(n if n in self._kinds else n + ' (not loaded)' for n in self)})")


KINDS = Registry(BOOK_HOMES)
# name -> the module that declared the kind ("__main__" for a notebook cell): a kind declared
# again by the same module replaces its old self; one from elsewhere may not take its name.
ORIGINS: dict[str, str | None] = {n: w.partition(":")[0] for n, w in BOOK_HOMES.items()}
DEFAULT_MODEL = "char"  # what `minixl train` trains without --model


def register(*kinds: ModelKind, replace: bool = False, origin: str | None = None) -> ModelKind:
    """Add model kinds to KINDS, so that `minixl.setup_run`, `model_from_checkpoint` and the
    command line (--model NAME) know them; returns the last.

    Declaring a kind again in the module that declared it (re-running a notebook cell,
    reloading a module) replaces it. A name taken by a kind from elsewhere is an error,
    unless replace=True. All or nothing: if one kind is refused, none is added. origin: the
    declaring module's name (default: the module that calls register)."""
    if origin is None:
        # The module of the code that called us: a notebook cell runs in __main__, a module
        # in its own name. Python tells a function its caller's module only through the
        # caller's frame (one step up, no walk); the alternative, origin=__name__ in every
        # call, is a line a student would forget.
        origin = sys._getframe(1).f_globals.get("__name__")
    for kind in kinds:
        if not isinstance(kind, ModelKind):
            raise TypeError(f"register() takes minixl.kinds.ModelKind objects, got "
                            f"{type(kind).__name__}")
    names = [k.name for k in kinds]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"register() was given two model kinds called {twice[0]!r}")
    for kind in kinds:
        # a book kind not imported yet is imported here, to tell whether it is this one
        if replace or kind.name not in KINDS or ORIGINS.get(kind.name) == origin:
            continue
        old = KINDS[kind.name]
        if old is not kind:
            raise ValueError(f"a model kind called {kind.name!r} is registered already "
                             f"(from {old.source or ORIGINS.get(kind.name)}); give yours "
                             "another name, or register(kind, replace=True) to take its place")
    for kind in kinds:
        KINDS[kind.name] = kind
        ORIGINS[kind.name] = origin
    return kinds[-1]


def kind_of(name: str) -> ModelKind:
    """The registered ModelKind called `name`, or a clear error."""
    if name in KINDS:
        return KINDS[name]
    if ":" in name:
        raise ValueError(f"{name} names a module of your own: load it with --model {name} on "
                         "the command line, minixl.plugins.load_kind in Python, or register "
                         "its kind first")
    raise ValueError(f"unknown model {name!r}: expected one of {', '.join(KINDS)}, or "
                     "MODULE:NAME for a ModelKind of your own")


def registered(kind: ModelKind) -> ModelKind:
    """The kind, after a clear error if it is not the one registered under its name (a run
    of it could not be read back: a checkpoint names its kind)."""
    old = KINDS.get(kind.name)
    # (the same kind, loaded again by --model MODULE:NAME, is registered with its source)
    same = old is not None and replace(old, source=None) == replace(kind, source=None)
    if old is not kind and not same:
        taken = "another kind is registered under that name" if kind.name in KINDS else (
            "it is not registered")
        raise ValueError(f"model kind {kind.name!r}: {taken}; register(kind) first (or "
                         "register(kind, replace=True) to take the name)")
    return kind


def paper_presets() -> dict[str, str]:
    """Paper-scale preset -> the model it belongs to, over every registered kind."""
    return {name: kind.name for kind in KINDS.values()
            for name, p in kind.presets.items() if p.paper}


def resolve_preset(model: ModelKind | str | None, preset: str | None) -> tuple[ModelKind, str]:
    """(kind, preset) from --model (a kind, a registered name or None) and --preset: a
    paper-scale preset picks its model; otherwise the model defaults to DEFAULT_MODEL and the
    preset to tiny."""
    preset = "tiny" if preset is None else preset
    kind = kind_of(model) if isinstance(model, str) else model
    if kind is not None:
        registered(kind)
    papers = paper_presets()
    if preset in papers:
        own = papers[preset]
        if kind is not None and kind.name != own:
            raise ValueError(f"--preset {preset} is a --model {own} preset, not a --model "
                             f"{kind.name} one: drop --model or use --model {own}")
        kind = KINDS[own]
    kind = kind_of(DEFAULT_MODEL) if kind is None else kind
    if preset not in kind.presets or papers.get(preset, kind.name) != kind.name:
        names = [n for n in kind.presets if papers.get(n, kind.name) == kind.name]
        raise ValueError(f"unknown preset {preset!r} for --model {kind.name}: expected one of "
                         f"{', '.join(names)}")
    return kind, preset


def model_fields(kinds=None) -> dict[str, tuple[type, list[str]]]:
    """Every config setting of the kinds (all registered ones by default) that a flag may
    set: name -> (type, the kinds that have it)."""
    found: dict[str, tuple[type, list[str]]] = {}
    for kind in KINDS.values() if kinds is None else kinds:
        for f in fields(kind.config):
            if f.name != "vocab_size" and f.default is not MISSING:
                found.setdefault(f.name, (type(f.default), []))[1].append(kind.name)
    return found


def refuse_foreign(kind: ModelKind, model_settings=(), objective_options=()) -> None:
    """A clear error for config fields or objective options that `kind` does not have,
    naming the registered kinds that do."""
    own = {f.name for f in fields(kind.config)}
    foreign = [n for n in model_settings if n not in own]
    if foreign:
        known = model_fields()
        raise ValueError(not_for(foreign, [k for n in foreign for k in known.get(n, (0, []))[1]],
                                 kind.name))
    takes = {o.name for o in kind.objective.options} if kind.objective else set()
    foreign = [n for n in objective_options if n not in takes]
    if foreign:
        takers = [k.name for k in KINDS.values() if k.objective and
                  set(foreign) <= {o.name for o in k.objective.options}]
        raise ValueError(not_for(foreign, takers, kind.name))


def model_from_checkpoint(ckpt: dict | str | Path) -> nn.Module:
    """Rebuild the model a checkpoint holds, with its weights (on the CPU, in eval mode). A
    model of your own must be registered first (or named with --model MODULE:NAME): a
    checkpoint never makes minixl import code."""
    ckpt = ckpt if isinstance(ckpt, dict) else load_checkpoint(ckpt)
    meta = ckpt["meta"] if isinstance(ckpt["meta"], dict) else {}
    name = meta.get("kind")
    if name not in KINDS:
        if meta.get("kind_source"):
            raise CheckpointError(f"the checkpoint holds --model {name}, a model of your own: "
                                  f"pass --model {meta['kind_source']} (or register it) to load "
                                  "its code")
        raise CheckpointError(f"the checkpoint does not say which model it holds (kind {name!r}; "
                              f"expected one of {', '.join(KINDS)})")
    kind = KINDS[name]
    try:
        model = kind.build(kind.config(**saved_config(kind.config, ckpt["model_config"])))
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"the checkpoint's weights do not fit its --model {name} config: "
                              + (str(err).splitlines() or [type(err).__name__])[0]) from None
    if not all(torch.isfinite(t).all() for t in model.state_dict().values()):
        raise CheckpointError("the checkpoint holds weights that are not finite (NaN or inf): "
                              "the run that wrote it diverged; use an earlier checkpoint")
    return model.eval()
