"""ARENA chapter 1.4 (indirect object identification), as the exercises write it, on a tiny GPT-2.

Logit difference, direct logit attribution with `apply_ln_to_stack` and `residual_stack_to_logit_diff` (the
final residual stream, the logit lens, per layer, per head), activation patching with `get_act_patch_*`, and
path patching by hand with hooks. The numbers are checked against the formulas they stand for: the direct
logit attribution of the final residual stream is the logit difference, the per-component attributions sum
to it, patching the one position where clean and corrupted prompts differ restores the clean metric, and each
`get_act_patch_*` grid equals the hand-written hook loop of the course.
"""

from __future__ import annotations

import itertools
from functools import partial
from types import SimpleNamespace

import einops
import torch as t

PROMPT_FORMAT = [
    "When John and Mary went to the shops,{} gave the bag to",
    "When Tom and James went to the park,{} gave the ball to",
    "When Dan and Sid went to the shops,{} gave an apple to",
    "After Martin and Amy went to the park,{} gave a drink to",
]
NAME_PAIRS = [(" John", " Mary"), (" Tom", " James"), (" Dan", " Sid"), (" Martin", " Amy")]


def load_gpt2_small(lens, gpt2_hf, tokenizer):
    """The exercise's `HookedTransformer.from_pretrained("gpt2-small", ...)`, on the tiny GPT-2's weights."""
    return lens.HookedTransformer.from_pretrained(
        "gpt2-small", hf_model=gpt2_hf, tokenizer=tokenizer,
        center_unembed=True, center_writing_weights=True, fold_ln=True, refactor_factored_attn_matrices=True,
    )  # fmt: skip


def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
    final_logits = logits[:, -1, :]  # [batch, d_vocab]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens)  # [batch, 2]
    correct_logits, incorrect_logits = answer_logits.unbind(dim=-1)
    answer_logit_diff = correct_logits - incorrect_logits
    return answer_logit_diff if per_prompt else answer_logit_diff.mean()


def ioi_dataset(model):
    """The exercise's prompts, answers and tokens: each prompt twice, with the subject and the indirect object
    swapped, so that adjacent prompts differ in one token (the second name)."""
    prompts = [
        prompt.format(name) for (prompt, names) in zip(PROMPT_FORMAT, NAME_PAIRS, strict=True) for name in names[::-1]
    ]
    answers = [names[::i] for names in NAME_PAIRS for i in (1, -1)]
    answer_tokens = t.concat([model.to_tokens(names, prepend_bos=False).T for names in answers])  # [batch, 2]
    tokens = model.to_tokens(prompts, prepend_bos=True)  # [batch, pos]
    assert len({len(model.to_str_tokens(p)) for p in prompts}) == 1  # no padding: position -1 is every prompt's end
    return SimpleNamespace(prompts=prompts, answers=answers, answer_tokens=answer_tokens, tokens=tokens)


