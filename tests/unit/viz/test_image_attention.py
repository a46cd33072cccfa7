"""`hooked.viz.attention_over_image`: the data a page draws is the cache's attention at the image's patches."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from hooked import HookedTransformer
from hooked.core.errors import InputError
from hooked.viz import attention_over_image
from tests.tiny_models import save_tiny_vlm, tiny_image

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llava")
    save_tiny_vlm("llava", directory, seed=9)
    model = HookedTransformer.from_pretrained(str(directory))
    inputs = model.prepare_inputs("USER: <image>\nWhat is in the picture?", [tiny_image(4)])
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs.tokens, **inputs.image_kwargs)
    return model, inputs, cache


def test_weights_are_the_cached_attention_at_each_patch(run):
    model, inputs, cache = run
    view = attention_over_image(model, cache, 1, inputs.pixel_values, heads=[2])
    data, grid = view.data, model.image_positions(inputs.tokens).grid(0)
    pattern = cache["pattern", 1][0]  # [head, query, key]
    query = data["positions"][-1]
    assert data["heads"] == ["mean", "L1H2"] and (data["rows"], data["cols"]) == tuple(grid.shape)
    mean = torch.tensor(data["weights"][0][-1]).reshape(grid.shape)
    head = torch.tensor(data["weights"][1][-1]).reshape(grid.shape)
    assert torch.allclose(mean, pattern[:, query, grid].mean(0), atol=1e-5)
    assert torch.allclose(head, pattern[2, query, grid], atol=1e-5)
    assert abs(data["share"][1][-1] - float(pattern[2, query, grid.flatten()].sum())) <= 1e-5
    image_positions = set(grid.flatten().tolist())
    assert not image_positions & set(data["positions"])  # the queries are the text tokens


def test_the_image_is_embedded_as_rgb_bytes(run):
    model, inputs, cache = run
    drawn = attention_over_image(model, cache, 0, inputs.pixel_values).data["image"]
    rgb = np.frombuffer(base64.b64decode(drawn["rgb"]), dtype=np.uint8).reshape(drawn["height"], drawn["width"], 3)
    assert rgb.shape == (28, 28, 3) and rgb.min() == 0 and rgb.max() == 255  # each channel min-max scaled
    given = attention_over_image(model, cache, 0, tiny_image(4, 20, 30)).data["image"]
    assert (given["height"], given["width"]) == (20, 30)
    assert base64.b64decode(given["rgb"]) == np.asarray(tiny_image(4, 20, 30)).tobytes()


def test_bad_arguments_name_the_problem(run):
    model, inputs, cache = run
    with pytest.raises(InputError, match="layer=5"):
        attention_over_image(model, cache, 5, inputs.pixel_values)
    with pytest.raises(InputError, match="heads"):
        attention_over_image(model, cache, 0, inputs.pixel_values, heads=[9])
    with pytest.raises(InputError, match="no tile 1"):
        attention_over_image(model, cache, 0, inputs.pixel_values, tile=1)
    with pytest.raises(InputError, match="image=1"):
        attention_over_image(model, cache, 0, inputs.pixel_values, image=1)
