"""Opt-in import compatibility: code written for TransformerLens 2.x imports `hooked`.

    import hooked.compat
    hooked.compat.alias_transformer_lens()
    from transformer_lens import HookedTransformer        # hooked's class
    import transformer_lens.utils as utils                # hooked.core.utils
    from transformer_lens.components.mlps.mlp import MLP  # components.MLP

Every public module path of TransformerLens 2.x is mapped in `TL_MODULES` to the `hooked`
module doing that job; the few names only TransformerLens has live in this package
(`components.py`, `utilities.py`, `factories.py`, `pretrained.py`, `evals.py`). Nothing is
registered unless you call `alias_transformer_lens()`.
"""

from __future__ import annotations

from hooked.compat.aliasing import TL_MODULES, TL_VERSION, alias_transformer_lens, unalias_transformer_lens
from hooked.compat.state_dict import tl_state_dict

__all__ = ["TL_MODULES", "TL_VERSION", "alias_transformer_lens", "tl_state_dict", "unalias_transformer_lens"]
