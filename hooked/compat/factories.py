"""`transformer_lens.factories`: pick an activation function or build an MLP from a config."""

from __future__ import annotations

from hooked.compat import components
from hooked.compat.utilities import ActivationFunctionFactory  # noqa: F401  (transformer_lens.factories' name)
from hooked.compat.utils import ACTIVATION_FN_DICT, XIELU  # noqa: F401  (importable from here before)
from hooked.core.config import HookedTransformerConfig

__path__: list[str] = []


class MLPFactory:
    @staticmethod
    def create_mlp(cfg: HookedTransformerConfig):
        if cfg.uses_moe:
            gpt_oss = cfg.original_architecture == "GptOssForCausalLM"
            return components.GptOssMoE(cfg) if gpt_oss else components.MoE(cfg)
        return components.GatedMLP(cfg) if cfg.gated_mlp else components.MLP(cfg)
