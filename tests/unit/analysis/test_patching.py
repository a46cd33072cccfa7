"""Activation patching: batched sweeps equal one forward per patch
(docs/analysis-and-patching.md#activation-patching)."""

import itertools

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.analysis import patching
from hooked.core.utils import get_act_name

torch.set_num_threads(1)

ATOL = 1e-5
L, H, HKV, P = 2, 4, 2, 4


@pytest.fixture(scope="module")
def setup():
    cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_layers=L, n_ctx=16, d_vocab=50, d_mlp=48, act_fn="silu", gated_mlp=True,
        normalization_type="RMS", positional_embedding_type="rotary", n_key_value_heads=HKV, seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 50, (2, P), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 1] = torch.randint(0, 50, (2,), generator=gen)
    _, clean_cache = model.run_with_cache(clean)
    return model, corrupted, clean_cache


def metric(logits):
    return (logits[:, -1, 3] - logits[:, -1, 7]).mean()


def naive_patch(model, corrupted, clean_cache, setter, name, axes):
    """The reference: one forward per index tuple."""
    ranges = patching.axis_ranges(model, corrupted, name)
    shape = [ranges[a] for a in axes]
    out = torch.zeros(shape)
    for index in itertools.product(*(range(n) for n in shape)):
        hook_name = get_act_name(name, layer=index[0])

        def hook(act, hook, index=index, clean=clean_cache[hook_name]):
            return setter(act.clone(), list(index), clean)

        out[index] = metric(model.run_with_hooks(corrupted, fwd_hooks=[(hook_name, hook)])).item()
    return out


PATCH = patching
POS, POS_HEAD, HEAD = ("layer", "pos"), ("layer", "pos", "head"), ("layer", "head")
CASES = [
    ("get_act_patch_resid_pre", PATCH.layer_pos_patch_setter, "resid_pre", POS, (L, P)),
    ("get_act_patch_resid_mid", PATCH.layer_pos_patch_setter, "resid_mid", POS, (L, P)),
    ("get_act_patch_attn_out", PATCH.layer_pos_patch_setter, "attn_out", POS, (L, P)),
    ("get_act_patch_mlp_out", PATCH.layer_pos_patch_setter, "mlp_out", POS, (L, P)),
    ("get_act_patch_attn_head_out_by_pos", PATCH.layer_pos_head_vector_patch_setter, "z", POS_HEAD, (L, P, H)),
    ("get_act_patch_attn_head_q_by_pos", PATCH.layer_pos_head_vector_patch_setter, "q", POS_HEAD, (L, P, H)),
    ("get_act_patch_attn_head_k_by_pos", PATCH.layer_pos_head_vector_patch_setter, "k", POS_HEAD, (L, P, HKV)),
    ("get_act_patch_attn_head_v_by_pos", PATCH.layer_pos_head_vector_patch_setter, "v", POS_HEAD, (L, P, HKV)),
    (
        "get_act_patch_attn_head_pattern_by_pos",
        PATCH.layer_head_pos_pattern_patch_setter,
        "pattern",
        ("layer", "head_index", "dest_pos"),
        (L, H, P),
    ),
    (
        "get_act_patch_attn_head_pattern_dest_src_pos",
        PATCH.layer_head_dest_src_pos_pattern_patch_setter,
        "pattern",
        ("layer", "head_index", "dest_pos", "src_pos"),
        (L, H, P, P),
    ),
    ("get_act_patch_attn_head_out_all_pos", PATCH.layer_head_vector_patch_setter, "z", HEAD, (L, H)),
    ("get_act_patch_attn_head_q_all_pos", PATCH.layer_head_vector_patch_setter, "q", HEAD, (L, H)),
    ("get_act_patch_attn_head_k_all_pos", PATCH.layer_head_vector_patch_setter, "k", HEAD, (L, HKV)),
    ("get_act_patch_attn_head_v_all_pos", PATCH.layer_head_vector_patch_setter, "v", HEAD, (L, HKV)),
    (
        "get_act_patch_attn_head_pattern_all_pos",
        PATCH.layer_head_pattern_patch_setter,
        "pattern",
        ("layer", "head_index"),
        (L, H),
    ),
]


