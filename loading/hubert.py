"""HuBERT (`HubertModel`): convolutional front end, positional convolution, BERT-style encoder.

Not in the `HookedTransformer` registry: `HookedAudioEncoder.from_pretrained` uses `HUBERT`.
The positional convolution is stored weight-normed (`g`, `v`, norm over every axis but the
kernel axis); it is folded here into one kernel with `torch._weight_norm`, the function
HF's parametrization calls, so the folded weight is bit for bit the one HF convolves with.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.registry import register_model_class_architecture

HUBERT_CLASSES = ("HubertModel",)

FRONTEND_FIELDS = (
    "conv_dim",
    "conv_kernel",
    "conv_stride",
    "conv_bias",
    "feat_extract_norm",
    "feat_extract_activation",
    "feat_proj_layer_norm",
    "num_conv_pos_embeddings",
    "num_conv_pos_embedding_groups",
    "do_stable_layer_norm",
)


def convert_hubert_config(hf) -> dict:
    require_supported(hf, "Hubert", "conv_pos_batch_norm", (False,), default=False)  # a batch-normed conv
    require_activation(hf, "feat_extract_activation")  # the convolutional front end's
    require_supported(hf, "Hubert", "feat_extract_norm", ("group", "layer"))
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.num_attention_heads,
        n_heads=hf.num_attention_heads,
        d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_ctx=1 << 20,  # no learned positions: any number of frames
        act_fn=require_activation(hf, "hidden_act"),
        eps=hf.layer_norm_eps,
        normalization_type="LN",
        attention_dir="bidirectional",
        original_architecture="HubertModel",
    )


def hubert_frontend_config(hf) -> dict:
    """The `components.hubert.AudioFrontendConfig` fields of an HF `HubertConfig`."""
    fields = {name: getattr(hf, name) for name in FRONTEND_FIELDS}
    fields.update(conv_dim=list(hf.conv_dim), conv_kernel=list(hf.conv_kernel), conv_stride=list(hf.conv_stride))
    return fields


def block_weights(hf: Mapping[str, torch.Tensor], l: int, cfg) -> dict[str, torch.Tensor]:  # noqa: E741 - public name
    """Encoder layer `l` in TransformerLens names; absent biases are left out."""
    H, p, b = cfg.n_heads, f"encoder.layers.{l}.", f"blocks.{l}."
    sd = {}
    for n, proj in zip("QKV", ("q_proj", "k_proj", "v_proj"), strict=True):
        w = hf[p + f"attention.{proj}.weight"]  # [head * d_head, d_model]
        sd[b + f"attn.W_{n}"] = w.T.reshape(w.shape[1], H, -1).permute(1, 0, 2)  # [head, d_model, d_head]
        if p + f"attention.{proj}.bias" in hf:
            sd[b + f"attn.b_{n}"] = hf[p + f"attention.{proj}.bias"].reshape(H, -1)  # [head, d_head]
    w_o = hf[p + "attention.out_proj.weight"]  # [d_model, head * d_head]
    sd[b + "attn.W_O"] = w_o.T.reshape(H, -1, w_o.shape[0])  # [head, d_head, d_model]
    if p + "attention.out_proj.bias" in hf:
        sd[b + "attn.b_O"] = hf[p + "attention.out_proj.bias"]
    for ln, name in (("ln1", "layer_norm"), ("ln2", "final_layer_norm")):
        sd[b + f"{ln}.w"], sd[b + f"{ln}.b"] = hf[p + f"{name}.weight"], hf[p + f"{name}.bias"]
    sd[b + "mlp.W_in"] = hf[p + "feed_forward.intermediate_dense.weight"].T  # [d_model, d_mlp]
    sd[b + "mlp.W_out"] = hf[p + "feed_forward.output_dense.weight"].T  # [d_mlp, d_model]
    for ours, theirs in (("b_in", "intermediate_dense"), ("b_out", "output_dense")):
        if p + f"feed_forward.{theirs}.bias" in hf:
            sd[b + f"mlp.{ours}"] = hf[p + f"feed_forward.{theirs}.bias"]
    return sd


def folded_positional_kernel(hf: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """`g * v / ||v||` (norm over all axes but 2), from the parametrization or the legacy `weight_g`/`weight_v`."""
    p = "encoder.pos_conv_embed.conv."
    if p + "parametrizations.weight.original0" in hf:
        g, v = hf[p + "parametrizations.weight.original0"], hf[p + "parametrizations.weight.original1"]
    elif p + "weight_g" in hf:
        g, v = hf[p + "weight_g"], hf[p + "weight_v"]
    else:
        return hf[p + "weight"]
    return torch._weight_norm(v, g, 2)  # pyright: ignore[reportPrivateImportUsage] - torch's stubs do not export it; HF's weight norm computes this


def _frontend(hf: Mapping[str, torch.Tensor], hf_config) -> dict[str, torch.Tensor]:
    sd = {}
    for i in range(len(hf_config.conv_dim)):
        p, b = f"feature_extractor.conv_layers.{i}.", f"feature_extractor.conv_layers.{i}."
        sd[b + "W"] = hf[p + "conv.weight"]  # [c_out, c_in, kernel]
        if p + "conv.bias" in hf:
            sd[b + "b"] = hf[p + "conv.bias"]
        if p + "layer_norm.weight" in hf:
            sd[b + "norm_w"], sd[b + "norm_b"] = hf[p + "layer_norm.weight"], hf[p + "layer_norm.bias"]
    if "feature_projection.layer_norm.weight" in hf:
        sd["feature_projection.ln.w"] = hf["feature_projection.layer_norm.weight"]
        sd["feature_projection.ln.b"] = hf["feature_projection.layer_norm.bias"]
    sd["feature_projection.W"] = hf["feature_projection.projection.weight"].T  # [channels, d_model]
    sd["feature_projection.b"] = hf["feature_projection.projection.bias"]
    sd["pos_conv_embed.W"] = folded_positional_kernel(hf)  # [d_model, d_model / groups, kernel]
    sd["pos_conv_embed.b"] = hf["encoder.pos_conv_embed.conv.bias"]
    return sd


def convert_hubert_weights(hf: Mapping[str, torch.Tensor], cfg, hf_config=None) -> dict[str, torch.Tensor]:
    """HF HuBERT state dict -> hooked names: `feature_extractor`, `feature_projection`, `pos_conv_embed`,
    `encoder_ln` (before the blocks, or after them with stable layer norm), `blocks.{l}`.

    Without `hf_config` only the transformer (blocks and `encoder_ln`) is converted.
    """
    sd = _frontend(hf, hf_config) if hf_config is not None else {}
    for layer in range(cfg.n_layers):
        sd.update(block_weights(hf, layer, cfg))
    sd["encoder_ln.w"], sd["encoder_ln.b"] = hf["encoder.layer_norm.weight"], hf["encoder.layer_norm.bias"]
    return sd


HUBERT = register_model_class_architecture(
    "HubertModel", "HookedAudioEncoder", convert_hubert_config, convert_hubert_weights
)
