"""`LoadOptions`: `from_pretrained`'s keywords in one object, checked once with today's messages; TL signature kept."""

import dataclasses
import inspect

import pytest
import torch

import hooked.loading
from hooked import HookedTransformer
from hooked.core.errors import InputError, UnsafeCheckpointError
from hooked.loading import load_pretrained
from hooked.loading.options import LoadOptions
from tests.helpers import NO_PROCESSING, make_tokenizer, tiny_gpt2

_EMPTY = inspect.Parameter.empty
#: `from_pretrained`'s parameters before LoadOptions existed: TransformerLens's names, order and defaults.
FROM_PRETRAINED_SIGNATURE = [
    ("model_name", "POSITIONAL_OR_KEYWORD", _EMPTY),
    ("fold_ln", "POSITIONAL_OR_KEYWORD", True),
    ("center_writing_weights", "POSITIONAL_OR_KEYWORD", True),
    ("center_unembed", "POSITIONAL_OR_KEYWORD", True),
    ("refactor_factored_attn_matrices", "POSITIONAL_OR_KEYWORD", False),
    ("checkpoint_index", "POSITIONAL_OR_KEYWORD", None),
    ("checkpoint_value", "POSITIONAL_OR_KEYWORD", None),
    ("checkpoint_label", "POSITIONAL_OR_KEYWORD", None),
    ("hf_model", "POSITIONAL_OR_KEYWORD", None),
    ("device", "POSITIONAL_OR_KEYWORD", None),
    ("n_devices", "POSITIONAL_OR_KEYWORD", 1),
    ("tokenizer", "POSITIONAL_OR_KEYWORD", None),
    ("move_to_device", "POSITIONAL_OR_KEYWORD", True),
    ("fold_value_biases", "POSITIONAL_OR_KEYWORD", True),
    ("default_prepend_bos", "POSITIONAL_OR_KEYWORD", None),
    ("default_padding_side", "POSITIONAL_OR_KEYWORD", "right"),
    ("dtype", "POSITIONAL_OR_KEYWORD", "float32"),
    ("first_n_layers", "POSITIONAL_OR_KEYWORD", None),
    ("n_ctx", "POSITIONAL_OR_KEYWORD", None),
    ("device_map", "POSITIONAL_OR_KEYWORD", None),
    ("max_memory", "POSITIONAL_OR_KEYWORD", None),
    ("offload_folder", "POSITIONAL_OR_KEYWORD", None),
    ("from_pretrained_kwargs", "VAR_KEYWORD", _EMPTY),
]


def test_the_transformerlens_signature_is_unchanged():
    got = [
        (p.name, p.kind.name, p.default)
        for p in inspect.signature(HookedTransformer.from_pretrained).parameters.values()
    ]
    assert got == FROM_PRETRAINED_SIGNATURE


def test_the_fields_start_with_the_named_parameters_and_their_defaults():
    named = FROM_PRETRAINED_SIGNATURE[1:-1]
    fields = dataclasses.fields(LoadOptions)
    assert [(f.name, f.default) for f in fields[: len(named)]] == [(name, default) for name, _, default in named]
    extra = [f.name for f in fields[len(named) :]]
    assert extra == list(hooked.loading.validation.HF_LOADING_ARGS[:4]) + [
        "trust_remote_code", "torch_dtype", "pipeline", "micro_batches", "timeout_s",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(trust_remote_code=True), UnsafeCheckpointError, "trust_remote_code=True is refused"),
        (
            dict(dtype="float16", torch_dtype=torch.float64),
            InputError,
            r"dtype='float16' and torch_dtype=torch.float64 disagree: pass only dtype=",
        ),
        (dict(micro_batches=2), TypeError, "micro_batches= and timeout_s= configure pipeline loading"),
        (dict(pipeline=True, device="cpu"), InputError, "pipeline=True places each stage on its rank's device"),
    ],
)
def test_options_are_checked_when_built_with_from_pretrained_messages(kwargs, error, match):
    with pytest.raises(error, match=match):
        LoadOptions(**kwargs)
    with pytest.raises(error, match=match):  # from_pretrained refuses them before reading anything
        HookedTransformer.from_pretrained("no-such-model", **kwargs)


