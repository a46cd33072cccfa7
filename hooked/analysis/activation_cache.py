"""`ActivationCache`: the activations of one forward pass, indexed by hook name or shorthand."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from jaxtyping import Int

from hooked.analysis.cache_analysis import CacheAnalysisMixin
from hooked.analysis.layer_types import check_present
from hooked.core.errors import InputError, MissingHooksError
from hooked.core.utils import Slice, SliceInput, get_act_name, token_index

logger = logging.getLogger(__name__)


class ActivationCache(CacheAnalysisMixin):
    """A read-only mapping from hook names to cached activations, with TransformerLens shorthands.

    `cache["pattern", 0]`, `cache["resid_pre", -1]`, `cache["k6"]` and
    `cache["scale4ln1"]` all go through `get_act_name`; negative layers count from the
    end. `tokens` and `attention_mask` are those of the cached forward (None if unknown).
    Residual-stream analysis (decompositions, direct logit attribution, logit lens) comes
    from `CacheAnalysisMixin` (`hooked/analysis/cache_analysis.py`).

    Args:
        cache_dict: hook name -> activation (`[batch, pos, ...]`, or `[pos, ...]` without a batch axis).
        model: the model the activations came from (analysis reads its config and weights).
        has_batch_dim: False when the batch axis was removed (`remove_batch_dim=True`).
    """

    def __init__(self, cache_dict: dict[str, torch.Tensor], model, has_batch_dim: bool = True):
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim
        self.tokens: torch.Tensor | None = None
        self.attention_mask: torch.Tensor | None = None

    # -- mapping -------------------------------------------------------------------
    def _key(self, key) -> str:
        if isinstance(key, str):
            return key if key in self.cache_dict else get_act_name(key)
        if isinstance(key, tuple):
            name, *rest = key
            if rest and isinstance(rest[0], int) and rest[0] < 0:
                rest[0] = self.model.cfg.n_layers + rest[0]
            return get_act_name(name, *rest)
        raise TypeError(f"Cache keys are str or tuple, got {type(key).__name__}")

    def __getitem__(self, key) -> torch.Tensor:
        """The activation under `key`: an exact hook name or a TransformerLens shorthand.

        Args:
            key: `"blocks.0.attn.hook_pattern"`, `("pattern", 0)`, `("resid_pre", -1)`,
                `("scale", 4, "ln1")`, `"k6"` or `"scale4ln1"`; negative layers count from the end.

        Returns:
            The cached tensor, e.g. `[batch, head, query_pos, key_pos]` for a pattern.
        """
        name = self._key(key)
        if name not in self.cache_dict:
            check_present(self.model.cfg, [name])  # a hybrid block without that sublayer: say which layer type
            raise MissingHooksError(
                f"{name!r} (from key {key!r}) is not in the cache. It holds {len(self.cache_dict)} activations; "
                "pass names_filter=None to run_with_cache to cache every hook."
            )
        return self.cache_dict[name]

    def __contains__(self, key) -> bool:
        return self._key(key) in self.cache_dict

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict)}"

    # -- batch and device ----------------------------------------------------------
    def remove_batch_dim(self) -> ActivationCache:
        """Drop the batch axis in place; needs batch size 1."""
        if not self.has_batch_dim:
            logger.warning("remove_batch_dim: the cache has no batch axis already")
            return self
        for name, t in self.cache_dict.items():
            if t.shape[0] != 1:
                raise InputError(f"remove_batch_dim needs batch size 1, but {name} has batch {t.shape[0]}")
            self.cache_dict[name] = t[0]
        self.has_batch_dim = False
        return self

    def to(self, device, move_model: bool = False) -> ActivationCache:
        if move_model:
            logger.warning("ActivationCache.to(move_model=True) is deprecated; move the model yourself")
            self.model.to(device)
        self.cache_dict = {k: v.to(device) for k, v in self.cache_dict.items()}
        return self

    def toggle_autodiff(self, mode: bool = False) -> None:
        logger.warning("toggle_autodiff sets torch's global grad mode to %s", mode)
        torch.set_grad_enabled(mode)

    def apply_slice_to_batch_dim(self, batch_slice: SliceInput) -> ActivationCache:
        """A new cache with `batch_slice` applied to every batched tensor; an int drops the batch axis."""
        batch_slice = Slice.unwrap(batch_slice)
        if not self.has_batch_dim and batch_slice.mode != "empty":
            raise InputError("Cannot slice the batch axis of a cache without one")
        batch = self._batch_size()

        def cut(t):
            return batch_slice.apply(t, dim=0) if t is not None and t.ndim > 0 and t.shape[0] == batch else t

        sliced = ActivationCache(
            {k: cut(v) for k, v in self.cache_dict.items()},
            self.model,
            has_batch_dim=self.has_batch_dim and batch_slice.mode != "int",
        )
        sliced.tokens, sliced.attention_mask = cut(self.tokens), cut(self.attention_mask)
        return sliced

    def _batch_size(self) -> int:
        if self.tokens is not None:
            return self.tokens.shape[0]
        sizes = [v.shape[0] for v in self.cache_dict.values() if v.ndim > 0]
        return max(set(sizes), key=sizes.count) if sizes else 1

    def token_index(self, idx: int | Int[torch.Tensor, "batch"]) -> Int[torch.Tensor, "batch"]:
        """Absolute column of each row's logical token `idx` (0 = first real token, -1 = last), padding-aware."""
        mask = self.attention_mask
        if mask is None:
            shape = self.tokens.shape if self.tokens is not None else self["resid_pre", 0].shape[:-1]
            if not self.has_batch_dim:
                shape = (1, *shape[-1:])
            mask = torch.ones(shape[0], shape[-1], dtype=torch.long)
        return token_index(idx, mask)
