"""`GenerationOptions`: checked once, the same call as the keywords, disagreeing mixes refused, TL signature kept."""

import dataclasses
import inspect

import pytest
import torch

from hooked import HookedTransformer
from hooked.core.errors import InputError, InputTypeError
from hooked.generation import GenerationOptions, generate_stream
from hooked.generation import loop as loop_module
from hooked.generation import options as options_module
from tests.helpers import hooked_from, make_tokenizer, tiny_gpt2

#: `generate`'s parameters before GenerationOptions existed: (name, kind, default). TransformerLens's
#: names and positional order for the leading ones; only `options` (keyword-only, last) may be added.
GENERATE_SIGNATURE = [
    ("model", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
    ("input", "POSITIONAL_OR_KEYWORD", ""),
    ("max_new_tokens", "POSITIONAL_OR_KEYWORD", 10),
    ("stop_at_eos", "POSITIONAL_OR_KEYWORD", True),
    ("eos_token_id", "POSITIONAL_OR_KEYWORD", None),
    ("do_sample", "POSITIONAL_OR_KEYWORD", True),
    ("top_k", "POSITIONAL_OR_KEYWORD", None),
    ("top_p", "POSITIONAL_OR_KEYWORD", None),
    ("temperature", "POSITIONAL_OR_KEYWORD", 1.0),
    ("freq_penalty", "POSITIONAL_OR_KEYWORD", 0.0),
    ("use_past_kv_cache", "POSITIONAL_OR_KEYWORD", True),
    ("prepend_bos", "POSITIONAL_OR_KEYWORD", None),
    ("padding_side", "POSITIONAL_OR_KEYWORD", None),
    ("return_type", "POSITIONAL_OR_KEYWORD", "input"),
    ("verbose", "POSITIONAL_OR_KEYWORD", True),
    ("repetition_penalty", "KEYWORD_ONLY", 1.0),
    ("attention_mask", "KEYWORD_ONLY", None),
    ("fwd_hooks", "KEYWORD_ONLY", ()),
    ("return_cache", "KEYWORD_ONLY", False),
    ("names_filter", "KEYWORD_ONLY", None),
    ("device", "KEYWORD_ONLY", None),
    ("output_logits", "KEYWORD_ONLY", False),
    ("generator", "KEYWORD_ONLY", None),
    ("seed", "KEYWORD_ONLY", None),
    ("cache_implementation", "KEYWORD_ONLY", None),
    ("compile", "KEYWORD_ONLY", None),
    ("static_options", "KEYWORD_ONLY", None),
]
_STREAM_HEAD = [p if p[0] != "verbose" else ("verbose", "POSITIONAL_OR_KEYWORD", False) for p in GENERATE_SIGNATURE]
STREAM_SIGNATURE = _STREAM_HEAD[:15] + [("max_tokens_per_yield", "KEYWORD_ONLY", 25)] + _STREAM_HEAD[15:]
OPTIONS_PARAMETER = ("options", "KEYWORD_ONLY", None)


def _signature(fn):
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(
    "fn, expected",
    [(HookedTransformer.generate, GENERATE_SIGNATURE), (generate_stream, STREAM_SIGNATURE)],
    ids=["generate", "generate_stream"],
)
def test_the_transformerlens_signature_is_unchanged(fn, expected):
    assert _signature(fn) == expected + [OPTIONS_PARAMETER]


def test_the_fields_are_the_keywords_but_the_prompt():
    names = [f.name for f in dataclasses.fields(GenerationOptions)]
    assert names == [p[0] for p in GENERATE_SIGNATURE if p[0] not in ("model", "input", "attention_mask")]
    defaults = GenerationOptions()
    for name, _, default in GENERATE_SIGNATURE[2:]:
        if name != "attention_mask":
            assert getattr(defaults, name) == (list(default) if name == "fwd_hooks" else default), name


@pytest.mark.unchecked  # wrong types on purpose: the library's own message is under test, not the shape checker's
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(max_new_tokens=-1), InputError, "max_new_tokens must be >= 0, got -1"),
        (dict(top_k=0), InputError, "top_k must be >= 1, got 0"),
        (dict(top_p=1.5), InputError, r"top_p must be a number in \(0, 1\], got 1.5"),
        (dict(seed="abc"), InputTypeError, r"seed must be an int, got str \('abc'\)"),
        (dict(eos_token_id=[]), InputError, "eos_token_id is an empty list"),
        (dict(eos_token_id="eos"), InputTypeError, r"eos_token_id must be an int or a list of ints, got 'eos'"),
        (dict(return_type="logits"), InputError, r"return_type must be one of .* got 'logits'"),
        (dict(fwd_hooks=("hook_embed", print)), InputTypeError, "one bare pair"),
        (dict(return_cache=True, names_filter=7), InputTypeError, r"names_filter must be None.* got int \(7\)"),
        (dict(cache_implementation="paged"), InputError, "cache_implementation must be None, 'dynamic' or 'static'"),
        (dict(compile=True), InputError, "compile=True compiles the static-cache decode step"),
        (
            dict(cache_implementation="static", use_past_kv_cache=False),
            InputError,
            "cache_implementation='static' is a KV cache: it needs use_past_kv_cache=True",
        ),
    ],
)
def test_options_are_checked_when_built_with_generates_messages(kwargs, error, match):
    with pytest.raises(error, match=match):
        GenerationOptions(**kwargs)


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        GenerationOptions().max_new_tokens = 3


