"""The hooks of ARENA's SAE and steering material and of TransformerLens's activation-steering demo, as they
are written there, on a tiny GPT-2 with a random stand-in SAE (`W_enc`, `b_enc`, `W_dec`, `b_dec`).

Adding a steering vector at a residual hook during `generate` inside `with model.hooks(...)`, with
`model.add_hook` and `reset_hooks`, and with `get_caching_hooks` for the activation difference; ablating an
SAE latent with a hook; `run_with_hooks(..., reset_hooks_end=False)`. Greedy generations are checked against
the same hook on a full forward pass without a KV cache (the tokens must be its argmaxes), edits against the
formula they apply, and hook bookkeeping against TransformerLens's rules (what stays attached, what goes).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch as t
import torch.nn.functional as F

HOOK_NAME = "blocks.1.hook_resid_pre"
PROMPT = "When John and Mary went to the shops,"


@pytest.fixture
def model(lens, gpt2_hf, course_tokenizer):
    return lens.HookedTransformer.from_pretrained("gpt2-small", hf_model=gpt2_hf, tokenizer=course_tokenizer)


@pytest.fixture
def sae(model):
    """An SAE's parameters on `HOOK_NAME` (random: the hooks, not the features, are under test)."""
    g = t.Generator().manual_seed(3)
    d_in, d_sae = model.cfg.d_model, 128
    return SimpleNamespace(
        W_enc=t.randn(d_in, d_sae, generator=g) / d_in**0.5, b_enc=t.randn(d_sae, generator=g) * 0.1,
        W_dec=t.randn(d_sae, d_in, generator=g), b_dec=t.randn(d_in, generator=g) * 0.1,
        cfg=SimpleNamespace(hook_name=HOOK_NAME, prepend_bos=True),
    )  # fmt: skip


def no_hooks_left(model) -> bool:
    return not any(hp.has_hooks() for hp in model.hook_points())


def assert_greedy_under(model, output_tokens, prompt_len, fwd_hooks):
    """Each generated token is the argmax of a full forward pass (no KV cache) under the same hooks."""
    logits = model.run_with_hooks(output_tokens[:, :-1], fwd_hooks=fwd_hooks)
    assert t.equal(logits[:, prompt_len - 1 :].argmax(-1), output_tokens[:, prompt_len:])


def steering_hook(activations, hook, sae, latent_idx, steering_coefficient):
    return activations + steering_coefficient * sae.W_dec[latent_idx]


def generate_with_steering(model, sae, prompt, latent_idx, steering_coefficient=1.0, max_new_tokens=50, **kwargs):
    _steering_hook = partial(steering_hook, sae=sae, latent_idx=latent_idx, steering_coefficient=steering_coefficient)
    with model.hooks(fwd_hooks=[(sae.cfg.hook_name, _steering_hook)]):
        output = model.generate(prompt, max_new_tokens=max_new_tokens, prepend_bos=sae.cfg.prepend_bos, **kwargs)
    return output


def test_steering_vector_during_generate(model, sae):
    GENERATE_KWARGS = dict(temperature=0.5, freq_penalty=2.0, verbose=False)  # the chapter's sampling
    t.manual_seed(0)
    sampled = generate_with_steering(model, sae, PROMPT, latent_idx=7, steering_coefficient=4.0, max_new_tokens=8,
                                     **GENERATE_KWARGS)  # fmt: skip
    t.manual_seed(0)
    again = generate_with_steering(model, sae, PROMPT, latent_idx=7, steering_coefficient=4.0, max_new_tokens=8,
                                   **GENERATE_KWARGS)  # fmt: skip
    assert isinstance(sampled, str) and sampled.startswith(PROMPT) and sampled == again
    assert no_hooks_left(model)  # the context manager removed the hook

    greedy = dict(do_sample=False, return_type="tokens", verbose=False)
    steered = generate_with_steering(model, sae, PROMPT, 7, steering_coefficient=8.0, max_new_tokens=6, **greedy)
    plain = model.generate(PROMPT, max_new_tokens=6, **greedy)
    assert not t.equal(steered, plain)  # the vector changes what the model says
    hook = partial(steering_hook, sae=sae, latent_idx=7, steering_coefficient=8.0)
    prompt_len = model.to_tokens(PROMPT).shape[1]
    assert_greedy_under(model, steered, prompt_len, [(HOOK_NAME, hook)])
    assert_greedy_under(model, plain, prompt_len, [])


def test_add_hook_then_generate_then_reset_hooks(model, sae):
    hook = partial(steering_hook, sae=sae, latent_idx=3, steering_coefficient=8.0)
    greedy = dict(max_new_tokens=5, do_sample=False, return_type="tokens", verbose=False)
    with model.hooks(fwd_hooks=[(HOOK_NAME, hook)]):
        expected = model.generate(PROMPT, **greedy)
    model.add_hook(HOOK_NAME, hook)
    assert t.equal(model.generate(PROMPT, **greedy), expected)  # generate keeps hooks the user added
    assert model.hook_dict[HOOK_NAME].has_hooks()
    model.reset_hooks()
    assert no_hooks_left(model)
    assert not t.equal(model.generate(PROMPT, **greedy), expected)


