"""T5 (`T5ForConditionalGeneration`): encoder-decoder, relative position bias, RMSNorm, no biases.

Not in the `HookedTransformer` registry: `HookedEncoderDecoder.from_pretrained` uses `T5`.
HF's `q/k/v/o` are `nn.Linear` (`[out, in]`), so each is transposed into TransformerLens's
`[head, d_model, d_head]`. T5 v1.1 / Flan-T5 use a gated-GELU MLP (`wi_0` gate, `wi_1` linear).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.config_checks import HF_ACTIVATIONS, refuse, require_supported
from hooked.loading.registry import register_model_class_architecture

T5_CLASSES = ("T5ForConditionalGeneration",)


def convert_t5_config(hf) -> dict:
    num_decoder_layers = getattr(hf, "num_decoder_layers", None) or hf.num_layers
    if num_decoder_layers != hf.num_layers:
        refuse(
            "T5",
            "num_decoder_layers",
            num_decoder_layers,
            f"as many decoder layers as encoder layers ({hf.num_layers}): "
            "HookedEncoderDecoder, as TransformerLens, builds both stacks with n_layers",
        )
    proj = require_supported(
        hf, "T5", "feed_forward_proj", lambda p: p.split("-")[-1] in HF_ACTIVATIONS,
        describe=f"'<act>' or 'gated-<act>', <act> one of {', '.join(sorted(HF_ACTIVATIONS))}",
    )  # fmt: skip
    gated = proj.startswith("gated-")
    act = HF_ACTIVATIONS[proj.split("-")[-1]]
    if gated and act == "gelu":  # HF's T5 maps "gated-gelu" to the tanh approximation
        act = "gelu_new"
    return dict(
        d_model=hf.d_model,
        d_head=hf.d_kv,
        n_heads=hf.num_heads,
        d_mlp=hf.d_ff,
        d_vocab=hf.vocab_size,
        n_layers=hf.num_layers,
        n_ctx=getattr(hf, "n_positions", None) or 512,
        eps=hf.layer_norm_epsilon,
        act_fn=act,
        gated_mlp=gated,
        normalization_type="RMS",
        positional_embedding_type="relative_positional_bias",
        relative_attention_num_buckets=hf.relative_attention_num_buckets,
        relative_attention_max_distance=hf.relative_attention_max_distance,
        decoder_start_token_id=getattr(hf, "decoder_start_token_id", None),  # None: the pad token
        attention_dir="bidirectional",
        use_attn_scale=False,
        # TransformerLens's name for "rescale by d_model**-0.5 before the unembedding" (original T5, not v1.1);
        # transformers >= 5 keeps it in scale_decoder_outputs and always ties the embeddings
        tie_word_embeddings=getattr(hf, "scale_decoder_outputs", hf.tie_word_embeddings),
        original_architecture="T5ForConditionalGeneration",
    )


def _heads_in(w: torch.Tensor, H: int) -> torch.Tensor:
    """`nn.Linear` weight `[head * d_head, d_model]` -> `[head, d_model, d_head]` (a view)."""
    return w.T.reshape(w.shape[1], H, -1).permute(1, 0, 2)


def _attention(hf: Mapping[str, torch.Tensor], p: str, b: str, cfg) -> dict[str, torch.Tensor]:
    H, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    w = hf[p + "q.weight"]
    sd = {b + f"W_{n}": _heads_in(hf[p + f"{n.lower()}.weight"], H) for n in "QKV"}
    sd[b + "W_O"] = hf[p + "o.weight"].T.reshape(H, dh, d)  # [head, d_head, d_model]
    zeros: dict[str, Any] = dict(dtype=w.dtype, device=w.device)
    sd.update({b + f"b_{n}": torch.zeros(H, dh, **zeros) for n in "QKV"})
    sd[b + "b_O"] = torch.zeros(d, **zeros)
    return sd


def _mlp(hf: Mapping[str, torch.Tensor], p: str, b: str, cfg) -> dict[str, torch.Tensor]:
    wo = hf[p + "wo.weight"]  # [d_model, d_mlp]
    zeros: dict[str, Any] = dict(dtype=wo.dtype, device=wo.device)
    sd = {
        b + "W_out": wo.T,
        b + "b_out": torch.zeros(cfg.d_model, **zeros),
        b + "b_in": torch.zeros(cfg.d_mlp, **zeros),
    }
    if cfg.gated_mlp:
        sd[b + "W_gate"], sd[b + "W_in"] = hf[p + "wi_0.weight"].T, hf[p + "wi_1.weight"].T  # [d_model, d_mlp]
        sd[b + "b_gate"] = torch.zeros(cfg.d_mlp, **zeros)
    else:
        sd[b + "W_in"] = hf[p + "wi.weight"].T  # [d_model, d_mlp]
    return sd


def _stack(hf, stack: str, cfg) -> dict[str, torch.Tensor]:
    """One stack's blocks: the encoder's sublayers are `layer.0` (attn), `layer.1` (MLP); the
    decoder's `layer.0` (self), `layer.1` (cross), `layer.2` (MLP)."""
    decoder = stack == "decoder"
    sd = {
        f"{stack}.0.attn.rel_pos_bias.weight": hf[
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        ]
    }
    for layer_i in range(cfg.n_layers):
        p, b = f"{stack}.block.{layer_i}.layer.", f"{stack}.{layer_i}."
        sd.update(_attention(hf, p + "0.SelfAttention.", b + "attn.", cfg))
        sd[b + "ln1.w"] = hf[p + "0.layer_norm.weight"]
        if decoder:
            sd.update(_attention(hf, p + "1.EncDecAttention.", b + "cross_attn.", cfg))
        sd[b + "ln2.w"] = hf[p + "1.layer_norm.weight"]
        last = "2" if decoder else "1"
        sd.update(_mlp(hf, p + last + ".DenseReluDense.", b + "mlp.", cfg))
        if decoder:
            sd[b + "ln3.w"] = hf[p + "2.layer_norm.weight"]
    sd[f"{stack}_final_ln.w"] = hf[f"{stack}.final_layer_norm.weight"]
    return sd


def _first(hf: Mapping[str, torch.Tensor], *keys: str) -> torch.Tensor:
    for key in keys:
        if key in hf:
            return hf[key]
    raise KeyError(f"none of {keys} in the T5 checkpoint")


def convert_t5_weights(hf: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF T5 state dict -> TransformerLens names: `embed`, `encoder.{l}`, `encoder_final_ln`,
    `decoder.{l}` (with `cross_attn` and `ln3`), `decoder_final_ln`, `unembed`."""
    W_E = _first(hf, "shared.weight", "encoder.embed_tokens.weight")  # [d_vocab, d_model]
    sd = {"embed.W_E": W_E}
    sd.update(_stack(hf, "encoder", cfg))
    sd.update(_stack(hf, "decoder", cfg))
    lm_head = hf.get("lm_head.weight", W_E)  # [d_vocab, d_model]
    sd["unembed.W_U"] = lm_head.T  # [d_model, d_vocab]
    sd["unembed.b_U"] = torch.zeros(lm_head.shape[0], dtype=W_E.dtype, device=W_E.device)
    return sd


T5 = register_model_class_architecture(
    "T5ForConditionalGeneration", "HookedEncoderDecoder", convert_t5_config, convert_t5_weights
)
