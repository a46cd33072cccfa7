"""`alias_transformer_lens()`: register `transformer_lens.*` module paths in `sys.modules`.

While the alias is active, `importlib.metadata.version("transformer-lens")` answers
`TL_VERSION` (the TransformerLens API `hooked` provides), unless a real transformer-lens
is installed, which then keeps answering for itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from typing import Any, cast

TL_VERSION = "2.18.0"

# transformer_lens module path -> the module that provides its names
TL_MODULES: dict[str, str] = {
    "transformer_lens": "hooked.compat.root",
    "transformer_lens.utils": "hooked.compat.utils",
    "transformer_lens.hook_points": "hooked.core.hook_points",
    "transformer_lens.patching": "hooked.analysis.patching",
    "transformer_lens.head_detector": "hooked.analysis.head_detector",
    "transformer_lens.past_key_value_caching": "hooked.generation.kv_cache",
    "transformer_lens.loading_from_pretrained": "hooked.compat.loading_from_pretrained",
    "transformer_lens.ActivationCache": "hooked.analysis.activation_cache",
    "transformer_lens.FactoredMatrix": "hooked.core.factored_matrix",
    "transformer_lens.HookedTransformer": "hooked.models.hooked_transformer",
    "transformer_lens.HookedTransformerConfig": "hooked.core.config",
    "transformer_lens.evals": "hooked.compat.evals",
    "transformer_lens.pretrained": "hooked.compat.pretrained",
    "transformer_lens.pretrained.weight_conversions": "hooked.compat.pretrained",
    **{
        f"transformer_lens.pretrained.weight_conversions.{name}": "hooked.compat.pretrained"
        for name in (
            "apertus",
            "bloom",
            "gemma",
            "gpt2",
            "gptj",
            "llama",
            "mistral",
            "mixtral",
            "neo",
            "neox",
            "openai",
            "opt",
            "phi",
            "phi3",
            "qwen",
            "qwen2",
            "qwen3",
        )
    },
    "transformer_lens.utilities": "hooked.compat.utilities",
    "transformer_lens.utilities.activation_functions": "hooked.compat.utilities",
    "transformer_lens.utilities.addmm": "hooked.compat.utilities",
    "transformer_lens.utilities.attention": "hooked.compat.utilities",
    "transformer_lens.utilities.devices": "hooked.compat.utilities",
    "transformer_lens.factories": "hooked.compat.factories",
    "transformer_lens.factories.activation_function_factory": "hooked.compat.factories",
    "transformer_lens.factories.mlp_factory": "hooked.compat.factories",
    "transformer_lens.components": "hooked.compat.components",
    # encoders (BERT) and the LIT integration
    "transformer_lens.HookedEncoder": "hooked.models.hooked_encoder",
    "transformer_lens.BertNextSentencePrediction": "hooked.models.next_sentence_prediction",
    "transformer_lens.pretrained.weight_conversions.bert": "hooked.compat.pretrained",
    "transformer_lens.lit": "hooked.compat.lit",
    "transformer_lens.lit.constants": "hooked.compat.lit.constants",
    "transformer_lens.lit.utils": "hooked.compat.lit.utils",
    "transformer_lens.lit.model": "hooked.compat.lit.wrappers",
    "transformer_lens.lit.dataset": "hooked.compat.lit.wrappers",
    **{
        f"transformer_lens.components.{name}": "hooked.compat.components"
        for name in (
            "abstract_attention",
            "attention",
            "grouped_query_attention",
            "embed",
            "pos_embed",
            "unembed",
            "layer_norm",
            "layer_norm_pre",
            "rms_norm",
            "rms_norm_pre",
            "transformer_block",
            "mlps",
            "mlps.can_be_used_as_mlp",
            "mlps.mlp",
            "mlps.gated_mlp",
            "mlps.moe",
            "mlps.gated_mlp_4bit",
            "mlps.gpt_oss_moe",
        )
    },
}


# encoders and encoder-decoders: T5 (HookedEncoderDecoder) and HuBERT (HookedAudioEncoder)
TL_MODULES.update(
    {
        "transformer_lens.HookedEncoderDecoder": "hooked.models.hooked_encoder_decoder",
        "transformer_lens.HookedAudioEncoder": "hooked.models.hooked_audio_encoder",
        "transformer_lens.pretrained.weight_conversions.t5": "hooked.compat.encoders",
        "transformer_lens.pretrained.weight_conversions.hubert": "hooked.compat.encoders",
        "transformer_lens.components.t5_attention": "hooked.compat.encoders",
        "transformer_lens.components.t5_block": "hooked.compat.encoders",
    }
)


class _Distribution(importlib.metadata.Distribution):
    """Package metadata of the `transformer-lens` API `hooked` provides."""

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: transformer-lens\nVersion: {TL_VERSION}\n"
        return None

    def locate_file(self, path):
        return path


class _MetadataFinder:
    """A `sys.meta_path` entry that only answers metadata queries for `transformer-lens`."""

    @staticmethod
    def find_spec(*args, **kwargs):
        return None

    @staticmethod
    def find_distributions(context=None):
        if context is None:  # importlib's own default: a query for every distribution
            context = importlib.metadata.DistributionFinder.Context()
        name = (context.name or "").replace("_", "-").lower()
        if name != "transformer-lens" or _installed_transformer_lens():
            return iter(())
        return iter((_Distribution(),))


def _installed_transformer_lens() -> bool:
    others = (f for f in sys.meta_path if f is not _MetadataFinder and hasattr(f, "find_distributions"))
    context = importlib.metadata.DistributionFinder.Context(name="transformer-lens")
    # (MetaPathFinderProtocol does not declare find_distributions: only the hasattr above knows it is there)
    return any(next(iter(cast(Any, f).find_distributions(context)), None) is not None for f in others)


def alias_transformer_lens(strict: bool = False) -> list[str]:
    """Register the `transformer_lens` module tree in `sys.modules`; returns the paths registered.

    Submodules are set as attributes of their parents, so `import transformer_lens.utils`
    and `transformer_lens.components.mlps.mlp.MLP` work. With `strict=False` a module
    that fails to import is skipped instead of raising.
    """
    registered = []
    for path in sorted(TL_MODULES, key=lambda p: p.count(".")):
        try:
            module = importlib.import_module(TL_MODULES[path])
        except ImportError:
            if strict:
                raise
            continue
        sys.modules[path] = module
        registered.append(path)
        parent, _, leaf = path.rpartition(".")
        if parent in sys.modules:
            _set_child(sys.modules[parent], leaf, module, path)
    if _MetadataFinder not in sys.meta_path:
        sys.meta_path.append(_MetadataFinder)
    return registered


def _set_child(parent: types.ModuleType, leaf: str, module: types.ModuleType, path: str) -> None:
    """`parent.leaf = module`, unless the parent defines that name otherwise.

    As in TransformerLens, `transformer_lens.HookedTransformer` stays the class, not its module.
    """
    if not hasattr(parent, leaf) or isinstance(getattr(parent, leaf), types.ModuleType):
        setattr(parent, leaf, module)


def unalias_transformer_lens() -> None:
    """Remove every `transformer_lens` entry registered by `alias_transformer_lens()`."""
    for path in TL_MODULES:
        sys.modules.pop(path, None)
    if _MetadataFinder in sys.meta_path:
        sys.meta_path.remove(_MetadataFinder)
