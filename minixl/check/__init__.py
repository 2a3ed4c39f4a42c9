"""Checkers for the exercises: call them on your own implementation.

Hand-written (not generated). Each checker runs property tests against the
reference in minixl, prints a short verdict that says what is wrong when
something is, and returns True when every test passes.

    >>> from minixl import check
    >>> check.attention(my_attention)

Each chapter's checkers live in its home, beside its module: minixl.char_transformer.check
(Chapter 1), minixl.aux_losses.check (2), .relative_attention.check (3),
.transformer_xl.check (4), .xlnet.check (5), .segtree.check (6) and .one_bench.check (7);
the checks every model kind must pass are minixl.check.kinds, and the verdict helpers they
all share minixl.check.verdicts. This package is a table of names, loaded on first use:
`check.attention` imports Chapter 1's checkers and what they import at their top (Chapter
1's module), never a later chapter's.
"""

from __future__ import annotations

from importlib import import_module

# where each checker is defined, in the book's order: each chapter's home, then the checks of
# every model kind (yours too)
_MODULES = {
    "minixl.char_transformer.check": ("causal_mask", "attention", "sinusoid_positions"),
    "minixl.aux_losses.check": ("intermediate_weight", "sliding_windows", "ahead_pairs",
                                "step_weight", "every_start_table"),
    "minixl.relative_attention.check": ("shaw_attention", "relative_index", "distance_weights",
                                        "per_head_shaw"),
    "minixl.transformer_xl.check": ("rel_shift", "four_term_score", "memory_update",
                                    "stream_batches", "same_length_mask", "xl_two_segments"),
    "minixl.xlnet.check": ("permutation_masks", "query_stream_mask", "query_stream_update",
                           "rel_shift_bi", "span_targets", "targets_for_k"),
    "minixl.segtree.check": ("leaf_context", "bpt_context", "causal_tree_graph",
                             "gathered_attention", "sibling_scores"),
    "minixl.one_bench.check": ("matched_compute", "reach", "contestant", "winner"),
    "minixl.check.kinds": ("kind",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"minixl.check has no checker {name!r}; the checkers are "
                             f"{', '.join(_WHERE)}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