# -- calls -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return hooked_from(tiny_gpt2(initializer_range=0.2), tokenizer=make_tokenizer())


PROMPT = "The quick brown fox"


@pytest.mark.parametrize(
    "kwargs",
    [dict(do_sample=False), dict(seed=3, top_k=20, temperature=0.8), dict(seed=5, use_past_kv_cache=False)],
    ids=["greedy", "seeded-sampling", "seeded-no-kv-cache"],
)
def test_options_give_the_same_tokens_as_the_keywords(model, kwargs):
    common = dict(max_new_tokens=6, stop_at_eos=False, return_type="tokens", verbose=False, **kwargs)
    by_keywords = model.generate(PROMPT, **common)
    by_options = model.generate(PROMPT, options=GenerationOptions(**common))
    torch.testing.assert_close(by_options, by_keywords, rtol=0, atol=0)
    tokens = model.to_tokens(PROMPT)  # token input: the stream yields token chunks
    streamed = list(generate_stream(model, tokens, options=GenerationOptions(**common), max_tokens_per_yield=4))
    torch.testing.assert_close(torch.cat(streamed, dim=1), by_keywords[:, -6:], rtol=0, atol=0)


def test_every_keyword_reaches_the_options(model, monkeypatch):
    seen = []

    def capture(model, input, attention_mask, options):
        seen.append((input, attention_mask, options))
        raise RuntimeError("captured")

    monkeypatch.setattr(loop_module, "_prepare", capture)
    hooks, generator, mask = (
        [("hook_embed", lambda x, hook: None)],
        torch.Generator(),
        torch.ones(1, 2, dtype=torch.long),
    )
    values = dict(
        max_new_tokens=3, stop_at_eos=False, eos_token_id=[1, 2], do_sample=False, top_k=4, top_p=0.5,
        temperature=0.7, freq_penalty=0.1, use_past_kv_cache=False, prepend_bos=True, padding_side="left",
        return_type="tokens", verbose=False, repetition_penalty=1.2, fwd_hooks=hooks, return_cache=True,
        names_filter=["hook_embed"], device="cpu", output_logits=True, generator=generator, seed=9,
        cache_implementation="dynamic", compile=False, static_options=None,
    )  # fmt: skip
    assert set(values) == {f.name for f in dataclasses.fields(GenerationOptions)}
    with pytest.raises(RuntimeError, match="captured"):
        model.generate(torch.tensor([[1, 2]]), attention_mask=mask, **values)
    _, got_mask, options = seen[0]
    assert got_mask is mask
    assert {name: getattr(options, name) for name in values} == values


def test_options_are_checked_once_per_build_not_per_call(model, monkeypatch):
    options = GenerationOptions(max_new_tokens=2, do_sample=False, verbose=False)
    calls = []
    monkeypatch.setattr(options_module, "check_generate_args", lambda *a: calls.append(a))
    for _ in range(2):
        model.generate(PROMPT, options=options)
    assert calls == []  # a generate call with options= never checks them again


@pytest.mark.parametrize("eos", [5000, [1, -2]])
def test_eos_ids_are_checked_against_the_models_vocabulary(model, eos):
    options = GenerationOptions(max_new_tokens=2, eos_token_id=eos, verbose=False)  # the vocabulary is the model's
    bad = 5000 if eos == 5000 else -2
    with pytest.raises(InputError, match=rf"eos_token_id {bad} is outside the vocabulary \[0, 1000\)"):
        model.generate(PROMPT, options=options)


def test_a_keyword_that_disagrees_with_options_is_refused(model):
    options = GenerationOptions(max_new_tokens=3, do_sample=False, verbose=False)
    with pytest.raises(InputError, match=r"max_new_tokens=5 \(options has 3\).*Pass each setting once"):
        model.generate(PROMPT, max_new_tokens=5, options=options)
    with pytest.raises(InputError, match=r"top_k=2 \(options has None\)"):
        next(generate_stream(model, PROMPT, top_k=2, options=options))


def test_keywords_at_their_default_or_agreeing_defer_to_options(model):
    options = GenerationOptions(max_new_tokens=3, do_sample=False, stop_at_eos=False, verbose=False)
    expected = model.generate(PROMPT, 3, False, do_sample=False, verbose=False, return_type="tokens")
    same = model.generate(PROMPT, max_new_tokens=3, options=dataclasses.replace(options, return_type="tokens"))
    torch.testing.assert_close(same, expected, rtol=0, atol=0)
    assert model.generate(PROMPT, options=options) == model.tokenizer.decode(expected[0], skip_special_tokens=True)


@pytest.mark.unchecked  # wrong types on purpose: the library's own message is under test, not the shape checker's
def test_options_of_another_type_are_refused(model):
    with pytest.raises(InputTypeError, match="options must be a GenerationOptions, got dict"):
        model.generate(PROMPT, options={"max_new_tokens": 2})
