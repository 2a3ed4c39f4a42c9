"""minixl: the library exported by the chapters of the minixl book.

Hand-written: this file only gathers the public names. The modules it imports
from are generated from the chapters (see each module's header), except
`data`, `check`, `train` and `cli`, which are hand-written.
"""

from . import check, data
from .aux_losses import (
    AuxLossConfig,
    AuxLosses,
    evaluate_bpc_sliding,
    intermediate_weight,
    layer_weights,
    next_byte_loss,
    sliding_windows,
)
from .relative_attention import (
    ShawRelativeAttention,
    relative_index,
    shaw_attention,
    shaw_attention_gathered,
    shaw_attention_loop,
    shaw_factory,
)
from .transformer_xl import (
    NoMemory,
    PositionwiseFF,
    RelMultiHeadAttention,
    TransformerXL,
    TransformerXLConfig,
    XLLayer,
    evaluate_bpc_xl,
    generate_xl,
    rel_scores,
    rel_scores_naive,
    rel_shift,
    relative_distances,
    relative_positions,
    stream_nll,
)
from .char_transformer import (
    Block,
    CharTransformer,
    CharTransformerConfig,
    MultiHeadAttention,
    attention,
    attention_weights,
    causal_mask,
    evaluate_bpc,
    generate,
    leakage_matrix,
    sample_next,
    sinusoid_positions,
)

__version__ = "0.1.0"

__all__ = [
    "AuxLossConfig", "AuxLosses", "evaluate_bpc_sliding", "intermediate_weight", "layer_weights",
    "next_byte_loss", "sliding_windows",
    "ShawRelativeAttention", "relative_index", "shaw_attention", "shaw_attention_gathered",
    "shaw_attention_loop", "shaw_factory",
    "NoMemory", "PositionwiseFF", "RelMultiHeadAttention", "TransformerXL", "TransformerXLConfig",
    "XLLayer", "evaluate_bpc_xl", "generate_xl", "rel_scores", "rel_scores_naive", "rel_shift",
    "relative_distances", "relative_positions", "stream_nll",
    "Block", "CharTransformer", "CharTransformerConfig", "MultiHeadAttention", "attention",
    "attention_weights", "causal_mask", "check", "data", "evaluate_bpc", "generate",
    "leakage_matrix", "sample_next", "sinusoid_positions",
]
