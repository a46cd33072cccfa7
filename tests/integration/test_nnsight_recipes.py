"""nnsight's documented recipes on a `hooked` model, each against the same recipe on the HF model.

The HF side is nnsight's own `LanguageModel` over a tiny random GPT-2; the hooked side is
`HookedNNsight` over its conversion (same weights, no weight processing). Paths map as
`transformer.h[i]` -> `blocks[i]`, `transformer.wte` -> `embed`, `.mlp` -> `blocks[i].hook_mlp_out`,
`transformer.ln_f` -> `ln_final`, `lm_head` -> `unembed`.
"""

from __future__ import annotations

import warnings

import nnsight
import pytest
import torch

from hooked.compat.nnsight import HookedNNsight
from tests.tiny_models import hooked_from, make_tokenizer, tiny_gpt2

ATOL = 1e-5
PROMPTS = ["The Eiffel Tower is in the city of", "When Mary and John went"]


def hidden(value):
    """A GPT-2 block's output is its hidden state (a tuple's first entry on older transformers)."""
    return value[0] if isinstance(value, tuple) else value


@pytest.fixture(scope="module")
def pair():
    """(nnsight LanguageModel over HF GPT-2, HookedNNsight over its conversion), one tokenizer
    (BOS, pad, left padding)."""
    tokenizer = make_tokenizer(prepends_bos=True)
    tokenizer.padding_side = "left"
    hf = tiny_gpt2()
    for config in (hf.config, hf.generation_config):  # the tiny vocabulary's own special tokens
        config.eos_token_id, config.pad_token_id, config.bos_token_id = (
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            tokenizer.bos_token_id,
        )
    model = hooked_from(hf, tokenizer=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nnsight.NNsightDeprecationWarning)  # LanguageModel: what the docs teach
        lm = nnsight.LanguageModel(hf, tokenizer=tokenizer)
    return lm, HookedNNsight(model)


def test_same_tokens(pair):
    lm, nm = pair
    for prompt in PROMPTS:
        assert nm._module.to_tokens(prompt)[0].tolist() == lm.tokenizer(prompt)["input_ids"]


def test_save_hidden_states_and_logits(pair):
    lm, nm = pair
    with torch.no_grad(), lm.trace(PROMPTS[0]) as tracer:
        hf_hidden = lm.transformer.h[-1].output.save()
        hf_logits = tracer.result.logits.save()
    with torch.no_grad(), nm.trace(PROMPTS[0]) as tracer:
        our_resid = nm.blocks[-1].hook_resid_post.output.save()  # inside the block: reached first
        our_hidden = nm.blocks[-1].output.save()
        our_logits = tracer.result.save()
    torch.testing.assert_close(our_hidden, hidden(hf_hidden), rtol=0, atol=ATOL)
    torch.testing.assert_close(our_resid, our_hidden, rtol=0, atol=0)
    torch.testing.assert_close(our_logits, hf_logits, rtol=0, atol=ATOL)


def test_edit_zero_the_last_mlp(pair):
    """Setting activations: zero the last MLP's output in place, then read the logits."""
    lm, nm = pair
    with torch.no_grad(), lm.trace(PROMPTS[0]) as tracer:
        lm.transformer.h[-1].mlp.output[:] = 0
        hf_logits = tracer.result.logits.save()
    with torch.no_grad(), nm.trace(PROMPTS[0]) as tracer:
        nm.blocks[-1].hook_mlp_out.output[:] = 0
        our_logits = tracer.result.save()
    torch.testing.assert_close(our_logits, hf_logits, rtol=0, atol=ATOL)
    assert not torch.allclose(our_logits, nm._module(PROMPTS[0]), atol=1e-3)


def test_edit_by_assignment_and_save_before_after(pair):
    lm, nm = pair
    with torch.no_grad(), lm.trace(PROMPTS[1]) as tracer:
        before = hidden(lm.transformer.h[0].output).clone().save()
        lm.transformer.h[0].output = before * 0.5 + 1.0
        hf_logits = tracer.result.logits.save()
    with torch.no_grad(), nm.trace(PROMPTS[1]) as tracer:
        ours_before = nm.blocks[0].output.clone().save()
        nm.blocks[0].output = ours_before * 0.5 + 1.0
        our_logits = tracer.result.save()
    torch.testing.assert_close(ours_before, before, rtol=0, atol=ATOL)
    torch.testing.assert_close(our_logits, hf_logits, rtol=0, atol=ATOL)


