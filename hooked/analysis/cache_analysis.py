"""Residual-stream decompositions of an `ActivationCache` (TransformerLens semantics).

The residual stream is a sum: embeddings, every attention head's output, every MLP
neuron's output, and the biases. These methods split a cached residual stream into
those pieces (`[component, *batch_and_pos, d_model]` stacks with labels), rescale them
the way the next norm would (`apply_ln_to_stack`), and project them onto the logit
difference of chosen tokens (`logit_attrs`, direct logit attribution).

`pos_slice` uses `Slice` semantics: an int drops the position axis.

A stack that went through `apply_ln` (here or in `apply_ln_to_stack`) remembers which
norm scaled it, also through views such as `stack[:, :, -1]`: scaling it again raises,
and `logit_attrs` uses a stack scaled by the final norm as it is.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.analysis.layer_types import check_present
from hooked.components.norms import LayerNormPre
from hooked.core.config import POST_NORM_ARCHITECTURES  # noqa: F401  (importable from here before)
from hooked.core.errors import InputError, MissingHooksError
from hooked.core.utils import Slice, SliceInput
from hooked.core.validation import check_layer

logger = logging.getLogger(__name__)


def has_post_sublayer_norms(cfg) -> bool:
    """Whether each sublayer's output is normalized again before the residual add (Gemma 2/3, OLMo-2/3).

    Kept for callers of this function: `HookedTransformerConfig.has_post_sublayer_norms` defines it.
    """
    return cfg.has_post_sublayer_norms


def _through_norm_gain(
    writes: Float[torch.Tensor, "... d_model"], centers: bool, gain: torch.Tensor | None
) -> torch.Tensor:
    """What a norm does to its input after the division by its scale: centering (LayerNorm), then the gain."""
    if centers:
        writes = writes - writes.mean(-1, keepdim=True)
    return writes if gain is None else writes * gain.to(writes.dtype)


@dataclass(frozen=True)
class Normalized:
    """Which norm already scaled a stack: `reader` (e.g. `"ln_final"`, `"blocks.3.ln1"`), and whether the
    norm was applied in full to each component (`recomputed`: the logit lens, gain included)."""

    reader: str
    recomputed: bool = False


_NORMALIZED: dict[int, tuple[weakref.ref, Normalized]] = {}  # storage address -> (weak ref to the tensor, how)


def mark_normalized(stack: torch.Tensor, how: Normalized) -> torch.Tensor:
    """Remember that `stack` was scaled by a norm, for it and every tensor sharing its storage
    (views such as `stack[:, :, -1]`, `stack.detach()`); returns `stack`."""
    key = stack.untyped_storage().data_ptr()
    if stack.numel() == 0 or key == 0:
        return stack

    def forget(ref, key=key):
        if _NORMALIZED.get(key, (None,))[0] is ref:
            del _NORMALIZED[key]

    _NORMALIZED[key] = (weakref.ref(stack, forget), how)
    return stack


def normalized_by(stack: torch.Tensor) -> Normalized | None:
    """How `stack` (or the tensor whose storage it shares) was scaled by `apply_ln`, or None."""
    key = stack.untyped_storage().data_ptr()
    entry = _NORMALIZED.get(key)
    if entry is None or key == 0:
        return None
    marked = entry[0]()  # alive, so its storage (and address) is still the one marked
    return entry[1] if marked is not None and marked.untyped_storage().data_ptr() == key else None


Stack = Float[torch.Tensor, "component *batch_and_pos d_model"]
# What apply_ln_to_stack and logit_attrs accept: any leading axes that broadcast against the cache's
# (`[component, batch, pos, d_model]`, `[batch, d_model]`, `[layer, head, batch, d_model]`, ...), as TransformerLens
AnyStack = Float[torch.Tensor, "*stack d_model"]
Projection = Float[torch.Tensor, "d_model"] | Float[torch.Tensor, "d_model n_outs"] | None


class CacheAnalysisMixin:
    """Needs `self.model`, `self.cache_dict`, `self.has_batch_dim` and `self[key]`."""

    # set by the host class (`ActivationCache`); declared here for the type checker
    model: Any
    cache_dict: dict[str, torch.Tensor]
    has_batch_dim: bool
    tokens: torch.Tensor | None

    if TYPE_CHECKING:

        def _key(self, key) -> str: ...

        def __getitem__(self, key) -> torch.Tensor: ...

    # -- helpers -------------------------------------------------------------------------
    def _check_decomposable(self, what: str, needs_sum: bool = True) -> None:
        """Refuse `what` where the residual stream is not what it assumes: one stream (not Gemma 3n's AltUp
        streams) and, with `needs_sum`, the sum of the embedding and the sublayers' outputs (not Gemma 3n/4)."""
        cfg = self.model.cfg
        if getattr(cfg, "uses_altup", False):
            raise NotImplementedError(
                f"{what}: this model's residual stream is {cfg.altup_num_inputs} AltUp streams (Gemma 3n), "
                "[batch, pos, stream, d_model]; read the cached streams (resid_pre, resid_post) directly"
            )
        if needs_sum and not getattr(cfg, "residual_is_sum_of_sublayers", True):
            raise NotImplementedError(
                f"{what}: this model's residual stream is not the sum of the embedding and the attention and MLP "
                "outputs (Gemma 4: per-layer inputs and a layer scalar also write or scale it)"
            )

    def _final_layer(self, layer: int | None) -> int:
        """`None` and -1 mean the unembed input, i.e. layer `n_layers`."""
        n_layers = self.model.cfg.n_layers
        if layer is None or layer == -1:
            return n_layers
        check_layer(layer, "layer", low=0, high=n_layers)
        return layer

    def _has_embed(self) -> bool:
        return "hook_embed" in self.cache_dict

    def _has_pos_embed(self) -> bool:
        """Whether the model adds a position embedding to the residual stream (then it must be cached)."""
        # A shortformer's position embedding feeds q and k but is never added to the residual stream.
        return "hook_pos_embed" in self.model.hook_dict and self.model.cfg.positional_embedding_type != "shortformer"

    def _embed_keys(self) -> list[str]:
        return ["hook_embed"] + (["hook_pos_embed"] if self._has_pos_embed() else [])

    def _require(self, keys: list, what: str) -> None:
        """Raise `MissingHooksError` naming every cache entry `what` needs but this cache lacks."""
        names = [self._key(k) for k in keys]
        missing = [n for n in dict.fromkeys(names) if n not in self.cache_dict]
        if not missing:
            return
        check_present(self.model.cfg, missing)
        suffixes = tuple(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise MissingHooksError(
            f"{what} needs {shown}, which this cache lacks. Cache them with "
            f"run_with_cache(..., names_filter=lambda name: name.endswith({suffixes!r})), or names_filter=None for all."
        )

    def _resid_like(self) -> Float[torch.Tensor, "*batch_and_pos d_model"]:
        """Any cached `[*batch_and_pos, d_model]` tensor, to shape empty stacks."""
        return self["hook_embed"] if self._has_embed() else self["resid_pre", 0]

    def _resid_entering(self, layer: int, mlp_input: bool) -> Float[torch.Tensor, "*batch_and_pos d_model"]:
        """The residual stream read by `layer`'s attention (its MLP with `mlp_input`; the unembed at n_layers)."""
        if mlp_input:
            return self["resid_mid", layer]
        return self["resid_pre", 0] if layer == 0 else self["resid_post", layer - 1]

    def _reads_with_ln2(self, layer: int, mlp_input: bool) -> bool:
        """Whether `ln2` reads the stream entering `layer` (its MLP's input, or a block with no token mixer)."""
        return mlp_input or not self.model.cfg.block_has_mixer(layer)

    def _reader_name(self, layer: int, mlp_input: bool) -> str:
        if layer == self.model.cfg.n_layers:
            return "ln_final"
        return f"blocks.{layer}.{'ln2' if self._reads_with_ln2(layer, mlp_input) else 'ln1'}"

    def _reader_norm(self, layer: int, mlp_input: bool) -> tuple[nn.Module, str]:
        """The norm that reads the residual stream at `layer` (ln_final at n_layers) and its scale hook."""
        if layer == self.model.cfg.n_layers:
            return getattr(self.model, "ln_final", nn.Identity()), "ln_final.hook_scale"
        if self.model.cfg.post_sublayer_norm:
            raise InputError(
                f"apply_ln at layer {layer}: this post-norm model (OLMo-2/3) has no norm reading the residual stream "
                "inside its blocks (ln1/ln2 normalize the sublayer outputs); apply_ln works at the final layer only"
            )
        which = "ln2" if self._reads_with_ln2(layer, mlp_input) else "ln1"
        norm = getattr(self.model.blocks[layer], which, None)
        if norm is None:  # an attention-only block has no ln2: no MLP reads the stream there
            if self.model.cfg.normalization_type is None:
                return nn.Identity(), f"blocks.{layer}.{which}.hook_scale"  # no norm anywhere: as TransformerLens
            raise InputError(
                f"mlp_input=True at layer {layer}: this attention-only model has no MLP, so no {which} reads the "
                "residual stream there; drop mlp_input"
            )
        return norm, f"blocks.{layer}.{which}.hook_scale"

    def _cached_scale(
        self, layer: int, mlp_input: bool, pos_slice: Slice, batch_slice: Slice | None = None
    ) -> Float[torch.Tensor, "*batch_and_pos 1"]:
        _, key = self._reader_norm(layer, mlp_input)
        if key not in self.cache_dict:
            raise KeyError(f"apply_ln needs the cached scale {key!r}; cache it with run_with_cache")
        scale = self.cache_dict[key]
        if scale.ndim == (4 if self.has_batch_dim else 3):  # split-input mode: one scale per head
            scale = scale[..., 0, :]  # [*batch_and_pos, head, 1] -> [*batch_and_pos, 1]: query head 0
        scale = pos_slice.apply(scale, dim=-2)
        if batch_slice is not None and self.has_batch_dim:
            scale = batch_slice.apply(scale, dim=0)
        return scale

    def _post_norm(self, layer: int, sublayer: Literal["attn", "mlp"]) -> tuple[nn.Module, str] | None:
        """The norm applied to `layer`'s attention (or MLP) output before the residual add, and its scale hook."""
        cfg = self.model.cfg
        if cfg.use_normalization_before_and_after:
            name = "ln1_post" if sublayer == "attn" else "ln2_post"
        elif cfg.post_sublayer_norm:
            name = "ln1" if sublayer == "attn" else "ln2"  # OLMo-2/3: the only norms of a block
        else:
            return None
        return getattr(self.model.blocks[layer], name), f"blocks.{layer}.{name}.hook_scale"

    def _freeze_post_norm(
        self,
        writes: Float[torch.Tensor, "*batch_and_pos n d_model"],
        layer: int,
        sublayer: Literal["attn", "mlp"],
        pos_slice: Slice,
    ) -> Float[torch.Tensor, "*batch_and_pos n d_model"]:
        """Each of `n` writes (heads, neurons) as its share of the post-sublayer norm's output.

        The norm divides the sublayer's summed output by one cached scale per position and
        multiplies by its gain; with the scale frozen that map is linear, so applying it to
        each write separately gives terms that sum to `hook_attn_out` / `hook_mlp_out`.
        """
        frozen = self._post_norm_scale(layer, sublayer, pos_slice)
        if frozen is None:
            return writes
        centers, gain, scale = frozen
        writes = writes / scale[..., None, :].to(writes.dtype)  # [*batch_and_pos, n, d_model]
        return _through_norm_gain(writes, centers, gain)

    def _post_norm_scale(
        self, layer: int, sublayer: Literal["attn", "mlp"], pos_slice: Slice
    ) -> tuple[bool, torch.Tensor | None, Float[torch.Tensor, "*batch_and_pos 1"]] | None:
        """`(centers, gain, cached scale)` of `layer`'s post-sublayer norm (None without post-sublayer norms).

        The gain is read with `model.block_weight` (paged in if offloaded; from its rank in a pipeline).
        """
        post = self._post_norm(layer, sublayer)
        if post is None:
            return None
        norm, key = post
        self._require([key], f"per-{'head' if sublayer == 'attn' else 'neuron'} results behind post-sublayer norms")
        name = key.removesuffix(".hook_scale").removeprefix(f"blocks.{layer}.")
        bias = self._norm_weight(norm, layer, name, "b")
        if bias is not None and bool(bias.detach().ne(0).any()):
            raise NotImplementedError(
                f"{key.rsplit('.', 1)[0]} has a bias, which belongs to no single head or neuron: "
                "pass freeze_post_norm=False for the raw pre-norm results"
            )
        gain = self._norm_weight(norm, layer, name, "w")
        return isinstance(norm, LayerNormPre), gain, pos_slice.apply(self.cache_dict[key], dim=-2)  # [*bp, 1]

    def _norm_weight(self, norm: nn.Module, layer: int, name: str, leaf: str) -> torch.Tensor | None:
        if not isinstance(getattr(norm, leaf, None), torch.Tensor):
            return None
        return self.model.block_weight(layer, f"{name}.{leaf}")

    # -- residual stream stacks ----------------------------------------------------------
    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: SliceInput = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream as it stood before each layer (`{l}_pre`), up to `layer`.

        This is the input of the logit lens: what the model "believes" after l layers.

        Args:
            layer: the last layer to include; `n_layers` (or None/-1) ends with `final_post`.
            incl_mid: add each `resid_mid` (`{l}_mid`).
            apply_ln: scale each component as the norm reading the stream at `layer` scales it.
            pos_slice: positions to keep (an int keeps a length-1 axis, a tuple is `slice(*t)`, a
                list or tensor indexes); None keeps all.
            mlp_input: add the `resid_mid` of `layer` (the MLP's input).
            return_labels: also return the component labels.

        Returns:
            `[component, batch, pos, d_model]` (and the labels).
        """
        self._check_decomposable("accumulated_resid", needs_sum=False)
        pos_slice = Slice.unwrap(pos_slice)
        layer = self._final_layer(layer)
        n_layers = self.model.cfg.n_layers
        needed = [("resid_pre", layer_i) for layer_i in range(min(layer + 1, n_layers))]
        wants_mid = lambda i: ((incl_mid and i < layer) or (mlp_input and i == layer)) and self._has_mid(i)  # noqa: E731
        needed += [("resid_mid", layer_i) for layer_i in range(min(layer + 1, n_layers)) if wants_mid(layer_i)]
        self._require(needed + ([("resid_post", n_layers - 1)] if layer == n_layers else []), "accumulated_resid")
        parts, labels = [], []
        for layer_i in range(layer + 1):
            if layer_i == n_layers:
                parts.append(self["resid_post", n_layers - 1])
                labels.append("final_post")
                continue
            parts.append(self["resid_pre", layer_i])
            labels.append(f"{layer_i}_pre")
            if wants_mid(layer_i):
                parts.append(self["resid_mid", layer_i])
                labels.append(f"{layer_i}_mid")
        stack = torch.stack([pos_slice.apply(p, dim=-2) for p in parts], dim=0)  # [component, *bp, d_model]
        if apply_ln:
            stack = self.apply_ln_to_stack(
                stack, layer, mlp_input=mlp_input, pos_slice=pos_slice, recompute_ln=layer == n_layers
            )
        return (stack, labels) if return_labels else stack

    def _has_mid(self, layer: int) -> bool:
        """Whether block `layer` has `hook_resid_mid` (a hybrid's single-sublayer blocks have none)."""
        cfg = self.model.cfg
        return cfg.layer_types is None or len(cfg.block_writes(layer)) == 2

    def _sublayer_writes(self, layer: int, mode: str) -> list[str]:
        """What block `layer` adds to the residual stream, as hook shorthands (`attn_out`, `mixer_out`, `mlp_out`),
        limited by `mode`: "attn" keeps the token mixers (attention or recurrent), "mlp" the MLPs."""
        writes = self.model.cfg.block_writes(layer)
        return [w for w in writes if mode == "all" or (w == "mlp_out") == (mode == "mlp")]

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: Literal["all", "mlp", "attn"] = "all",
        apply_ln: bool = False,
        pos_slice: SliceInput = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream entering `layer` split into the sublayer outputs that wrote it.

        Components are `embed`, `pos_embed`, then `{l}_attn_out` and `{l}_mlp_out` for each
        earlier layer (a recurrent layer of a state-space or hybrid model writes `{l}_mixer_out`;
        a single-sublayer block writes one of them). They sum to the residual stream, also with
        post-sublayer norms (Gemma 2/3): the `attn_out`/`mlp_out` hooks hold what was added, after any such norm.

        Args:
            layer: the residual stream entering this layer (None: the final one).
            mlp_input: the stream entering `layer`'s MLP instead (adds `{layer}_attn_out`).
            mode: "all", or only "attn" (the token mixers: attention and recurrent layers) or "mlp" outputs.
            apply_ln: scale each component as the norm reading the stream scales their sum.
            pos_slice: positions to keep (an int keeps a length-1 axis, a tuple is `slice(*t)`, a
                list or tensor indexes); None keeps all.
            incl_embeds: include `embed` and `pos_embed`.
            return_labels: also return the component labels.

        Returns:
            `[component, batch, pos, d_model]` (and the labels).
        """
        self._check_decomposable("decompose_resid")
        pos_slice = Slice.unwrap(pos_slice)
        layer = self._final_layer(layer)
        writes = [(name, layer_i) for layer_i in range(layer) for name in self._sublayer_writes(layer_i, mode)]
        if mlp_input and mode != "mlp" and layer < self.model.cfg.n_layers and self._has_mid(layer):
            writes += [(name, layer) for name in self._sublayer_writes(layer, "attn")]  # the token mixer before it
        self._require((self._embed_keys() if incl_embeds else []) + writes, "decompose_resid")
        parts, labels = [], []
        if incl_embeds:
            parts.append(self["hook_embed"])
            labels.append("embed")
        if incl_embeds and self._has_pos_embed():
            parts.append(self["hook_pos_embed"])
            labels.append("pos_embed")
        for name, layer_i in writes:
            parts.append(self[name, layer_i])
            labels.append(f"{layer_i}_{name}")
        stack = torch.stack([pos_slice.apply(p, dim=-2) for p in parts], dim=0)  # [component, *bp, d_model]
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    # -- attention heads -----------------------------------------------------------------
    def compute_head_results(self) -> None:
        """Cache each head's write to the residual stream, `blocks.{l}.attn.hook_result`.

        A head's result is `z[..., h, :] @ W_O[h]` (without `b_O`), so a layer's
        `attn_out` is the sum of its heads' results plus `b_O`, except behind a
        post-sublayer norm (Gemma 2/3 `ln1_post`, OLMo-2 `ln1`), where `attn_out` is the
        norm of that sum. These are the forward pass's `hook_result` values (before that
        norm); `stack_head_results` gives each head's share of `attn_out`.
        """
        missing = [
            layer_i
            for layer_i in self.model.cfg.attention_layers  # a hybrid's recurrent layers have no heads
            if f"blocks.{layer_i}.attn.hook_result" not in self.cache_dict
        ]
        if not missing:
            logger.warning("compute_head_results: head results are already cached")
        for layer_i in missing:
            z = self["z", layer_i]  # [*batch_and_pos, head, d_head]
            W_O = self.model.block_weight(layer_i, "attn.W_O")  # [head, d_head, d_model]
            with torch.set_grad_enabled(z.requires_grad and torch.is_grad_enabled()):
                result = torch.einsum("...hd,hdm->...hm", z, W_O.to(z.dtype))  # [*batch_and_pos, head, d_model]
            self.cache_dict[f"blocks.{layer_i}.attn.hook_result"] = result

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: SliceInput = None,
        apply_ln: bool = False,
        freeze_post_norm: bool = True,
    ) -> Stack | tuple[Stack, list[str]]:
        """Every head's write to the residual stream in layers before `layer`, `L{l}H{h}`, stacked on axis 0.

        In a hybrid model only its attention layers have heads (`cfg.attention_layers`); a recurrent
        layer's write stays in the remainder. `incl_remainder` appends `remainder` =
        `resid_post[layer-1]` minus the heads, so the stack sums to the residual stream. Behind
        post-sublayer norms (Gemma 2/3 `ln1_post`, OLMo-2/3 `ln1`) each head's result is passed
        through that norm with its scale frozen from the cache (`hook_scale`, as `apply_ln` freezes
        the final norm's) and its gain applied, so a layer's heads sum to its `hook_attn_out`;
        `freeze_post_norm=False` gives the raw results from before the norm instead.

        Args:
            layer: heads of the layers before this one (-1: all layers).
            return_labels: also return the labels `L{l}H{h}`.
            incl_remainder: append the rest of the residual stream, so the stack sums to it.
            pos_slice: positions to keep (an int keeps a length-1 axis, a tuple is `slice(*t)`, a
                list or tensor indexes); None keeps all.
            apply_ln: scale each head's write as the norm reading the stream at `layer` scales it.
            freeze_post_norm: pass each write through its post-sublayer norm (see above).

        Returns:
            `[layer * head (+1), batch, pos, d_model]` (and the labels).
        """
        pos_slice = Slice.unwrap(pos_slice)
        layer = self._final_layer(layer)
        n_heads = self.model.cfg.n_heads
        layers = [layer_i for layer_i in self.model.cfg.attention_layers if layer_i < layer]  # a hybrid: its attention
        if any(f"blocks.{layer_i}.attn.hook_result" not in self.cache_dict for layer_i in layers):
            self.compute_head_results()
        labels = [f"L{layer_i}H{h}" for layer_i in layers for h in range(n_heads)]
        if layers:
            results = [pos_slice.apply(self["result", layer_i], dim=-3) for layer_i in layers]  # [*bp, head, d_model]
            if freeze_post_norm:
                results = [
                    self._freeze_post_norm(r, layer_i, "attn", pos_slice)
                    for layer_i, r in zip(layers, results, strict=True)
                ]
            stack = torch.cat(results, dim=-2).movedim(-2, 0)  # [layer * head, *bp, d_model]
        else:
            stack = torch.zeros(0, *pos_slice.apply(self._resid_like(), dim=-2).shape, device=self._resid_like().device)
        if incl_remainder:
            resid = pos_slice.apply(self._resid_entering(layer, mlp_input=False), dim=-2)
            stack = torch.cat([stack, (resid - stack.sum(0))[None]], dim=0)
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def stack_activation(
        self, activation_name: str, layer: int = -1, sublayer_type: str | None = None
    ) -> Float[torch.Tensor, "layer ..."]:
        """`cache[(activation_name, l, sublayer_type)]` for every l < `layer`, stacked on axis 0."""
        layer = self._final_layer(layer)
        return torch.stack([self[(activation_name, layer_i, sublayer_type)] for layer_i in range(layer)], dim=0)

    # -- MLP neurons ---------------------------------------------------------------------
    def get_neuron_results(
        self,
        layer: int,
        neuron_slice: SliceInput = None,
        pos_slice: SliceInput = None,
        project_output_onto: Projection = None,
        freeze_post_norm: bool = True,
    ) -> Float[torch.Tensor, "*batch_and_pos neuron d_model"] | torch.Tensor:
        """Each neuron's write to the residual stream, `post[..., n] * W_out[n]`.

        With `project_output_onto` (`[d_model]` or `[d_model, k]`) the projection is
        applied to `W_out` first, so the `[..., neuron, d_model]` tensor is never built.
        Behind a post-sublayer norm (Gemma 2/3 `ln2_post`, OLMo-2/3 `ln2`) the write goes
        through that norm with its cached scale frozen and its gain applied, so the
        neurons sum to `hook_mlp_out`; `freeze_post_norm=False` gives the write before it.
        """
        neuron_slice, pos_slice = Slice.unwrap(neuron_slice), Slice.unwrap(pos_slice)
        self._check_dense_mlp()
        acts = pos_slice.apply(self["post", layer], dim=-2)  # [*bp, d_mlp]
        acts = neuron_slice.apply(acts, dim=-1)
        W_out = neuron_slice.apply(self.model.block_weight(layer, "mlp.W_out"), dim=0)  # [neuron, d_model]
        if freeze_post_norm and self._post_norm(layer, "mlp") is not None:
            writes = self._freeze_post_norm(acts[..., None] * W_out, layer, "mlp", pos_slice)  # [*bp, neuron, d_model]
            return writes if project_output_onto is None else writes @ project_output_onto.to(writes.dtype)
        if project_output_onto is None:
            return acts[..., None] * W_out  # [*bp, neuron, d_model]
        projected = W_out @ project_output_onto.to(W_out.dtype)  # [neuron] or [neuron, k]
        return acts * projected if project_output_onto.ndim == 1 else acts[..., None] * projected

    def _check_dense_mlp(self) -> None:
        if self.model.cfg.uses_moe:
            raise NotImplementedError("Neuron results of mixture-of-experts MLPs: use expand_neurons=False")

    def _neuron_write(
        self,
        layer: int,
        neuron_slice: Slice,
        project_2d: torch.Tensor | None,
        reader_norm: nn.Module | None,
        post_norm: tuple[bool, torch.Tensor | None] | None = None,
    ) -> Float[torch.Tensor, "neuron out"]:
        """Per-neuron output direction: through a post norm (`(centers, gain)`), then centered if the reader centers."""
        W_out = neuron_slice.apply(self.model.block_weight(layer, "mlp.W_out"), dim=0)  # [neuron, d_model]
        if post_norm is not None:
            W_out = _through_norm_gain(W_out, *post_norm)
        if isinstance(reader_norm, LayerNormPre):
            W_out = W_out - W_out.mean(-1, keepdim=True)
        return W_out if project_2d is None else W_out @ project_2d.to(W_out.dtype)

    def stack_neuron_results(
        self,
        layer: int,
        pos_slice: SliceInput = None,
        neuron_slice: SliceInput = None,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        project_output_onto: Projection = None,
        mlp_input: bool = False,
        freeze_post_norm: bool = True,
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Every neuron's write to the residual stream in layers before `layer`, `L{l}N{n}`, stacked on axis 0.

        `incl_remainder` appends `remainder` (the residual stream read at `layer` minus the
        neurons). `project_output_onto` is contracted with `W_out` before the per-neuron
        expansion, also under `apply_ln` (normalizing by a cached scale is linear).
        Behind post-sublayer norms (Gemma 2/3 `ln2_post`, OLMo-2/3 `ln2`) each write goes
        through that norm with its cached scale frozen and its gain applied, so a layer's
        neurons sum to its `hook_mlp_out`; `freeze_post_norm=False` gives the raw writes.

        Args:
            layer: neurons of the layers before this one.
            pos_slice: positions to keep (an int keeps a length-1 axis, a tuple is `slice(*t)`, a
                list or tensor indexes); None keeps all.
            neuron_slice: the neurons to keep in each layer (same forms as `pos_slice`).
            return_labels: also return the labels `L{l}N{n}`.
            incl_remainder: append the rest of the residual stream.
            apply_ln: scale each write as the norm reading the stream at `layer` scales it.
            project_output_onto: a direction `[d_model]` or directions `[d_model, k]`: return each
                neuron's write projected onto it instead of the full `[d_model]` vector.
            mlp_input: measure against the stream entering `layer`'s MLP (its `ln2` scale, and
                `resid_mid` for the remainder) instead of the block's input.
            freeze_post_norm: pass each write through its post-sublayer norm (see above).

        Returns:
            `[layer * d_mlp (+1), batch, pos, d_model or k]` (and the labels).
        """
        layer = self._final_layer(layer)
        self._check_dense_mlp()
        pos_slice, neuron_slice = Slice.unwrap(pos_slice), Slice.unwrap(neuron_slice)
        if neuron_slice.mode == "int":  # layers are concatenated on the neuron axis: keep it
            neuron_slice = Slice([neuron_slice.slice])
        proj = project_output_onto
        project_2d = None if proj is None else (proj[:, None] if proj.ndim == 1 else proj)  # [d_model, k]
        neurons = neuron_slice.apply(torch.arange(self.model.cfg.d_mlp), dim=0).tolist()
        mlp_layers = [layer_i for layer_i in range(layer) if self.model.cfg.block_has_mlp(layer_i)]
        labels = [f"L{layer_i}N{n}" for layer_i in mlp_layers for n in neurons]
        norm, _ = self._reader_norm(layer, mlp_input)
        ln_folded = apply_ln and not isinstance(norm, nn.Identity)
        scale = self._cached_scale(layer, mlp_input, pos_slice) if ln_folded else None
        per_layer = []
        for layer_i in mlp_layers:
            acts = neuron_slice.apply(pos_slice.apply(self["post", layer_i], dim=-2), dim=-1)  # [*bp, neuron]
            if scale is not None:
                acts = acts / scale
            frozen = self._post_norm_scale(layer_i, "mlp", pos_slice) if freeze_post_norm else None
            if frozen is not None:
                acts = acts / frozen[2].to(acts.dtype)
            post_norm = None if frozen is None else frozen[:2]
            per_layer.append(
                acts[..., None]
                * self._neuron_write(layer_i, neuron_slice, project_2d, norm if ln_folded else None, post_norm)
            )
        out_dim = self.model.cfg.d_model if project_2d is None else project_2d.shape[-1]
        if per_layer:
            stack = torch.cat(per_layer, dim=-2).movedim(-2, 0)  # [layer * neuron, *bp, out]
        else:
            bp = pos_slice.apply(self._resid_like(), dim=-2).shape[:-1]
            stack = torch.zeros(0, *bp, out_dim, device=self._resid_like().device)
        if incl_remainder:
            stack = self._with_neuron_remainder(stack, layer, mlp_input, pos_slice, ln_folded, project_2d)
            labels.append("remainder")
        if proj is not None and proj.ndim == 1:
            stack = stack.squeeze(-1)
        if ln_folded and proj is None:
            mark_normalized(stack, Normalized(self._reader_name(layer, mlp_input)))
        return (stack, labels) if return_labels else stack

    def _with_neuron_remainder(
        self,
        stack: torch.Tensor,  # [n_neurons, *bp, out]
        layer: int,
        mlp_input: bool,
        pos_slice: Slice,
        ln_folded: bool,
        project_2d: torch.Tensor | None,  # [d_model, k]
    ) -> torch.Tensor:  # [n_neurons + 1, *bp, out]
        """`stack` with the residual stream read at `layer` minus the neurons' writes appended, treated as they are."""
        target = pos_slice.apply(self._resid_entering(layer, mlp_input), dim=-2)[None]  # [1, *bp, d_model]
        if ln_folded:
            target = self.apply_ln_to_stack(target, layer, mlp_input=mlp_input, pos_slice=pos_slice)
        if project_2d is not None:
            target = target @ project_2d.to(target.dtype)
        return torch.cat([stack, target - stack.sum(0, keepdim=True)], dim=0)

    # -- norms and logits ----------------------------------------------------------------
    def apply_ln_to_stack(
        self,
        residual_stack: AnyStack,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: SliceInput = None,
        batch_slice: SliceInput = None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
    ) -> Float[torch.Tensor, "*stack_out d_model"]:
        """Rescale each component the way the norm reading the stream at `layer` scales their sum.

        A norm divides the whole residual stream by one scale, so each component's share of
        the norm's output is `(component - mean) / cached_scale` (no mean for RMSNorm): the
        norm's `hook_normalized`, before any gain (which `fold_ln` moves into the next weights). The
        reader is `ln1` of `layer` (`ln2` with `mlp_input`), or `ln_final` for None/-1/n_layers.
        `recompute_ln` at the final layer instead applies `ln_final` to each component alone
        (the logit lens). Models without norms get the stack back unchanged.

        As in TransformerLens the stack is divided by the cached scale (after `pos_slice` and
        `batch_slice`, e.g. `pos_slice=-1` for a stack of the last position) by broadcasting, so
        any leading axes work: `[component, batch, pos, d_model]`, `[batch, d_model]`,
        `[layer, head, batch, d_model]`. A stack the scale does not broadcast against is refused;
        one it would enlarge gets TransformerLens's result and a warning; a stack that was scaled
        already (`apply_ln=True`) is refused.

        Args:
            residual_stack: components `[component, batch, pos, d_model]`, or any shape whose axes
                before `d_model` end in the cache's batch/position axes as sliced.
            layer: whose reader norm: `ln1` of `layer`, or `ln_final` for None/-1/n_layers.
            mlp_input: use `ln2` of `layer` instead.
            pos_slice: the positions `residual_stack` holds, so the cached scale matches.
            batch_slice: the batch rows to keep.
            has_batch_dim: False when `residual_stack` has no batch axis.
            recompute_ln: at the final layer, normalize each component with its own statistics.

        Returns:
            The scaled stack, same shape (after `batch_slice`).
        """
        self._check_decomposable("apply_ln_to_stack", needs_sum=False)
        layer = self._final_layer(layer)
        norm, _ = self._reader_norm(layer, mlp_input)
        pos_slice, batch_slice = Slice.unwrap(pos_slice), Slice.unwrap(batch_slice)
        done = normalized_by(residual_stack)
        if done is not None and not isinstance(norm, nn.Identity):
            raise InputError(
                f"apply_ln: this stack was already scaled by {done.reader} (built with apply_ln=True); scaling it "
                f"again by {self._reader_name(layer, mlp_input)} would divide it twice: pass the stack built with "
                "apply_ln=False, or use this one as it is"
            )
        if has_batch_dim:
            residual_stack = batch_slice.apply(residual_stack, dim=1)
        if isinstance(norm, nn.Identity):  # (TransformerLens skips the batch slice here; we apply it always)
            return residual_stack
        how = Normalized(
            self._reader_name(layer, mlp_input), recomputed=recompute_ln and layer == self.model.cfg.n_layers
        )
        if how.recomputed:
            return mark_normalized(torch.stack([norm(c) for c in residual_stack], dim=0), how)  # [component, *bp, d]
        scale = self._cached_scale(layer, mlp_input, pos_slice, batch_slice)  # [*bp, 1]
        what = f"{how.reader}'s cached scale with pos_slice={_shown(pos_slice)} and batch_slice={_shown(batch_slice)}"
        _check_broadcast(residual_stack, scale, "apply_ln", what, _SLICE_FIX)
        if isinstance(norm, LayerNormPre):
            residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
        return mark_normalized(residual_stack / scale, how)

    def logit_attrs(
        self,
        residual_stack: AnyStack,
        tokens: str | int | Int[torch.Tensor, "..."],
        incorrect_tokens: str | int | Int[torch.Tensor, "..."] | None = None,
        pos_slice: SliceInput = None,
        batch_slice: SliceInput = None,
        has_batch_dim: bool = True,
    ) -> Float[torch.Tensor, "*stack_out"]:
        """Direct logit attribution: each component's contribution to a token's logit (difference).

        The stack is scaled by the final norm's cached scale and dotted with
        `W_U[:, tokens]` (minus `W_U[:, incorrect_tokens]`), times the final norm's gain
        where it was not folded into `W_U` (unprocessed and post-norm models; TransformerLens
        leaves it out). Summed over a full decomposition this is the logit (difference)
        without `b_U` (and without an unfolded final LayerNorm's bias).

        A stack already scaled by the final norm (`apply_ln=True` at the last layer) is used
        as it is, not scaled twice (the logit lens's `accumulated_resid(apply_ln=True)`, which
        went through all of `ln_final`, gives each layer's logit-lens difference without
        `b_U`); one scaled by another layer's norm is refused. As in TransformerLens the
        stack may have any leading axes (see `apply_ln_to_stack`), and the token directions
        multiply it by broadcasting: tokens shaped like the stack's batch/position axes, a
        single token, or (beyond TransformerLens, which would broadcast them against the
        position axis) one token per sequence `[batch]` for a stack of every position.

        Args:
            residual_stack: components `[component, batch, pos, d_model]` (from `decompose_resid`,
                `stack_head_results`, ...) or any stack `apply_ln_to_stack` takes
                (`[batch, d_model]`, `[layer, head, batch, d_model]`), not yet scaled by the final norm.
            tokens: the answer: a string (one token), an id, or ids `[batch]` (one per example).
            incorrect_tokens: the wrong answer, same form: attribute the logit difference.
            pos_slice: the positions `residual_stack` was sliced to, so the cached scale matches.
            batch_slice: the batch rows `residual_stack` was sliced to.
            has_batch_dim: False when `residual_stack` has no batch axis.

        Returns:
            `[component, batch, pos]` contributions (without the axes sliced away).
        """
        done = normalized_by(residual_stack)
        if done is not None and done.reader != "ln_final":
            raise InputError(
                f"logit_attrs: this stack was scaled by {done.reader} (apply_ln=True at that layer), but logit "
                "attribution scales by ln_final: build the stack with layer=-1, or with apply_ln=False"
            )
        directions = self._token_directions(tokens)
        if incorrect_tokens is not None:
            wrong = self._token_directions(incorrect_tokens)
            if wrong.shape != directions.shape:
                raise ValueError(
                    f"tokens and incorrect_tokens must have the same shape, got {tuple(directions.shape[:-1])} "
                    f"and {tuple(wrong.shape[:-1])}"
                )
            directions = directions - wrong
        gain = getattr(getattr(self.model, "ln_final", None), "w", None)
        if gain is not None and not (done is not None and done.recomputed):  # (a recomputed ln_final applied it)
            directions = directions * gain.to(directions.dtype)  # [..., d_model]
        if done is None:
            scaled = self.apply_ln_to_stack(
                residual_stack, -1, pos_slice=pos_slice, batch_slice=batch_slice, has_batch_dim=has_batch_dim
            )
        else:
            scaled = Slice.unwrap(batch_slice).apply(residual_stack, dim=1) if has_batch_dim else residual_stack
        if has_batch_dim and self._one_token_per_sequence(directions, scaled, pos_slice, batch_slice):
            directions = directions[:, None]  # [batch, 1, d_model]: one direction per sequence, every position
        _check_broadcast(scaled, directions, "logit_attrs", "the tokens' residual directions", _TOKENS_FIX)
        return (scaled * directions.to(scaled.dtype)).sum(-1)

    def _one_token_per_sequence(
        self, directions: torch.Tensor, stack: torch.Tensor, pos_slice: SliceInput, batch_slice: SliceInput
    ) -> bool:
        """Whether `directions` `[batch, d_model]` give one token per sequence of a stack that ends in the cached
        forward's `[batch, pos]` axes (TransformerLens would broadcast them against the position axis instead)."""
        batch_slice = Slice.unwrap(batch_slice)
        if directions.ndim != 2 or batch_slice.mode == "int" or not self.has_batch_dim:
            return False
        reference = self.tokens if self.tokens is not None else self.cache_dict.get("hook_embed")
        if reference is None:  # this cache cannot tell its axes: read the stack as [component, batch, pos, d_model]
            return stack.ndim == 4 and directions.shape[0] == stack.shape[1]
        reference = reference if reference.ndim == 2 else reference[..., 0]  # [batch, pos]
        axes = tuple(batch_slice.apply(Slice.unwrap(pos_slice).apply(reference, dim=-1), dim=0).shape)
        return len(axes) == 2 and tuple(stack.shape[-3:-1]) == axes and directions.shape[0] == axes[0]

    def _token_directions(self, tokens) -> Float[torch.Tensor, "... d_model"]:
        if isinstance(tokens, str):
            tokens = self.model.to_single_token(tokens)
        return self.model.tokens_to_residual_directions(tokens)

    def logit_lens(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        pos_slice: SliceInput = None,
        return_labels: bool = False,
    ) -> Float[torch.Tensor, "component *batch_and_pos d_vocab_out"] | tuple[torch.Tensor, list[str]]:
        """Unembed every `accumulated_resid` component as if it were the final residual stream.

        Each component goes through `ln_final` with its own statistics, then `W_U`, `b_U`
        and the logit soft-cap, so the last component (`final_post`) equals the logits.

        Args:
            layer: the last layer to include (None: all, ending with `final_post`).
            incl_mid: add each `resid_mid`.
            pos_slice: positions to keep (an int keeps a length-1 axis, a tuple is `slice(*t)`, a
                list or tensor indexes); None keeps all.
            return_labels: also return the component labels.

        Returns:
            Logits `[component, batch, pos, d_vocab_out]` (and the labels).
        """
        self._check_decomposable("logit_lens", needs_sum=False)
        stack, labels = _labelled(
            self.accumulated_resid(layer, incl_mid=incl_mid, pos_slice=pos_slice, return_labels=True)
        )
        norm = getattr(self.model, "ln_final", nn.Identity())
        logits = torch.stack([self.model.unembed(norm(c)) for c in stack], dim=0)  # [component, *bp, d_vocab_out]
        return (logits, labels) if return_labels else logits

    def _check_no_bias_behind_post_norms(self, layers: int) -> None:
        """A bias behind a post-sublayer norm is scaled per position: no `[d_model]` bias term describes it."""
        for layer_i in range(layers):
            block = self.model.blocks[layer_i]
            names = ["attn.b_O"] + (
                [] if self.model.cfg.attn_only or not hasattr(block.mlp, "b_out") else ["mlp.b_out"]
            )
            biases = [self.model.block_weight(layer_i, name) for name in names]  # paged in / from their rank
            if any(bool(b.detach().ne(0).any()) for b in biases):
                raise NotImplementedError(
                    f"layer {layer_i} adds output biases before its post-sublayer norm, so they scale with each "
                    "position; "
                    "use decompose_resid (whole sublayers) or freeze_post_norm=False"
                )

    # -- everything at once --------------------------------------------------------------
    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: SliceInput = None,
        return_labels: bool = False,
        project_output_onto: Projection = None,
        freeze_post_norm: bool = True,
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """The residual stream entering `layer` as heads, neurons (or MLP layers), embeddings and biases.

        Order: `L{l}H{h}`, then `L{l}N{n}` (or `{l}_mlp_out`), a hybrid's recurrent layers as
        `{l}_mixer_out` (whole: they have no heads or neurons), `embed`, `pos_embed`, `bias`.
        The components sum to the residual stream, also behind post-sublayer norms
        (Gemma 2/3, OLMo-2/3): there each head and neuron goes through its sublayer's norm
        with the cached scale frozen (see `stack_head_results`); `freeze_post_norm=False`
        gives the raw pre-norm writes, which do not sum to it.
        `project_output_onto` is applied per component (before neuron expansion).

        Args:
            layer: the residual stream entering this layer (None: the final one).
            mlp_input: the stream entering `layer`'s MLP (adds its heads).
            expand_neurons: one component per neuron (False: one per MLP layer, `{l}_mlp_out`).
            apply_ln: scale each component as the norm reading the stream scales their sum.
            pos_slice: positions to keep (an int keeps a length-1 axis, a tuple is `slice(*t)`, a
                list or tensor indexes); None keeps all.
            return_labels: also return the component labels.
            project_output_onto: a direction `[d_model]` or directions `[d_model, k]` to project
                each component onto.
            freeze_post_norm: pass writes through post-sublayer norms (see `stack_head_results`).

        Returns:
            `[component, batch, pos, d_model or k]` (and the labels).
        """
        self._check_decomposable("get_full_resid_decomposition")
        layer = self._final_layer(layer)
        if freeze_post_norm and has_post_sublayer_norms(self.model.cfg):
            self._check_no_bias_behind_post_norms(layer + int(mlp_input))
        pos_slice = Slice.unwrap(pos_slice)
        self._require(self._embed_keys(), "get_full_resid_decomposition")
        proj = project_output_onto
        project_2d = None if proj is None else (proj[:, None] if proj.ndim == 1 else proj)  # [d_model, k]

        def finish(stack: torch.Tensor) -> torch.Tensor:
            """LN (cached scale, linear) then projection, per block of components."""
            if apply_ln:
                stack = self.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
            return stack if project_2d is None else stack @ project_2d.to(stack.dtype)

        heads, labels = _labelled(
            self.stack_head_results(
                layer + int(mlp_input), pos_slice=pos_slice, return_labels=True, freeze_post_norm=freeze_post_norm
            )
        )
        parts = [finish(heads)]
        if any(self.model.cfg.block_has_mlp(layer_i) for layer_i in range(layer)):
            if expand_neurons:
                neurons, neuron_labels = _labelled(self.stack_neuron_results(
                    layer, pos_slice=pos_slice, return_labels=True, apply_ln=apply_ln,
                    project_output_onto=project_2d, mlp_input=mlp_input, freeze_post_norm=freeze_post_norm,
                ))  # fmt: skip
                parts.append(neurons)
            else:
                mlps, neuron_labels = _labelled(self.decompose_resid(
                    layer, mlp_input=mlp_input, mode="mlp", pos_slice=pos_slice, incl_embeds=False, return_labels=True
                ))  # fmt: skip
                parts.append(finish(mlps))
            labels += neuron_labels
        mixers = self._recurrent_writes(layer + int(mlp_input), pos_slice)
        if mixers is not None:  # a recurrent layer's write is one component (it has no heads or neurons)
            parts.append(finish(mixers[0]))
            labels += mixers[1]
        for name, part in self._embed_and_bias(layer, mlp_input, expand_neurons, pos_slice, heads):
            parts.append(finish(part))
            labels.append(name)
        stack = torch.cat(parts, dim=0)
        how = normalized_by(parts[0]) if apply_ln and proj is None and len(parts) else None
        if how is not None:
            mark_normalized(stack, how)
        if proj is not None and proj.ndim == 1:
            stack = stack.squeeze(-1)
        return (stack, labels) if return_labels else stack

    def _embed_and_bias(
        self, layer: int, mlp_input: bool, include_mlp_biases: bool, pos_slice: Slice, heads: torch.Tensor
    ) -> list[tuple[str, torch.Tensor]]:
        """The last components, each `[1, *bp, d_model]`: `embed`, `pos_embed` (if any) and the summed `bias`."""
        parts = [("embed", pos_slice.apply(self["hook_embed"], dim=-2)[None])]
        if self._has_pos_embed():
            parts.append(("pos_embed", pos_slice.apply(self["hook_pos_embed"], dim=-2)[None]))
        bias = self.model.accumulated_bias(layer, mlp_input, include_mlp_biases=include_mlp_biases)  # [d_model]
        parts.append(("bias", bias.to(heads.dtype).expand(1, *heads.shape[1:-1], bias.shape[-1])))  # [1, *bp, d_model]
        return parts

    def _recurrent_writes(self, before: int, pos_slice: Slice) -> tuple[torch.Tensor, list[str]] | None:
        """The writes `[mixer layer, *bp, d_model]` of a hybrid's recurrent layers before `before`, labelled."""
        mixers = [layer_i for layer_i in self.model.cfg.recurrent_layers if layer_i < before]
        if not mixers:
            return None
        self._require([("mixer_out", layer_i) for layer_i in mixers], "get_full_resid_decomposition")
        writes = [pos_slice.apply(self["mixer_out", layer_i], dim=-2) for layer_i in mixers]
        return torch.stack(writes, dim=0), [f"{layer_i}_mixer_out" for layer_i in mixers]


def _labelled(result: torch.Tensor | tuple[torch.Tensor, list[str]]) -> tuple[torch.Tensor, list[str]]:
    """`(stack, labels)` from a method called with `return_labels=True` (its declared return type is a union)."""
    assert isinstance(result, tuple)
    return result


def _check_broadcast(stack: torch.Tensor, other: torch.Tensor, op: str, what: str, fix: str) -> None:
    """`other` (a cached scale `[*batch_and_pos, 1]`, or token directions `[*tokens, d_model]`) must broadcast
    against `stack`, which it divides (multiplies).

    TransformerLens divides and multiplies by broadcasting, so every stack that broadcasts is accepted, whatever
    its leading axes (`[batch, d_model]`, `[layer, head, batch, d_model]`, ...); one that does not is refused,
    naming the fix. Where broadcasting *enlarges* the stack (a size-1 axis meets a longer one) the result is
    TransformerLens's, with a warning: rows of the stack then meet rows of the cache they were not built from.
    """
    try:
        out = tuple(torch.broadcast_shapes(stack.shape, other.shape))
    except RuntimeError:
        raise InputError(
            f"{op}: the stack {tuple(stack.shape)} and {what} {tuple(other.shape)} do not broadcast (the stack's "
            f"axes between component and d_model are {tuple(stack.shape[1:-1])}): {fix}"
        ) from None
    if out != tuple(stack.shape):
        warnings.warn(
            f"{op}: {what} {tuple(other.shape)} broadcasts the stack {tuple(stack.shape)} up to {out}, as "
            f"TransformerLens does, so rows of the stack meet rows of the cache they were not built from: {fix}",
            stacklevel=3,
        )


_SLICE_FIX = (
    "pass the pos_slice (and batch_slice) the stack was built with, e.g. pos_slice=-1 for a stack of the last position"
)
_TOKENS_FIX = (
    "pass one token per batch/position entry of the stack, one per sequence, or a single token; for a stack of "
    "one position, slice it with pos_slice (e.g. pos_slice=-1)"
)


def _shown(sl: Slice) -> str:
    return "None" if sl.mode == "empty" else repr(sl.slice)
