"""`transformer_lens.factories`: pick an activation function or build an MLP from a config."""

from __future__ import annotations

from hooked.compat.utils import ACTIVATION_FN_DICT, XIELU
from hooked.core.config import HookedTransformerConfig

__path__: list[str] = []


class ActivationFunctionFactory:
    @staticmethod
    def pick_activation_function(cfg: HookedTransformerConfig):
        if cfg.act_fn is None:
            raise ValueError("act_fn not set when trying to select Activation Function")
        if cfg.act_fn == "xielu":  # trainable: an instance, so its parameters register on the MLP
            return XIELU()
        if cfg.act_fn not in ACTIVATION_FN_DICT:
            raise ValueError(f"Invalid activation function name: {cfg.act_fn}")
        return ACTIVATION_FN_DICT[cfg.act_fn]


class MLPFactory:
    @staticmethod
    def create_mlp(cfg: HookedTransformerConfig):
        from hooked.compat import components

        if cfg.uses_moe:
            gpt_oss = cfg.original_architecture == "GptOssForCausalLM"
            return components.GptOssMoE(cfg) if gpt_oss else components.MoE(cfg)
        return components.GatedMLP(cfg) if cfg.gated_mlp else components.MLP(cfg)