def test_a_bad_dtype_is_refused_as_before():
    match = r"dtype='float33' is not a dtype hooked can load into\. Did you mean float32"
    with pytest.raises(InputError, match=match):
        LoadOptions(dtype="float33")
    with pytest.raises(InputError, match=match):
        HookedTransformer.from_pretrained("no-such-model", dtype="float33")


def test_an_unknown_keyword_names_the_close_ones():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'fold_LN'\. Did you mean fold_ln"):
        LoadOptions.from_keywords(fold_LN=False)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'revison'\. Did you mean revision"):
        HookedTransformer.from_pretrained("no-such-model", revison="main")


def test_torch_dtype_becomes_dtype():
    options = LoadOptions(torch_dtype="bfloat16")
    assert (options.dtype, options.torch_dtype) == (torch.bfloat16, None)
    assert dataclasses.replace(options, fold_ln=False).dtype == torch.bfloat16  # re-checked, still one dtype


def test_hub_arguments_are_passed_on_only_when_set():
    assert LoadOptions().hub_kwargs == {}
    assert LoadOptions(revision="main", local_files_only=False).hub_kwargs == {
        "revision": "main",
        "local_files_only": False,
    }


def test_every_keyword_reaches_the_options(monkeypatch):
    seen = []
    monkeypatch.setattr(hooked.loading, "load_pretrained", lambda cls, name, options: seen.append((cls, name, options)))
    hf, tok = object(), object()
    values = dict(
        fold_ln=False, center_writing_weights=False, center_unembed=False, refactor_factored_attn_matrices=True,
        checkpoint_index=3, checkpoint_value=None, checkpoint_label=None, hf_model=hf, device="cpu", n_devices=1,
        tokenizer=tok, move_to_device=False, fold_value_biases=False, default_prepend_bos=False,
        default_padding_side="left", dtype="bfloat16", first_n_layers=1, n_ctx=64, device_map=None,
        max_memory=None, offload_folder="/tmp/x", revision="main", cache_dir="/tmp/c",
    )  # fmt: skip
    HookedTransformer.from_pretrained("some-model", **values)
    cls, name, options = seen[0]
    assert (cls, name) == (HookedTransformer, "some-model")
    assert {k: getattr(options, k) for k in values} == values
    positional = [v for k, v in values.items() if k in dict.fromkeys(p[0] for p in FROM_PRETRAINED_SIGNATURE)]
    HookedTransformer.from_pretrained("some-model", *positional)  # TL's positional order
    assert seen[1][2] == dataclasses.replace(options, revision=None, cache_dir=None)


def test_no_processing_still_turns_every_step_off(monkeypatch):
    seen = []
    monkeypatch.setattr(hooked.loading, "load_pretrained", lambda cls, name, options: seen.append(options))
    HookedTransformer.from_pretrained_no_processing("some-model", n_ctx=32)
    assert seen[0].processing == dict.fromkeys(seen[0].processing, False)
    assert (seen[0].dtype, seen[0].n_ctx) == (torch.float32, 32)


def test_pipeline_loads_through_the_registered_loader_with_the_options(monkeypatch):
    seen = []
    monkeypatch.setitem(
        HookedTransformer._placement_loaders, "pipeline", lambda name, *, options: seen.append((name, options))
    )
    HookedTransformer.from_pretrained("some-model", pipeline=True, micro_batches=2, timeout_s=30, fold_ln=False)
    name, options = seen[0]
    assert (name, options.pipeline, options.micro_batches, options.timeout_s, options.fold_ln) == (
        "some-model", True, 2, 30, False,
    )  # fmt: skip


def test_from_pretrained_pipeline_refuses_options_with_keywords():
    from hooked.scale.pipeline import from_pretrained_pipeline

    with pytest.raises(InputError, match="got options= and keywords"):
        from_pretrained_pipeline("some-model", options=LoadOptions(pipeline=True), fold_ln=False)


def test_load_pretrained_with_options_equals_from_pretrained():
    hf, tok = tiny_gpt2(), make_tokenizer()
    by_keywords = HookedTransformer.from_pretrained("gpt2", hf_model=hf, tokenizer=tok, **NO_PROCESSING)
    options = LoadOptions(hf_model=hf, tokenizer=tok, **NO_PROCESSING)
    by_options = load_pretrained(HookedTransformer, "gpt2", options)
    assert by_options.cfg == by_keywords.cfg
    expected = by_keywords.state_dict()
    for name, tensor in by_options.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