def test_batched_invokes_left_padded(pair):
    """Two prompts of different lengths in one batch: each invoke sees its own (left-padded) rows."""
    lm, nm = pair
    with torch.no_grad(), lm.trace() as tracer:
        with tracer.invoke(PROMPTS[0]):
            hf_a = lm.lm_head.output[:, -1].save()
        with tracer.invoke(PROMPTS[1]):
            lm.transformer.h[0].mlp.output[:] = 0
            hf_b = lm.lm_head.output[:, -1].save()
    with torch.no_grad(), nm.trace() as tracer:
        with tracer.invoke(PROMPTS[0]):
            our_a = nm.unembed.output[:, -1].save()
        with tracer.invoke(PROMPTS[1]):
            nm.blocks[0].hook_mlp_out.output[:] = 0
            our_b = nm.unembed.output[:, -1].save()
    torch.testing.assert_close(our_a, hf_a, rtol=0, atol=ATOL)
    torch.testing.assert_close(our_b, hf_b, rtol=0, atol=ATOL)
    # and each invoke alone, unpadded, gives the same last-position logits
    torch.testing.assert_close(our_a, nm._module(PROMPTS[0])[:, -1], rtol=0, atol=ATOL)


def test_cross_prompt_barrier(pair):
    """Patch the embeddings of one prompt into another of the same length, across invokes."""
    lm, nm = pair
    source, target = "The capital of France is", "The capital of Italy is"
    assert len(lm.tokenizer(source)["input_ids"]) == len(lm.tokenizer(target)["input_ids"])
    with torch.no_grad(), lm.trace() as tracer:
        barrier = tracer.barrier(2)
        with tracer.invoke(source):
            embeddings = lm.transformer.wte.output
            barrier()
        with tracer.invoke(target):
            barrier()
            lm.transformer.wte.output = embeddings
            hf_logits = lm.lm_head.output.save()
    with torch.no_grad(), nm.trace() as tracer:
        barrier = tracer.barrier(2)
        with tracer.invoke(source):
            embeddings = nm.embed.output
            barrier()
        with tracer.invoke(target):
            barrier()
            nm.embed.output = embeddings
            our_logits = nm.unembed.output.save()
    torch.testing.assert_close(our_logits, hf_logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(our_logits, nm._module(source), rtol=0, atol=ATOL)


def test_logit_lens(pair):
    """Each layer's residual through the final norm and the unembedding, called ad hoc inside the trace."""
    lm, nm = pair
    n_layers = nm._module.cfg.n_layers
    with torch.no_grad(), lm.trace(PROMPTS[0]):
        hf_probs = nnsight.save([])
        for layer in lm.transformer.h:
            hf_probs.append(lm.lm_head(lm.transformer.ln_f(hidden(layer.output))).softmax(-1))
    with torch.no_grad(), nm.trace(PROMPTS[0]):
        our_probs = nnsight.save([])
        for layer in nm.blocks:
            our_probs.append(nm.unembed(nm.ln_final(layer.output)).softmax(-1))
    assert len(our_probs) == len(hf_probs) == n_layers
    for ours, theirs in zip(our_probs, hf_probs, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)


def test_generate_saves_every_step(pair):
    lm, nm = pair
    # an open loop (`tracer.all()`) ends the block it is in: the ids are read in a second invoke
    with torch.no_grad(), lm.generate(max_new_tokens=3) as tracer:
        with tracer.invoke(PROMPTS[0]):
            hf_states = nnsight.save([])
            for _ in tracer.all():
                hf_states.append(hidden(lm.transformer.h[-1].output))
        with tracer.invoke():
            hf_ids = tracer.result.save()
    with torch.no_grad(), nm.generate(max_new_tokens=3) as tracer:
        with tracer.invoke(PROMPTS[0]):
            our_states = nnsight.save([])
            for _ in tracer.all():
                our_states.append(nm.blocks[-1].output)
        with tracer.invoke():
            our_ids = tracer.result.save()
    assert len(our_states) == len(hf_states) == 3
    assert our_ids.tolist() == hf_ids.tolist()
    assert [s.shape[1] for s in our_states] == [s.shape[1] for s in hf_states]  # prefill, then one token a step
    for ours, theirs in zip(our_states, hf_states, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)


def test_generate_per_step_intervention_and_streamer(pair):
    """Intervene on step 1 only (`tracer.iter[1]`); read each step's tokens from `generator.streamer`."""
    lm, nm = pair

    with torch.no_grad(), lm.generate(PROMPTS[1], max_new_tokens=4) as tracer:
        hf_tokens = nnsight.save([])
        for step in tracer.iter[:4]:
            hf_tokens.append(lm.generator.streamer.output)  # put before the step's forward
            if step == 1:
                lm.transformer.h[-1].output = hidden(lm.transformer.h[-1].output) * -3.0
        hf_ids = tracer.result.save()
    with torch.no_grad(), nm.generate(PROMPTS[1], max_new_tokens=4) as tracer:
        our_tokens = nnsight.save([])
        for step in tracer.iter[:4]:
            our_tokens.append(nm.generator.streamer.output)  # put before the step's forward
            if step == 1:
                nm.blocks[-1].output = nm.blocks[-1].output * -3.0
        our_ids = tracer.result.save()
    assert our_ids.tolist() == hf_ids.tolist()
    assert [t.tolist() for t in our_tokens] == [t.tolist() for t in hf_tokens]
    plain = nm._module.generate(PROMPTS[1], max_new_tokens=4, do_sample=False, return_type="tokens", verbose=False)
    assert plain.tolist() != our_ids.tolist(), "the step-1 edit changed no token: pick a stronger edit"


def test_generate_batched_invokes(pair):
    """Two prompts generated together (left-padded), one of them edited at every step."""
    lm, nm = pair
    with torch.no_grad(), lm.generate(max_new_tokens=3) as tracer:
        with tracer.invoke(PROMPTS[0]):
            hf_ids = tracer.result.save()
        with tracer.invoke(PROMPTS[1]):
            for _ in tracer.all():
                lm.transformer.ln_f.output = lm.transformer.ln_f.output.flip(-1)
    with torch.no_grad(), nm.generate(max_new_tokens=3) as tracer:
        with tracer.invoke(PROMPTS[0]):
            our_ids = tracer.result.save()
        with tracer.invoke(PROMPTS[1]):
            for _ in tracer.all():
                nm.ln_final.output = nm.ln_final.output.flip(-1)
    assert our_ids.tolist() == hf_ids.tolist()


def test_arena_attention_patterns_queries_and_last_logits(pair):
    """The ARENA introduction's reads: attention patterns, query vectors, the last position's logits."""
    lm, nm = pair
    with torch.no_grad(), lm.trace(PROMPTS[0]):
        hf_query_key_value = lm.transformer.h[0].attn.c_attn.output.save()  # [batch, pos, 3 * d_model]
        hf_pattern = lm.transformer.h[0].attn.output[1].save()  # eager attention returns its weights
        hf_last = lm.lm_head.output[0, -1].save()
    with torch.no_grad(), nm.trace(PROMPTS[0]):
        q = nm.blocks[0].attn.hook_q.output.save()  # [batch, pos, head, d_head]
        pattern = nm.blocks[0].attn.hook_pattern.output.save()  # [batch, head, query, key]
        last = nm.unembed.output[0, -1].save()
    d_model = nm._module.cfg.d_model
    torch.testing.assert_close(q.flatten(-2), hf_query_key_value[..., :d_model], rtol=0, atol=ATOL)
    torch.testing.assert_close(pattern, hf_pattern, rtol=0, atol=ATOL)
    torch.testing.assert_close(last, hf_last, rtol=0, atol=ATOL)


def test_generate_noise_edit_and_cross_prompt_embeddings(pair):
    """The early nnsight examples: add noise to the last hidden state while generating; give a
    placeholder prompt another prompt's embeddings for every generated token (a barrier per step)."""
    lm, nm = pair
    noise = torch.randn(1, 64, generator=torch.Generator().manual_seed(1)) * 5.0

    with torch.no_grad(), lm.generate(PROMPTS[0], max_new_tokens=1) as tracer:
        lm.transformer.h[-1].output = hidden(lm.transformer.h[-1].output) + noise
        hf_noised = tracer.result.save()
    with torch.no_grad(), nm.generate(PROMPTS[0], max_new_tokens=1) as tracer:
        nm.blocks[-1].output = nm.blocks[-1].output + noise
        noised = tracer.result.save()
    assert noised.tolist() == hf_noised.tolist()

    source, target = "The capital of France is", "The capital of Italy is"
    with torch.no_grad(), lm.generate(max_new_tokens=3) as tracer:
        barrier = tracer.barrier(2)
        with tracer.invoke(source):
            embeddings = lm.transformer.wte.output
            barrier()
        with tracer.invoke(target):
            barrier()
            lm.transformer.wte.output = embeddings
        with tracer.invoke():
            hf_ids = tracer.result.save()
    with torch.no_grad(), nm.generate(max_new_tokens=3) as tracer:
        barrier = tracer.barrier(2)
        with tracer.invoke(source):
            embeddings = nm.embed.output
            barrier()
        with tracer.invoke(target):
            barrier()
            nm.embed.output = embeddings
        with tracer.invoke():
            ids = tracer.result.save()
    assert ids.tolist() == hf_ids.tolist()
    assert ids[1, -3:].tolist() == ids[0, -3:].tolist()  # the target continues as the source does
