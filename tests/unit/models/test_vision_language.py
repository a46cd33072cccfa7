"""`HookedVisionLanguageModel`: the image-position helper, image patching, the processor entry points, caching
across both towers, analysis on text positions, weight processing and the errors (issue 39).

Parity with HF lives in tests/acceptance/test_vision_language_parity.py; here the reference is either HF's
own code run on other inputs (its any-resolution packing, on token indices) or the model itself.
"""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer
from hooked.analysis import patching
from hooked.core.errors import ConfigError, InputError
from hooked.models.vision_language import HookedVisionLanguageModel
from tests.helpers import max_abs
from tests.tiny_models import VLM_CONFIGS, save_tiny_vlm, tiny_image, vlm_image_processor

torch.set_num_threads(1)

PROMPT = "USER: {}\nWhat is in the picture?"


def placeholder(name: str) -> str:
    return "<start_of_image>" if name.startswith("gemma3") else "<image>"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF model, hooked model loaded by path, unprocessed)."""
    out = {}
    for name in VLM_CONFIGS:
        directory = tmp_path_factory.mktemp(name)
        hf = save_tiny_vlm(name, directory, seed=5)
        out[name] = (hf, HookedTransformer.from_pretrained_no_processing(str(directory)), directory)
    return out


def inputs_for(name: str, model, image, prompt: str = PROMPT) -> tuple[torch.Tensor, dict]:
    """`(tokens, image keywords)` for one prompt and one image: the processor's, or (OneVision, whose processor
    needs torchvision) its image processor's pixels with the image tokens counted from `image_positions`' layout."""
    if model.processor is not None:
        inputs = model.prepare_inputs(prompt.format(placeholder(name)), [image])
        return inputs.tokens, inputs.image_kwargs
    pixels = dict(vlm_image_processor(name)(images=[image], return_tensors="pt"))
    pixels.pop("batch_num_images", None)
    with torch.no_grad():
        n = model.image_features(**pixels).shape[0]
    tokens = torch.tensor([[1, 40, 41] + [model.vcfg.image_token_id] * n + [50, 51, 52]])
    return tokens, pixels


# -- the image-position helper ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llava_next", "llava_onevision"])
@pytest.mark.parametrize("size", [(40, 70), (70, 40), (20, 20), (56, 56)])
def test_positions_name_the_tile_and_patch_hf_packs_there(models, name, size):
    """HF's own `pack_image_features`, run on feature vectors that hold their tile and patch index, puts at each
    image token the index `image_positions` names there (newlines and a shrunk grid's blends marked as such)."""
    hf, model, _ = models[name]
    tokens, pixels = inputs_for(name, model, tiny_image(0, *size))
    positions = model.image_positions(tokens, pixels["image_sizes"])
    side = model.vcfg.tokens_per_side
    n_tiles = int(torch.tensor(positions.grids[0]).prod()) + 1
    ids = torch.arange(n_tiles * side * side, dtype=torch.float64).reshape(n_tiles, side * side, 1)
    newline = torch.tensor([-1.0], dtype=torch.float64)
    pack = hf.model.pack_image_features
    if name == "llava_next":
        packed, _ = pack([ids], pixels["image_sizes"], "default", image_newline=newline)
    else:
        packed, _ = pack([ids], pixels["image_sizes"], image_newline=newline, vision_aspect_ratio="anyres_max_1")
    hf_ids = packed[0][:, 0]
    assert torch.equal(positions.pos, (tokens[0] == model.vcfg.image_token_id).nonzero().flatten())
    assert torch.equal(positions.newline.bool(), hf_ids == -1)
    exact = positions.tile >= 0
    ours = positions.tile * side * side + positions.row * side + positions.col
    assert torch.equal(ours[exact].double(), hf_ids[exact])
    blended = ~exact & ~positions.newline.bool()  # a downsampled grid: HF's values are blends, not one index
    assert bool((hf_ids[blended] != hf_ids[blended].round()).any()) or not blended.any()
    assert (positions.tile[:16] == 0).all() and torch.equal(positions.grid(0, 0).flatten(), positions.pos[:16])


@pytest.mark.parametrize("name", ["llava", "gemma3_pooled"])
def test_positions_of_one_tile_images_are_the_grid_in_reading_order(models, name):
    _, model, _ = models[name]
    tokens, _ = inputs_for(name, model, tiny_image(1))
    positions = model.image_positions(tokens)
    side = model.vcfg.tokens_per_side
    assert len(positions) == side * side == int((tokens == model.vcfg.image_token_id).sum())
    assert torch.equal(positions.grid(0, 0).flatten(), positions.pos)
    assert positions.at(image=0, row=1, col=side - 1) == (0, int(positions.pos[2 * side - 1]))
    with pytest.raises(InputError, match="no image token"):
        positions.at(image=0, row=side, col=0)


def test_qwen_positions_follow_each_images_own_grid(models):
    """Qwen2.5-VL: a 40 x 70 image is 6 x 10 patches, 3 x 5 image tokens in reading order."""
    _, model, _ = models["qwen2_5_vl"]
    tokens, pixels = inputs_for("qwen2_5_vl", model, tiny_image(2, 40, 70))
    assert pixels["image_grid_thw"].tolist() == [[1, 6, 10]]
    positions = model.image_positions(tokens, image_grid_thw=pixels["image_grid_thw"])
    grid = positions.grid(0)
    assert grid.shape == (3, 5) and torch.equal(grid.flatten(), positions.pos)
    assert positions.at(image=0, row=2, col=4) == (0, int(positions.pos[-1]))


def test_positions_refuse_a_token_count_the_images_do_not_fill(models):
    _, model, _ = models["llava"]
    tokens, _ = inputs_for("llava", model, tiny_image(1))
    one_more = torch.cat([tokens, torch.tensor([[model.vcfg.image_token_id]])], dim=1)  # 17 image tokens
    with pytest.raises(InputError, match="image tokens"):
        model.image_positions(one_more)


# -- patching between two images ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VLM_CONFIGS))
def test_patching_every_image_position_from_a_into_b_gives_a(models, name):
    """Image A's merged embeddings written over image B's image tokens make B's run A's, bit for bit; any one
    patch alone does not (the helper found every image position, and only those)."""
    _, model, _ = models[name]
    tokens, a = inputs_for(name, model, tiny_image(10))
    tokens_b, b = inputs_for(name, model, tiny_image(11))  # same size: the same image tokens
    assert torch.equal(tokens, tokens_b)
    positions = model.image_positions(tokens, a.get("image_sizes"), image_grid_thw=a.get("image_grid_thw"))
    with torch.no_grad():
        logits_a, cache_a = model.run_with_cache(tokens, names_filter="hook_merged_embed", **a)
        logits_b = model(tokens, **b)

    def patch(where):
        def hook(embed, hook):
            embed[positions.batch[where], positions.pos[where]] = cache_a["hook_merged_embed"][
                positions.batch[where], positions.pos[where]
            ]
            return embed

        return hook

    everywhere = torch.arange(len(positions))
    with torch.no_grad():
        patched = model.run_with_hooks(tokens, fwd_hooks=[("hook_merged_embed", patch(everywhere))], **b)
        one = model.run_with_hooks(tokens, fwd_hooks=[("hook_merged_embed", patch(everywhere[:1]))], **b)
    assert not torch.equal(logits_a, logits_b)
    assert torch.equal(patched, logits_a)
    assert not torch.equal(one, logits_a)


def test_batched_activation_patching_runs_with_the_images(models):
    """`using_images` lets `hooked.analysis.patching` (which runs `model(tokens)`, batched) see image B."""
    _, model, _ = models["llava"]
    tokens, a = inputs_for("llava", model, tiny_image(10))
    _, b = inputs_for("llava", model, tiny_image(11))
    answer = 7

    def metric(logits):
        return logits[:, -1, answer].mean()

    with torch.no_grad():
        logits_a, cache_a = model.run_with_cache(tokens, **a)
    with model.using_images(**b):
        batched = patching.get_act_patch_resid_pre(model, tokens, cache_a, metric, batch_size=8, verbose=False)
        one_by_one = patching.get_act_patch_resid_pre(model, tokens, cache_a, metric, batch_size=1, verbose=False)
    assert batched.shape == (model.cfg.n_layers, tokens.shape[1])
    assert max_abs(batched, one_by_one) <= 1e-5
    image = model.image_positions(tokens).pos
    with torch.no_grad():
        b_metric = metric(model(tokens, **b))
    # layer 0: a text position before the image holds the same in A and B (the metric stays B's); an image
    # position carries A's patch into B's run and moves it
    assert max_abs(batched[0, : int(image[0])], b_metric.expand(int(image[0]))) <= 1e-5
    assert (batched[0, image] - b_metric).abs().max() > 1e-4 and metric(logits_a) != b_metric


# -- the processor ---------------------------------------------------------------------------------


def test_text_with_images_runs_the_checkpoints_processor(models):
    _, model, directory = models["llava"]
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(directory)
    text, image = PROMPT.format("<image>"), tiny_image(3)
    expected = processor(text=text, images=image, return_tensors="pt")
    assert torch.equal(model.to_tokens(text, images=[image]), expected["input_ids"])
    with torch.no_grad():
        by_text = model(text, images=[image])
        by_tokens = model(expected["input_ids"], pixel_values=expected["pixel_values"])
    assert torch.equal(by_text, by_tokens)
    generated = model.generate(text, images=[image], max_new_tokens=3, do_sample=False, verbose=False)
    assert isinstance(generated, str) and generated.startswith("USER:")


def test_a_model_without_processor_says_how_to_get_one(models):
    _, model, _ = models["llava_onevision"]
    assert model.processor is None
    with pytest.raises(InputError, match="no processor"):
        model.prepare_inputs("<image>", [tiny_image(0)])


# -- caching, hooks and analysis across both towers ------------------------------------------------


def test_cache_and_names_filter_span_both_towers(models):
    _, model, _ = models["llava"]
    tokens, kwargs = inputs_for("llava", model, tiny_image(4))
    names = ["vision.blocks.0.attn.hook_pattern", "vision.embed.hook_patch_embed", "projector.hook_post",
             "hook_image_features", "hook_merged_embed", "blocks.1.attn.hook_pattern"]  # fmt: skip
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names, **kwargs)
    v, n_img = model.vcfg, int((tokens == model.vcfg.image_token_id).sum())
    assert set(cache.keys()) == set(names)
    assert cache["vision.blocks.0.attn.hook_pattern"].shape == (1, v.vision.n_heads, 17, 17)  # class token + 16
    assert cache["vision.embed.hook_patch_embed"].shape == (1, 16, v.vision.d_model)
    assert cache["projector.hook_post"].shape == (1, 16, model.cfg.d_model)
    assert cache["hook_image_features"].shape == (n_img, model.cfg.d_model)
    assert cache["blocks.1.attn.hook_pattern"].shape == (1, model.cfg.n_heads, tokens.shape[1], tokens.shape[1])
    image = model.image_positions(tokens).pos
    assert torch.equal(cache["hook_merged_embed"][0, image], cache["hook_image_features"])


