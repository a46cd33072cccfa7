"""hooked.viz.circuit_graph: the page embeds exactly the circuit's edges, scores and node sums."""

import pytest
import torch

from hooked.circuits import Graph, edge_attribution_patching
from hooked.core.errors import InputError, InputTypeError
from hooked.viz import circuit_graph, embedded_data
from tests.helpers import logit_diff
from tests.tiny_models import tiny_hooked, token_pair

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def scored():
    model = tiny_hooked("llama_gqa")
    clean, corrupted = token_pair()
    return edge_attribution_patching(model, clean, corrupted, logit_diff, method="eap-ig", verbose=False)


def view_data(view):
    (data,) = embedded_data(view.html)
    assert data == view.data
    return data


def test_embedded_edges_are_the_circuits_edges_and_scores(scored):
    circuit = scored.copy().top_k(25)
    data = view_data(circuit_graph(circuit))
    assert data["kind"] == "circuit" and data["n_edges"] == circuit.n_edges and data["notes"] == []
    embedded = {(e["from"], e["to"]): e["score"] for e in data["edges"]}
    assert len(embedded) == circuit.n_edges
    for s, r in circuit.in_graph.nonzero().tolist():
        assert embedded[circuit.senders[s], circuit.receivers[r]] == float(circuit.scores[s, r])  # exact
    for e in data["edges"]:
        assert e["port"] == (e["to"].split(".")[2] if e["to"].count(".") == 2 else "")
        assert e["node"] == ("logits" if e["to"] == "logits" else e["to"].rsplit(".", 1)[0] if e["port"] else e["to"])


def test_node_scores_sum_the_circuit_edges_in_and_out(scored):
    circuit = scored.copy().top_k(40)
    data = view_data(circuit_graph(circuit, max_edges=5))
    assert len(data["edges"]) == 5 and "showing the 5 largest of" in data["notes"][0]
    top = [abs(e["score"]) for e in data["edges"]]
    assert top == sorted(top, reverse=True) and top[-1] >= max(abs(s) for _, _, s in circuit.edges()[5:])
    edges = circuit.edges()
    for node in data["nodes"]:
        name = node["name"]
        into = [
            sc for _, r, sc in edges if (r == "logits" and name == "logits") or r == name or r.startswith(name + ".")
        ]
        out = [sc for s, _, sc in edges if s == name]
        assert node["n_in"] == len(into) and node["n_out"] == len(out)
        assert node["score_in"] == pytest.approx(sum(into), abs=1e-9)
        assert node["score_out"] == pytest.approx(sum(out), abs=1e-9)
    rows = {n["name"]: n["row"] for n in data["nodes"]}
    assert rows["logits"] == len(data["rows"]) - 1 == 5 and data["rows"][1] == "layer 0 attention"
    assert all(rows[e["from"]] < rows[e["node"]] for e in data["edges"])  # edges run down the page
    cols = {n["name"]: n["col"] for n in data["nodes"]}
    assert data["n_cols"] == 5 and cols["logits"] == 2
    assert all(
        c == (4 if name.startswith("m") else int(name.split(".h")[1])) for name, c in cols.items() if name[0] in "am"
    )


def test_post_norm_attention_is_one_node_per_layer():
    model = tiny_hooked("gemma_post_norm")
    graph = Graph.from_model(model)
    graph.scores = torch.randn(graph.scores.shape, generator=torch.Generator().manual_seed(0)) * graph.valid
    data = view_data(circuit_graph(graph))  # every edge
    names = {n["name"] for n in data["nodes"]}
    assert names == {"input", "a0", "m0", "a1", "m1", "logits"}
    assert {e["node"] for e in data["edges"] if e["port"]} <= {"a0", "a1"}


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_empty_circuit_and_bad_arguments(scored):
    empty = scored.copy()
    empty.in_graph = torch.zeros_like(empty.valid)
    data = view_data(circuit_graph(empty))
    assert data["edges"] == [] and "empty" in data["notes"][0] and [n["name"] for n in data["nodes"]] == ["logits"]
    with pytest.raises(InputError, match="max_edges"):
        circuit_graph(scored, max_edges=0)
    with pytest.raises(InputTypeError, match="Graph"):
        circuit_graph(scored.scores)


def test_non_finite_scores_embed_as_null(scored):
    circuit = scored.copy().top_k(25)
    s, r = circuit.in_graph.nonzero()[0].tolist()
    circuit.scores[s, r] = float("nan")
    data = view_data(circuit_graph(circuit))
    assert any(e["score"] is None for e in data["edges"])
    nodes = {n["name"]: n for n in data["nodes"]}
    assert nodes[circuit.senders[s]]["score_out"] is None


def test_page_is_self_contained(scored, tmp_path):
    import re

    page = circuit_graph(scored.copy().top_k(25)).save(tmp_path / "c.html").read_text()
    assert not re.search(r"(src|href)\s*=|https?://|@import", page)
    assert page.count("</script>") == 2 and "R.circuit=function(v,sec)" in page
