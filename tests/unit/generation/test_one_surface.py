"""`GenerationOptions` is the one surface of generation (issue #41): every generate's parameters and the
wire schema's partition are derived from its fields, and the checks below catch a planted extra one."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc

import pytest
import torch

from hooked import HookedTransformer
from hooked.generation import loop
from hooked.generation.options import OPTION_NAMES, POSITIONAL_OPTIONS, GenerationOptions
from hooked.models.vision_language import HookedVisionLanguageModel
from hooked.remote.client import RemoteModel
from hooked.serve import schema
from tests.tiny_models import hooked_from, make_tokenizer, tiny_gpt2

#: What a generate takes besides the options: its receiver, the prompt and its mask, and `options=`.
NOT_OPTIONS = ("input", "attention_mask", "options")

#: Each generate-like method, with the parameters of its own (not options, not the prompt).
SURFACES = {
    "generate": (loop.generate, ()),
    "generate_stream": (loop.generate_stream, ("max_tokens_per_yield",)),
    "HookedTransformer.generate": (HookedTransformer.generate, ()),
    "RemoteModel.generate": (RemoteModel.generate, ("on_token",)),
    "RemoteModel.generate_stream": (RemoteModel.generate_stream, ("max_tokens_per_yield",)),
    "vision-language generate": (
        HookedVisionLanguageModel.generate,
        ("pixel_values", "image_sizes", "batch_num_images", "image_grid_thw", "images"),
    ),
    "vision-language generate_stream": (HookedVisionLanguageModel.generate_stream, ("max_tokens_per_yield",)),
}


def surface_problems(signature: inspect.Signature, own: tuple[str, ...]) -> list[str]:
    """How `signature` strays from TransformerLens's, built from `GenerationOptions` (empty: it does not)."""
    names = list(signature.parameters)[1:]  # less the receiver (model or self)
    problems = [
        f"{n!r} is neither an option nor the prompt's" for n in names if n not in (*OPTION_NAMES, *NOT_OPTIONS, *own)
    ]
    problems += [f"option {n!r} is missing" for n in OPTION_NAMES if n not in names]
    problems += [f"{n!r} appears {names.count(n)} times" for n in set(names) if names.count(n) > 1]
    positional = [p.name for p in signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD][1:]
    if positional != ["input", *POSITIONAL_OPTIONS]:
        problems.append(f"positional parameters {positional} are not TransformerLens's")
    defaults = {n: p.default for n, p in signature.parameters.items()}
    fields = {f.name: f.default for f in dataclasses.fields(GenerationOptions)}
    problems += [
        f"{n!r} defaults to {defaults[n]!r}, GenerationOptions to {fields[n]!r}"
        for n in OPTION_NAMES
        if n in defaults and n != "verbose" and defaults[n] != fields[n]
    ]
    return problems


def partition_problems(fields: tuple[str, ...], *places: tuple[str, ...]) -> list[str]:
    """How the wire's places (sent, refused remotely, kept by the client) fail to hold each field exactly once."""
    placed = [name for place in places for name in place]
    problems = [f"field {n!r} is placed nowhere" for n in fields if n not in placed]
    problems += [f"{n!r} is placed {placed.count(n)} times" for n in set(placed) if placed.count(n) > 1]
    return problems + [f"{n!r} is not a field" for n in set(placed) if n not in fields]


# -- every generate takes the signature built from GenerationOptions ----------------------------
@pytest.mark.parametrize("name", list(SURFACES))
def test_every_generate_takes_the_signature_built_from_the_options(name):
    fn, own = SURFACES[name]
    assert surface_problems(inspect.signature(fn), own) == []
    code = inspect.unwrap(fn).__code__  # the def itself restates nothing: (receiver, *args, **kwargs)
    assert (code.co_argcount, code.co_kwonlyargcount) == (1, 0), code.co_varnames


