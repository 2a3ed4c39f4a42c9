"""A model's state, of any shape: split by rows, put back together, moved, saved.

Hand-written shared machinery (not generated). The state is what `model.step` carries from
one call to the next (Transformer-XL's memory, a list of tensors [B, M, C]). The trainer cuts
it by rows for micro-batches and processes, joins the rows again, moves it between devices
and saves it in checkpoints; it never looks inside. A state may be None or nest tensors in
tuples, lists, dicts, named tuples and dataclasses, with plain values (numbers, strings,
None) beside them; `torch.utils._pytree` walks it. Every tensor's first dimension is the
batch; plain values are the same for every row. Anything else is refused with a clear error.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

import torch
import torch.utils._pytree as pytree

__all__ = ["StateError", "flatten", "check_rows", "carried", "map_tensors", "rows", "cat_rows",
           "to_device", "encode", "decode"]

PLAIN = (int, float, bool, str, type(None))


class StateError(TypeError, ValueError):
    """A model's state holds something the trainer cannot split, move or save (a ValueError
    too, so that the command line reports it in one line as bad input)."""


def flatten(state) -> tuple[list, pytree.TreeSpec]:
    """The state's leaves (tensors and plain values) and its structure. Dataclasses are
    registered with pytree the first time one is met."""
    while True:
        leaves, spec = pytree.tree_flatten(state)
        new = {type(x) for x in leaves if dataclasses.is_dataclass(x) and not isinstance(x, type)}
        if not new:
            break
        for cls in new:
            _register_dataclass(cls)
    bad = [x for x in leaves if not isinstance(x, (torch.Tensor, *PLAIN))]
    if bad:
        raise StateError(f"a model's state may hold tensors (and plain values) in tuples, "
                         f"lists, dicts, named tuples and dataclasses; this one holds a "
                         f"{type(bad[0]).__name__}: make step() return tensors")
    return leaves, spec


def _register_dataclass(cls: type) -> None:
    """Teach pytree to walk a dataclass: every field is a child (so a tensor in any field is
    split, moved and detached with the rest); rebuilt from its init fields, then the others
    set as they were (as `decode` does)."""
    init = [f.name for f in dataclasses.fields(cls) if f.init]
    rest = [f.name for f in dataclasses.fields(cls) if not f.init]

    def unflatten(values, _):
        values = dict(zip(init + rest, values))
        obj = cls(**{k: values[k] for k in init})
        for k in rest:
            object.__setattr__(obj, k, values[k])
        return obj

    pytree.register_pytree_node(
        cls, lambda obj: ([getattr(obj, n) for n in init + rest], None), unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def check_rows(state, batch: int, where: str = "step()") -> None:
    """Refuse a state whose tensors do not have the batch's `batch` rows as their first
    dimension: the trainer splits a state by rows (micro-batches, processes), so a tensor laid
    out otherwise (a GRU's own hidden state is [layers, batch, hidden]) would be cut wrongly."""
    _check_rows(flatten(state)[0], batch, where)


def carried(state, batch: int, where: str = "step()"):
    """The state a step returned, as the trainer carries it to the next: its rows checked
    (check_rows) and every tensor detached, in one walk of the state."""
    leaves, spec = flatten(state)
    _check_rows(leaves, batch, where)
    return pytree.tree_unflatten([x.detach() if isinstance(x, torch.Tensor) else x
                                  for x in leaves], spec)


def _check_rows(leaves: list, batch: int, where: str) -> None:
    for x in leaves:
        if isinstance(x, torch.Tensor) and (x.dim() == 0 or x.size(0) != batch):
            raise StateError(f"{where} returned a state tensor of shape {list(x.shape)} for "
                             f"an input of {batch} rows: every tensor of a state must have the "
                             "batch as its first dimension (e.g. a GRU's hidden state "
                             "[layers, batch, hidden] as hidden.transpose(0, 1)); a value that "
                             "is the same for every row may ride along as a plain number")


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], state):
    """The state with fn applied to every tensor (plain values kept)."""
    leaves, spec = flatten(state)
    return pytree.tree_unflatten([fn(x) if isinstance(x, torch.Tensor) else x
                                  for x in leaves], spec)


def rows(state, index: slice):
    """Rows `index` (dim 0) of every tensor in the state."""
    return map_tensors(lambda t: t[index], state)


def to_device(state, device):
    """The state with every tensor on `device`."""
    return map_tensors(lambda t: t.to(device), state)


def cat_rows(states: list):
    """The states of consecutive rows, put back together along dim 0 (inverse of rows)."""
    if len(states) == 1:
        return states[0]
    flat = [flatten(s) for s in states]
    spec = flat[0][1]
    if any(s != spec for _, s in flat):
        raise StateError("the micro-batches returned states of different shapes: step() must "
                         "return the same structure for every batch")
    joined = []
    for parts in zip(*(leaves for leaves, _ in flat)):
        if isinstance(parts[0], torch.Tensor):
            joined.append(torch.cat(parts, dim=0))
        elif any(p != parts[0] for p in parts):
            raise StateError(f"a plain value of the state differs between rows ({parts[0]!r} "
                             f"and {next(p for p in parts if p != parts[0])!r}): only tensors "
                             "may vary by row")
        else:
            joined.append(parts[0])
    return pytree.tree_unflatten(joined, spec)


# ---------------------------------------------------------------- in a checkpoint

CLASS = "minixl.state.class"  # the key that marks an encoded named tuple or dataclass


def encode(state):
    """The state as a checkpoint can hold it (read back with weights_only=True): tensors,
    plain values, lists, tuples and dicts as they are; a named tuple or dataclass as a dict
    that names its class. The same check as flatten: anything else is refused."""
    flatten(state)
    return _encode(state)


def _encode(x):
    if isinstance(x, (torch.Tensor, *PLAIN)):
        return x
    if dataclasses.is_dataclass(x):
        return {CLASS: _class_name(type(x)), "fields": {
            f.name: _encode(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if _is_namedtuple(x):
        return {CLASS: _class_name(type(x)), "fields": {k: _encode(v)
                                                        for k, v in x._asdict().items()}}
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    return type(x)(_encode(v) for v in x)  # a list or a tuple


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def decode(saved):
    """The state encode() saved. A named class is looked up in a module already imported
    (building the model imports it): a checkpoint never makes minixl import code."""
    if isinstance(saved, dict) and CLASS in saved:
        cls = _find_class(saved[CLASS])
        values = {k: decode(v) for k, v in saved["fields"].items()}
        if dataclasses.is_dataclass(cls):
            init = {f.name for f in dataclasses.fields(cls) if f.init}
            obj = cls(**{k: v for k, v in values.items() if k in init})
            for k, v in values.items():
                if k not in init:
                    object.__setattr__(obj, k, v)
            return obj
        return cls(**values)
    if isinstance(saved, dict):
        return {k: decode(v) for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        return type(saved)(decode(v) for v in saved)
    return saved


def _find_class(name: str) -> type:
    module_name, _, qualname = name.partition(":")
    module = sys.modules.get(module_name)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type):
        raise StateError(f"the checkpoint's state is a {name}, which is not loaded: build the "
                         "model (which imports its module) before reading its state")
    return obj
