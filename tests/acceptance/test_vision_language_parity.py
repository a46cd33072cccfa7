"""Image-text models against HF eager: LLaVA, LLaVA-NeXT, LLaVA-OneVision and Gemma 3 with images (issue 39).

Each tiny random checkpoint (`tests.tiny_models.VLM_CONFIGS`) is saved with its processor and loaded
by path with `HookedTransformer.from_pretrained`, as a user would. Two prompts with two images of
different shapes (so LLaVA-NeXT/OneVision tile them differently and the batch is left-padded) go
through both models. Bounds (docs/numerics.md#tolerances): logits and every block output of both
towers `atol 1e-5`; greedy generation identical; bfloat16 bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hooked import HookedTransformer
from hooked.models.vision_language import HookedVisionLanguageModel
from tests.helpers import hf_block_outputs, max_abs
from tests.tiny_models import VLM_CONFIGS, save_tiny_vlm, tiny_image, vlm_image_processor, vlm_processor

torch.set_num_threads(1)

FAMILIES = list(VLM_CONFIGS)
PROMPTS = ("USER: {}\nWhat is it?", "The quick brown fox {} jumps over the lazy dog.")


def placeholder(name: str) -> str:
    return "<start_of_image>" if name.startswith("gemma3") else "<image>"


def hf_inputs(name: str, hf, batch: int = 2) -> dict:
    """The HF model's keyword inputs for `batch` prompts, one image each, left-padded.

    With a processor (LLaVA, LLaVA-NeXT, Gemma 3) it makes them; LLaVA-OneVision's and Qwen2.5-VL's
    processors need torchvision, so their image processors make the pixels and the image tokens are
    counted by HF's own `get_image_features`, which HF checks against the tokens (Qwen2.5-VL's 3-D
    positions also read `mm_token_type_ids`, 1 at image tokens, as its processor writes it).
    """
    images = [tiny_image(1, 40, 70), tiny_image(2, 70, 40)][:batch]
    processor = vlm_processor(name)
    if processor is not None:
        text = [p.format(placeholder(name)) for p in PROMPTS[:batch]]
        out = processor(text=text, images=[[i] for i in images], return_tensors="pt", padding=True, padding_side="left")
        return dict(out)
    pixels = vlm_image_processor(name)(images=images, return_tensors="pt")
    with torch.no_grad():
        counts = [f.shape[0] for f in hf.model.get_image_features(**pixels).pooler_output]
    rows = [[1, 40 + i, 41 + i] + [hf.config.image_token_id] * n + [50 + i] * (3 + 2 * i) for i, n in enumerate(counts)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[2] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    extra = dict(mm_token_type_ids=(ids == hf.config.image_token_id).long()) if name == "qwen2_5_vl" else {}
    return dict(input_ids=ids, attention_mask=mask, **pixels, **extra)


def our_kwargs(inputs: dict) -> dict:
    """Our model's keywords for the HF inputs (Gemma 3's `token_type_ids` follow from the image tokens)."""
    return {k: v for k, v in inputs.items() if k not in ("input_ids", "token_type_ids", "mm_token_type_ids")}


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    name = request.param
    directory = tmp_path_factory.mktemp(name)
    hf = save_tiny_vlm(name, directory, seed=3)
    model = HookedTransformer.from_pretrained_no_processing(str(directory))
    return name, directory, hf, model, hf_inputs(name, hf)


def test_from_pretrained_returns_the_vision_language_model(pair):
    name, _, _, model, _ = pair
    assert isinstance(model, HookedVisionLanguageModel)
    assert (model.processor is None) == (name in ("llava_onevision", "qwen2_5_vl"))  # theirs need torchvision
    assert "vision.blocks.0.attn.hook_pattern" in model.hook_dict and "hook_merged_embed" in model.hook_dict


def test_logits_and_every_text_block_match_hf_eager(pair):
    name, _, hf, model, inputs = pair
    mask = inputs["attention_mask"].bool()
    theirs = hf_block_outputs(hf, hf.model.language_model.layers, **inputs)
    with torch.no_grad():
        ref = hf(**inputs).logits
        logits, cache = model.run_with_cache(inputs["input_ids"], **our_kwargs(inputs))
    assert max_abs(logits[mask], ref[mask]) <= 1e-5, name
    for layer, hidden in enumerate(theirs):
        assert max_abs(cache["resid_post", layer][mask], hidden[mask]) <= 1e-5, (name, layer)
    assert not torch.equal(logits, model(inputs["input_ids"], attention_mask=inputs["attention_mask"]))  # images count


def hf_tiles(hf, inputs: dict) -> torch.Tensor:
    """The images HF's ViT reads: `[images, C, H, W]`, or each image's tiles (HF's own count) concatenated."""
    pixels = inputs["pixel_values"]
    if pixels.ndim == 4:
        return pixels
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    pinpoints, size = hf.config.image_grid_pinpoints, hf.config.vision_config.image_size
    counts = [image_size_to_num_patches(s, pinpoints, size) for s in inputs["image_sizes"]]
    return torch.cat([p[:n] for p, n in zip(pixels, counts, strict=True)])


def test_vision_tower_and_image_features_match_hf(pair):
    name, _, hf, model, inputs = pair
    pixels = {k: v for k, v in inputs.items() if k in ("pixel_values", "image_sizes", "image_grid_thw")}
    if name == "qwen2_5_vl":  # one flat sequence of every image's patches, the blocks in window order as ours
        tiles = inputs["image_grid_thw"]
        theirs = hf_block_outputs(hf.model.visual, hf.model.visual.blocks, inputs["pixel_values"], grid_thw=tiles)
        theirs = [hidden[None] for hidden in theirs]  # [1, patches, d_vision]
    else:
        tiles = hf_tiles(hf, inputs)
        blocks = hf.model.vision_tower.encoder.layers[: model.vcfg.vision.n_layers]
        theirs = hf_block_outputs(hf.model.vision_tower, blocks, tiles)
    with torch.no_grad():
        ref = torch.cat(list(hf.model.get_image_features(**pixels).pooler_output)).reshape(-1, model.cfg.d_model)
        _, cache = model.run_with_cache(
            inputs["input_ids"], names_filter=lambda n: n.startswith(("vision.", "hook_image")), **our_kwargs(inputs)
        )
    assert cache["vision.hook_embed"].shape[0] == (1 if name == "qwen2_5_vl" else len(tiles)) > 0
    for layer, hidden in enumerate(theirs):
        assert max_abs(cache[f"vision.blocks.{layer}.hook_resid_post"], hidden) <= 1e-5, (name, layer)
    assert max_abs(cache["hook_image_features"], ref) <= 1e-5, name


def test_greedy_generation_equals_hf_token_for_token(pair):
    name, _, hf, model, _ = pair
    one = hf_inputs(name, hf, batch=1)
    hf.generation_config.eos_token_id = None  # run every step
    with torch.no_grad():
        theirs = hf.generate(**one, max_new_tokens=12, do_sample=False, pad_token_id=2)
    kwargs = dict(max_new_tokens=12, do_sample=False, stop_at_eos=False, verbose=False, **our_kwargs(one))
    ours = model.generate(one["input_ids"], **kwargs)
    assert torch.equal(ours, theirs), name
    assert torch.equal(model.generate(one["input_ids"], use_past_kv_cache=False, **kwargs), theirs), name


@pytest.mark.slow  # a bfloat16 reload per family
def test_bfloat16_equals_hf_bit_for_bit(pair):
    from transformers import AutoModelForImageTextToText

    name, directory, _, _, inputs = pair
    hf = AutoModelForImageTextToText.from_pretrained(Path(directory), dtype=torch.bfloat16, attn_implementation="eager")
    model = HookedTransformer.from_pretrained_no_processing(str(directory), dtype=torch.bfloat16)
    model.cfg.attn_implementation = model.vcfg.vision.attn_implementation = "eager"  # HF's eager path
    mask = inputs["attention_mask"].bool()
    # positions count real tokens, as ours and HF's generate do (HF's forward alone counts the padding too: in
    # float32 rotary is shift-invariant to rounding, in bfloat16 a shift changes the bits)
    # (Qwen2.5-VL's 3-D positions already count real tokens only)
    positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    extra = {} if name == "qwen2_5_vl" else dict(position_ids=positions)
    with torch.no_grad():
        ref = hf.eval()(**inputs, **extra).logits
        ours = model(inputs["input_ids"], **our_kwargs(inputs))
    assert torch.equal(ours[mask], ref[mask]), (name, max_abs(ours[mask].float(), ref[mask].float()))


def test_default_processing_keeps_log_probs(pair):
    name, directory, _, model, inputs = pair
    processed = HookedTransformer.from_pretrained(str(directory))
    assert "fold_ln" in processed.cfg.weight_processing
    with torch.no_grad():
        ours = processed(inputs["input_ids"], **our_kwargs(inputs)).log_softmax(-1)
        plain = model(inputs["input_ids"], **our_kwargs(inputs)).log_softmax(-1)
    mask = inputs["attention_mask"].bool()
    assert max_abs(ours[mask], plain[mask]) <= 1e-5, name


def test_gemma3_image_tokens_attend_to_each_other_both_ways(tmp_path):
    """HF's `token_type_ids` mask: an image token sees the later tokens of its own image; text stays causal."""
    hf = save_tiny_vlm("gemma3_pooled", tmp_path, seed=4)
    model = HookedTransformer.from_pretrained_no_processing(str(tmp_path))
    inputs = hf_inputs("gemma3_pooled", hf, batch=1)
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs["input_ids"], **our_kwargs(inputs))
        causal = hf(**{k: v for k, v in inputs.items() if k != "token_type_ids"}).logits
        ref = hf(**inputs).logits
    image = (inputs["input_ids"][0] == hf.config.image_token_id).nonzero().flatten().tolist()
    n = inputs["input_ids"].shape[1]
    text = [q for q in range(n) if q not in image]
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer][0]  # [head, query, key]
        assert (pattern[:, image[0], image[1:]] > 0).all(), layer  # the first image token sees the later ones
        assert all((pattern[:, q, q + 1 :] == 0).all() for q in text), layer  # text never sees a later token
    assert max_abs(causal, ref) > 1e-3  # without the mask HF differs: this comparison can fail
