"""Read-only weight views of `HookedTransformer`, stacked over layers (TransformerLens names).

Each property is recomputed on access. Grouped-query K/V weights are repeated up to
`n_heads`, so every attention view is `[n_layers, n_heads, ...]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Float

from hooked.analysis.layer_types import check_present, describe_layer
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import LayerTypeError, ReplacedModuleError
from hooked.core.factored_matrix import FactoredMatrix
from hooked.core.validation import check_token_range
from hooked.placement.dispatch import read_weight


class WeightViewsMixin:
    """Needs `self.cfg`, `self.embed`, `self.unembed`, `self.blocks` (and `self.pos_embed`)."""

    # set by the host class (`HookedTransformer`, `HookedEncoder`); declared here for the type checker
    cfg: HookedTransformerConfig
    blocks: torch.nn.ModuleList
    if TYPE_CHECKING:

        @property
        def input_device(self) -> torch.device: ...

        def to_single_token(self, string: str) -> int: ...

    def block_weight(self, layer: int, name: str) -> torch.Tensor:
        """`blocks[layer].<name>` (e.g. `"attn.W_O"`), paged in if offloaded (a pipeline fetches it from its rank)."""
        check_present(self.cfg, [f"blocks.{layer}.{name}"])  # a hybrid block without that sublayer: say which
        return _read_or_explain(self.blocks[layer], name, f"blocks.{layer}")

    def part_weight(self, part: str, name: str) -> torch.Tensor:
        """`<part>.<name>` of a non-block part (`"embed"`, `"pos_embed"`, `"unembed"`), as `block_weight`."""
        return _read_or_explain(getattr(self, part), name, part)

    def _stack(self, module: str, name: str) -> torch.Tensor:
        if module == "mlp" and self.cfg.uses_moe:
            raise NotImplementedError(
                f"{name} of a mixture-of-experts model is per expert: read blocks[l].mlp.experts[e].{name}.weight "
                "(nn.Linear layout, [out, in]); the router is blocks[l].mlp.W_gate.weight [num_experts, d_model]"
            )
        if module == "attn" and len(self.cfg.attention_layers) < self.cfg.n_layers:
            raise LayerTypeError(
                f"{name} stacks every layer's attention, but only layers {self.cfg.attention_layers} of this hybrid "
                f"model are attention layers ({describe_layer(self.cfg, _first_other_layer(self.cfg))}): read "
                f"blocks[l].attn.{name} for l in model.cfg.attention_layers"
            )
        _check_stackable(self.cfg, module, name)
        tensors = [self.block_weight(layer, f"{module}.{name}") for layer in range(self.cfg.n_layers)]
        return torch.stack([t.to(tensors[0].device) for t in tensors], dim=0)  # one device on a split model

    @property
    def W_E(self) -> Float[torch.Tensor, "d_vocab d_model"]:
        return self.part_weight("embed", "W_E")

    @property
    def W_pos(self) -> Float[torch.Tensor, "n_ctx d_model"]:
        if not hasattr(self, "pos_embed"):
            raise AttributeError(
                f"W_pos exists only for absolute positions, not {self.cfg.positional_embedding_type!r}"
            )
        return self.part_weight("pos_embed", "W_pos")

    @property
    def W_E_pos(self) -> Float[torch.Tensor, "d_vocab_plus_n_ctx d_model"]:
        W_E = self.W_E
        return torch.cat([W_E, self.W_pos.to(W_E.device)], dim=0)

    @property
    def W_U(self) -> Float[torch.Tensor, "d_model d_vocab_out"]:
        return self.part_weight("unembed", "W_U")

    @property
    def b_U(self) -> Float[torch.Tensor, "d_vocab_out"]:
        return self.part_weight("unembed", "b_U")

    W_Q = property(lambda self: self._stack("attn", "W_Q"), doc="[n_layers, n_heads, d_model, d_head]")
    W_K = property(lambda self: self._stack("attn", "W_K"), doc="[n_layers, n_heads, d_model, d_head]")
    W_V = property(lambda self: self._stack("attn", "W_V"), doc="[n_layers, n_heads, d_model, d_head]")
    W_O = property(lambda self: self._stack("attn", "W_O"), doc="[n_layers, n_heads, d_head, d_model]")
    b_Q = property(lambda self: self._stack("attn", "b_Q"), doc="[n_layers, n_heads, d_head]")
    b_K = property(lambda self: self._stack("attn", "b_K"), doc="[n_layers, n_heads, d_head]")
    b_V = property(lambda self: self._stack("attn", "b_V"), doc="[n_layers, n_heads, d_head]")
    b_O = property(lambda self: self._stack("attn", "b_O"), doc="[n_layers, d_model]")
    W_in = property(lambda self: self._stack("mlp", "W_in"), doc="[n_layers, d_model, d_mlp]")
    W_out = property(lambda self: self._stack("mlp", "W_out"), doc="[n_layers, d_mlp, d_model]")
    b_in = property(lambda self: self._stack("mlp", "b_in"), doc="[n_layers, d_mlp]")
    b_out = property(lambda self: self._stack("mlp", "b_out"), doc="[n_layers, d_model]")

    @property
    def W_gate(self) -> Float[torch.Tensor, "n_layers d_model d_mlp"] | None:
        return self._stack("mlp", "W_gate") if self.cfg.gated_mlp else None

    @property
    def QK(self) -> FactoredMatrix:
        """`W_Q @ W_K^T` per head, `[n_layers, n_heads, d_model, d_model]`, kept factored."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """`W_V @ W_O` per head, `[n_layers, n_heads, d_model, d_model]`, kept factored."""
        return FactoredMatrix(self.W_V, self.W_O)

    def all_composition_scores(self, mode: str) -> Float[torch.Tensor, "n_layers n_heads n_layers n_heads"]:
        """How strongly each head's output is read by each later head's queries, keys or values.

        `scores[l1, h1, l2, h2] = |OV[l1,h1] R[l2,h2]|_F / (|OV[l1,h1]|_F |R[l2,h2]|_F)`, with
        R = `QK` (Q-composition), `QK.T` (K-composition) or `OV` (V-composition); zero
        unless `l1 < l2`. Computed on `d_head`-sized factors via `collapse_l`/`collapse_r`.
        """
        rights = {"Q": lambda: self.QK, "K": lambda: self.QK.T, "V": lambda: self.OV}
        if mode not in rights:
            raise ValueError(f"mode must be 'Q', 'K' or 'V', got {mode!r}")
        left, right = _upcast(self.OV), _upcast(rights[mode]())
        n_layers = self.cfg.n_layers
        scores = composition_scores(left, right)  # [L, H, L, H]
        layer = torch.arange(n_layers, device=scores.device)
        earlier = layer[:, None, None, None] < layer[None, None, :, None]  # [L, 1, L, 1]
        return torch.where(earlier, scores, torch.zeros((), dtype=scores.dtype, device=scores.device))

    def all_head_labels(self) -> list[str]:
        return [f"L{layer}H{h}" for layer in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[torch.Tensor, "d_model"]:
        """Sum of the output biases written to the residual stream before `layer` (plus its b_O if mlp_input)."""
        total = torch.zeros(self.cfg.d_model, device=self.input_device, dtype=self.cfg.dtype)
        mlp_biases = include_mlp_biases and not self.cfg.attn_only
        if mlp_biases and self.cfg.uses_moe and self.cfg.swiglu_limit is not None:
            raise NotImplementedError(
                "GPT-OSS's experts have output biases mixed per token by the router, so they add no constant "
                "bias: pass include_mlp_biases=False"
            )
        attention = set(self.cfg.attention_layers)  # a hybrid's recurrent layers keep their bias in `mixer_out`
        for i in range(layer):
            if i in attention:
                total = total + self.block_weight(i, "attn.b_O").to(total.device)
            if mlp_biases and not self.cfg.uses_moe and self.cfg.block_has_mlp(i):  # bias-free experts add none
                total = total + self.block_weight(i, "mlp.b_out").to(total.device)
        if mlp_input and layer in attention:
            total = total + self.block_weight(layer, "attn.b_O").to(total.device)
        return total

    def tokens_to_residual_directions(self, tokens) -> Float[torch.Tensor, "... d_model"]:
        """The unembedding direction of each token: `W_U[:, tokens]` with d_model last."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        W_U = self.W_U  # read once (it may be paged in from an offload file)
        tokens = torch.as_tensor(tokens, device=W_U.device)
        check_token_range(tokens.reshape(-1), self.cfg.d_vocab_out, "tokens")
        return W_U[:, tokens].movedim(0, -1)


