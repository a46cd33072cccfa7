"""Batched patching starts each forward at the first patched block (hooked/analysis/patching.py `_CorruptedPrefix`).

The corrupted residual stream entering block l is computed once; chunks of patches at
layer >= l start there. Hooks already on the model must still act exactly once.
"""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.analysis import patching

L, P = 4, 5


@pytest.fixture(scope="module")
def setup():
    cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_layers=L, n_ctx=16, d_vocab=50, d_mlp=48, act_fn="silu", gated_mlp=True,
        normalization_type="RMS", positional_embedding_type="rotary", n_key_value_heads=2, seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 50, (2, P), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 1] = torch.randint(0, 50, (2,), generator=gen)
    _, clean_cache = model.run_with_cache(clean)
    return model, corrupted, clean_cache


def metric(logits):
    return (logits[:, -1, 3] - logits[:, -1, 7]).mean()


def resid_pre_sweep(model, corrupted, clean_cache, batch_size):
    return patching.generic_activation_patch(
        model, corrupted, clean_cache, metric, patching.layer_pos_patch_setter, "resid_pre",
        index_axis_names=("layer", "pos"), batch_size=batch_size,
    )  # fmt: skip


@pytest.mark.parametrize("batch_size", [2, 5, 6])
def test_chunks_starting_mid_model_equal_one_forward_per_patch(setup, batch_size):
    model, corrupted, clean_cache = setup
    torch.testing.assert_close(
        resid_pre_sweep(model, corrupted, clean_cache, batch_size),
        resid_pre_sweep(model, corrupted, clean_cache, 1),
        atol=1e-5, rtol=0,
    )  # fmt: skip


def test_existing_hooks_act_once(setup):
    """A steering hook on resid_pre of a block where chunks start, and one on an earlier block."""
    model, corrupted, clean_cache = setup

    def steer(act, hook):
        return act + 0.5

    names = ["blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre", "blocks.0.hook_mlp_out"]
    for name in names:
        model.add_hook(name, steer)
    try:
        reference = resid_pre_sweep(model, corrupted, clean_cache, 1)
        batched = resid_pre_sweep(model, corrupted, clean_cache, P)  # chunks start at blocks 1, 2, 3
        # The same patch by hand, with the steering hooks active.
        clean = clean_cache["blocks.2.hook_resid_pre"]

        def patch(act, hook):
            act = act.clone()
            act[:, 3] = clean[:, 3]
            return act

        by_hand = metric(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.2.hook_resid_pre", patch)])).item()
    finally:
        model.reset_hooks()
    torch.testing.assert_close(batched, reference, atol=1e-5, rtol=0)
    assert abs(batched[2, 3].item() - by_hand) < 1e-5
    unsteered = resid_pre_sweep(model, corrupted, clean_cache, P)
    assert (unsteered - batched).abs().max() > 1e-3  # the steering hooks did matter
