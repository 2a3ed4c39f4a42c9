"""The old home of the book's kinds and of the registry, kept so that code written against it
(``minixl.models.register(MY_KIND)``, as the README once showed) still runs.

Hand-written (not generated). New code imports the registry from `minixl.kinds`, a book
kind from its chapter's home (`minixl.xlnet.kind`) and kinds of your own through
`minixl.plugins`.
"""

from .aux_losses.kind import AUX_OBJECTIVE, parse_aux_losses
from .kinds import (DEFAULT_MODEL, KINDS, ModelKind, Objective, Preset, model_fields,
                    model_from_checkpoint, paper_presets, register, resolve_preset,
                    with_overrides)
from .plugins import kind_named as kind_of  # as before: a registered name or MODULE:NAME
from .relative_attention.kind import ShawConfig

__all__ = ["Preset", "Objective", "ModelKind", "KINDS", "DEFAULT_MODEL", "register", "kind_of",
           "paper_presets", "resolve_preset", "model_from_checkpoint", "with_overrides",
           "ShawConfig", "parse_aux_losses", "model_fields", "AUX_OBJECTIVE"]