def test_activation_addition_with_caching_hooks(model):
    """TransformerLens's activation-steering demo: the difference of two prompts' resid_pre, added to the start
    of the prompt at the prefill only (at a KV-cached step the hook sees one position and returns)."""
    layer, coeff = 1, 5.0

    def get_resid_pre(prompt, layer):
        name = f"blocks.{layer}.hook_resid_pre"
        cache, caching_hooks, _ = model.get_caching_hooks(lambda n: n == name)
        with model.hooks(fwd_hooks=caching_hooks):
            _ = model(prompt)
        return cache[name]

    act_diff = get_resid_pre(" John", layer) - get_resid_pre(" Mary", layer)  # [1, 2, d_model] (BOS, name)
    t.testing.assert_close(act_diff[:, 1], model.run_with_cache(" John")[1]["resid_pre", 1][:, 1]
                           - model.run_with_cache(" Mary")[1]["resid_pre", 1][:, 1])  # fmt: skip

    def ave_hook(resid_pre, hook):
        if resid_pre.shape[1] == 1:
            return  # caching in model.generate for new tokens
        ppos, apos = resid_pre.shape[1], act_diff.shape[1]
        assert apos <= ppos, f"More mod tokens ({apos}) then prompt tokens ({ppos})!"
        resid_pre[:, :apos, :] += coeff * act_diff

    def hooked_generate(prompt_batch, fwd_hooks=[], seed=None, **kwargs):  # noqa: B006  (as the demo writes it)
        if seed is not None:
            t.manual_seed(seed)
        with model.hooks(fwd_hooks=fwd_hooks):
            tokenized = model.to_tokens(prompt_batch)
            result = model.generate(input=tokenized, max_new_tokens=6, **kwargs)
        return result

    editing_hooks = [(f"blocks.{layer}.hook_resid_pre", ave_hook)]
    sampled = hooked_generate([PROMPT] * 2, editing_hooks, seed=0, do_sample=True, verbose=False)
    assert t.equal(sampled, hooked_generate([PROMPT] * 2, editing_hooks, seed=0, do_sample=True, verbose=False))
    greedy = hooked_generate([PROMPT], editing_hooks, do_sample=False, verbose=False)
    tokens = model.to_tokens(PROMPT)  # the edit reaches the last position (through layer 1's attention)
    assert not t.allclose(model.run_with_hooks(tokens, fwd_hooks=editing_hooks)[:, -1], model(tokens)[:, -1])
    assert_greedy_under(model, greedy, model.to_tokens(PROMPT).shape[1], editing_hooks)
    assert no_hooks_left(model)


def test_ablating_an_sae_latent_with_a_hook(model, sae):
    latent_idx = 5

    def ablate_latent_hook(resid, hook, sae, latent_idx):
        """Encode, and subtract the latent's part of the reconstruction (the SAE's error term stays)."""
        latent_acts = F.relu((resid - sae.b_dec) @ sae.W_enc + sae.b_enc)  # [batch pos d_sae]
        return resid - latent_acts[..., latent_idx, None] * sae.W_dec[latent_idx]

    tokens = model.to_tokens([PROMPT, "The quick brown fox jumps over the lazy dog."])
    _, clean_cache = model.run_with_cache(tokens)
    hook = partial(ablate_latent_hook, sae=sae, latent_idx=latent_idx)
    with model.hooks(fwd_hooks=[(HOOK_NAME, hook)]):
        ablated_logits, ablated_cache = model.run_with_cache(tokens)
    resid = clean_cache[HOOK_NAME]
    acts = F.relu((resid - sae.b_dec) @ sae.W_enc + sae.b_enc)[..., latent_idx]  # [batch pos]
    assert (acts > 0).any()  # the latent fires somewhere, so the ablation changes something
    t.testing.assert_close(ablated_cache[HOOK_NAME], resid - acts[..., None] * sae.W_dec[latent_idx])
    t.testing.assert_close(model.unembed(model.ln_final(ablated_cache["resid_post", -1])), ablated_logits)
    assert no_hooks_left(model)


def test_run_with_hooks_reset_hooks_end_false_keeps_the_hook(model, sae):
    tokens = model.to_tokens(PROMPT)
    hook = partial(steering_hook, sae=sae, latent_idx=1, steering_coefficient=2.0)
    plain = model(tokens)
    hooked_logits = model.run_with_hooks(tokens, fwd_hooks=[(HOOK_NAME, hook)], reset_hooks_end=False)
    assert not t.allclose(hooked_logits, plain)
    assert model.hook_dict[HOOK_NAME].has_hooks()
    t.testing.assert_close(model(tokens), hooked_logits)  # still attached
    model.reset_hooks()
    assert no_hooks_left(model)
    t.testing.assert_close(model(tokens), plain)
