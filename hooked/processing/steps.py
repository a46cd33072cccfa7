"""Weight processing: rewrite a model's weights without changing what it computes.

TransformerLens processes weights so that they are easier to interpret:

1. `fold_ln` moves each norm's gain (and LayerNorm's bias) into the matrices that read
   the norm's output, leaving a parameter-free `LNPre` / `RMSPre`;
2. `center_writing_weights` removes the mean over `d_model` from everything that writes
   to the residual stream (exact when every reader of the stream is a LayerNorm, which
   subtracts that mean anyway);
3. `center_unembed` removes the mean over the vocabulary from `W_U` and `b_U` (logits
   shift by a per-position constant, so log-probabilities are unchanged);
4. `fold_value_biases` moves `b_V` into `b_O` (exact because each attention row sums to 1);
5. `refactor_factored_attn_matrices` rebalances `W_Q W_K^T` and `W_V W_O` by SVD.

Every function here takes a TransformerLens-format state dict and replaces its entries
one at a time: input tensors are never written in place (they may be views of a user's
HuggingFace model) and the dict is never cloned as a whole. The arithmetic is float32
per tensor (float64 for the refactoring SVDs) and each result is cast to `cfg.dtype`.
The model records applied steps in `cfg.weight_processing`; `process_state_dict` skips a
recorded step (with a warning), so processing twice equals processing once.
With tied embeddings `unembed.W_U` is
a transposed view of `embed.W_E`; a step that writes one of them gives it a new tensor,
so the two separate only when processing actually makes them differ.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable

import torch
from jaxtyping import Float

from hooked.core.config import (  # noqa: F401  (POST_NORM_ARCHITECTURES re-exported: its old home)
    LAYER_NORM_TYPES,
    POST_NORM_ARCHITECTURES,
    ConfigError,
    HookedTransformerConfig,
)

logger = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]

STEPS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases", "refactor_factored_attn_matrices")
_QKV_LEAVES = ("W_Q", "W_K", "W_V", "_W_K", "_W_V", "W_Q_B", "W_KV_B")  # MLA's up-projections: head-major too
_PRE = {"LN": "LNPre", "RMS": "RMSPre"}


# -- tensor helpers ------------------------------------------------------------------------


def _f32(sd: StateDict, key: str) -> torch.Tensor:
    """The entry as float32 (the same tensor if already fp32: callers only use out-of-place ops)."""
    return sd[key].float()


class OwnedStateDict(dict):
    """A state dict whose tensors processing may overwrite in place (they belong to nobody else).

    Writing results into the existing buffers keeps loading's memory at one copy of the
    weights: no second set of long-lived tensors, no allocator churn. A tensor sharing
    storage with another entry (tied embeddings, GPT-2's fused QKV) or with a
    `protected` storage (a user's live HF model) is still replaced, never written.
    """

    def __init__(self, entries: StateDict, protected: frozenset[int] = frozenset()):
        super().__init__(entries)
        counts: dict[int, int] = {}
        for t in entries.values():
            ptr = t.untyped_storage().data_ptr()
            counts[ptr] = counts.get(ptr, 0) + 1
        self._shared = {ptr for ptr, n in counts.items() if n > 1} | set(protected)

    def may_overwrite(self, key: str, shape: torch.Size, dtype: torch.dtype) -> bool:
        old = self.get(key)
        return (
            old is not None
            and old.shape == shape
            and old.dtype == dtype
            and old.untyped_storage().data_ptr() not in self._shared
        )


def _put(sd: StateDict, key: str, value: torch.Tensor, cfg: HookedTransformerConfig) -> None:
    """Store `value` under `key` as a `cfg.dtype` tensor; Q/K/V weights keep a head-major layout.

    In an `OwnedStateDict` the old buffer is overwritten when it can be. Otherwise a
    freshly computed `value` already in the right dtype and layout is stored as is: a
    second copy would only raise the peak memory of loading.
    """
    if isinstance(sd, OwnedStateDict) and sd.may_overwrite(key, value.shape, cfg.dtype):
        sd[key].copy_(value)
        return
    is_qkv = key.rsplit(".", 1)[-1] in _QKV_LEAVES and value.ndim == 3
    if value.dtype == cfg.dtype and (not is_qkv or _heads_flatten_as_view(value)):
        sd[key] = value
        return
    if is_qkv:
        n_heads, d_in, d_out = value.shape
        out = torch.empty(d_in, n_heads, d_out, dtype=cfg.dtype, device=value.device).permute(1, 0, 2)
    else:
        out = torch.empty(value.shape, dtype=cfg.dtype, device=value.device)
    sd[key] = out.copy_(value)


def _heads_flatten_as_view(w: torch.Tensor) -> bool:
    """Whether `[head, d_in, d_out]` flattens to `[d_in, head * d_out]` without a copy (one-matmul projection)."""
    try:
        w.permute(1, 0, 2).view(w.shape[1], -1)
        return True
    except RuntimeError:
        return False


def _bias(sd: StateDict, key: str, shape: torch.Size, device) -> torch.Tensor:
    """A reader's bias in fp32, zeros if the state dict has none."""
    return _f32(sd, key) if key in sd else torch.zeros(shape, device=device)


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def embeddings_tied(sd: StateDict) -> bool:
    """Whether `unembed.W_U` is a view of `embed.W_E`'s storage."""
    if "embed.W_E" not in sd or "unembed.W_U" not in sd:
        return False
    return _shares_storage(sd["embed.W_E"], sd["unembed.W_U"])


def _layers(cfg: HookedTransformerConfig) -> Iterable[str]:
    return (f"blocks.{layer}." for layer in range(cfg.n_layers))


def _kv(cfg: HookedTransformerConfig) -> str:
    """Key prefix of stored K/V tensors: `_` for grouped-query attention (`_W_K`, `_b_V`, ...)."""
    return "_" if cfg.uses_grouped_query_attention else ""


def _experts(sd: StateDict, p: str) -> list[str]:
    """Key prefixes `blocks.{l}.mlp.experts.{e}.` of a mixture-of-experts layer (empty for dense MLPs)."""
    n, prefix = 0, p + "mlp.experts."
    while f"{prefix}{n}.W_in.weight" in sd:
        n += 1
    return [f"{prefix}{e}." for e in range(n)]


# -- norm kinds ------------------------------------------------------------------------------


def _is_layernorm(kind: str | None) -> bool:
    return kind in LAYER_NORM_TYPES


def final_norm_kind(cfg: HookedTransformerConfig) -> str | None:
    """`ln_final`'s kind: RMS(Pre) when `final_rms` turns a LayerNorm model's last norm into RMSNorm."""
    if cfg.final_rms and cfg.uses_layer_norm:
        return "RMSPre" if cfg.normalization_type == "LNPre" else "RMS"
    return cfg.normalization_type


# -- 1. fold_ln ------------------------------------------------------------------------------


def _fold_norm_into_readers(
    sd: StateDict,
    cfg: HookedTransformerConfig,
    norm: str,
    readers: list[tuple[str, str]],
    layernorm: bool,
    fold_biases: bool,
    center_weights: bool,
) -> None:
    """Fold norm `(w, b)` into every reader `(R, b_R)` (R's input axis is -2).

    `b_R += b @ R`, then `R = diag(w) R`, then (LayerNorm only) `R -= mean_d(R)`: the
    LNPre output is orthogonal to the all-ones vector, so that mean never contributes.
    """
    w = _f32(sd, norm + ".w") if norm + ".w" in sd else None
    b = _f32(sd, norm + ".b") if layernorm and fold_biases and norm + ".b" in sd else None
    for R_key, b_key in readers:
        R = _f32(sd, R_key)  # [..., d_in, d_out]
        if b is not None:
            bias = _bias(sd, b_key, R.shape[:-2] + R.shape[-1:], R.device)
            _put(sd, b_key, bias + b @ R, cfg)  # b @ R: [..., d_out]
        if w is not None:
            R = R * w.unsqueeze(-1)
        if layernorm and center_weights:
            R = R - R.mean(-2, keepdim=True)
        _put(sd, R_key, R, cfg)
    sd.pop(norm + ".w", None)
    if b is not None:
        sd.pop(norm + ".b")


def fold_layer_norm(
    sd: StateDict, cfg: HookedTransformerConfig, fold_biases: bool = True, center_weights: bool = True
) -> StateDict:
    """Fold every pre-norm's gain (and LayerNorm bias) into its readers; the norms lose their parameters.

    Readers: W_Q, W_K, W_V per head for `ln1` (`_W_K`/`_W_V` under GQA; W_Q alone in a layer that
    reuses another's keys and values; an output gate's `W_gate`), or a recurrent mixer's input
    projection `mixer.W_in`; W_in and W_gate
    (and every MoE expert's, plus the router) for `ln2`; W_U for `ln_final`; W_out for
    `solu_ln`'s `mlp.ln`. RMSNorms fold their gain only (no bias, no centering), so this
    is right for every norm type with the default flags. `ln1_post`/`ln2_post` and
    `q_norm`/`k_norm` are never folded: their gain acts after the normalization.
    """
    block_ln = cfg.uses_layer_norm
    fold = dict(fold_biases=fold_biases, center_weights=center_weights)
    for layer, p in enumerate(_layers(cfg)):
        if cfg.block_has_mixer(layer):
            _fold_norm_into_readers(sd, cfg, p + "ln1", _ln1_readers(sd, cfg, layer), block_ln, **fold)
        if cfg.uses_mla and layer in cfg.attention_layers:
            _fold_latent_norms(sd, cfg, p + "attn.", **fold)
        if not cfg.block_has_mlp(layer):
            continue
        experts = _experts(sd, p)
        if experts:  # TL MoE layout: bias-free nn.Linear weights [out, d_model]
            _fold_moe(sd, cfg, p, experts, block_ln, **fold)
        else:
            mlp = p + "mlp."
            readers = [(mlp + "W_in", mlp + "b_in")] + ([(mlp + "W_gate", mlp + "b_gate")] if cfg.gated_mlp else [])
            _fold_norm_into_readers(sd, cfg, p + "ln2", readers, block_ln, **fold)
        if p + "mlp.ln.w" in sd:  # solu_ln: a LayerNorm over d_mlp, read by W_out
            _fold_norm_into_readers(sd, cfg, p + "mlp.ln", [(p + "mlp.W_out", p + "mlp.b_out")], True, **fold)
    if cfg.normalization_type is not None:
        final_ln = _is_layernorm(final_norm_kind(cfg))
        _fold_norm_into_readers(sd, cfg, "ln_final", [("unembed.W_U", "unembed.b_U")], final_ln, **fold)
    return sd


def _ln1_readers(sd: StateDict, cfg: HookedTransformerConfig, layer: int) -> list[tuple[str, str]]:
    """`(weight, bias)` keys of what reads block `layer`'s `ln1`: W_Q, W_K, W_V (W_Q alone in a layer that reuses
    another's keys and values; and an output gate's `W_gate`); under MLA the down-projections and DSA's indexer; or
    a recurrent mixer's input projections (`NORM_READERS` of its class)."""
    p, kind = f"blocks.{layer}.", cfg.mixer_types[layer]
    if kind != "attention":
        from hooked.components.hybrid_block import mixer_class

        return [(p + f"mixer.{w}", p + f"mixer.b{w[1:]}") for w in mixer_class(kind).NORM_READERS]  # type: ignore[attr-defined]
    attn = p + "attn."
    if cfg.uses_mla:
        names = ("W_Q_A" if cfg.q_lora_rank else "W_Q_B", "W_KV_A", "indexer.W_K", "indexer.W_weights")
        return [(attn + n, attn + n.replace("W_", "b_")) for n in names if attn + n in sd]
    kv = _kv(cfg.layer_config(layer))
    readers = [(attn + "W_Q", attn + "b_Q")]
    if cfg.kv_source(layer) is None:  # a KV-sharing layer projects q only
        readers += [(attn + kv + f"W_{x}", attn + kv + f"b_{x}") for x in "KV"]
    return readers + ([(attn + "W_gate", attn + "b_gate")] if attn + "W_gate" in sd else [])


def _fold_latent_norms(sd: StateDict, cfg: HookedTransformerConfig, attn: str, **fold) -> None:
    """MLA: each latent norm's gain into the up-projections that read it (RMSNorms: exact, no bias)."""
    if cfg.q_lora_rank:
        readers = [(attn + n, attn + "unused_bias") for n in ("W_Q_B", "indexer.W_Q") if attn + n in sd]
        _fold_norm_into_readers(sd, cfg, attn + "q_a_norm", readers, False, **fold)
    _fold_norm_into_readers(sd, cfg, attn + "kv_a_norm", [(attn + "W_KV_B", attn + "unused_bias")], False, **fold)


def _fold_moe(sd, cfg, p: str, experts: list[str], layernorm: bool, fold_biases: bool, center_weights: bool) -> None:
    """Fold `ln2` into the router(s) and every expert's W_in/W_gate (bias-free nn.Linear `[out, in]` weights)."""
    fold_bias = layernorm and fold_biases and p + "ln2.b" in sd
    if fold_bias and bool(sd[p + "ln2.b"].any()):
        raise NotImplementedError("Folding a LayerNorm bias into bias-free MoE experts is not supported")
    experts = experts + [p + "mlp.shared_expert."]  # Qwen2-MoE's always-on expert (absent elsewhere)
    keys = [p + "mlp.W_gate.weight", p + "mlp.shared_expert_gate.weight"]  # routers: [E or 1, d_model]
    keys += [e + name for e in experts for name in ("W_in.weight", "W_gate.weight")]
    keys = [k for k in keys if k in sd]
    w = _f32(sd, p + "ln2.w") if p + "ln2.w" in sd else None
    for key in keys:
        R = _f32(sd, key)  # [out, d_model]
        if w is not None:
            R = R * w
        if layernorm and center_weights:
            R = R - R.mean(-1, keepdim=True)
        _put(sd, key, R, cfg)
    sd.pop(p + "ln2.w", None)
    if fold_bias:  # an all-zero bias folds to nothing
        sd.pop(p + "ln2.b")


# -- 2. center_writing_weights -------------------------------------------------------------


def _center_last(sd: StateDict, cfg: HookedTransformerConfig, key: str, axis: int = -1) -> None:
    value = _f32(sd, key)
    if value is sd[key] and isinstance(sd, OwnedStateDict) and sd.may_overwrite(key, value.shape, cfg.dtype):
        value.sub_(value.mean(axis, keepdim=True))  # fp32 and ours: no temporary the size of W_U
        return
    _put(sd, key, value - value.mean(axis, keepdim=True), cfg)


def center_writing_weights(sd: StateDict, cfg: HookedTransformerConfig) -> StateDict:
    """Remove the mean over `d_model` from everything that writes to the residual stream.

    `W_E`, `W_pos` (learned absolute positions), `W_O`, `b_O`, `W_out`, `b_out` (every
    expert's for MoE). Exact only when every reader of the residual stream is a
    LayerNorm, which subtracts that mean itself; `process_state_dict` checks this.
    """
    _center_last(sd, cfg, "embed.W_E")  # [d_vocab, d_model]
    if cfg.positional_embedding_type == "standard" and "pos_embed.W_pos" in sd:
        _center_last(sd, cfg, "pos_embed.W_pos")  # [n_ctx, d_model]
    for layer, p in enumerate(_layers(cfg)):
        for writer in ("attn.W_O", "attn.b_O", "mixer.W_out", "mixer.b_out"):  # [.., d_model]
            if p + writer in sd:
                _center_last(sd, cfg, p + writer)
        if not cfg.block_has_mlp(layer):
            continue
        for e in _experts(sd, p) + [p + "mlp.shared_expert."] * (p + "mlp.shared_expert.W_out.weight" in sd):
            _center_last(sd, cfg, e + "W_out.weight", axis=0)  # [d_model, d_mlp]
        if p + "mlp.W_out" in sd:
            _center_last(sd, cfg, p + "mlp.W_out")  # [d_mlp, d_model]
        if p + "mlp.b_out" in sd:
            _center_last(sd, cfg, p + "mlp.b_out")  # [d_model]
    return sd


# -- 3. center_unembed -----------------------------------------------------------------------


def center_unembed(sd: StateDict, cfg: HookedTransformerConfig) -> StateDict:
    """Remove the mean over the vocabulary from `W_U` and `b_U`: every logit shifts by the same amount."""
    _center_last(sd, cfg, "unembed.W_U")  # [d_model, d_vocab_out]
    _center_last(sd, cfg, "unembed.b_U")  # [d_vocab_out]
    return sd


# -- 4. fold_value_biases --------------------------------------------------------------------


def _value_bias_out(
    b_V: Float[torch.Tensor, "head d_head"], W_O: Float[torch.Tensor, "head d_head d_model"]
) -> Float[torch.Tensor, "d_model"]:
    """`sum_h b_V[h] @ W_O[h]`: what the value biases add to the attention output, `[d_model]`."""
    return torch.einsum("he,hed->d", b_V, W_O)


def _fold_value_bias_layer(sd: StateDict, cfg: HookedTransformerConfig, attn: str, recenter: bool) -> None:
    """One layer of `fold_value_biases` (`attn` is the `blocks.{l}.attn.` prefix)."""
    kv = _kv(cfg)
    b_V = _f32(sd, attn + kv + "b_V")  # [kv_head, d_head]
    b_V_per_head = b_V.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, 0)  # [head, d_head]
    b_O = _f32(sd, attn + "b_O") + _value_bias_out(b_V_per_head, _f32(sd, attn + "W_O"))
    _put(sd, attn + "b_O", b_O - b_O.mean() if recenter else b_O, cfg)
    _put(sd, attn + kv + "b_V", torch.zeros_like(b_V), cfg)


def fold_value_biases(sd: StateDict, cfg: HookedTransformerConfig, recenter: bool = False) -> StateDict:
    """Move `b_V` into `b_O` and set it to zero.

    Each query's pattern sums to 1, so the values' bias reaches the output as the
    constant `sum_h b_V[h] @ W_O[h]`. Under GQA each `b_V` head serves a group of query
    heads, so it is repeated first. `recenter` removes `b_O`'s mean over `d_model` again
    (used when the writing weights were centered, so `b_O` stays exactly centered).
    """
    for layer in cfg.attention_layers:
        _fold_value_bias_layer(sd, cfg, f"blocks.{layer}.attn.", recenter)
    return sd


# -- 5. refactor_factored_attn_matrices --------------------------------------------------------


def check_refactorable(cfg: HookedTransformerConfig) -> None:
    """Refactoring changes q, k and v; only exact if nothing but `q.k` and `pattern @ v` use them."""
    reasons = [
        (cfg.uses_rotary, "rotary embeddings rotate q and k between the factors"),
        (cfg.use_qk_norm, "qk-norm normalizes q and k"),
        (cfg.uses_grouped_query_attention, "grouped-query attention shares W_K/W_V between query heads"),
        (cfg.clip_qkv is not None, "clip_qkv clamps q, k and v"),
        (cfg.attn_output_gate, "an output gate multiplies z elementwise between W_V and W_O"),
    ]
    for failed, why in reasons:
        if failed:
            raise ConfigError(f"refactor_factored_attn_matrices is not supported: {why}")


def _f64(sd: StateDict, key: str) -> torch.Tensor:
    """The entry as float64 on the CPU: SVD factors lose ~1e-6 relative in float32, which shows in the outputs."""
    return sd[key].to("cpu", torch.float64)


def _refactor_qk(
    W_Q: Float[torch.Tensor, "head d_model d_head"],
    b_Q: Float[torch.Tensor, "head d_head"],
    W_K: Float[torch.Tensor, "head d_model d_head"],
    b_K: Float[torch.Tensor, "head d_head"],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rebalance `[W_Q; b_Q] [W_K; b_K]^T` as `(U sqrt(S), sqrt(S) V^T)` per head."""
    from hooked.core.factored_matrix import FactoredMatrix

    Q_aug = torch.cat([W_Q, b_Q[:, None, :]], dim=1)  # [head, d_model + 1, d_head]
    K_aug = torch.cat([W_K, b_K[:, None, :]], dim=1)  # [head, d_model + 1, d_head]
    Q_even, K_even_T = FactoredMatrix(Q_aug, K_aug.transpose(-1, -2)).make_even().pair
    K_even = K_even_T.transpose(-1, -2)  # [head, d_model + 1, d_head]
    return Q_even[:, :-1], Q_even[:, -1], K_even[:, :-1], K_even[:, -1]


def refactor_factored_attn_matrices(sd: StateDict, cfg: HookedTransformerConfig, recenter: bool = False) -> StateDict:
    """Refactor each head's QK and OV circuits into balanced SVD factors.

    QK: with the biases appended as an extra input row, `W_Q^+ W_K^+T = U S V^T` becomes
    `W_Q^+ = U sqrt(S)`, `W_K^+ = V sqrt(S)`. OV: the value bias is folded into `b_O`,
    then `W_V W_O = U S V^T` becomes `W_V = U S`, `W_O = V^T`. Attention scores,
    patterns and outputs are unchanged; q, k, v and z are not. The SVDs run in float64
    (on the CPU) so the refactored products match the originals to float32 rounding.
    """
    from hooked.core.factored_matrix import FactoredMatrix

    check_refactorable(cfg)
    for layer in cfg.attention_layers:
        a = f"blocks.{layer}.attn."
        device = sd[a + "W_Q"].device
        W_Q, b_Q, W_K, b_K = _refactor_qk(*(_f64(sd, a + name) for name in ("W_Q", "b_Q", "W_K", "b_K")))
        for name, value in zip(("W_Q", "b_Q", "W_K", "b_K"), (W_Q, b_Q, W_K, b_K), strict=True):
            _put(sd, a + name, value.to(device), cfg)
        _fold_value_bias_layer(sd, cfg, a, recenter)
        U, S, V = FactoredMatrix(_f64(sd, a + "W_V"), _f64(sd, a + "W_O")).svd()  # [h,d,dh], [h,dh], [h,d,dh]
        _put(sd, a + "W_V", (U * S.unsqueeze(-2)).to(device), cfg)
        _put(sd, a + "W_O", V.transpose(-1, -2).to(device), cfg)  # [head, d_head, d_model]
    return sd


# -- the pipeline ------------------------------------------------------------------------------


_W, _I, _D = logging.WARNING, logging.INFO, logging.DEBUG
_NORM_STEPS = STEPS[:3]  # fold_ln, center_writing_weights, center_unembed
#: `(steps, applies(cfg), why the step must not run, log level)`, checked in order.
_SKIP_RULES: tuple[tuple[tuple[str, ...], Callable[[HookedTransformerConfig], bool], str, int], ...] = (
    (_NORM_STEPS, lambda c: c.positional_embedding_type == "shortformer",
     "shortformer adds positions after ln1, so the norms cannot be folded or relied on", _W),
    (STEPS[:2], lambda c: c.is_post_norm,
     "post-norm models normalize after each sublayer: no reader follows a pre-norm", _W),
    (("center_unembed",), lambda c: c.output_logits_soft_cap > 0,
     "output_logits_soft_cap > 0 makes the softmax sensitive to a shift of the logits", _W),
    (("fold_ln",), lambda c: bool(c.laurel_rank),
     "LAuReL (Gemma 3n) adds ln1's output itself to the residual stream, gain included", _W),
    (("fold_ln",), lambda c: c.normalization_type is None, "the model has no norms", _D),
    (("center_writing_weights",), lambda c: not (c.uses_layer_norm and not c.final_rms),
     "only LayerNorm models (not final_rms) center their residual stream", _D),
    (("fold_ln",), lambda c: c.uses_moe and c.uses_layer_norm,
     "a LayerNorm's bias cannot fold into the bias-free experts and router (PhiMoE)", _W),
    (("fold_value_biases",), lambda c: c.uses_mla,
     "multi-head latent attention has no value bias after its latent norm", _I),
    (("fold_value_biases",), lambda c: c.clip_qkv is not None, "clip_qkv clamps v after its bias", _I),
    (("fold_value_biases",), lambda c: c.use_v_norm, "the values are normalized after their bias (use_v_norm)", _I),
    (("fold_value_biases",), lambda c: bool(c.attn_sinks),
     "attention sinks make each pattern row sum to less than 1", _I),
)  # fmt: skip


def skip_reason(cfg: HookedTransformerConfig, step: str) -> tuple[str | None, int]:
    """Why `step` must not run on this model (None if it may), and the log level to say it at.

    A step already recorded in `cfg.weight_processing` is skipped, which makes processing
    idempotent. Shortformer and post-norm models keep their norms; a soft-capped output
    is not shift-invariant; centering the residual is exact only if LayerNorms read it.
    """
    if step in cfg.weight_processing:
        return "it was already applied (recorded in cfg.weight_processing)", _W
    for steps, applies, reason, level in _SKIP_RULES:
        if step in steps and applies(cfg):
            return reason, level
    return None, _D


def resolve_steps(cfg: HookedTransformerConfig, requested: dict[str, bool]) -> list[str]:
    """The requested steps that will run, in processing order; each skip is logged with its reason."""
    steps = []
    for step in STEPS:
        if not requested.get(step):
            continue
        reason, level = skip_reason(cfg, step)
        if reason is None:
            steps.append(step)
        else:
            logger.log(level, "Skipping %s: %s", step, reason)
    return steps


def apply_step(sd: StateDict, cfg: HookedTransformerConfig, step: str) -> StateDict:
    """Run one processing step on the state dict (the model is not touched)."""
    centered = "center_writing_weights" in cfg.weight_processing
    if step == "fold_ln":
        return fold_layer_norm(sd, cfg)
    if step == "center_writing_weights":
        return center_writing_weights(sd, cfg)
    if step == "center_unembed":
        return center_unembed(sd, cfg)
    if step == "fold_value_biases":
        return fold_value_biases(sd, cfg, recenter=centered)
    if step == "refactor_factored_attn_matrices":
        return refactor_factored_attn_matrices(sd, cfg, recenter=centered)
    raise ValueError(f"Unknown weight processing step {step!r}; steps are {STEPS}")


def folded_norm_type(normalization_type: str | None) -> str | None:
    """The norms' kind after `fold_ln`: `LN` -> `LNPre`, `RMS` -> `RMSPre` (gains and biases now in the readers)."""
    if normalization_type is None:
        return None
    return _PRE.get(normalization_type, normalization_type)


def run_steps(sd: StateDict, work: HookedTransformerConfig, steps: Iterable[str]) -> StateDict:
    """Apply `steps` in order, recording each in the working config `work` as it goes (the next step reads it)."""
    for step in steps:
        was_tied = embeddings_tied(sd)
        sd = apply_step(sd, work, step)
        if step == "fold_ln":
            work.normalization_type = folded_norm_type(work.normalization_type)
        work.weight_processing = work.weight_processing + (step,)
        _log_untie(step, was_tied, sd)
        logger.debug("Applied weight processing step %s", step)
    return sd


def _log_untie(step: str, was_tied: bool, sd: StateDict) -> None:
    if was_tied and not embeddings_tied(sd):  # expected after fold_ln on a tied model: not a warning
        logger.debug(
            "%s wrote %s: unembed.W_U now has its own tensor (it was a view of embed.W_E); the embeddings are untied",
            step,
            "unembed.W_U" if step in ("fold_ln", "center_unembed") else "embed.W_E",
        )


def float32_config(cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    """A working copy of `cfg` with dtype float32 for processing: a half-precision model's steps all run and
    store in float32 (a tensor two steps touch, such as `W_U`, is rounded once, when the model takes it)."""
    work = copy.copy(cfg)
    work.dtype = torch.float32
    return work


def process_state_dict(
    cfg: HookedTransformerConfig,
    state_dict: StateDict,
    *,
    fold_ln: bool,
    center_writing_weights: bool,
    center_unembed: bool,
    fold_value_biases: bool,
    refactor_factored_attn_matrices: bool,
    in_place: bool = False,
    protected_storages: frozenset[int] = frozenset(),
) -> tuple[StateDict, tuple[str, ...]]:
    """Run the enabled steps in order on `state_dict`; returns it and the steps that ran.

    `cfg` is not changed: the model records the steps (`record_weight_processing`), which
    after `fold_ln` also makes its norms `LNPre`/`RMSPre` so the state-dict keys match.
    Entries are replaced one at a time and input tensors are never modified, unless
    `in_place` says the caller owns them (see `OwnedStateDict`; `protected_storages` are
    still never written).
    """
    if in_place:
        state_dict = OwnedStateDict(state_dict, protected_storages)
    requested = dict(
        fold_ln=fold_ln,
        center_writing_weights=center_writing_weights,
        center_unembed=center_unembed,
        fold_value_biases=fold_value_biases,
        refactor_factored_attn_matrices=refactor_factored_attn_matrices,
    )
    steps = resolve_steps(cfg, requested)
    if "refactor_factored_attn_matrices" in steps:
        check_refactorable(cfg)  # raise before anything changes
    return run_steps(state_dict, float32_config(cfg), steps), tuple(steps)
