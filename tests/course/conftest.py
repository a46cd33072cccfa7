"""Fixtures of the course-code tests: the TransformerLens names a course imports, by the alias or from `hooked`,
and the tiny models standing in for the course's models (same shapes, random weights, no download).

`lens` is parametrised over the two ways a student gets the names: `alias` runs
`hooked.compat.alias_transformer_lens()` and then imports them from `transformer_lens` exactly as the course
writes it; `hooked` imports them from `hooked`'s own modules. Every course test runs once through each.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from tests.tiny_models import tiny_gpt2

#: the names a course imports from TransformerLens
NAMES = (
    "HookedTransformer", "HookedTransformerConfig", "ActivationCache", "FactoredMatrix", "HookPoint",
    "HookedRootModule", "utils", "patching",
)  # fmt: skip


def _through_alias() -> SimpleNamespace:
    from hooked.compat import alias_transformer_lens

    alias_transformer_lens()
    import transformer_lens  # (the course's first import)
    from transformer_lens import (
        ActivationCache,
        FactoredMatrix,
        HookedTransformer,
        HookedTransformerConfig,
        patching,
        utils,
    )
    from transformer_lens.hook_points import HookedRootModule, HookPoint

    assert transformer_lens.HookedTransformer is HookedTransformer
    return SimpleNamespace(
        HookedTransformer=HookedTransformer, HookedTransformerConfig=HookedTransformerConfig,
        ActivationCache=ActivationCache, FactoredMatrix=FactoredMatrix, HookPoint=HookPoint,
        HookedRootModule=HookedRootModule, utils=utils, patching=patching,
    )  # fmt: skip


def _through_hooked() -> SimpleNamespace:
    import hooked.utils as utils
    from hooked import (
        ActivationCache,
        FactoredMatrix,
        HookedRootModule,
        HookedTransformer,
        HookedTransformerConfig,
        HookPoint,
    )
    from hooked.analysis import patching

    return SimpleNamespace(
        HookedTransformer=HookedTransformer, HookedTransformerConfig=HookedTransformerConfig,
        ActivationCache=ActivationCache, FactoredMatrix=FactoredMatrix, HookPoint=HookPoint,
        HookedRootModule=HookedRootModule, utils=utils, patching=patching,
    )  # fmt: skip


@pytest.fixture(params=["alias", "hooked"])
def lens(request):
    """The course's `transformer_lens` names, through the alias or from `hooked` directly."""
    was_aliased = "transformer_lens" in sys.modules
    names = _through_alias() if request.param == "alias" else _through_hooked()
    assert set(vars(names)) == set(NAMES)
    yield names
    if request.param == "alias" and not was_aliased:
        from hooked.compat.aliasing import unalias_transformer_lens

        unalias_transformer_lens()


# -- a tokenizer in which the course's names and words are single tokens -------------------------------
NAMES_IN_PROMPTS = [" John", " Mary", " Tom", " James", " Dan", " Sid", " Martin", " Amy"]
CORPUS = [
    "When John and Mary went to the shops, John gave the bag to Mary.",
    "When Tom and James went to the park, James gave the ball to Tom.",
    "When Dan and Sid went to the shops, Sid gave an apple to Dan.",
    "After Martin and Amy went to the park, Amy gave a drink to Martin.",
    "After John and Mary went to the store, Mary gave a bottle of milk to John.",
    "The quick brown fox jumps over the lazy dog.",
    "Natural language processing tasks are typically approached with supervised learning.",
    "I love cats and dogs, and the cat sat on the mat.",
]


@pytest.fixture(scope="session")
def course_tokenizer():
    """A GPT-2-like byte-level BPE (`<|endoftext|>` is BOS and EOS) trained so that every name and word of the
    course's prompts is one token, as in GPT-2's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    assert all(len(tokenizer.encode(name)) == 1 for name in NAMES_IN_PROMPTS)
    return tokenizer


@pytest.fixture(scope="session")
def gpt2_hf(course_tokenizer):
    """GPT-2 small's architecture at 2 layers x 4 heads x d_model 64 (random, `tests/tiny_models.py`), with
    query and key weights 10x HF's initial scale, so that attention is far from uniform and patching a head's
    pattern moves the logits well above float32 rounding; and its final LayerNorm bias zero, so that folding it
    leaves `b_U` zero, as the IOI exercise's equality of the direct logit attribution and the logit difference
    assumes."""
    hf = tiny_gpt2(vocab_size=len(course_tokenizer), bos_token_id=0, eos_token_id=0)
    d_model = hf.config.n_embd
    with torch.no_grad():
        for block in hf.transformer.h:
            block.attn.c_attn.weight[:, : 2 * d_model] *= 10  # [d_model, 3 d_model]: the q and k columns
        hf.transformer.ln_f.bias.zero_()
    return hf