def test_direct_logit_attribution_gives_the_logit_difference(lens, gpt2_hf, course_tokenizer):
    model = load_gpt2_small(lens, gpt2_hf, course_tokenizer)
    data = ioi_dataset(model)
    prompts, answer_tokens = data.prompts, data.answer_tokens
    original_logits, cache = model.run_with_cache(data.tokens)
    original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)

    answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)  # [batch 2 d_model]
    correct_residual_directions, incorrect_residual_directions = answer_residual_directions.unbind(dim=1)
    logit_diff_directions = correct_residual_directions - incorrect_residual_directions  # [batch d_model]

    # -- the exercise, as written (issue #42: its first call had stopped working) --
    final_residual_stream = cache["resid_post", -1]  # [batch seq d_model]
    final_token_residual_stream = final_residual_stream[:, -1, :]  # [batch d_model]
    scaled_final_token_residual_stream = cache.apply_ln_to_stack(final_token_residual_stream, layer=-1, pos_slice=-1)
    average_logit_diff = einops.einsum(
        scaled_final_token_residual_stream, logit_diff_directions, "batch d_model, batch d_model ->"
    ) / len(prompts)
    t.testing.assert_close(average_logit_diff, original_average_logit_diff)
    assert t.equal(model.b_U, t.zeros_like(model.b_U))  # (the equality leaves b_U out: the fixture's is zero)

    def residual_stack_to_logit_diff(residual_stack, cache, logit_diff_directions=logit_diff_directions):
        batch_size = residual_stack.size(-2)
        scaled_residual_stack = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
        return (
            einops.einsum(scaled_residual_stack, logit_diff_directions, "... batch d_model, batch d_model -> ...")
            / batch_size
        )

    t.testing.assert_close(residual_stack_to_logit_diff(final_token_residual_stream, cache), average_logit_diff)

    # the logit lens: the last accumulated component is the final residual stream
    accumulated_residual, labels = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
    logit_lens_logit_diffs = residual_stack_to_logit_diff(accumulated_residual, cache)  # [component]
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    t.testing.assert_close(logit_lens_logit_diffs[-1], original_average_logit_diff)

    # per layer: the components sum to the final residual stream, so their attributions sum to the difference
    per_layer_residual, layer_labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
    per_layer_logit_diffs = residual_stack_to_logit_diff(per_layer_residual, cache)  # [component]
    assert layer_labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    t.testing.assert_close(per_layer_logit_diffs.sum(), original_average_logit_diff)
    # ... and TransformerLens's own helper gives each prompt's share of the same numbers
    attrs = cache.logit_attrs(per_layer_residual, answer_tokens[:, 0], answer_tokens[:, 1], pos_slice=-1)
    t.testing.assert_close(attrs.mean(-1), per_layer_logit_diffs)

    # per head: `[layer, head, batch, d_model]`; a layer's heads are its attention output less b_O
    per_head_residual, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    per_head_residual = einops.rearrange(
        per_head_residual, "(layer head) ... -> layer head ...", layer=model.cfg.n_layers
    )
    per_head_logit_diffs = residual_stack_to_logit_diff(per_head_residual, cache)  # [layer, head]
    assert per_head_logit_diffs.shape == (model.cfg.n_layers, model.cfg.n_heads) and labels[:2] == ["L0H0", "L0H1"]
    b_O = einops.repeat(model.b_O, "layer d_model -> layer batch d_model", batch=len(prompts))
    layer_attn = per_layer_logit_diffs[[layer_labels.index(f"{layer}_attn_out") for layer in range(2)]]
    t.testing.assert_close(per_head_logit_diffs.sum(-1) + residual_stack_to_logit_diff(b_O, cache), layer_attn)
    with_remainder = cache.stack_head_results(layer=-1, pos_slice=-1, incl_remainder=True)
    t.testing.assert_close(residual_stack_to_logit_diff(with_remainder, cache).sum(), original_average_logit_diff)


def patching_setup(lens, gpt2_hf, tokenizer):
    """The exercise's clean and corrupted runs: adjacent prompts swapped, and its normalised metric."""
    model = load_gpt2_small(lens, gpt2_hf, tokenizer)
    data = ioi_dataset(model)
    answer_tokens, clean_tokens = data.answer_tokens, data.tokens
    indices = [i + 1 if i % 2 == 0 else i - 1 for i in range(len(clean_tokens))]
    corrupted_tokens = clean_tokens[indices]
    clean_logits, clean_cache = model.run_with_cache(clean_tokens)
    corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens)
    clean_logit_diff = logits_to_ave_logit_diff(clean_logits, answer_tokens)
    corrupted_logit_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens)

    def ioi_metric(logits, answer_tokens=answer_tokens, corrupted_logit_diff=corrupted_logit_diff,
                   clean_logit_diff=clean_logit_diff):  # fmt: skip
        patched_logit_diff = logits_to_ave_logit_diff(logits, answer_tokens)
        return (patched_logit_diff - corrupted_logit_diff) / (clean_logit_diff - corrupted_logit_diff)

    # comparisons of the metric: 1e-5 in the logit difference, which the metric divides by the clean - corrupted gap
    atol = 1e-5 / abs(clean_logit_diff - corrupted_logit_diff).item()
    return SimpleNamespace(**locals())


def hand_patch(model, lens, run, name, hook_fn):
    """The metric after one hand-written patching hook (the course's loop body)."""
    patched_logits = model.run_with_hooks(run.corrupted_tokens, fwd_hooks=[(name, hook_fn)])
    return run.ioi_metric(patched_logits)