@pytest.mark.parametrize("fn_name, setter, name, axes, shape", CASES, ids=[c[0] for c in CASES])
def test_batched_partial_equals_naive_loop(setup, fn_name, setter, name, axes, shape):
    model, corrupted, clean_cache = setup
    batched = getattr(patching, fn_name)(model, corrupted, clean_cache, metric)
    assert batched.shape == shape
    expected = naive_patch(model, corrupted, clean_cache, setter, name, axes)
    torch.testing.assert_close(batched, expected, atol=ATOL, rtol=0)
    assert batched.max() - batched.min() > 1e-3  # the patches do move the metric


def test_chunked_generic_equals_batch_size_one(setup):
    model, corrupted, clean_cache = setup
    args = (model, corrupted, clean_cache, metric, patching.layer_pos_head_vector_patch_setter, "z", POS_HEAD)
    one = patching.generic_activation_patch(*args, batch_size=1)
    for batch_size in (3, 7, 100):  # chunks that straddle layers, and one chunk for everything
        chunked = patching.generic_activation_patch(*args, batch_size=batch_size)
        torch.testing.assert_close(chunked, one, atol=ATOL, rtol=0)


def test_index_df_gives_flat_output(setup):
    model, corrupted, clean_cache = setup
    rows = [(1, 2, 0), (0, 3, 3), (1, 1, 2)]
    common = dict(patch_setter=patching.layer_pos_head_vector_patch_setter, activation_name="z")
    flat = patching.generic_activation_patch(
        model, corrupted, clean_cache, metric, index_df=rows, batch_size=2, **common
    )
    full = patching.get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, metric)
    assert flat.shape == (3,)
    torch.testing.assert_close(flat, torch.stack([full[r] for r in rows]), atol=ATOL, rtol=0)
    out, index_df = patching.generic_activation_patch(
        model, corrupted, clean_cache, metric, index_axis_names=("layer", "pos"), return_index_df=True,
        patch_setter=patching.layer_pos_patch_setter, activation_name="resid_pre",
    )  # fmt: skip
    assert out.shape == (L, P) and len(index_df) == L * P


def test_every_bundles(setup):
    model, corrupted, clean_cache = setup
    every = patching.get_act_patch_attn_head_all_pos_every(model, corrupted, clean_cache, metric)
    assert every.shape == (5, L, H)
    k_all = patching.get_act_patch_attn_head_k_all_pos(model, corrupted, clean_cache, metric)
    torch.testing.assert_close(every[2, :, :HKV], k_all, atol=ATOL, rtol=0)
    assert (every[2:4, :, HKV:] == 0).all()
    by_pos = patching.get_act_patch_attn_head_by_pos_every(model, corrupted, clean_cache, metric, batch_size=5)
    assert by_pos.shape == (5, L, P, H)
    pattern = patching.get_act_patch_attn_head_pattern_by_pos(model, corrupted, clean_cache, metric)
    torch.testing.assert_close(by_pos[4], pattern.transpose(1, 2), atol=ATOL, rtol=0)
    block = patching.get_act_patch_block_every(model, corrupted, clean_cache, metric)
    assert block.shape == (3, L, P)
    # Patching all of resid_pre at a position restores the clean run where nothing later differs.
    clean_value = metric(model(clean_cache.tokens)).item()
    torch.testing.assert_close(block[0, 0, 1], torch.tensor(clean_value), atol=ATOL, rtol=0)


def test_auto_batch_size_respects_budget(setup):
    model, corrupted, _ = setup
    assert patching.auto_batch_size(model, corrupted, 1000) == patching.MAX_AUTO_BATCH
    assert patching.auto_batch_size(model, corrupted, 10) == 10
    assert patching.auto_batch_size(model, corrupted, 1000, memory_bytes=1) == 1


def test_patching_sweeps_show_a_progress_bar_unless_verbose_false(setup, capsys):
    model, corrupted, clean_cache = setup
    quiet = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric, verbose=False)
    assert "patching resid_pre" not in capsys.readouterr().err
    shown = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    err = capsys.readouterr().err
    assert "patching resid_pre" in err and f"{L * P}/{L * P}" in err
    torch.testing.assert_close(shown, quiet, atol=0, rtol=0)
