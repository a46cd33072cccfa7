"""DeepSeek sparse attention (DSA, GLM-MoE-DSA): an indexer picks the keys each query attends to.

A small attention-like scorer, the indexer, rates every earlier key for every query; the
`index_topk` best keys stay, and multi-head latent attention (`components/mla.py`) runs over
those only. Per query position `i` and key position `j` (`H_I` indexer heads of width `D_I`):

    q_I[h] = c_q W_Q[h]                      from the query latent     indexer.hook_q  [batch, pos, H_I, D_I]
    k_I    = LayerNorm(x W_K)                one key per position      indexer.hook_k  [batch, pos, D_I] (cached)
    w[h]   = x W_weights[h] / sqrt(H_I)      a weight per head
    score[i, j] = sum_h w_i[h] relu(q_I[i, h] . k_I[j] / sqrt(D_I))      indexer.hook_scores [batch, pos, n_keys]
                  (-inf where query i may not see key j: later keys, padding)
    selected[i] = top-index_topk_j (score[i, j] over the keys i may see)  attn.hook_selected_keys [batch, pos, k]

The first `rotary_dim` dims of `q_I` and `k_I` are rotated (GLM's interleaved pairs). Editing
`hook_scores` changes the selection; editing `hook_selected_keys` (key columns) changes which
keys are attended. Layers in `cfg.index_shared_layers` have no indexer and reuse the previous
layer's selection. The KV cache keeps each layer's indexer keys beside the latent.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.attention import head_major
from hooked.components.forward_state import ForwardState
from hooked.components.mla import LATENT_NORM_EPS, MultiHeadLatentAttention, up_project
from hooked.components.norms import LayerNorm
from hooked.components.rotary import apply_rotary_interleaved
from hooked.core.config import INDEXER_KEYS, HookedTransformerConfig
from hooked.core.errors import InputError
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set

#: where a layer leaves its selection for the next (`index_shared_layers`), in the call's ForwardState
_SELECTION = "dsa_selected_keys"


class SparseIndexer(nn.Module):
    """DSA's indexer: scores of every key for every query (module docstring), float32.

    Weights: `W_Q` `[H_I, q_lora_rank, D_I]`, `W_K` `[d_model, D_I]`, `k_norm` (a LayerNorm with
    bias), `W_weights` `[d_model, H_I]` (float32 in a float16 model, as HF keeps it).
    """

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.cfg = cfg
        H, D, dt = (
            require_set(cfg.index_n_heads, "index_n_heads"),
            require_set(cfg.index_d_head, "index_d_head"),
            cfg.dtype,
        )
        self.W_Q = nn.Parameter(head_major(H, require_set(cfg.q_lora_rank, "q_lora_rank"), D, dt))
        self.W_K = nn.Parameter(torch.empty(cfg.d_model, D, dtype=dt))
        self.k_norm = LayerNorm(cfg, D)
        self.k_norm.eps = LATENT_NORM_EPS  # HF's nn.LayerNorm(eps=1e-6)
        self.W_weights = nn.Parameter(torch.empty(cfg.d_model, H, dtype=self._weights_dtype(dt)))
        self.d_rope = require_set(cfg.rotary_dim, "rotary_dim")
        self.hook_q = HookPoint()  # [batch, pos, index_n_heads, index_d_head], rotated
        self.hook_k = HookPoint()  # [batch, pos, index_d_head], rotated (cached)
        self.hook_scores = HookPoint(pos_axis=1)  # [batch, pos, n_keys], float32

    @staticmethod
    def _weights_dtype(dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if dtype == torch.float16 else dtype  # HF's `_keep_in_fp32_modules` (float16 only)

    def cast_parameter(self, leaf: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`tensor` as stored in a `dtype` model: `W_weights` stays float32 in float16."""
        return tensor.to(self._weights_dtype(dtype) if leaf == "W_weights" else dtype)

    def _apply(self, fn, recurse: bool = True):
        weights = self.W_weights.data  # before `fn` (e.g. `.to(torch.float16)`) rounds it
        super()._apply(fn, recurse)
        if self.W_weights.dtype == torch.float16:
            self.W_weights.data = weights.to(self.W_weights.device, torch.float32)
        return self

    def forward(
        self,
        x: Float[torch.Tensor, "batch pos d_model"],
        q_latent: torch.Tensor,
        cos,
        sin,
        state: ForwardState,
        layer: int,
    ) -> Float[torch.Tensor, "batch pos n_keys"]:
        """Every key's score for every new query (cached keys included), before masking."""
        q = up_project(q_latent, self.W_Q)  # [batch, pos, H_I, D_I]
        k = self.k_norm(F.linear(x, self.W_K.t()))[:, :, None]  # [batch, pos, 1, D_I]
        q = self.hook_q(self._rotate(q, cos, sin))
        k = self.hook_k(self._rotate(k, cos, sin)[:, :, 0])  # [batch, pos, D_I]
        if state.past_kv_cache is not None:
            columns = () if state.query_columns is None else (state.query_columns,)
            k = state.past_kv_cache[layer].append(INDEXER_KEYS, k, *columns)  # [batch, n_keys, D_I]
        D, H = k.shape[-1], q.shape[2]
        scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * D**-0.5  # [batch, pos, H, n_keys]
        weights = F.linear(x.to(self.W_weights.dtype), self.W_weights.t()).float() * H**-0.5  # [batch, pos, H_I]
        scores = torch.matmul(weights.unsqueeze(-2), F.relu(scores)).squeeze(-2)  # [batch, pos, n_keys]
        allowed = state.allowed(None)  # [batch or 1, 1, pos, n_keys] or None
        if allowed is not None:  # -inf compares as HF's additive finfo.min does: below every score, equal to itself
            scores = scores.masked_fill(~allowed[:, 0], float("-inf"))
        return self.hook_scores(scores)

    def _rotate(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        """GLM's indexer rotates the first `rotary_dim` dims as interleaved pairs (DeepSeek-V3.2's: halves)."""
        rotated = apply_rotary_interleaved(x[..., : self.d_rope], cos, sin)
        return torch.cat([rotated, x[..., self.d_rope :]], dim=-1)


class SparseLatentAttention(MultiHeadLatentAttention):
    """MLA over the keys the indexer selects: each query attends to at most `index_topk` earlier keys."""

    def __init__(self, cfg: HookedTransformerConfig | dict, layer: int = 0):
        super().__init__(cfg, layer)
        if layer not in (self.cfg.index_shared_layers or ()):
            self.indexer = SparseIndexer(self.cfg)
        self.hook_selected_keys = HookPoint()  # [batch, pos, index_topk]: key columns each query attends to
        self._selected: torch.Tensor | None = None

    def _before_attention(self, x, q_latent, cos, sin, state: ForwardState) -> None:
        if hasattr(self, "indexer"):
            selected = self._select(self.indexer(x, q_latent, cos, sin, state, self.layer))
        else:
            selected = state._memo.get(_SELECTION)
            if selected is None:
                raise InputError(
                    f"layer {self.layer} reuses the key selection of the layer before it (cfg.index_shared_layers), "
                    "which did not run in this forward: start at a layer with an indexer of its own"
                )
        selected = self.hook_selected_keys(selected)  # [batch, pos, k]
        state._memo[_SELECTION] = selected  # for the next layer, if it shares this one's selection
        keep = torch.zeros(*selected.shape[:2], state.n_keys, dtype=torch.bool, device=selected.device)
        self._selected = keep.scatter(-1, selected.long(), True)[:, None]  # [batch, 1, pos, n_keys]

    def _select(self, scores: Float[torch.Tensor, "batch pos n_keys"]) -> Int[torch.Tensor, "batch pos k"]:
        """The `index_topk` best keys of each query (those it may not see score -inf), as HF's `topk` picks them."""
        k = min(require_set(self.cfg.index_topk, "index_topk"), scores.shape[-1])
        return scores.topk(k, dim=-1).indices

    def _allowed(self, state: ForwardState) -> torch.Tensor | None:
        allowed = state.allowed(self.window)
        if self._selected is None:
            return allowed
        return self._selected if allowed is None else allowed & self._selected

    def _sdpa_mask(self, state: ForwardState) -> tuple[torch.Tensor | None, bool]:
        return self._allowed(state), False

    def forward(self, *args, **kwargs) -> Float[torch.Tensor, "batch pos d_model"]:
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._selected = None  # a selection belongs to one forward call