def test_activation_patching_get_act_patch(lens, gpt2_hf, course_tokenizer):
    run = patching_setup(lens, gpt2_hf, course_tokenizer)
    model, patching, utils = run.model, lens.patching, lens.utils
    corrupted_tokens, clean_cache, ioi_metric = run.corrupted_tokens, run.clean_cache, run.ioi_metric
    t.testing.assert_close(ioi_metric(run.clean_logits), t.tensor(1.0))
    t.testing.assert_close(ioi_metric(run.corrupted_logits), t.tensor(0.0))

    act_patch_resid_pre = patching.get_act_patch_resid_pre(
        model=model, corrupted_tokens=corrupted_tokens, clean_cache=clean_cache, patching_metric=ioi_metric
    )  # [layer, pos]
    # the prompts differ only at the second name: patching it at layer 0 restores the clean run, elsewhere nothing
    (differs,) = (run.clean_tokens != corrupted_tokens).any(0).nonzero()[:, 0].tolist()
    expected = t.zeros(run.clean_tokens.shape[1])
    expected[differs] = 1.0
    t.testing.assert_close(act_patch_resid_pre[0], expected, rtol=0, atol=run.atol)

    act_patch_block_every = patching.get_act_patch_block_every(model, corrupted_tokens, clean_cache, ioi_metric)
    assert act_patch_block_every.shape == (3, model.cfg.n_layers, run.clean_tokens.shape[1])
    t.testing.assert_close(act_patch_block_every[0], act_patch_resid_pre)

    def patch_residual_component(corrupted_residual_component, hook, pos, clean_cache):
        corrupted_residual_component[:, pos, :] = clean_cache[hook.name][:, pos, :]
        return corrupted_residual_component

    for row, name in enumerate(["resid_pre", "attn_out", "mlp_out"]):  # the course's loop, at the last position
        for layer in range(model.cfg.n_layers):
            hook_fn = partial(patch_residual_component, pos=-1, clean_cache=clean_cache)
            by_hand = hand_patch(model, lens, run, utils.get_act_name(name, layer), hook_fn)
            t.testing.assert_close(act_patch_block_every[row, layer, -1], by_hand, rtol=0, atol=run.atol)

    act_patch_attn_head_out_all_pos = patching.get_act_patch_attn_head_out_all_pos(
        model, corrupted_tokens, clean_cache, ioi_metric
    )  # [layer, head]

    def patch_head_vector(corrupted_head_vector, hook, head_index, clean_cache):
        corrupted_head_vector[:, :, head_index, :] = clean_cache[hook.name][:, :, head_index, :]
        return corrupted_head_vector

    by_hand = t.zeros(model.cfg.n_layers, model.cfg.n_heads)
    for layer, head_index in itertools.product(range(model.cfg.n_layers), range(model.cfg.n_heads)):
        hook_fn = partial(patch_head_vector, head_index=head_index, clean_cache=clean_cache)
        by_hand[layer, head_index] = hand_patch(model, lens, run, utils.get_act_name("z", layer, "attn"), hook_fn)
    t.testing.assert_close(act_patch_attn_head_out_all_pos, by_hand, rtol=0, atol=run.atol)

    every = patching.get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, ioi_metric)
    assert every.shape == (5, model.cfg.n_layers, model.cfg.n_heads)  # output, query, key, value, pattern
    t.testing.assert_close(every[0], act_patch_attn_head_out_all_pos)

    by_pos = patching.get_act_patch_attn_head_by_pos_every(model, corrupted_tokens, clean_cache, ioi_metric)
    assert by_pos.shape == (5, model.cfg.n_layers, run.clean_tokens.shape[1], model.cfg.n_heads)

    def patch_head_input(corrupted_activation, hook, pos, head_index, clean_cache):
        corrupted_activation[:, pos, head_index] = clean_cache[hook.name][:, pos, head_index]
        return corrupted_activation

    def patch_head_pattern(corrupted_head_pattern, hook, pos, head_index, clean_cache):
        corrupted_head_pattern[:, head_index, pos] = clean_cache[hook.name][:, head_index, pos]
        return corrupted_head_pattern

    for row, name in enumerate(["z", "q", "k", "v", "pattern"]):  # one layer, the second name's position
        fn = patch_head_pattern if name == "pattern" else patch_head_input
        for head_index in range(model.cfg.n_heads):
            hook_fn = partial(fn, pos=differs, head_index=head_index, clean_cache=clean_cache)
            by_hand = hand_patch(model, lens, run, utils.get_act_name(name, 1), hook_fn)
            t.testing.assert_close(by_pos[row, 1, differs, head_index], by_hand, rtol=0, atol=run.atol)


