"""`transformer_lens.lit`: TransformerLens's LIT (Learning Interpretability Tool) integration, through the alias.

The helpers and constants work; the LIT model/dataset wrappers are not provided (see
`hooked.compat.lit.wrappers`).
"""

from __future__ import annotations

from hooked.compat.lit.constants import ERRORS, HOOK_POINTS, INPUT_FIELDS, OUTPUT_FIELDS, SERVER_CONFIG
from hooked.compat.lit.utils import check_lit_installed
from hooked.compat.lit.wrappers import (
    HookedTransformerLIT,
    HookedTransformerLITConfig,
    InductionDataset,
    IOIDataset,
    LITWidget,
    PromptCompletionDataset,
    SimpleTextDataset,
    serve,
    wrap_for_lit,
)

HookedTransformerLITBatched = None  # TransformerLens sets it only when lit-nlp is installed

__all__ = [
    "ERRORS",
    "HOOK_POINTS",
    "HookedTransformerLIT",
    "HookedTransformerLITBatched",
    "HookedTransformerLITConfig",
    "INPUT_FIELDS",
    "IOIDataset",
    "InductionDataset",
    "LITWidget",
    "OUTPUT_FIELDS",
    "PromptCompletionDataset",
    "SERVER_CONFIG",
    "SimpleTextDataset",
    "check_lit_installed",
    "serve",
    "wrap_for_lit",
]
