"""`HookedModel`, the base of the model classes: one `run_with_cache` and one `to` for all of them.

A model class states only what differs; `test_no_model_class_redefines_the_base` fails when one
defines `run_with_cache` or `to` again. The behaviour tests check, class by class, what the moved
code did before: `to` keeps `cfg.device` and `cfg.dtype` in step with the weights, and
`run_with_cache` returns an `ActivationCache` of the model, with the run's tokens and mask where
the class recorded them (`HookedTransformer`), or a plain dict with `return_cache_object=False`.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from hooked.analysis.activation_cache import ActivationCache
from hooked.models.hooked_audio_encoder import HookedAudioEncoder
from hooked.models.hooked_encoder import HookedEncoder
from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder
from hooked.models.hooked_model import HookedModel
from hooked.models.hooked_transformer import HookedTransformer
from hooked.models.next_sentence_prediction import BertNextSentencePrediction
from tests.tiny_models import tiny_hooked, tiny_hubert, tiny_vlm
from tests.unit.components.test_t5 import t5_cfg
from tests.unit.models.test_hooked_encoder import config as bert_cfg
from tests.unit.models.test_hooked_encoder import make_wordpiece_tokenizer

BASE_METHODS = ("run_with_cache", "to")
# every module that defines a model class (a subclass of HookedModel)
MODEL_MODULES = (
    "hooked.models.hooked_transformer",
    "hooked.models.hooked_encoder",
    "hooked.models.hooked_encoder_decoder",
    "hooked.models.hooked_audio_encoder",
    "hooked.models.vision_language",
    "hooked.scale.pipeline",
    "hooked.compat.encoders",
    "hooked.compat.nnsight",
)
# the one override allowed: a pipeline's run_with_cache is a collective, so every rank checks in first
COLLECTIVES = {("hooked.scale.pipeline.PipelineTransformer", "run_with_cache")}


def model_classes(module_prefix: str) -> list[type]:
    """Every subclass of `HookedModel` defined in a module whose name starts with `module_prefix`."""
    found, todo = [], list(HookedModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith(module_prefix):
            found.append(cls)
    return found


def redefined(classes: list[type]) -> list[str]:
    """`module.Class.method` for each base method a class defines again (the allowed collective aside)."""
    return sorted(
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for cls in classes
        for name in BASE_METHODS
        if name in vars(cls) and (f"{cls.__module__}.{cls.__qualname__}", name) not in COLLECTIVES
    )


def test_no_model_class_redefines_the_base():
    for module in MODEL_MODULES:
        importlib.import_module(module)
    classes = model_classes("hooked.")
    assert {HookedTransformer, HookedEncoder, HookedEncoderDecoder, HookedAudioEncoder} <= set(classes)
    assert len(classes) >= 6  # the vision-language model and the pipeline too
    assert redefined(classes) == [], "state what differs through the seams of hooked/models/hooked_model.py"


def test_the_check_catches_a_planted_override():
    class Planted(HookedTransformer):
        def to(self, *args, **kwargs):
            return super().to(*args, **kwargs)

    assert redefined(model_classes(Planted.__module__)) == [f"{Planted.__module__}.{Planted.__qualname__}.to"]


def test_the_pipeline_override_only_checks_in():
    from hooked.scale.pipeline import PipelineTransformer

    source = inspect.getsource(inspect.unwrap(PipelineTransformer.run_with_cache))
    assert source.rstrip().endswith("return super().run_with_cache(*model_args, **kwargs)")


# -- behaviour of the moved code, class by class -------------------------------------------------
def gpt2() -> HookedTransformer:
    return tiny_hooked("gpt2")


def bert() -> HookedEncoder:
    return HookedEncoder(bert_cfg(), tokenizer=make_wordpiece_tokenizer())


def t5() -> HookedEncoderDecoder:
    return HookedEncoderDecoder(t5_cfg(seed=0, decoder_start_token_id=0, device="cpu"))


def hubert() -> HookedAudioEncoder:
    return HookedAudioEncoder.from_pretrained("tiny-hubert", hf_model=tiny_hubert(2), device="cpu")


BUILDERS = {"gpt2": gpt2, "bert": bert, "t5": t5, "hubert": hubert}
TOKENS = torch.tensor([[2, 5, 6, 7, 3], [2, 10, 11, 12, 3]])


def run_args(name: str) -> tuple:
    """The positional arguments of one forward of the model named `name` (a batch of 2)."""
    if name == "t5":
        return TOKENS, TOKENS[:, :2]  # encoder tokens, decoder tokens
    if name == "hubert":
        return (torch.randn(2, 5, 32),)  # projected frames [batch, frames, d_model]
    return (TOKENS,)


@pytest.mark.parametrize("name", BUILDERS)
def test_to_keeps_cfg_device_and_dtype(name):
    model = BUILDERS[name]()
    assert model.to(torch.float64, print_details=False) is model
    assert model.cfg.dtype == torch.float64
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    model.to(device="cpu", dtype=torch.float32)
    assert (model.cfg.device, model.cfg.dtype) == ("cpu", torch.float32)
    model.to(torch.zeros((), dtype=torch.float64))  # `to(tensor)`: that tensor's device and dtype
    assert (model.cfg.device, model.cfg.dtype) == ("cpu", torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.move_model_modules_to_device() is model
    assert model.n_params_total == sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("name", BUILDERS)
def test_run_with_cache_returns_an_activation_cache_of_the_model(name):
    model = BUILDERS[name]()
    args = run_args(name)
    out, cache = model.run_with_cache(*args)
    assert isinstance(cache, ActivationCache) and cache.model is model and cache.has_batch_dim
    assert torch.equal(out, model(*args))
    assert len(cache.keys()) > 0 and set(cache.keys()) <= set(model.hook_dict)
    recorded_inputs = name == "gpt2"  # only HookedTransformer records its run's tokens and mask
    assert (cache.tokens is not None) == recorded_inputs
    _, as_dict = model.run_with_cache(*args, return_cache_object=False)
    assert type(as_dict) is dict and set(as_dict) == set(cache.keys())
    first = [a[:1] for a in args]
    _, single = model.run_with_cache(*first, remove_batch_dim=True)
    name0 = next(iter(single.keys()))
    assert not single.has_batch_dim and torch.equal(single[name0], model.run_with_cache(*first)[1][name0][0])


def test_run_with_cache_stores_the_tokens_and_mask_of_a_transformer_run():
    model = gpt2()
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    _, cache = model.run_with_cache(TOKENS, attention_mask=mask)
    assert torch.equal(cache.tokens, TOKENS) and torch.equal(cache.attention_mask, mask)


def test_next_sentence_prediction_delegates_to_its_encoder():
    encoder = bert()
    nsp = BertNextSentencePrediction(encoder)
    types = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    out, cache = nsp.run_with_cache(TOKENS, token_type_ids=types)
    assert out.shape == (2, 2) and isinstance(cache, ActivationCache) and cache.model is encoder
    assert torch.equal(out, nsp(TOKENS, token_type_ids=types))
    _, as_dict = nsp.run_with_cache(TOKENS, token_type_ids=types, return_cache_object=False)
    assert type(as_dict) is dict and set(as_dict) == set(cache.keys())
    assert "forward" not in vars(encoder)  # the masked-LM forward is back


def test_vision_language_to_keeps_the_vision_config_in_step():
    model = HookedTransformer.from_pretrained_no_processing("tiny-llava", hf_model=tiny_vlm("llava"))
    model.to(torch.float64)
    assert model.cfg.dtype == model.vcfg.vision.dtype == torch.float64
    assert model.vcfg.vision.device == model.cfg.device == "cpu"
    assert {p.dtype for p in model.vision.parameters()} == {torch.float64}
