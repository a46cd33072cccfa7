"""`generate`: parity with HF, KV cache vs recompute, hooks and caches across steps, sampling, EOS, outputs."""

import logging

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.utils import MissingStepsError, at_steps
from hooked.generation.loop import (
    GenerationOutput,
    apply_freq_penalty,
    apply_repetition_penalty,
    sample_next_token,
    top_k_filter,
    top_p_filter,
)
from tests.tiny_models import NO_PROCESSING, hooked_from, make_tokenizer, tiny_gpt2

PROMPTS = ["The quick brown fox jumps over", "Hooks", "The capital of France is"]


# -- models ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def bos_tok():
    return make_tokenizer(prepends_bos=True)


@pytest.fixture(scope="module")
def gpt2_pair(tok):
    hf = tiny_gpt2(initializer_range=0.2)  # large enough weights that greedy text does not just repeat
    return hf, hooked_from(hf, tokenizer=tok)


def tiny_llama_hf(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=300, max_position_embeddings=128, attn_implementation="eager", bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def llama_pair(bos_tok):
    hf = tiny_llama_hf(bos_tok)
    return hf, HookedTransformer.from_pretrained("tiny-llama", hf_model=hf, tokenizer=bos_tok, **NO_PROCESSING)


@pytest.fixture(scope="module")
def llama_like(bos_tok):
    """A LLaMA-shaped hooked model built from a config alone: RMSNorm, rotary, gated SiLU MLP, GQA."""
    cfg = HookedTransformerConfig(
        d_model=64, d_head=16, n_layers=2, n_ctx=128, d_vocab=300, act_fn="silu", normalization_type="RMS",
        positional_embedding_type="rotary", gated_mlp=True, n_key_value_heads=2, seed=0,
    )  # fmt: skip
    return HookedTransformer(cfg, tokenizer=bos_tok)


@pytest.fixture(params=["gpt2", "llama_like"])
def model(request, gpt2_pair, llama_like):
    return gpt2_pair[1] if request.param == "gpt2" else llama_like


def left_padded(model, prompts=PROMPTS):
    return model.to_tokens(prompts, padding_side="left", return_attention_mask=True)


def greedy(model, tokens, mask=None, n=8, **kwargs):
    kwargs = {**dict(do_sample=False, verbose=False, stop_at_eos=False), **kwargs}
    return model.generate(tokens, max_new_tokens=n, attention_mask=mask, **kwargs)


def max_real_diff(a, b):
    """Max |a - b| where both are finite; -inf must sit in the same places."""
    assert a.shape == b.shape
    assert torch.equal(a.isneginf(), b.isneginf())
    finite = a.isfinite()
    return (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0


# -- HF parity --------------------------------------------------------------------------------
def hf_greedy(hf, tokens, mask, n, eos, **kwargs):
    with torch.no_grad():
        return hf.generate(
            tokens, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos, **kwargs
        )


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_matches_hf_one_prompt(family, request):
    hf, model = request.getfixturevalue(f"{family}_pair")
    tokens = model.to_tokens(PROMPTS[0])
    eos = model.tokenizer.eos_token_id
    ours = greedy(model, tokens, n=20, stop_at_eos=True)
    assert torch.equal(ours, hf_greedy(hf, tokens, torch.ones_like(tokens), 20, eos))
    # the repetition penalty is HF's formula (no pads here, which HF would also penalize)
    ours = greedy(model, tokens, n=20, stop_at_eos=True, repetition_penalty=1.5)
    assert torch.equal(ours, hf_greedy(hf, tokens, torch.ones_like(tokens), 20, eos, repetition_penalty=1.5))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_matches_hf_left_padded_batch(family, request):
    hf, model = request.getfixturevalue(f"{family}_pair")
    tokens, mask = left_padded(model)
    assert (mask == 0).any()
    eos = model.tokenizer.eos_token_id
    ours = greedy(model, tokens, mask, n=20, stop_at_eos=True)
    theirs = hf_greedy(hf, tokens, mask, 20, eos)
    assert torch.equal(ours, theirs)
    # text input is left-padded the same way, whatever padding_side says
    assert greedy(model, PROMPTS, n=20, stop_at_eos=True, return_type="tokens", padding_side="right").equal(ours)


# -- KV cache vs recompute -----------------------------------------------------------------
def test_cached_logits_equal_uncached_and_full_forward(model):
    tokens, mask = left_padded(model)
    cached = greedy(model, tokens, mask, n=6, output_logits=True)
    uncached = greedy(model, tokens, mask, n=6, output_logits=True, use_past_kv_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    for a, b in zip(cached.logits, uncached.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    full = model(cached.sequences, attention_mask=cached.attention_mask)  # [batch, pos, vocab]
    p = tokens.shape[1]
    for t, step_logits in enumerate(cached.logits):
        torch.testing.assert_close(step_logits, full[:, p - 1 + t], atol=1e-5, rtol=0)


def test_steps_and_shapes_seen_by_hooks(gpt2_pair):
    model = gpt2_pair[1]
    tokens, mask = left_padded(model)
    seen = []

    def record(x, hook):
        state = model.forward_state
        seen.append((state.step, tuple(x.shape), state.attention_mask.shape[1]))

    for use_cache in (True, False):
        seen.clear()
        hooks = [("blocks.0.attn.hook_pattern", record)]
        greedy(model, tokens, mask, n=4, use_past_kv_cache=use_cache, fwd_hooks=hooks)
        b, p = tokens.shape
        H = model.cfg.n_heads
        if use_cache:
            expected = [(t, (b, H, p if t == 0 else 1, p + t), p + t) for t in range(4)]
        else:
            expected = [(t, (b, H, p + t, p + t), p + t) for t in range(4)]
        assert seen == expected
    assert not model.list_hooks()


# -- caches across generation ----------------------------------------------------------------
@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_cache_equals_run_with_cache(model, use_cache):
    tokens, mask = left_padded(model)
    out = greedy(model, tokens, mask, n=5, return_cache=True, use_past_kv_cache=use_cache, device="cpu")
    assert isinstance(out, GenerationOutput)
    n_fed = tokens.shape[1] + 5 - 1  # the last sampled token is never fed
    fed, fed_mask = out.sequences[:, :n_fed], out.attention_mask[:, :n_fed]
    _, reference = model.run_with_cache(fed, attention_mask=fed_mask)
    assert set(out.cache.keys()) == set(reference.keys())
    for name in reference:
        assert max_real_diff(out.cache[name], reference[name]) <= 1e-4, name
    assert out.cache["pattern", 0].shape == (3, model.cfg.n_heads, n_fed, n_fed)
    assert torch.equal(out.cache.attention_mask, fed_mask) and torch.equal(out.cache.tokens, fed)
    assert not model.list_hooks()
    assert all(block.attn._use_sdpa() for block in model.blocks)  # the explicit path was for that call only


def test_generation_cache_names_filter_records_after_interventions(gpt2_pair):
    model = gpt2_pair[1]
    tokens = model.to_tokens(PROMPTS[0])
    name = "blocks.0.hook_resid_mid"
    out = greedy(model, tokens, n=3, return_cache=True, names_filter=[name], fwd_hooks=[(name, lambda x, hook: x * 0)])
    assert list(out.cache.keys()) == [name]
    assert out.cache[name].shape == (1, tokens.shape[1] + 2, model.cfg.d_model)
    assert (out.cache[name] == 0).all()


# -- hooks across steps -----------------------------------------------------------------------
def zero_head_1(z, hook):
    z = z.clone()
    z[:, :, 1] = 0
    return z


def test_at_steps_changes_exactly_the_logits_from_that_step_on(model):
    tokens, mask = left_padded(model)
    plain = greedy(model, tokens, mask, n=5, output_logits=True)
    hook = ("blocks.0.attn.hook_z", at_steps(zero_head_1, 2, strict=True))
    hooked = greedy(model, tokens, mask, n=5, output_logits=True, fwd_hooks=[hook])
    for t in (0, 1):
        assert torch.equal(plain.logits[t], hooked.logits[t])
    for t in (2, 3, 4):
        assert not torch.allclose(plain.logits[t], hooked.logits[t])
    assert not model.list_hooks()


def test_hook_on_every_step_equals_run_with_hooks_on_each_prefix(model):
    tokens, mask = left_padded(model)
    hook = ("blocks.0.attn.hook_z", zero_head_1)
    out = greedy(model, tokens, mask, n=5, output_logits=True, fwd_hooks=[hook])
    p = tokens.shape[1]
    for t, step_logits in enumerate(out.logits):
        prefix = slice(0, p + t)
        expected = model.run_with_hooks(
            out.sequences[:, prefix], attention_mask=out.attention_mask[:, prefix], fwd_hooks=[hook]
        )[:, -1]
        torch.testing.assert_close(step_logits, expected, atol=1e-5, rtol=0)


def test_at_steps_step_selection_and_strictness(gpt2_pair, caplog):
    model = gpt2_pair[1]
    tokens = model.to_tokens(PROMPTS[0])
    calls = []

    def log_step(x, hook):
        calls.append(model.forward_state.step)

    for steps, expected in [(0, [0]), ([1, 3], [1, 3]), (slice(2, None), [2, 3]), (slice(0, None, 2), [0, 2])]:
        calls.clear()
        greedy(model, tokens, n=4, fwd_hooks=[("blocks.1.hook_resid_post", at_steps(log_step, steps, strict=True))])
        assert calls == expected, steps
    with pytest.raises(MissingStepsError, match=r"\[7\]"):
        greedy(model, tokens, n=4, fwd_hooks=[("hook_embed", at_steps(log_step, [1, 7], strict=True))])
    assert not model.list_hooks()
    with caplog.at_level(logging.WARNING):
        greedy(model, tokens, n=4, fwd_hooks=[("hook_embed", at_steps(log_step, 9))])
    assert "never ran" in caplog.text
    with pytest.raises(RuntimeError, match="model"):
        model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", at_steps(log_step, 0))])
    hook = at_steps(log_step, 0, strict=True, model=model)
    calls.clear()
    with hook:
        model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", hook)])
    assert calls == [0]


def test_hooks_removed_on_exception_and_backward_hooks_rejected(gpt2_pair):
    model = gpt2_pair[1]
    tokens = model.to_tokens(PROMPTS[0])

    def explode(x, hook):
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        greedy(model, tokens, n=4, fwd_hooks=[("blocks.0.hook_resid_pre", at_steps(explode, 2))])
    assert not model.list_hooks()
    model.add_hook("blocks.0.hook_resid_pre", lambda g, hook: None, dir="bwd")
    try:
        with pytest.raises(ValueError, match="[Bb]ackward"):
            greedy(model, tokens, n=2)
    finally:
        model.reset_hooks()


# -- sampling ------------------------------------------------------------------------------
@pytest.fixture
def fixed_logits():
    return torch.randn(3, 40, generator=torch.Generator().manual_seed(0)) * 3


def test_top_k_and_top_p_match_reference(fixed_logits):
    for k in (1, 5, 40, 100):
        kept = top_k_filter(fixed_logits, k).isfinite()
        assert torch.equal(kept.sum(-1), torch.full((3,), min(k, 40)))
        ranks = fixed_logits.argsort(-1, descending=True).argsort(-1)
        assert torch.equal(kept, ranks < k)
    for p in (0.05, 0.3, 0.9, 0.999, 1.0):
        kept = top_p_filter(fixed_logits, p).isfinite()
        probs = fixed_logits.softmax(-1)
        for row in range(3):
            order = probs[row].argsort(descending=True).tolist()
            expected, mass = set(), 0.0
            for i in order:  # the smallest most-likely-first prefix reaching p
                expected.add(i)
                mass += probs[row, i].item()
                if mass >= p and p < 1.0:
                    break
            assert set(kept[row].nonzero().flatten().tolist()) == expected


def test_penalties_match_reference_and_skip_pads(fixed_logits):
    tokens = torch.tensor([[3, 3, 7, 0], [1, 2, 2, 2], [5, 5, 5, 5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])  # token 0 of row 0 is a pad
    out = apply_repetition_penalty(fixed_logits, tokens, 1.5, mask)
    expected = fixed_logits.clone()
    for row in range(3):
        for v in {int(t) for t, m in zip(tokens[row], mask[row], strict=True) if m}:
            x = expected[row, v]
            expected[row, v] = x / 1.5 if x > 0 else x * 1.5
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    out = apply_freq_penalty(fixed_logits, tokens, 0.7, mask)
    expected = fixed_logits.clone()
    expected[0, 3] -= 1.4
    expected[0, 7] -= 0.7
    expected[1, 1] -= 0.7
    expected[1, 2] -= 2.1
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_sample_next_token_order_and_temperature(fixed_logits):
    tokens, mask = torch.tensor([[1, 2], [3, 3], [4, 5]]), torch.ones(3, 2, dtype=torch.long)
    options = dict(temperature=0.7, freq_penalty=0.3, repetition_penalty=1.3, top_k=10)
    got = sample_next_token(fixed_logits, tokens, mask, generator=torch.Generator().manual_seed(5), **options)
    reference = apply_repetition_penalty(fixed_logits, tokens, 1.3, mask) / 0.7
    reference = top_k_filter(apply_freq_penalty(reference, tokens, 0.3, mask), 10)
    expected = torch.multinomial(reference.softmax(-1), 1, generator=torch.Generator().manual_seed(5))[:, 0]
    assert torch.equal(got, expected)
    argmax = apply_repetition_penalty(fixed_logits, tokens, 1.3, mask).argmax(-1)
    assert torch.equal(sample_next_token(fixed_logits, tokens, mask, do_sample=False, repetition_penalty=1.3), argmax)
    assert torch.equal(sample_next_token(fixed_logits, temperature=0.0), fixed_logits.argmax(-1))
    # with top_k and top_p both set, top_k wins
    both = sample_next_token(fixed_logits, top_k=1, top_p=0.99, generator=torch.Generator().manual_seed(0))
    assert torch.equal(both, fixed_logits.argmax(-1))


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(model):
    tokens, mask = left_padded(model)
    run = dict(max_new_tokens=6, attention_mask=mask, verbose=False, stop_at_eos=False, temperature=1.5)
    a = model.generate(tokens, seed=11, **run)
    assert torch.equal(a, model.generate(tokens, seed=11, **run))
    assert torch.equal(a, model.generate(tokens, generator=torch.Generator().manual_seed(11), **run))
    assert not torch.equal(a, model.generate(tokens, seed=12, **run))
    assert torch.equal(model.generate(tokens, top_k=1, seed=3, **run), greedy(model, tokens, mask, n=6))
    with pytest.raises(ValueError, match="top_p"):
        model.generate(tokens, top_p=0.0, **run)


# -- EOS, padding and outputs ---------------------------------------------------------------
def test_eos_stops_each_row_and_pads_it(gpt2_pair):
    model = gpt2_pair[1]
    tokens, mask = left_padded(model)
    p = tokens.shape[1]
    free = greedy(model, tokens, mask, n=8)
    stop = int(free[0, p + 2])  # row 0 emits it at step 2 (maybe earlier too)
    first = (free[:, p:] == stop).int().argmax(-1)  # per row, the first step emitting it
    hit = (free[:, p:] == stop).any(-1)
    out = greedy(model, tokens, mask, n=8, stop_at_eos=True, eos_token_id=stop, output_logits=True)
    assert torch.equal(out.finished, hit) and hit.any() and not hit.all()
    for row in range(3):
        if hit[row]:
            end = p + int(first[row])
            assert torch.equal(out.sequences[row, : end + 1], free[row, : end + 1])
            assert (out.sequences[row, end:] == stop).all()  # an int stop id is its own pad
        else:
            assert torch.equal(out.sequences[row], free[row, : out.sequences.shape[1]])
    # a list of stop ids pads with the tokenizer EOS
    listed = greedy(model, tokens, mask, n=8, stop_at_eos=True, eos_token_id=[stop, 999])
    finished_rows = hit.nonzero().flatten()
    for row in finished_rows.tolist():
        end = p + int(first[row])
        assert (listed[row, end + 1 :] == model.tokenizer.eos_token_id).all()
    # all rows finish at once: the loop ends early
    single = greedy(model, tokens[:1], mask[:1], n=8, stop_at_eos=True, eos_token_id=int(free[0, p]))
    assert single.shape[1] == p + 1


def test_return_types(gpt2_pair):
    model = gpt2_pair[1]
    text = greedy(model, PROMPTS[0], n=3)
    assert isinstance(text, str) and text.startswith(PROMPTS[0])
    batch = greedy(model, [PROMPTS[1]], n=3)
    assert isinstance(batch, list) and len(batch) == 1
    tokens, mask = left_padded(model)
    seq = greedy(model, tokens, mask, n=3)
    assert seq.shape == (3, tokens.shape[1] + 3) and torch.equal(seq[:, : tokens.shape[1]], tokens)
    assert seq.requires_grad is False and not torch.is_inference(seq)
    embeds = greedy(model, tokens, mask, n=3, return_type="embeds")
    torch.testing.assert_close(embeds, model.W_E[seq].detach(), atol=0, rtol=0)
    strs = greedy(model, tokens, mask, n=3, return_type="str")
    assert strs == [model.tokenizer.decode(row, skip_special_tokens=True) for row in seq]
    # embeddings input: "input" gives embeddings, "tokens"/"str" only the new tokens
    prompt_embeds = model.W_E[tokens].detach()
    new = greedy(model, prompt_embeds, mask, n=3, return_type="tokens")
    assert torch.equal(new, seq[:, tokens.shape[1] :])
    all_embeds = greedy(model, prompt_embeds, mask, n=3)
    torch.testing.assert_close(all_embeds, embeds, atol=0, rtol=0)
    assert greedy(model, prompt_embeds, mask, n=3, return_type="str") == model.tokenizer.batch_decode(
        new, skip_special_tokens=True
    )
    # 1-D tokens get a batch axis
    assert greedy(model, tokens[0], n=2).shape == (1, tokens.shape[1] + 2)
    structured = greedy(model, tokens, mask, n=3, output_logits=True)
    assert torch.equal(structured.sequences, seq) and len(structured.logits) == 3
    assert structured.logits[0].shape == (3, model.cfg.d_vocab_out)
    assert structured.text == strs and structured.attention_mask.shape == seq.shape
    with pytest.raises(ValueError, match="return_type"):
        greedy(model, tokens, n=1, return_type="logits")


def test_right_padded_mask_raises(gpt2_pair):
    model = gpt2_pair[1]
    tokens, mask = model.to_tokens(PROMPTS, padding_side="right", return_attention_mask=True)
    with pytest.raises(ValueError, match="left padding"):
        greedy(model, tokens, mask, n=2)


def test_generate_stream_yields_chunks_equal_to_generate(gpt2_pair):
    model = gpt2_pair[1]
    tokens, mask = left_padded(model)
    full = greedy(model, tokens, mask, n=7)
    stream = model.generate_stream(
        tokens, max_new_tokens=7, attention_mask=mask, do_sample=False, stop_at_eos=False, max_tokens_per_yield=3
    )
    chunks = list(stream)
    assert [c.shape[1] for c in chunks] == [3, 3, 1]
    assert torch.equal(torch.cat(chunks, dim=1), full[:, tokens.shape[1] :])
    texts = list(model.generate_stream(PROMPTS[0], max_new_tokens=4, do_sample=False, max_tokens_per_yield=2))
    assert all(isinstance(t, str) for t in texts) and len(texts) == 2
    assert not model.list_hooks() and not torch.is_inference_mode_enabled()


# -- hooks that only fit the prompt ------------------------------------------------------------
def test_fixed_position_hook_fails_at_the_first_decode_step_naming_hook_step_and_fix(llama_like):
    from functools import partial

    from hooked.core.errors import GenerationHookError

    model = llama_like
    tokens = model.to_tokens("The quick brown fox jumps over")
    steer = torch.randn(3, model.cfg.d_model, generator=torch.Generator().manual_seed(0))  # one row per position

    def add_to_prompt_positions(resid, hook, vector):
        resid[:, 1:4] += vector  # only the prompt has positions 1..3: [1, 0, d_model] at a decode step

    hook = ("blocks.1.hook_resid_pre", partial(add_to_prompt_positions, vector=steer))
    with pytest.raises(GenerationHookError) as info:
        greedy(model, tokens, n=3, fwd_hooks=[hook])
    message = str(info.value)
    for part in ("'add_to_prompt_positions'", "'blocks.1.hook_resid_pre'", "step 1", "at_steps(hook, 0)"):
        assert part in message
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not model.list_hooks()

    prompt_only = greedy(model, tokens, n=3, fwd_hooks=[(hook[0], at_steps(hook[1], 0))], output_logits=True)
    steered = model.run_with_hooks(tokens, fwd_hooks=[hook])[:, -1]  # the prefill's steered logits
    torch.testing.assert_close(prompt_only.logits[0], steered, atol=1e-5, rtol=0)
    assert not torch.allclose(steered, model(tokens)[:, -1])  # the hook does steer the prefill


def test_hook_errors_outside_decode_steps_keep_their_type(llama_like):
    tokens = llama_like.to_tokens("The quick brown fox jumps over")

    def broken(resid, hook):
        raise RuntimeError("a bug in the hook")

    with pytest.raises(RuntimeError, match="a bug in the hook") as info:
        greedy(llama_like, tokens, n=2, fwd_hooks=[("blocks.0.hook_resid_pre", broken)])
    assert type(info.value) is RuntimeError  # step 0 (the prefill): the user's own error, untouched
