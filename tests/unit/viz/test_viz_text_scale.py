"""activations_over_text: strips on one page share a colour scale unless given `vmax`; the page embeds it."""

from __future__ import annotations

import math

import pytest
import torch

from hooked.core.errors import InputError
from hooked.viz import activations_over_text, embedded_data

TOKENS = ["<bos>", "The", " ", " cat", "\n", "  "]


def _strip(peak: float, **kwargs):
    return activations_over_text(TOKENS, torch.tensor([0.0, 0.5, -0.25, peak, 1.0, 0.0]), **kwargs)


def test_views_added_together_share_the_largest_value_as_full_colour():
    views = embedded_data((_strip(2.0) + _strip(4.5) + _strip(-3.0)).html)
    assert [v["scale"] for v in views] == [4.5, 4.5, 4.5]
    assert all(v["scale_note"] == "shared by the 3 strips on this page" for v in views)


def test_a_strip_alone_uses_its_own_largest_magnitude_and_nan_is_ignored():
    values = torch.tensor([float("nan"), -2.5, 1.0, 0.0, 0.5, 0.25])
    (view,) = embedded_data(activations_over_text(TOKENS, values).html)
    assert view["scale"] == 2.5 and view["values"][0] is None
    assert view["scale_note"] == "this strip's largest |value|"


def test_vmax_fixes_the_scale_and_leaves_the_others_shared_among_themselves():
    views = embedded_data((_strip(2.0, vmax=10) + _strip(4.5) + _strip(3.0)).html)
    assert [v["scale"] for v in views] == [10.0, 4.5, 4.5]
    assert views[0]["scale_note"] == "vmax set" and views[1]["scale_note"] == "shared by the 2 strips on this page"


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
@pytest.mark.parametrize("vmax", [0, -1.0, math.inf, "2"])
def test_bad_vmax_is_refused(vmax):
    with pytest.raises(InputError, match="vmax"):
        _strip(1.0, vmax=vmax)


def test_the_fragment_shown_in_jupyter_has_the_same_scales():
    assert [v["scale"] for v in embedded_data((_strip(2.0) + _strip(4.5))._repr_html_())] == [4.5, 4.5]
