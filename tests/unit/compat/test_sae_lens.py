"""SAELens (installed with --no-deps: `transformer_lens` is hooked's alias) runs on a hooked model."""

from __future__ import annotations

import random

import pytest
import torch

from hooked import HookedTransformerConfig
from hooked.compat import alias_transformer_lens

alias_transformer_lens()
import sae_lens  # noqa: E402  (installed with --no-deps by the Makefile; needs the alias first)

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture
def model(tokenizer):
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, d_head=8, n_ctx=32, act_fn="gelu_new", seed=0, device="cpu")
    return sae_lens.HookedSAETransformer(cfg, tokenizer=tokenizer)


def test_sae_lens_sees_transformer_lens_2(model):
    from sae_lens.analysis.compat import has_transformer_bridge

    assert not has_transformer_bridge()
    assert isinstance(model, sae_lens.HookedSAETransformer)


def test_run_with_saes_and_run_with_cache_with_saes(model):
    sae = sae_lens.StandardSAE(
        sae_lens.StandardSAEConfig(d_in=32, d_sae=64, metadata=sae_lens.saes.sae.SAEMetadata(hook_name=HOOK))
    )
    tokens = model.to_tokens(["The quick brown fox", "Paris is in France"])
    clean, clean_cache = model.run_with_cache(tokens)
    logits, cache = model.run_with_cache_with_saes(tokens, saes=[sae])
    recons = cache[f"{HOOK}.hook_sae_recons"]
    torch.testing.assert_close(recons, sae(clean_cache[HOOK]))
    # downstream of the SAE, the model runs on the reconstruction: splice it in by hand and compare
    spliced = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda x, hook: recons)])
    torch.testing.assert_close(logits, spliced)
    torch.testing.assert_close(model.run_with_saes(tokens, saes=[sae]), logits)
    assert model.acts_to_saes == {}  # the SAEs are detached again
    torch.testing.assert_close(model(tokens), clean)


def test_sae_with_error_term_leaves_the_model_unchanged_and_transcoders_run(model):
    tokens = model.to_tokens(["The quick brown fox", "Paris is in France"])
    clean = model(tokens)
    metadata = sae_lens.saes.sae.SAEMetadata(hook_name=HOOK)
    model.add_sae(
        sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=32, d_sae=64, metadata=metadata)), use_error_term=True
    )
    torch.testing.assert_close(model(tokens), clean, atol=1e-5, rtol=1e-5)
    model.reset_saes()
    transcoder = sae_lens.Transcoder(
        sae_lens.TranscoderConfig(
            d_in=32,
            d_sae=64,
            d_out=32,
            apply_b_dec_to_input=False,
            metadata=sae_lens.saes.sae.SAEMetadata(
                hook_name="blocks.0.mlp.hook_in", hook_name_out="blocks.0.hook_mlp_out"
            ),
        )
    )
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.mlp.hook_in")  # SAELens's added MLP hook
    mlp_out = transcoder(cache["blocks.0.mlp.hook_in"])
    spliced = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: mlp_out)])
    torch.testing.assert_close(model.run_with_saes(tokens, saes=[transcoder]), spliced, atol=1e-5, rtol=1e-5)


def test_training_loop_trains_an_sae_on_hooked_activations(model):
    from datasets import Dataset

    rng = random.Random(0)
    dataset = Dataset.from_list([{"tokens": [rng.randrange(5, 290) for _ in range(16)]} for _ in range(32)])
    sae_cfg = sae_lens.StandardTrainingSAEConfig(d_in=32, d_sae=64, l1_coefficient=1.0)
    sae = sae_lens.StandardTrainingSAE(sae_cfg)
    before = sae.W_enc.detach().clone()
    runner_cfg = sae_lens.LanguageModelSAERunnerConfig(
        sae=sae_cfg,
        model_name="hooked-tiny",
        hook_name=HOOK,
        dataset_path="in-memory",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=16,
        n_batches_in_buffer=2,
        store_batch_size_prompts=4,
        train_batch_size_tokens=32,
        training_tokens=32 * 4,
        logger=sae_lens.LoggingConfig(log_to_wandb=False),
        output_path=None,
        checkpoint_path=None,
        verbose=False,
        n_batches_for_norm_estimate=2,
    )
    runner = sae_lens.LanguageModelSAETrainingRunner(
        runner_cfg, override_dataset=dataset, override_model=model, override_sae=sae
    )
    trained = runner.run()
    assert trained is sae
    assert not torch.equal(trained.W_enc.detach(), before)
    acts = model.run_with_cache(torch.tensor(dataset["tokens"][:2]), names_filter=HOOK)[1][HOOK]
    assert torch.isfinite(trained(acts)).all()
