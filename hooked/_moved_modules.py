"""The module paths `hooked` had before its subpackages, still importable.

`import hooked.hook_points` and `from hooked.patching import ...` keep working: a
`sys.meta_path` finder hands out the module that now does that job (the same module
object, so `hooked.hook_points.HookPoint is hooked.core.hook_points.HookPoint`). New code
imports the new paths; `hooked.utils` is the TransformerLens-compatible utilities
(`hooked.compat.utils`, which holds everything in `hooked.core.utils` too).

Compatibility with a date: an old path warns once, at its first import, with a
`DeprecationWarning` naming the new path and `REMOVED_IN`, the release that drops it. The
documented public modules (`PUBLIC_OLD_PATHS`) stay without a warning, as do TransformerLens's
`transformer_lens.*` paths (`hooked.compat.alias_transformer_lens()`, a different mechanism).
The module handed out keeps its own `__spec__`, so `importlib.reload` (and IPython's
autoreload) of the new module reloads the new name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

# old path -> the module that now does its job
MOVED_MODULES: dict[str, str] = {
    "hooked.activation_cache": "hooked.analysis.activation_cache",
    "hooked.cache_analysis": "hooked.analysis.cache_analysis",
    "hooked.config": "hooked.core.config",
    "hooked.dtypes": "hooked.core.dtypes",
    "hooked.encoder_loading": "hooked.loading.encoder_checkpoints",
    "hooked.encoder_weights": "hooked.models.stacked_weights_mixin",
    "hooked.errors": "hooked.core.errors",
    "hooked.factored_matrix": "hooked.core.factored_matrix",
    "hooked.fast_attributes": "hooked.core.fast_attributes",
    "hooked.head_detector": "hooked.analysis.head_detector",
    "hooked.hook_points": "hooked.core.hook_points",
    "hooked.hooked_audio_encoder": "hooked.models.hooked_audio_encoder",
    "hooked.hooked_encoder": "hooked.models.hooked_encoder",
    "hooked.hooked_encoder_decoder": "hooked.models.hooked_encoder_decoder",
    "hooked.hooked_transformer": "hooked.models.hooked_transformer",
    "hooked.inspection": "hooked.analysis.inspection",
    "hooked.interventions": "hooked.analysis.interventions",
    "hooked.loading_from_pretrained": "hooked.loading",  # was `from hooked.loading import *`
    "hooked.metrics": "hooked.analysis.metrics",
    "hooked.next_sentence_prediction": "hooked.models.next_sentence_prediction",
    "hooked.past_key_value_caching": "hooked.generation.kv_cache",
    "hooked.patching": "hooked.analysis.patching",
    "hooked.processing_mixin": "hooked.models.weight_processing_mixin",
    "hooked.sampling": "hooked.generation.sampling",
    "hooked.scale.dispatch": "hooked.placement.dispatch",
    "hooked.scale.placement": "hooked.placement.plan",
    "hooked.static_generation": "hooked.generation.static_cache",
    "hooked.thread_guard": "hooked.core.thread_guard",
    "hooked.token_index_mixin": "hooked.models.tokenizer_mixin",
    "hooked.tokenization": "hooked.models.tokenization",
    "hooked.tokenizer_mixin": "hooked.models.tokenizer_mixin",
    "hooked.utils": "hooked.compat.utils",
    "hooked.validation": "hooked.core.validation",
    "hooked.weight_processing": "hooked.processing.steps",
    "hooked.weight_views": "hooked.models.weight_views_mixin",
}

# old paths documented as public (docs/architecture.md): they stay, without a warning
PUBLIC_OLD_PATHS = frozenset({"hooked.interventions", "hooked.metrics", "hooked.utils"})
# the release that removes every other old path
REMOVED_IN = "0.3.0"


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module it moved to (no new module object, its `__spec__` kept)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.target_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name not in PUBLIC_OLD_PATHS:
            warnings.warn(
                f"`{spec.name}` is an old module path, removed in hooked {REMOVED_IN}: import `{self.target}`",
                DeprecationWarning,
                stacklevel=2,  # the `import` line: warnings skips the import machinery's frames
            )
        module = importlib.import_module(self.target)
        self.target_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # already executed under its own name; the import system has just stamped the old path's
        # spec on it: give the module its own back, so reloading it reloads the new name
        module.__spec__ = self.target_spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers only the paths in `MOVED_MODULES`; every other import goes on to the next finder."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(MOVED_MODULES[fullname]))


def install() -> None:
    """Put the finder on `sys.meta_path` once (called by `hooked/__init__.py`)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