def test_logit_lens_and_attribution_read_image_information_at_text_positions(models):
    _, model, _ = models["gemma3_pooled"]
    tokens, kwargs = inputs_for("gemma3_pooled", model, tiny_image(5))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, **kwargs)
        text_only = model(tokens)
    last = tokens.shape[1] - 1
    parts = cache.decompose_resid(pos_slice=last)  # [component, batch, d_model]
    assert max_abs(parts.sum(0), cache["resid_post", -1][:, last]) <= 1e-5
    lens = cache.accumulated_resid(pos_slice=last, apply_ln=True)  # the logit lens at the last text position
    final = lens[-1] @ model.W_U + model.b_U
    assert max_abs(final, logits[:, last]) <= 1e-4
    assert max_abs(logits[:, last], text_only[:, last]) > 1e-3  # the text position reads the image


def test_weight_processing_folds_the_language_model_and_keeps_the_vision_tower(models):
    hf, _, directory = models["llava_next"]
    model = HookedTransformer.from_pretrained(str(directory))
    keys = set(model.state_dict())
    assert "blocks.0.ln1.w" not in keys and "vision.blocks.0.ln1.w" in keys  # text folded, vision as loaded
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.process_weights_()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # twice is once


# -- errors ------------------------------------------------------------------------------------------


