"""Checkers for the exercises: call them on your own implementation.

Hand-written (not generated). Each checker runs property tests against the
reference in minixl, prints a short verdict that says what is wrong when
something is, and returns True when every test passes.

    >>> from minixl import check
    >>> check.attention(my_attention)

Each chapter's checkers live in the module named after the chapter's own module:
minixl.check.char_transformer (Chapter 1), .aux_losses (2), .relative_attention (3),
.transformer_xl (4), .xlnet (5), .segtree (6) and .one_bench (7); the verdict helpers they share are in
minixl.check._common. A checker loads its references only when it runs, so a chapter's
checkers work before later chapters' modules exist.
"""

from __future__ import annotations

from .char_transformer import attention, causal_mask, sinusoid_positions
from .aux_losses import (ahead_pairs, every_start_table, intermediate_weight, sliding_windows,
                         step_weight)
from .relative_attention import distance_weights, per_head_shaw, relative_index, shaw_attention
from .transformer_xl import (four_term_score, memory_update, rel_shift, same_length_mask,
                             stream_batches, xl_two_segments)
from .xlnet import (permutation_masks, query_stream_mask, query_stream_update, rel_shift_bi,
                    span_targets, targets_for_k)
from .segtree import (bpt_context, causal_tree_graph, gathered_attention, leaf_context,
                      sibling_scores)
from .one_bench import contestant, matched_compute, reach
from .kinds import kind


__all__ = ["causal_mask", "attention", "sinusoid_positions",  # Chapter 1
           "intermediate_weight", "sliding_windows", "ahead_pairs", "step_weight",  # Chapter 2
           "every_start_table",
           "shaw_attention", "relative_index", "distance_weights", "per_head_shaw",  # Chapter 3
           "rel_shift", "four_term_score", "memory_update", "stream_batches",  # Chapter 4
           "same_length_mask", "xl_two_segments",
           "permutation_masks", "query_stream_mask", "query_stream_update",  # Chapter 5
           "rel_shift_bi", "span_targets", "targets_for_k",
           "leaf_context", "bpt_context", "causal_tree_graph",  # Chapter 6
           "gathered_attention", "sibling_scores",
           "matched_compute", "reach", "contestant",  # Chapter 7
           "kind"]  # every model kind, yours too (minixl.check.kinds)
