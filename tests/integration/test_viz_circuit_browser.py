"""hooked.viz.circuit_graph in a real headless Chromium (Playwright driving the system package):
the circuit's nodes and edges are drawn in layers, hovering shows scores, the console stays clean."""

from __future__ import annotations

import pytest
import torch

from hooked.circuits import edge_attribution_patching
from hooked.viz import circuit_graph
from tests.helpers import logit_diff
from tests.integration.browser import check_screenshot, file_url, open_page, require_browser
from tests.tiny_models import tiny_hooked, token_pair

require_browser()

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def circuit():
    model = tiny_hooked("llama_gqa")
    clean, corrupted = token_pair()
    graph = edge_attribution_patching(model, clean, corrupted, logit_diff, method="eap-ig", verbose=False)
    return graph.top_k(30)


@pytest.fixture
def page_of(browser, tmp_path):
    """Open a saved view; after the test, a screenshot must come out and the console must be clean."""
    opened = []

    def open_(view, name):
        page, _, errors, _ = open_page(browser, file_url(view.save(tmp_path / f"{name}.html")), wait_for="svg.circuit")
        opened.append((page, errors, tmp_path / f"{name}.png"))
        return page, errors

    yield open_
    for page, errors, png in opened:
        check_screenshot(page, png)
        assert errors == [], errors
        page.close()


def test_nodes_and_edges_are_drawn_in_layers(page_of, circuit):
    view = circuit_graph(circuit)
    page, errors = page_of(view, "circuit")
    names = page.eval_on_selector_all("svg.circuit .node", "ns => ns.map(n => n.dataset.name)")
    assert sorted(names) == sorted(n["name"] for n in view.data["nodes"])
    assert page.locator("svg.circuit .node text").all_text_contents() == names
    drawn = page.eval_on_selector_all("svg.circuit .edge", "es => es.map(e => [e.dataset.from, e.dataset.to])")
    assert sorted(map(tuple, drawn)) == sorted((s, r) for s, r, _ in circuit.edges())
    # layers top to bottom: each node's y follows its row, and every edge runs downwards
    y = page.evaluate(
        "() => Object.fromEntries(Array.from(document.querySelectorAll('svg.circuit .node'))"
        ".map(n => [n.dataset.name, n.getBoundingClientRect().top]))"
    )
    rows = {n["name"]: n["row"] for n in view.data["nodes"]}
    assert sorted(y, key=y.get) == sorted(rows, key=lambda n: (rows[n], y[n]))
    assert y["logits"] == max(y.values())
    for e in view.data["edges"]:
        assert y[e["from"]] < y[e["node"]]
    # width and colour follow the score
    lines = page.eval_on_selector_all(
        "svg.circuit .edge .line", "ls => ls.map(l => [l.getAttribute('stroke'), +l.getAttribute('stroke-width')])"
    )[::-1]  # drawn weakest first (the strongest on top)
    scores = [e["score"] for e in view.data["edges"]]
    assert [c for c, _ in lines] == ["#1e5ac8" if s >= 0 else "#d23228" for s in scores]
    widths = [w for _, w in lines]
    assert widths == sorted(widths, reverse=True) and widths[0] > 3 * widths[-1]  # edges are in |score| order
    assert errors == []


MIDPOINT = """sel => {const p = document.querySelector(sel), pt = p.getPointAtLength(p.getTotalLength() / 2),
  m = p.getScreenCTM(); return [pt.x * m.a + pt.y * m.c + m.e, pt.x * m.b + pt.y * m.d + m.f];}"""


def test_hover_shows_edge_and_node_scores(page_of, circuit):
    view = circuit_graph(circuit)
    page, errors = page_of(view, "circuit_hover")
    top = view.data["edges"][0]
    x, y = page.evaluate(MIDPOINT, "svg.circuit .edge[data-index='0'] .hit")
    assert page.evaluate("([x, y]) => document.elementFromPoint(x, y).parentNode.dataset.index", [x, y]) == "0"
    page.mouse.move(x, y)  # onto the strongest edge (drawn on top of the others)
    info = page.inner_text("section[data-kind=circuit] .info")
    assert info.startswith(f"{top['from']} → {top['to']}: score ") and repr(top["score"]) in info
    lit = "els => els.filter(e => e.classList.contains('hl')).map(e => e.dataset.name || e.dataset.index)"
    assert page.eval_on_selector_all("svg.circuit .edge", lit) == ["0"]  # only the hovered edge
    assert sorted(page.eval_on_selector_all("svg.circuit .node", lit)) == sorted({top["from"], top["node"]})
    node = next(n for n in view.data["nodes"] if n["name"] == top["node"])
    page.hover(f"svg.circuit .node[data-name='{node['name']}']")
    info = page.inner_text("section[data-kind=circuit] .info")
    assert info.startswith(f"{node['name']}: in ") and f"({node['n_in']} edges)" in info
    assert f"{node['score_in']:.4f}" in info
    touching = [str(i) for i, e in enumerate(view.data["edges"]) if node["name"] in (e["from"], e["node"])]
    assert sorted(page.eval_on_selector_all("svg.circuit .edge", lit), key=int) == touching
    dimmed = page.eval_on_selector_all("svg.circuit .edge", "es => es.filter(e => e.classList.contains('dim')).length")
    assert dimmed == len(view.data["edges"]) - len(touching)
    assert errors == []


def test_capped_circuit_says_so_and_sits_beside_other_views(page_of, circuit):
    view = circuit_graph(circuit, max_edges=4) + circuit_graph(circuit.copy().top_k(10), title="top 10")
    page, errors = page_of(view, "circuit_capped")
    assert page.eval_on_selector_all("section", "ss => ss.map(s => s.dataset.kind)") == ["circuit", "circuit"]
    assert f"showing the 4 largest of {circuit.n_edges} edges" in page.locator(".note").all_inner_texts()[0]
    assert page.locator("section >> nth=0").locator(".edge").count() == 4
    assert errors == []
