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
    sinusoid_positions,
)

__version__ = "0.1.0"

__all__ = [
    "AuxLossConfig", "AuxLosses", "evaluate_bpc_sliding", "intermediate_weight", "layer_weights",
    "next_byte_loss", "sliding_windows",
    "ShawRelativeAttention", "relative_index", "shaw_attention", "shaw_attention_gathered",
    "shaw_attention_loop", "shaw_factory",
    "Block", "CharTransformer", "CharTransformerConfig", "MultiHeadAttention", "attention",
    "attention_weights", "causal_mask", "check", "data", "evaluate_bpc", "generate",
    "leakage_matrix", "sinusoid_positions",
]
