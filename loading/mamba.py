"""Mamba (`MambaForCausalLM`) and Mamba-2 (`Mamba2ForCausalLM`): blocks with a selective scan and no MLP.

    x = embeddings(tokens)
    per layer:  x += mixer(norm(x))           (Mamba: components/mamba.py; Mamba-2: components/mamba2.py)
    logits = lm_head(norm_f(x))

RMSNorm cast before its gain (as LLaMA); no positions (the scan is causal by construction, so
`n_ctx` only bounds truncation); no MLPs (`single_sublayer_blocks`). Mamba ties its embeddings by
default, Mamba-2 does not. HF keeps the residual stream in float32 (`residual_in_fp32`) even in a
half-precision model; hooked keeps it in the model's dtype, so half precision is close to HF's, not
bit for bit. Weights: each mixer's `in_proj`, `x_proj`, `dt_proj` and `out_proj` become right-
multiplying `W_in`, `W_x`, `W_dt`, `W_out` (views), the depthwise `conv1d.weight` `[C, 1, k]` becomes
`conv.W [C, k]`; missing biases become zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import bias_or_zeros, strip_prefix, unembed_weights
from hooked.loading.config_checks import require_supported
from hooked.loading.registry import register_architecture

#: Mamba has no positions; this only bounds `to_tokens(truncate=True)` (the length the 130M-2.8B models trained on)
MAMBA_N_CTX = 2048


def _ssm_config(hf: Any, architecture: str, layer_type: str) -> dict:
    require_supported(hf, architecture, "hidden_act", ("silu",), default="silu")
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size,
        n_heads=1,
        n_layers=hf.num_hidden_layers,
        n_ctx=MAMBA_N_CTX,
        d_vocab=hf.vocab_size,
        eps=hf.layer_norm_epsilon,
        normalization_type="RMS",
        positional_embedding_type="rotary",  # no positions at all: every layer is a recurrent one
        layer_types=[layer_type] * hf.num_hidden_layers,
        single_sublayer_blocks=True,
        ssm_d_state=hf.state_size,
        ssm_conv_kernel=hf.conv_kernel,
        ssm_act_fn=hf.hidden_act,
        original_architecture=architecture,
        default_prepend_bos=False,
    )


def convert_mamba_config(hf: Any) -> dict:
    return dict(
        _ssm_config(hf, "MambaForCausalLM", "mamba"),
        ssm_d_inner=hf.intermediate_size,
        ssm_dt_rank=int(hf.time_step_rank),
    )


def convert_mamba2_config(hf: Any) -> dict:
    return dict(
        _ssm_config(hf, "Mamba2ForCausalLM", "mamba2"),
        ssm_d_inner=hf.num_heads * hf.head_dim,
        ssm_n_heads=hf.num_heads,
        ssm_n_groups=hf.n_groups,
        ssm_chunk_size=hf.chunk_size,
        ssm_dt_limit=tuple(hf.time_step_limit),
    )


def conv_weights(hf: Mapping[str, torch.Tensor], key: str, prefix: str = "conv.") -> dict[str, torch.Tensor]:
    """A depthwise `nn.Conv1d` `[C, 1, k]` (and its bias, or zeros) -> `conv.W [C, k]`, `conv.b [C]`."""
    w = hf[key + ".weight"]  # [channels, 1, kernel]
    return {prefix + "W": w[:, 0], prefix + "b": bias_or_zeros(hf, key + ".bias", w.shape[0], w)}


def linear_weights(hf: Mapping[str, torch.Tensor], key: str, name: str) -> dict[str, torch.Tensor]:
    """An `nn.Linear` at `key` -> right-multiplying `W_{name} [in, out]` (a view) and `b_{name}` (or zeros)."""
    w = hf[key + ".weight"]  # [out, in]
    return {f"W_{name}": w.T, f"b_{name}": bias_or_zeros(hf, key + ".bias", w.shape[0], w)}


def mamba_mixer_weights(hf: Mapping[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """Mamba's `mixer.*` under prefix `p` -> `MambaMixer`'s parameters."""
    out = {**linear_weights(hf, p + "in_proj", "in"), **linear_weights(hf, p + "out_proj", "out")}
    out.update(conv_weights(hf, p + "conv1d"))
    out["W_x"] = hf[p + "x_proj.weight"].T  # [d_inner, dt_rank + 2 d_state]
    out.update(linear_weights(hf, p + "dt_proj", "dt"))  # W_dt [dt_rank, d_inner]
    out["A_log"], out["D"] = hf[p + "A_log"], hf[p + "D"]
    return out


def mamba2_mixer_weights(hf: Mapping[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """Mamba-2's `mixer.*` under prefix `p` -> `Mamba2Mixer`'s parameters."""
    out = {**linear_weights(hf, p + "in_proj", "in"), **linear_weights(hf, p + "out_proj", "out")}
    out.update(conv_weights(hf, p + "conv1d"))
    out.update(dt_bias=hf[p + "dt_bias"], A_log=hf[p + "A_log"], D=hf[p + "D"])
    out["norm.w"] = hf[p + "norm.weight"]  # [d_inner]: the gated RMSNorm's gain
    return out


def make_ssm_weights(mixer_weights):
    def convert(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        """HF Mamba state dict (`backbone.layers.{l}...`) -> TransformerLens-style names (views)."""
        hf = strip_prefix(hf_state, "backbone.")
        embedding = "embeddings.weight" if "embeddings.weight" in hf else "embedding.weight"  # older checkpoints
        sd = {"embed.W_E": hf[embedding]}  # [d_vocab, d_model]
        for layer in range(cfg.n_layers):
            p, b = f"layers.{layer}.", f"blocks.{layer}."
            sd[b + "ln1.w"] = hf[p + "norm.weight"]
            sd.update({b + "mixer." + k: v for k, v in mixer_weights(hf, p + "mixer.").items()})
        sd["ln_final.w"] = hf["norm_f.weight"]
        sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
        return sd

    return convert


register_architecture(("MambaForCausalLM",), convert_mamba_config, make_ssm_weights(mamba_mixer_weights))
register_architecture(("Mamba2ForCausalLM",), convert_mamba2_config, make_ssm_weights(mamba2_mixer_weights))