def patch_or_freeze_head_vectors(orig_head_vector, hook, new_cache, orig_cache, head_to_patch):
    """ARENA's path patching hook: every head's output frozen to the original run, except the sender's."""
    orig_head_vector[...] = orig_cache[hook.name][...]
    if head_to_patch[0] == hook.layer():
        orig_head_vector[:, :, head_to_patch[1]] = new_cache[hook.name][:, :, head_to_patch[1]]
    return orig_head_vector


def test_path_patching_by_hand(lens, gpt2_hf, course_tokenizer):
    """Sender heads -> the final residual stream, the exercise's `get_path_patch_head_to_final_resid_post`."""
    run = patching_setup(lens, gpt2_hf, course_tokenizer)
    model, utils = run.model, lens.utils
    orig_tokens, orig_cache, new_cache = run.clean_tokens, run.clean_cache, run.corrupted_cache

    def patching_metric(logits):  # ARENA's ioi_metric_2: 0 on the clean run, -1 on the corrupted one
        patched_logit_diff = logits_to_ave_logit_diff(logits, run.answer_tokens)
        return (patched_logit_diff - run.clean_logit_diff) / (run.clean_logit_diff - run.corrupted_logit_diff)

    model.reset_hooks()
    results = t.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=t.float32)
    resid_post_hook_name = utils.get_act_name("resid_post", model.cfg.n_layers - 1)
    resid_post_name_filter = lambda name: name == resid_post_hook_name  # noqa: E731  (as the exercise writes it)
    z_name_filter = lambda name: name.endswith("z")  # noqa: E731
    for sender_layer, sender_head in itertools.product(range(model.cfg.n_layers), range(model.cfg.n_heads)):
        hook_fn = partial(
            patch_or_freeze_head_vectors, new_cache=new_cache, orig_cache=orig_cache,
            head_to_patch=(sender_layer, sender_head),
        )  # fmt: skip
        model.add_hook(z_name_filter, hook_fn)
        _, patched_cache = model.run_with_cache(orig_tokens, names_filter=resid_post_name_filter, return_type=None)
        assert set(patched_cache.keys()) == {resid_post_hook_name}
        patched_logits = model.unembed(model.ln_final(patched_cache[resid_post_hook_name]))
        results[sender_layer, sender_head] = patching_metric(patched_logits)
    # as in TransformerLens, run_with_cache removes only its own caching hooks: the added hooks pile up, one per
    # sender on every hook_z, and the loop is right only because the last one added runs last and overwrites the
    # others; the exercise clears them with reset_hooks() on its next call
    z_points = [hp for hp in model.hook_points() if z_name_filter(hp.name)]
    n_senders = model.cfg.n_layers * model.cfg.n_heads
    assert all(len(hp.fwd_hooks) == n_senders for hp in z_points)  # (TransformerLens's list of hook handles)
    model.reset_hooks()
    assert not any(hp.has_hooks() for hp in model.hook_points())

    # the final block's heads reach the final residual stream only directly (its MLP reads their change, as an
    # activation patch would let it): their path patch is the activation patch of the head, corrupted -> clean
    act_patch = lens.patching.get_act_patch_attn_head_out_all_pos(model, orig_tokens, new_cache, patching_metric)
    t.testing.assert_close(results[-1], act_patch[-1], rtol=0, atol=run.atol)
    # an earlier head's effect passes only through the MLPs (the later heads are frozen): recomputed by hand,
    # freezing the last block's heads with one hook and patching the sender with another
    for head in range(model.cfg.n_heads):

        def freeze(z, hook):
            return orig_cache[hook.name]

        def patch(z, hook, head=head):
            z[:, :, head] = new_cache[hook.name][:, :, head]
            return z

        logits = model.run_with_hooks(orig_tokens, fwd_hooks=[(utils.get_act_name("z", 0), patch),
                                                              (utils.get_act_name("z", 1), freeze)])  # fmt: skip
        t.testing.assert_close(results[0, head], patching_metric(logits), rtol=0, atol=run.atol)
