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

# checker -> the chapter (minixl.NAME.check) or module of minixl.check that defines it, in
# the book's order
_WHERE = {
    "causal_mask": "char_transformer", "attention": "char_transformer",  # Chapter 1
    "sinusoid_positions": "char_transformer",
    "intermediate_weight": "aux_losses", "sliding_windows": "aux_losses",  # Chapter 2
    "ahead_pairs": "aux_losses", "step_weight": "aux_losses", "every_start_table": "aux_losses",
    "shaw_attention": "relative_attention", "relative_index": "relative_attention",  # 3
    "distance_weights": "relative_attention", "per_head_shaw": "relative_attention",
    "rel_shift": "transformer_xl", "four_term_score": "transformer_xl",  # Chapter 4
    "memory_update": "transformer_xl", "stream_batches": "transformer_xl",
    "same_length_mask": "transformer_xl", "xl_two_segments": "transformer_xl",
    "permutation_masks": "xlnet", "query_stream_mask": "xlnet",  # Chapter 5
    "query_stream_update": "xlnet", "rel_shift_bi": "xlnet", "span_targets": "xlnet",
    "targets_for_k": "xlnet",
    "leaf_context": "segtree", "bpt_context": "segtree", "causal_tree_graph": "segtree",  # 6
    "gathered_attention": "segtree", "sibling_scores": "segtree",
    "matched_compute": "one_bench", "reach": "one_bench", "contestant": "one_bench",  # 7
    "kind": "kinds",  # every model kind, yours too
}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"minixl.check has no checker {name!r}; the checkers are "
                             f"{', '.join(_WHERE)}")
    where = _WHERE[name]
    value = getattr(import_module(f"minixl.{where}.check" if where != "kinds"
                                  else f"{__name__}.kinds"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
