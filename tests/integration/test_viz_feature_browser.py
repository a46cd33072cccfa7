"""The feature dashboard and the shared colour scale of text strips in a real headless Chromium (Playwright):
what a person reads is on the page, colours follow the one scale, hovering works, nothing is fetched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hooked.harvest import ActivationReader, harvest
from hooked.viz import DashboardOptions, activations_over_text, feature_dashboard
from tests.integration.browser import check_screenshot, file_url, open_page, require_browser
from tests.unit.harvest._harvest_common import HOOKS, corpus_dir_fixture, model_dir_fixture, model_fixture  # noqa: F401

require_browser()

BG = "els => els.map(e => getComputedStyle(e).backgroundColor)"


@pytest.fixture
def open_view(browser, tmp_path):
    """Save a view and open it; afterwards a screenshot must come out, the console must be clean and every request
    must have been for the file itself (an offline page)."""
    pages = []

    def open_(view, name: str):
        path = view.save(tmp_path / f"{name}.html")
        page, _, errors, requests = open_page(browser, file_url(path))
        pages.append((page, errors, requests, path, tmp_path / f"{name}.png"))
        return page, errors

    yield open_
    for page, errors, requests, path, png in pages:
        check_screenshot(page, png)
        assert errors == [], errors
        assert requests == [path.resolve().as_uri()], requests
        page.close()


def alpha(css: str) -> float:
    """The alpha of an `rgba(...)` colour (1.0 for `rgb(...)`)."""
    parts = re.findall(r"[\d.]+", css)
    return float(parts[3]) if len(parts) == 4 else 1.0


def test_strips_on_one_page_share_one_scale_with_a_legend(open_view):
    tokens = ["<bos>", "The", " ", " cat", "  ", "sat"]
    low = activations_over_text(tokens, [0.0, 1.0, 0.0, 2.0, 0.0, -1.0], title="peak 2.0")
    high = activations_over_text(tokens, [0.0, 1.0, 0.0, 4.5, 0.0, 0.5], title="peak 4.5")
    page, errors = open_view(low + high, "shared_scale")
    strips = page.locator("section[data-kind=text]")
    assert strips.count() == 2
    low_bg = strips.nth(0).locator(".tok").evaluate_all(BG)
    high_bg = strips.nth(1).locator(".tok").evaluate_all(BG)
    assert alpha(high_bg[3]) == pytest.approx(1.0)  # 4.5 is full colour
    assert alpha(low_bg[3]) == pytest.approx(2.0 / 4.5, abs=2e-3)  # 2.0 is 2.0/4.5 of it, not full colour
    assert alpha(low_bg[1]) == pytest.approx(alpha(high_bg[1]), abs=1e-6)  # the same value, the same colour
    assert "210, 50, 40" in low_bg[5] and alpha(low_bg[5]) == pytest.approx(1.0 / 4.5, abs=2e-3)  # negative: red
    legends = page.locator(".legend")
    assert legends.evaluate_all("ls => ls.map(l => +l.dataset.vmax)") == [4.5, 4.5]
    assert "full colour at ±4.5000 (shared by the 2 strips on this page)" in legends.nth(0).inner_text()
    assert strips.nth(0).locator(".tok").all_inner_texts() == ["<bos>", "The", "␣", " cat", "␣␣", "sat"]
    page.hover("section[data-kind=text] >> nth=0 >> .tok >> nth=2")
    assert page.locator(".info").nth(0).inner_text() == '" ": 0'
    assert errors == []


def test_vmax_sets_full_colour(open_view):
    page, errors = open_view(activations_over_text(["a", "b"], [1.0, 3.0], vmax=2.0), "vmax")
    colours = page.locator(".tok").evaluate_all(BG)
    assert alpha(colours[0]) == pytest.approx(0.5, abs=2e-3) and alpha(colours[1]) == pytest.approx(1.0)  # clamped
    assert "full colour at ±2.0000 (vmax set)" in page.inner_text(".legend")
    assert errors == []


@pytest.fixture(scope="module")
def reader(model, corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("acts")
    harvest(
        model,
        corpus_dir,
        HOOKS[:1],
        out,
        context_length=16,
        batch_size=4,
        max_tokens=16 * 24,
        batches_per_shard=2,
        progress=False,
    )
    return ActivationReader(out)


def test_feature_dashboard_shows_top_contexts_histogram_and_max_tokens(open_view, reader, model):
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    view = feature_dashboard(reader, HOOKS[0], direction, model, options=DashboardOptions(top_k=5, bins=12))
    data = view.data
    page, errors = open_view(view, "feature")
    rows = page.locator(".fd-ex")
    assert rows.count() == 5
    for n, ex in enumerate(data["examples"]):
        row = rows.nth(n)
        assert row.locator(".fd-val").inner_text() == f"{ex['value']:.4f}"
        shown = [t.replace("\n", "\\n") for t in ex["tokens"]]
        shown = ["␣" * len(t) if t.strip(" ") == "" and t else t for t in shown]
        assert row.locator(".tok").all_inner_texts() == shown
        assert row.locator(".tok.max").count() == 1
        assert row.locator(".tok.max").inner_text() == shown[ex["max_at"]]
        colours = row.locator(".tok").evaluate_all(BG)
        assert alpha(colours[ex["max_at"]]) == pytest.approx(min(1.0, ex["value"] / data["max"]), abs=2e-3)
    assert alpha(rows.nth(0).locator(".tok.max").evaluate(f"e => ({BG})([e])[0]")) == pytest.approx(1.0)
    bins = page.locator(".fd-bin")
    assert bins.count() == 12
    counts = bins.evaluate_all("bs => bs.map(b => +b.dataset.count)")
    assert counts == data["histogram"]["counts"]
    heights = bins.evaluate_all("bs => bs.map(b => b.getBoundingClientRect().height)")
    tallest = max(range(12), key=lambda i: counts[i])
    assert heights[tallest] == pytest.approx(80, abs=1.5)  # the tallest bar fills the 80 px box
    for i in range(12):
        assert heights[i] == pytest.approx(80 * counts[i] / counts[tallest], abs=1.5)
    stats = page.inner_text(".fd-stats")
    assert f"{data['n_rows']} rows" in stats and f"max {data['max']:.4f}" in stats
    page.hover(".fd-ex >> nth=1 >> .tok.max")
    ex = data["examples"][1]
    info = page.inner_text("section[data-kind=feature] .info")
    assert (
        info.startswith(f"#2 context {ex['context_index']} pos {ex['pos']} ")
        and str(ex["values"][ex["max_at"]])[:6] in info
    )
    assert errors == []


def test_dashboard_and_strips_on_one_page(open_view, reader, model):
    """A dashboard beside text strips: each kind draws, the strips keep their own shared scale."""
    view = (
        feature_dashboard(reader, HOOKS[0], lambda x: x[:, 0], model, options=DashboardOptions(top_k=2))
        + activations_over_text(["a", "b"], [1.0, 2.0])
        + activations_over_text(["c"], [4.0])
    )
    page, errors = open_view(view, "mixed")
    kinds = page.eval_on_selector_all("section", "ss => ss.map(s => s.dataset.kind)")
    assert kinds == ["feature", "text", "text"]
    assert page.locator("section[data-kind=text] .legend").evaluate_all("ls => ls.map(l => +l.dataset.vmax)") == [4, 4]
    assert errors == []


def test_saved_page_is_self_contained(reader, model, tmp_path):
    html = feature_dashboard(reader, HOOKS[0], lambda x: x[:, 0], model).save(tmp_path / "f.html").read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html and "src=" not in html
    assert Path(tmp_path / "f.html").stat().st_size < 200_000
