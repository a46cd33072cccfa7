"""Opt-in import compatibility: make `import transformer_lens...` resolve to `hooked`.

    import hooked.compat
    hooked.compat.alias_transformer_lens()
    from transformer_lens import HookedTransformer   # hooked's class
    import transformer_lens.utils as utils           # hooked.utils

Nothing is registered unless you call `alias_transformer_lens()`.
"""

from __future__ import annotations

import importlib
import sys

# transformer_lens submodule -> hooked module that provides its names
SUBMODULES = {
    "utils": "hooked.utils",
    "hook_points": "hooked.hook_points",
    "patching": "hooked.patching",
    "head_detector": "hooked.head_detector",
    "past_key_value_caching": "hooked.past_key_value_caching",
    "loading_from_pretrained": "hooked.loading_from_pretrained",
    "ActivationCache": "hooked.activation_cache",
    "FactoredMatrix": "hooked.factored_matrix",
    "HookedTransformer": "hooked.hooked_transformer",
    "HookedTransformerConfig": "hooked.config",
    "components": "components",
}


def alias_transformer_lens(strict: bool = False) -> list[str]:
    """Register `transformer_lens` and its submodules in `sys.modules`; returns the names registered.

    A submodule whose `hooked` counterpart cannot be imported is skipped (or raises with `strict`).
    """
    import hooked

    sys.modules["transformer_lens"] = hooked
    registered = ["transformer_lens"]
    for tl_name, module_name in SUBMODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if strict:
                raise
            continue
        sys.modules[f"transformer_lens.{tl_name}"] = module
        registered.append(f"transformer_lens.{tl_name}")
    return registered
