"""`hooked.viz.attention_over_image` in a real headless Chromium: the image is drawn, a text token's attention
tints the patches it reads, hovering a token or clicking a head redraws, the console stays clean (issue 39)."""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer
from hooked.viz import attention_over_image
from tests.integration.browser import check_screenshot, file_url, open_page, require_browser
from tests.tiny_models import save_tiny_vlm, tiny_image

require_browser()

torch.set_num_threads(1)
PIXEL = """([x, y]) => Array.from(document.querySelector('canvas.image-attention').getContext('2d')
    .getImageData(x, y, 1, 1).data)"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llava")
    save_tiny_vlm("llava", directory, seed=7)
    model = HookedTransformer.from_pretrained(str(directory))
    inputs = model.prepare_inputs("USER: <image>\nWhat is in the picture?", [tiny_image(8)])
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs.tokens, **inputs.image_kwargs)
    return model, inputs, cache


def test_attention_over_image_tints_the_patches_a_token_reads(browser, tmp_path, run):
    model, inputs, cache = run
    view = attention_over_image(model, cache, 1, inputs.pixel_values)
    page, _, errors, requests = open_page(browser, file_url(view.save(tmp_path / "image.html")))
    data, side = view.data, view.data["rows"]
    assert data["cols"] == side == 4  # LLaVA's 28-pixel image in 7-pixel patches
    canvas = page.locator("canvas.image-attention")
    size = int(page.evaluate("() => document.querySelector('canvas.image-attention').width"))
    cell = size / side
    shown = [t.replace("\n", "\\n") for t in data["tokens"]]  # the strip writes a newline as \n
    assert page.locator("section[data-kind=image_attention] .tok").all_inner_texts() == shown
    assert page.locator(".hbtn").all_inner_texts() == ["mean"] + [f"L1H{h}" for h in range(model.cfg.n_heads)]
    # the last text token, mean over heads: its most-attended patch is the most tinted
    assert canvas.get_attribute("data-query") == str(data["positions"][-1])
    assert canvas.get_attribute("data-head") == "mean"
    weights = torch.tensor(data["weights"][0][-1]).reshape(side, side)
    top, low = divmod(int(weights.argmax()), side), divmod(int(weights.argmin()), side)
    red = [page.evaluate(PIXEL, [int((c + 0.5) * cell), int((r + 0.5) * cell)])[0] for r, c in (top, low)]
    pixels = [page.evaluate(PIXEL, [int((c + 0.5) * cell), int((r + 0.5) * cell)]) for r, c in (top, low)]
    assert red[0] >= 200 and pixels[0] != pixels[1]
    # hover another token: the picture and the info follow it
    before = page.evaluate("() => document.querySelector('canvas.image-attention').toDataURL()")
    page.hover("section[data-kind=image_attention] .tok >> nth=1")
    assert canvas.get_attribute("data-query") == str(data["positions"][1])
    assert page.evaluate("() => document.querySelector('canvas.image-attention').toDataURL()") != before
    info = page.inner_text(".info")
    assert data["tokens"][1].strip() in info and "of its attention on this image" in info
    # one head instead of the mean
    page.click(".hbtn >> nth=2")
    assert canvas.get_attribute("data-head") == "L1H1"
    share = data["share"][2][1]
    assert f"{100 * share:.0f}%" in page.inner_text(".info") or f"{100 * share:.1f}%" in page.inner_text(".info")
    # a patch under the cursor names its weight
    canvas.hover(position={"x": cell * 0.5, "y": cell * 0.5})
    assert "patch (0, 0)" in page.inner_text(".info")
    assert all(url.startswith("file://") for url in requests) and errors == []
    check_screenshot(page, tmp_path / "image.png")


def test_a_qwen_image_at_its_own_grid_is_drawn_at_its_aspect(browser, tmp_path):
    """Qwen2.5-VL keeps an image's shape: a 40 x 70 image is 3 x 5 image tokens, drawn over the image as given."""
    from tests.tiny_models import vlm_image_processor

    directory = tmp_path / "qwen"
    save_tiny_vlm("qwen2_5_vl", directory, seed=7)
    model = HookedTransformer.from_pretrained(str(directory))
    image = tiny_image(8, 40, 70)
    pixels = dict(vlm_image_processor("qwen2_5_vl")(images=[image], return_tensors="pt"))
    tokens = torch.tensor([[1, 40, 41] + [model.vcfg.image_token_id] * 15 + [50, 51, 52]])
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, **pixels)
    view = attention_over_image(model, cache, 0, image, image_grid_thw=pixels["image_grid_thw"])
    assert (view.data["rows"], view.data["cols"]) == (3, 5)
    page, _, errors, _ = open_page(browser, file_url(view.save(tmp_path / "qwen.html")))
    width, height = page.evaluate("() => [document.querySelector('canvas.image-attention').width, "
                                  "document.querySelector('canvas.image-attention').height]")  # fmt: skip
    assert abs(width / height - 70 / 40) < 0.02
    canvas = page.locator("canvas.image-attention")
    canvas.hover(position={"x": width - 2, "y": height - 2})
    assert "patch (2, 4)" in page.inner_text(".info") and errors == []
    check_screenshot(page, tmp_path / "qwen.png")
