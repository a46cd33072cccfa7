"""hooked.viz pages in a real headless Chromium (the distribution's package, driven by Playwright):
the labels a person reads are there, hovering highlights, the console stays clean, a screenshot is taken."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.viz import activations_over_text, attention_patterns, direct_logit_attribution, logit_lens
from tests.integration.browser import check_screenshot, file_url, open_page, require_browser

require_browser()

torch.set_num_threads(1)
PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def model(tokenizer):
    cfg = HookedTransformerConfig(
        d_model=32,
        d_head=8,
        n_heads=4,
        n_layers=2,
        n_ctx=64,
        d_vocab=len(tokenizer),
        d_mlp=64,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
    )
    return HookedTransformer(cfg, tokenizer=tokenizer).eval()


@pytest.fixture(scope="module")
def run(model):
    tokens = model.to_tokens(PROMPT)
    _, cache = model.run_with_cache(tokens)
    return model.to_str_tokens(tokens[0]), cache


@pytest.fixture
def open_view(browser, tmp_path):
    """Save a view, open the file, and return (page, console errors); a screenshot must come out of it."""
    pages = []

    def open_(view, name: str):
        """`view` is a View, or the path of a page already written."""
        path = view if isinstance(view, Path) else view.save(tmp_path / f"{name}.html")
        page, _, errors, _ = open_page(browser, file_url(path))
        pages.append((page, errors, tmp_path / f"{name}.png"))
        return page, errors

    yield open_
    for page, errors, png in pages:
        check_screenshot(page, png)
        assert errors == [], errors
        page.close()


def shown(tokens: list[str]) -> list[str]:
    return [t.replace("\n", "\\n") for t in tokens]


def shown_in_text(tokens: list[str]) -> list[str]:
    """Text strips also draw whitespace-only tokens visibly, a space as ␣."""
    return [t.replace(" ", "␣") if t.strip() == "" else t for t in shown(tokens)]


def highlighted(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "els => els.filter(e => e.classList.contains('hl')).map(e => e.title)")


RED = (221, 51, 51)
PIXEL = """([sel, x, y]) => Array.from(document.querySelector(sel).getContext('2d').getImageData(x, y, 1, 1).data)"""


def pixel(page, selector: str, x: int, y: int) -> tuple[int, ...]:
    return tuple(page.evaluate(PIXEL, [selector, x, y])[:3])


def test_attention_hover_follows_the_token(open_view, model, run):
    str_tokens, cache = run
    page, errors = open_view(attention_patterns(model, cache, 1), "attention")
    assert page.locator("section[data-kind=attention] .tok").all_inner_texts() == shown(str_tokens)
    assert page.locator("canvas.pattern").count() == 4 and "L1H2" in page.inner_text("section")
    n = len(str_tokens)
    # every grid is labelled without hovering: key tokens along the top, query tokens down the side
    assert page.locator(".pgrid .k").all_inner_texts() == shown(str_tokens) * 4
    assert page.locator(".pgrid .q").all_inner_texts() == shown(str_tokens) * 4
    canvas = page.locator("canvas.pattern >> nth=0").bounding_box()
    rows = [page.locator(f".pgrid .q >> nth={i}").bounding_box() for i in (0, n - 1)]
    cols = [page.locator(f".pgrid .k >> nth={i}").bounding_box() for i in (0, n - 1)]
    assert (
        abs(rows[0]["y"] - canvas["y"]) < 1
        and abs(rows[1]["y"] + rows[1]["height"] - canvas["y"] - canvas["height"]) < 1
    )
    assert (
        abs(cols[0]["x"] - canvas["x"]) < 1 and abs(cols[1]["x"] + cols[1]["width"] - canvas["x"] - canvas["width"]) < 1
    )
    assert "row = the query token" in page.inner_text("p.desc")
    cell = page.evaluate("() => document.querySelector('canvas.pattern').width") // n
    heads = "canvas.pattern >> nth=2"
    before = page.evaluate("() => Array.from(document.querySelectorAll('canvas.pattern')).map(c => c.toDataURL())")
    row_2, row_5 = (1, 2 * cell), (1, 5 * cell)  # points on the red frame drawn around row 2 / row 5
    assert pixel(page, "canvas.pattern", *row_2) != RED
    page.hover("section[data-kind=attention] .tok >> nth=2")
    after = page.evaluate("() => Array.from(document.querySelectorAll('canvas.pattern')).map(c => c.toDataURL())")
    assert all(a != b for a, b in zip(before, after, strict=True))  # every head's picture changed
    assert pixel(page, "canvas.pattern", *row_2) == RED and pixel(page, "canvas.pattern", *row_5) != RED
    assert page.eval_on_selector_all("canvas.pattern", "cs => cs.map(c => c.dataset.highlight)") == ["2"] * 4
    page.hover("section[data-kind=attention] .tok >> nth=5")
    assert pixel(page, "canvas.pattern", *row_5) == RED and pixel(page, "canvas.pattern", *row_2) != RED
    assert str_tokens[5] in page.inner_text(".info")
    # hovering a cell names the pair and its weight
    page.hover(heads, position={"x": 3 * cell + cell / 2, "y": 7 * cell + cell / 2})
    weight = float(cache["pattern", 1][0, 2, 7, 3])
    assert page.inner_text(".info").startswith("L1H2: ") and f"{weight:.4f}" in page.inner_text(".info")
    assert errors == []


def test_logit_lens_hover_shows_the_top_token(open_view, model, run):
    str_tokens, cache = run
    view = logit_lens(model, cache, target=" the")
    page, errors = open_view(view, "logit_lens")
    assert page.locator(".tok").all_inner_texts() == shown(str_tokens)
    assert page.locator("th.col.input").all_inner_texts() == shown(str_tokens)
    assert page.locator("th.col.target").all_inner_texts() == shown([" the"] * len(str_tokens))
    assert page.locator("th.rh").all_inner_texts() == ["input", "target"]
    assert page.locator("th.r").all_inner_texts() == ["0_pre", "1_pre", "final_post"]
    assert page.get_attribute("th.r >> nth=0", "title") == "the residual stream entering layer 0"
    cells = page.locator("td.c").all_inner_texts()
    want = [f"{100 * p:.0f}%" if 100 * p >= 9.5 else f"{100 * p:.1f}%" for row in view.data["values"] for p in row]
    assert cells == want
    assert "l_pre is the stream entering layer l" in page.inner_text("p.desc")
    page.hover(".tok >> nth=3")
    lit = "els => els.filter(e => e.classList.contains('hl')).map(e => e.dataset.l + ',' + e.dataset.p)"
    column = page.eval_on_selector_all("td.c", lit)
    assert column == ["0,3", "1,3", "2,3"]
    page.hover("td.c >> nth=4")
    top = view.data["top_tokens"][0][4]
    info = page.inner_text(".info")
    assert info.startswith(f"0_pre @ {json.dumps(str_tokens[4], ensure_ascii=False)}: ") and top.strip() in info
    assert page.eval_on_selector_all("td.c", lit) == ["0,4"]
    assert errors == []


def test_attribution_bars_in_sorted_order(open_view, model, run):
    _, cache = run
    view = direct_logit_attribution(model, cache, " the", per="layer")
    page, errors = open_view(view, "dla")
    assert page.locator(".bar-label").all_inner_texts() == view.data["labels"]
    page.hover(".bar-row >> nth=1")
    assert view.data["labels"][1] in page.inner_text(".info")
    assert page.eval_on_selector_all(".bar-row", "rs => rs.filter(r => r.classList.contains('hl')).length") == 1
    assert errors == []


def test_text_strip_colours_and_hover(open_view, model, run):
    str_tokens, cache = run
    values = cache["post", 0][0, :, 1]
    page, errors = open_view(activations_over_text(str_tokens, values), "text")
    assert page.locator(".tok").all_inner_texts() == shown_in_text(str_tokens)
    colours = page.eval_on_selector_all(".tok", "ts => ts.map(t => getComputedStyle(t).backgroundColor)")
    assert len(set(colours)) > 1
    page.hover(".tok >> nth=4")
    assert str(float(values[4]))[:6] in page.inner_text(".info")
    assert highlighted(page, ".tok") == [page.get_attribute(".tok >> nth=4", "title")]
    assert errors == []


def test_long_inputs_are_capped_and_said_so(open_view, model, tokenizer):
    long_prompt = " ".join([PROMPT] * 12)
    tokens = model.to_tokens(long_prompt, truncate=False)[:, :64]
    _, cache = model.run_with_cache(tokens)
    view = attention_patterns(model, cache, 0, max_pos=16, max_heads=2) + logit_lens(model, cache, max_pos=20)
    page, errors = open_view(view, "capped")
    notes = page.locator(".note").all_inner_texts()
    assert any("last 16 of 64 positions" in n for n in notes) and any("2 of 4 heads" in n for n in notes)
    assert any("last 20 of 64 positions" in n for n in notes)
    assert page.locator("canvas.pattern").count() == 2 and page.locator("td.c").count() == 3 * 20
    assert page.evaluate("() => document.querySelector('canvas.pattern').width") % 16 == 0
    assert errors == []


def test_cli_report_page(open_view, tmp_path, capsys):
    """`hooked inspect ... --html` on a tiny checkpoint: the page has all views and runs cleanly."""
    from hooked.cli import main
    from tests.tiny_models import make_tokenizer, tiny_gpt2

    ckpt = tmp_path / "ckpt"
    tiny_gpt2().save_pretrained(ckpt, safe_serialization=True)
    make_tokenizer().save_pretrained(ckpt)
    out = tmp_path / "report.html"
    assert main(["inspect", PROMPT, "--model", str(ckpt), "--html", str(out)]) == 0
    assert "Top next tokens" in capsys.readouterr().out
    page, errors = open_view(out, "report")
    kinds = page.eval_on_selector_all("section", "ss => ss.map(s => s.dataset.kind)")
    assert kinds == ["logit_lens", "attention", "bars", "bars", "text"]
    labels = page.locator("section[data-kind=attention] .tok").all_inner_texts()
    assert "".join(labels).endswith(PROMPT) and len(labels) > 5
    descriptions = page.locator("p.desc").all_inner_texts()
    assert len(descriptions) == 4 and "is shown because its head" in descriptions[1]  # (the text view has none)
    assert errors == []
    # --answer/--wrong: the attribution is of a logit difference, in the text report and on the page
    diff = tmp_path / "diff.html"
    assert main(["inspect", PROMPT, "--model", str(ckpt), "--html", str(diff), "--answer", " the", "--wrong", "ver",
                 "--layer", "0"]) == 0  # fmt: skip
    assert "Top direct contributions to the logit of ' the' minus the logit of 'ver':" in capsys.readouterr().out
    page, errors = open_view(diff, "report_diff")
    titles = page.locator("section[data-kind=bars] h3").all_inner_texts()
    assert len(titles) == 2 and all("logit of ' the' minus 'ver'" in t for t in titles), titles
    assert page.inner_text("section[data-kind=attention] p.desc").startswith("Layer 0, as asked.")
    assert errors == []


def test_console_errors_are_caught(browser):
    """The error hook used above does see a failing script (so the clean-console checks can fail)."""
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_content("<script>undefinedFunction()</script>")
    page.wait_for_timeout(50)
    page.close()
    assert errors and "undefinedFunction" in errors[0]


def test_notebook_outputs_side_by_side(open_view, model, run, tmp_path):
    """Two `_repr_html_` fragments in one document (as in a notebook) each draw their own view."""
    str_tokens, cache = run
    fragments = [
        activations_over_text(str_tokens, cache["post", 1][0, :, 0])._repr_html_(),
        direct_logit_attribution(model, cache, 5, per="layer")._repr_html_(),
    ]
    path = tmp_path / "notebook.html"
    path.write_text("<!DOCTYPE html><meta charset='utf-8'><body>" + "".join(fragments) + "</body>")
    page, errors = open_view(path, "notebook")
    assert page.eval_on_selector_all("section", "ss => ss.map(s => s.dataset.kind)") == ["text", "bars"]
    assert page.locator(".tok").all_inner_texts() == shown_in_text(str_tokens)
    assert errors == []
