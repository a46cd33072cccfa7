"""`HookedTransformer` methods for weight processing (TransformerLens names).

The state-dict processors are thin wrappers over the pure functions of
`hooked.processing.steps`, bound to this model's config: they return the processed
state dict and leave the model alone. `process_weights_` processes the model's own
weights in place of the old ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from hooked.components.norms import LayerNormPre, make_norm
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import ReplacedModuleError
from hooked.processing import steps as wp

StateDict = dict[str, torch.Tensor]


def check_components_not_replaced(model: torch.nn.Module) -> None:
    """Raise `ReplacedModuleError` if a part weight processing rewrites is not one of hooked's own modules."""
    parts = ["embed", "unembed", "ln_final"]
    n_blocks = len(cast(torch.nn.ModuleList, model.blocks))
    parts += [f"blocks.{i}.{name}" for i in range(n_blocks) for name in ("attn", "mlp", "ln1", "ln2")]
    for path in parts:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue  # absent in this architecture (no ln_final, attention-only blocks)
        if (
            isinstance(module, torch.nn.Identity)
            and cast(HookedTransformerConfig, model.cfg).normalization_type is None
        ):
            continue  # the norm slot of a norm-free model
        if not type(module).__module__.startswith("hooked."):
            raise ReplacedModuleError(
                f"{path} is a {type(module).__name__} (from {type(module).__module__}), not hooked's component: weight "
                "processing cannot read or rewrite its weights. Process the weights before replacing the module "
                "(model.process_weights_(), then splice it in), or put the original module back first"
            )


class WeightProcessingMixin:
    """Needs `self.cfg`, `self.state_dict()` and `self.load_and_process_state_dict(...)`."""

    # set by the host class (`HookedTransformer`); declared here for the type checker
    cfg: HookedTransformerConfig
    if TYPE_CHECKING:

        def state_dict(self) -> dict[str, torch.Tensor]: ...

        def load_and_process_state_dict(self, state_dict: dict[str, torch.Tensor], *args, **kwargs) -> None: ...

        def setup(self) -> None: ...

    def process_weights_(
        self,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = True,
    ) -> None:
        """Process this model's weights (fold norms, center, ...) without changing its outputs.

        Steps already recorded in `cfg.weight_processing` are skipped with a warning, so
        calling this twice equals calling it once. Refused once a component was replaced by a
        module of another package (its weights would be missed or misread): process first, then replace.
        """
        check_components_not_replaced(cast(torch.nn.Module, self))  # the host is a HookedTransformer
        self.load_and_process_state_dict(
            self.state_dict(),
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        )

    def record_weight_processing(self, steps: Sequence[str]) -> None:
        """Record processing steps that ran on the weights this model takes, in `cfg.weight_processing`.

        After `fold_ln` the norms' gains and biases live in their readers: each folded norm
        becomes a parameter-free `LNPre`/`RMSPre`, in the config and as a module, so the state
        dict's keys match. `ln1_post`/`ln2_post` and `q_norm`/`k_norm` keep their parameters
        (they are never folded).
        """
        if "fold_ln" in steps and "fold_ln" not in self.cfg.weight_processing:
            self._use_folded_norms()
        self.cfg.weight_processing = self.cfg.weight_processing + tuple(steps)

    def _use_folded_norms(self) -> None:
        cfg = self.cfg
        cfg.normalization_type = wp.folded_norm_type(cfg.normalization_type)
        model: Any = self  # the host is a HookedTransformer
        for block in model.blocks:
            if hasattr(block, "ln1"):  # a Nemotron-H `mlp` block has none
                block.ln1 = make_norm(cfg)
            if cfg.uses_mla and hasattr(block, "attn"):  # the latent norms were folded too
                block.attn.use_folded_latent_norms()
            if hasattr(block, "ln2"):
                block.ln2 = make_norm(cfg)
            if hasattr(block, "mlp") and hasattr(block.mlp, "ln"):
                block.mlp.ln = LayerNormPre(cfg, cfg.d_mlp)
        if hasattr(model, "ln_final"):
            model.ln_final = make_norm(cfg, wp.final_norm_kind(cfg))
        self.setup()

    def fold_layer_norm(
        self, state_dict: StateDict, fold_biases: bool = True, center_weights: bool = True
    ) -> StateDict:
        """Fold the norms' gains (and LayerNorm biases) into their readers; see `weight_processing.fold_layer_norm`."""
        return wp.fold_layer_norm(state_dict, self.cfg, fold_biases=fold_biases, center_weights=center_weights)

    def center_writing_weights(self, state_dict: StateDict) -> StateDict:
        """Remove the mean over d_model from every residual-stream writer (exact for LayerNorm models)."""
        return wp.center_writing_weights(state_dict, self.cfg)

    def center_unembed(self, state_dict: StateDict) -> StateDict:
        """Remove the mean over the vocabulary from W_U and b_U (log-probs unchanged)."""
        return wp.center_unembed(state_dict, self.cfg)

    def fold_value_biases(self, state_dict: StateDict) -> StateDict:
        """Move b_V into b_O (each attention row sums to 1)."""
        return wp.fold_value_biases(state_dict, self.cfg)

    def refactor_factored_attn_matrices(self, state_dict: StateDict) -> StateDict:
        """Rebalance each head's QK and OV factors by SVD (non-rotary MHA models without qk-norm)."""
        return wp.refactor_factored_attn_matrices(state_dict, self.cfg)