def test_bad_image_inputs_get_clear_errors(models):
    _, model, _ = models["llava"]
    tokens, kwargs = inputs_for("llava", model, tiny_image(6))
    with pytest.raises(InputError, match="image tokens but the images give"):
        model(torch.cat([tokens, tokens[:, 7:9]], 1), **kwargs)  # two image tokens too many
    with pytest.raises(InputError, match="reads 28x28"):
        model(tokens, pixel_values=torch.zeros(1, 3, 32, 32))
    _, next_model, _ = models["llava_next"]
    with pytest.raises(InputError, match="image_sizes"):
        next_model(tokens, pixel_values=torch.zeros(1, 5, 3, 28, 28))
    with pytest.raises(ConfigError, match="vision_language"):
        HookedVisionLanguageModel(model.cfg.replace(vision_language=None))
    with pytest.raises(InputError, match="image-text model: device_map"):
        HookedTransformer.from_pretrained(str(models["llava"][2]), max_memory={"cpu": "1GB"})


@pytest.mark.unchecked  # tokens passed where text belongs, on purpose: the runtime check would refuse them first
def test_images_with_tokens_say_to_pass_pixel_values(models):
    _, model, _ = models["llava"]
    tokens, _ = inputs_for("llava", model, tiny_image(6))
    with pytest.raises(InputError, match="goes with text"):
        model(tokens, images=[tiny_image(6)])


def test_vision_language_config_round_trips(models):
    import pickle

    from hooked.core.config import HookedTransformerConfig

    _, model, _ = models["llava_next"]
    cfg = model.cfg
    again = HookedTransformerConfig.from_dict(dict(cfg.to_dict(), vision_language=cfg.vision_language.to_dict()))
    assert again.vision_language == cfg.vision_language and pickle.loads(pickle.dumps(cfg)) == cfg
    with pytest.raises(ConfigError, match="feature_layers"):
        cfg.vision_language.__class__.from_dict(dict(cfg.vision_language.to_dict(), feature_layers=(9,)))
