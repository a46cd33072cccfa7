"""`HookedModel`: what every hooked model class shares, so that each class states only what differs.

`HookedTransformer`, `HookedEncoder` (BERT), `HookedEncoderDecoder` (T5) and `HookedAudioEncoder`
(HuBERT) derive from it. The base owns the TransformerLens surface that does not depend on the
architecture:

- `run_with_cache`: `HookedRootModule`'s run with caching hooks, wrapped in an `ActivationCache`
  (`return_cache_object`, `remove_batch_dim`) that also holds the run's tokens and padding mask;
- `to`, `move_model_modules_to_device`: `nn.Module.to` keeping `cfg.device` and `cfg.dtype` in step
  with where the weights are;
- `n_params_total`, and the first placement of a new model on its device.

A class plugs in through small seams instead of restating these: `_cache_inputs()` (the tokens and
mask of the last run, `(None, None)` by default), `shared_cache_dict(local)` (how a cache is shared
between processes: a pipeline's stays on the ranks that computed it) and `_keep_cfg_in_step(device,
dtype)` (an image-text model keeps its vision tower's config in step too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from hooked.analysis.activation_cache import ActivationCache
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookedRootModule

# a run's `(tokens [batch, pos], attention_mask [batch, pos])`, either None where the run had none
CacheInputs = tuple[torch.Tensor | None, torch.Tensor | None]


class HookedModel(HookedRootModule):
    """Base of the hooked model classes: caching runs, devices and dtypes (see the module docstring)."""

    cfg: HookedTransformerConfig

    # -- caching -----------------------------------------------------------------------
    def run_with_cache(self, *model_args, return_cache_object: bool = True, remove_batch_dim: bool = False, **kwargs):
        """Run forward and return `(output, ActivationCache)`, recording every hooked activation.

        Args:
            *model_args: the arguments of `forward` (text, tokens, ...).
            return_cache_object: an `ActivationCache` (True) or a plain dict.
            remove_batch_dim: store `activation[0]` (the batch must be 1).
            **kwargs: `names_filter` (a name, a list of names or a predicate: which hooks to
                cache; unknown exact names raise), `device` (where to store), `incl_bwd` (also
                cache gradients under `name + "_grad"`; the output must be a scalar), `pos_slice`
                (positions to keep), `reset_hooks_end`, `clear_contexts`, and `forward`'s keywords.

        Returns:
            `(output, cache)`; the cache also stores the run's `tokens` and `attention_mask`
            where the model class records them (`HookedTransformer` does).
        """
        out, recorded = super().run_with_cache(*model_args, remove_batch_dim=remove_batch_dim, **kwargs)
        cache_dict = self.shared_cache_dict(recorded)
        if not return_cache_object:
            return out, cache_dict
        return out, activation_cache(cache_dict, self, remove_batch_dim, self._cache_inputs())

    def _cache_inputs(self) -> CacheInputs:
        """The tokens and padding mask of the last run, stored on its cache (none by default)."""
        return None, None

    def shared_cache_dict(self, local: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """The cache of activations this process recorded, as every reader sees it (a pipeline shares it)."""
        return local

    # -- devices and dtypes ------------------------------------------------------------
    def to(self, *args, print_details: bool = True, **kwargs):
        """`nn.Module.to`, keeping `cfg.device` and `cfg.dtype` in step (`print_details`: TransformerLens's, unused)."""
        device, dtype = _device_and_dtype(args, kwargs)
        self._keep_cfg_in_step(device, dtype)
        return super().to(*args, **kwargs)

    def _keep_cfg_in_step(self, device: torch.device | str | None, dtype: torch.dtype | None) -> None:
        """Record in the config where `to` moves the weights and what it casts them to."""
        if device is not None:
            self.cfg.device = str(device)
        if dtype is not None:
            self.cfg.dtype = dtype

    def move_model_modules_to_device(self):
        """Move every part to `cfg.device` (TransformerLens's name for it)."""
        return self.to(self.cfg.device)

    def _place_on_device(self, move_to_device: bool) -> None:
        """A new model's device: `cfg.device`, chosen (CUDA if there is one) when unset; moved there if asked."""
        if self.cfg.device is None:
            self.cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
        if move_to_device:
            self.to(self.cfg.device)

    @property
    def n_params_total(self) -> int:
        """The number of parameters (every element of every parameter)."""
        return sum(p.numel() for p in self.parameters())


def activation_cache(
    cache_dict: Mapping[str, torch.Tensor], model: Any, remove_batch_dim: bool, inputs: CacheInputs = (None, None)
) -> ActivationCache:
    """The `ActivationCache` of one run of `model`: its activations, and its tokens and mask (`inputs`)."""
    # a pipeline's DistributedCacheDict is a read-through Mapping that ActivationCache reads like its dict
    cache = ActivationCache(cast("dict[str, torch.Tensor]", cache_dict), model, has_batch_dim=not remove_batch_dim)
    cache.tokens, cache.attention_mask = inputs
    return cache


def _device_and_dtype(args: tuple, kwargs: dict) -> tuple[torch.device | str | None, torch.dtype | None]:
    """The device and dtype a call `to(*args, **kwargs)` moves to (None for what it leaves as is)."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    tensor = kwargs.get("tensor")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (str, torch.device)):
            device = a
        elif isinstance(a, torch.Tensor):
            tensor = a
    if tensor is not None:  # `to(other)`: other's device and dtype
        device, dtype = tensor.device, tensor.dtype
    return device, dtype