def _check_stackable(cfg: HookedTransformerConfig, module: str, name: str) -> None:
    """Refuse a stacked view whose layers differ in shape or lack the weight (Gemma 3n/4), naming the per-layer read."""
    shared = [layer for layer in range(cfg.n_layers) if cfg.kv_source(layer) is not None]
    if shared and module == "attn" and name[-1] in "KV":
        raise NotImplementedError(
            f"{name} has no value in layers {shared}: they attend to an earlier layer's keys and values "
            f"(cfg.kv_shared_from); read blocks[l].attn.{name} of the other layers one at a time"
        )
    width = "d_mlp" if module == "mlp" else "d_head"
    widths = [getattr(cfg.layer_config(layer), width) for layer in range(cfg.n_layers)]
    if len(set(widths)) > 1:
        raise NotImplementedError(
            f"{name} cannot be stacked over layers: their {width} differ ({widths}, cfg.layer_{width}); read "
            f"blocks[l].{module}.{name} one layer at a time"
        )


def _first_other_layer(cfg: HookedTransformerConfig) -> int:
    """The first layer whose token mixer is not attention."""
    return next(layer for layer, kind in enumerate(cfg.mixer_types) if kind != "attention")


def _read_or_explain(owner: torch.nn.Module, name: str, where: str) -> torch.Tensor:
    """`read_weight`, with a replaced component that lacks the weight named in the error."""
    try:
        return read_weight(owner, name)
    except AttributeError as e:
        module_path, _, leaf = f"{where}.{name}".rpartition(".")
        try:
            holder = owner.get_submodule(name.rpartition(".")[0])
        except AttributeError:
            holder = owner
        raise ReplacedModuleError(
            f"{module_path} is a {type(holder).__name__}, which has no {leaf!r}: a replaced component must expose the "
            f"weights the views read (e.g. a property returning the wrapped module's {leaf}), or read them from the "
            "original module you replaced"
        ) from e


