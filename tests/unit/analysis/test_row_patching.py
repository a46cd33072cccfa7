"""Cross-prompt patching in one padded forward equals cache-then-patch in two passes
(docs/analysis-and-patching.md#patching-across-prompts-in-one-forward)."""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.utils import gather_pos, row_patch_hook, token_index
from hooked.models.tokenizer_mixin import TokenizerMixin

torch.set_num_threads(1)

ATOL = 1e-5


def make_model(pos_type: str) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_layers=2, n_ctx=16, d_vocab=50, d_mlp=48, act_fn="gelu",
        positional_embedding_type=pos_type, seed=0,
    )  # fmt: skip
    return HookedTransformer(cfg)


def pad_batch(rows: list[torch.Tensor], side: str, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r) for r in rows)
    tokens = torch.full((len(rows), n), pad)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for i, r in enumerate(rows):
        cols = slice(n - len(r), n) if side == "left" else slice(0, len(r))
        tokens[i, cols], mask[i, cols] = r, 1
    return tokens, mask


@pytest.mark.parametrize("pos_type", ["standard", "rotary"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("hook_name", ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_z", "blocks.1.hook_mlp_out"])
def test_one_pass_cross_prompt_patch_equals_two_passes(pos_type, side, hook_name):
    model = make_model(pos_type)
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(1, 50, (6,), generator=gen), torch.randint(1, 50, (4,), generator=gen)
    tokens, mask = pad_batch([src, dst], side)
    src_col, dst_col = token_index(-2, mask)[0], token_index(-1, mask)[1]  # positions counted from the end
    hook = row_patch_hook(0, 1, src_pos=src_col, dst_pos=dst_col)
    one_pass = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[(hook_name, hook)])

    _, src_cache = model.run_with_cache(src[None], names_filter=hook_name)
    vector = src_cache[hook_name][0, -2]

    def set_last(act, hook):
        act[0, -1] = vector
        return act

    two_pass = model.run_with_hooks(dst[None], fwd_hooks=[(hook_name, set_last)])
    real = mask[1].bool()
    torch.testing.assert_close(one_pass[1, real], two_pass[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(one_pass[0, mask[0].bool()], model(src[None])[0], atol=ATOL, rtol=0)
    assert (two_pass[0, -1] - model(dst[None])[0, -1]).abs().max() > 1e-3  # the patch changed something


def test_row_patch_hook_swaps_rows_and_all_positions():
    model = make_model("rotary")
    tokens = torch.randint(1, 50, (3, 5), generator=torch.Generator().manual_seed(1))
    name = "blocks.1.hook_resid_pre"
    _, cache = model.run_with_cache(tokens, names_filter=name)
    seen = {}

    def record(act, hook):
        seen["act"] = act.clone()

    model.run_with_hooks(tokens, fwd_hooks=[(name, row_patch_hook([0, 2], [2, 0])), (name, record)])
    torch.testing.assert_close(seen["act"], cache[name][[2, 1, 0]], atol=0, rtol=0)
    model.run_with_hooks(
        tokens, fwd_hooks=[(name, row_patch_hook([0, 1], [2, 2], src_pos=[1, 3], dst_pos=[0, 4])), (name, record)]
    )
    expected = cache[name].clone()
    expected[2, 0], expected[2, 4] = cache[name][0, 1], cache[name][1, 3]
    torch.testing.assert_close(seen["act"], expected, atol=0, rtol=0)


def test_row_patch_hook_uses_pattern_position_axis():
    model = make_model("rotary")
    tokens = torch.randint(1, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    name = "blocks.0.attn.hook_pattern"
    _, cache = model.run_with_cache(tokens, names_filter=name)
    seen = {}

    def record(act, hook):
        seen["act"] = act.clone()

    model.run_with_hooks(tokens, fwd_hooks=[(name, row_patch_hook(0, 1, src_pos=3, dst_pos=3)), (name, record)])
    torch.testing.assert_close(seen["act"][1, :, 3], cache[name][0, :, 3], atol=0, rtol=0)
    torch.testing.assert_close(seen["act"][1, :, 2], cache[name][1, :, 2], atol=0, rtol=0)


def test_model_token_index_and_gather():
    model = make_model("rotary")
    tokens, mask = pad_batch([torch.arange(1, 6), torch.arange(1, 3)], "left")
    logits = model(tokens, attention_mask=mask)
    cols = TokenizerMixin.token_index(model, -1, mask)
    assert cols.tolist() == [4, 4]
    assert TokenizerMixin.token_index(model, 0).tolist() == [0, 3]  # the last call's mask
    last = gather_pos(logits, TokenizerMixin.token_index(model, torch.tensor([-1, 0]), mask))
    torch.testing.assert_close(last[1], model(torch.arange(1, 3)[None])[0, 0], atol=ATOL, rtol=0)
    model(tokens)
    assert TokenizerMixin.token_index(model, -2).tolist() == [3, 3]


def test_test_prompt_prints_ranks(tokenizer, capsys):
    from hooked.core.utils import test_prompt

    cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_layers=1, n_ctx=32, d_vocab=len(tokenizer), act_fn="relu", seed=0
    )
    model = HookedTransformer(cfg, tokenizer=tokenizer)
    assert test_prompt("The capital of France is", "Paris", model, top_k=3) is None
    out = capsys.readouterr().out
    assert "Tokenized prompt:" in out and "Top 2th token" in out and "Ranks of the answer tokens" in out
    assert "Paris" in out
    test_prompt("The quick brown", ["fox", " dog"], model, print_details=False)
    out = capsys.readouterr().out
    assert "Top 0th" not in out and out.count("(") >= 2