def test_a_planted_keyword_or_a_missing_option_is_caught():
    signature = inspect.signature(loop.generate)
    parameters = list(signature.parameters.values())
    planted = inspect.Parameter("max_tokens", inspect.Parameter.KEYWORD_ONLY, default=None)
    assert surface_problems(signature.replace(parameters=[*parameters[:-1], planted, parameters[-1]]), ()) == [
        "'max_tokens' is neither an option nor the prompt's"
    ]
    without_seed = [p for p in parameters if p.name != "seed"]
    assert surface_problems(signature.replace(parameters=without_seed), ()) == ["option 'seed' is missing"]
    moved = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.name == "verbose" else p for p in parameters]
    moved.sort(key=lambda p: p.kind)
    assert surface_problems(signature.replace(parameters=moved), ()) != []  # `verbose` no longer positional
    redefaulted = [p.replace(default=5) if p.name == "max_new_tokens" else p for p in parameters]
    assert surface_problems(signature.replace(parameters=redefaulted), ()) == [
        "'max_new_tokens' defaults to 5, GenerationOptions to 10"
    ]


def test_help_shows_every_parameter_and_the_options_documentation():
    text = pydoc.render_doc(HookedTransformer.generate, renderer=pydoc.plaintext)
    signature_line = next(line for line in text.splitlines() if line.startswith("generate("))
    assert all(f"{name}:" in signature_line for name in (*OPTION_NAMES, *NOT_OPTIONS)), signature_line
    options_doc = text[text.index("Options (the fields of `GenerationOptions`") :]
    assert all(f"\n{name}: " in options_doc.replace("    ", "") for name in OPTION_NAMES)


# -- the wire: each field sent, refused remotely or kept by the client, exactly once ---------------
def test_the_wire_partition_places_every_field_once():
    places = (schema.GENERATION_FIELDS, schema.LOCAL_ONLY_GENERATION, schema.CLIENT_SIDE_GENERATION)
    assert partition_problems(OPTION_NAMES, *places) == []
    assert schema.GENERATE.field_names == {"op", "hooks", "names_filter", *schema.GENERATION_FIELDS}


def test_a_planted_field_or_a_doubly_placed_one_is_caught():
    places = (schema.GENERATION_FIELDS, schema.LOCAL_ONLY_GENERATION, schema.CLIENT_SIDE_GENERATION)
    assert partition_problems((*OPTION_NAMES, "beam_width"), *places) == ["field 'beam_width' is placed nowhere"]
    doubled = (schema.GENERATION_FIELDS, (*schema.LOCAL_ONLY_GENERATION, "seed"), schema.CLIENT_SIDE_GENERATION)
    assert partition_problems(OPTION_NAMES, *doubled) == ["'seed' is placed 2 times"]
    assert partition_problems(OPTION_NAMES, *places, ("max_tokens",)) == ["'max_tokens' is not a field"]


# -- calls: TransformerLens's positional order, mapped onto the options ----------------------------
@pytest.fixture(scope="module")
def model():
    return hooked_from(tiny_gpt2(initializer_range=0.2), tokenizer=make_tokenizer())


def test_positional_arguments_land_on_their_options(model):
    tokens = torch.tensor([[5, 6, 7]])
    # TransformerLens's order: input, max_new_tokens, stop_at_eos, eos_token_id, do_sample, top_k, top_p,
    # temperature, freq_penalty, use_past_kv_cache, prepend_bos, padding_side, return_type, verbose
    positional = model.generate(tokens, 4, False, None, False, None, None, 1.0, 0.0, False, None, None, "tokens", False)
    options = GenerationOptions(max_new_tokens=4, stop_at_eos=False, do_sample=False, use_past_kv_cache=False,
                                return_type="tokens", verbose=False)  # fmt: skip
    torch.testing.assert_close(positional, model.generate(tokens, options=options), rtol=0, atol=0)
    assert positional.shape == (1, 7)
    with pytest.raises(TypeError, match="too many positional arguments"):
        model.generate(tokens, 4, False, None, False, None, None, 1.0, 0.0, True, None, None, "tokens", False, 1.0)