def _upcast(m: FactoredMatrix) -> FactoredMatrix:
    """SVDs need float32 or float64 factors."""
    if m.A.dtype in (torch.float32, torch.float64):
        return m
    return FactoredMatrix(m.A.float(), m.B.float())


def composition_scores(
    left: FactoredMatrix, right: FactoredMatrix, broadcast_dims: bool = True
) -> Float[torch.Tensor, "..."]:
    """`|left @ right|_F / (|left|_F |right|_F)` for every pair of matrices.

    With `broadcast_dims`, left's leading dims come first and right's after them (left
    `[a, b]` x right `[c]` -> `[a, b, c]`); otherwise they broadcast against each other.
    With `left = U S V^T`, `|left @ right|_F = |S V^T @ right|_F` (U has orthonormal
    columns), and likewise on the right, so only the small `[m, m]` product
    `collapse_l(left) @ collapse_r(right)` is formed, from one SVD per matrix.
    """
    if broadcast_dims:
        n_left, n_right = left.ndim - 2, right.ndim - 2
        for _ in range(n_right):
            left = left.unsqueeze(n_left)  # [*left_lead, 1.., l, m]
        for _ in range(n_left):
            right = right.unsqueeze(0)  # [1.., *right_lead, l, m]
    if left.rdim != right.ldim:
        raise ValueError(f"cannot compose {left} with {right}")
    new_left = left.collapse_l()  # [..., m_left, d]
    new_right = right.collapse_r()  # [..., d, m_right]
    comp = torch.linalg.matrix_norm(new_left @ new_right)  # [...]
    return comp / torch.linalg.matrix_norm(new_left) / torch.linalg.matrix_norm(new_right)
