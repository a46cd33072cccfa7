"""The residual graph: nodes and edges per family, circuit selection, pruning (exact), export."""

import json

import pytest
import torch

from hooked.circuits import Graph, edge_patching
from hooked.core.errors import InputError
from tests.tiny_models import tiny_hooked, token_pair

torch.set_num_threads(1)


def test_nodes_and_edges_of_a_sequential_model():
    graph = Graph.from_model(tiny_hooked("gpt2"))  # 2 layers, 4 heads
    assert graph.senders == ["input"] + [f"a0.h{h}" for h in range(4)] + ["m0"] + [f"a1.h{h}" for h in range(4)] + [
        "m1"
    ]
    assert len(graph.receivers) == 2 * (3 * 4 + 1) + 1 and graph.receivers[-1] == "logits"
    # layer-0 q/k/v read the input (12), m0 input + 4 heads (5), layer-1 q/k/v 6 senders (72), m1 10, logits 11
    assert graph.n_total_edges == 12 + 5 + 72 + 10 + 11 == graph.n_edges
    assert graph.valid[graph.sender_index["a0.h2"], graph.receiver_index["m0"]]
    assert not graph.valid[graph.sender_index["m0"], graph.receiver_index["a0.h1.k"]]


def test_parallel_blocks_have_no_edge_from_a_layers_heads_to_its_mlp():
    graph = Graph.from_model(tiny_hooked("neox_parallel"))
    assert not graph.valid[graph.sender_index["a0.h2"], graph.receiver_index["m0"]]
    assert graph.valid[graph.sender_index["a0.h2"], graph.receiver_index["m1"]]


@pytest.mark.parametrize("family", ["gemma_post_norm", "olmo2_post_norm"])
def test_post_norm_attention_is_one_sender_per_layer(family):
    graph = Graph.from_model(tiny_hooked(family))
    assert graph.senders == ["input", "a0", "m0", "a1", "m1"]
    assert "a1.h3.q" in graph.receiver_index  # heads still receive separately


def test_prune_keeps_only_paths_from_input_to_logits():
    graph = Graph.from_model(tiny_hooked("gpt2"))
    chain = [("input", "a0.h1.v"), ("a0.h1", "a1.h2.q"), ("a1.h2", "logits")]
    graph.set_edges(chain + [("m0", "logits"), ("input", "a1.h0.k")], prune=True)
    # m0 has no input edge (it outputs its corrupted value), a1.h0 reaches no logit
    assert sorted((s, r) for s, r, _ in graph.edges()) == sorted(chain)
    graph.set_edges([("a0.h1", "a1.h2.q"), ("a1.h2", "logits")], prune=True)
    assert graph.n_edges == 0


def test_pruning_does_not_change_edge_patching():
    model = tiny_hooked("llama_gqa")
    clean, corrupted = token_pair()
    graph = Graph.from_model(model)
    graph.scores = torch.randn(graph.scores.shape, generator=torch.Generator().manual_seed(0))
    unpruned = graph.copy().top_k(25, prune=False)
    pruned = graph.copy().top_k(25)
    assert pruned.n_edges < unpruned.n_edges == 25
    torch.testing.assert_close(
        edge_patching(model, pruned, clean, corrupted),
        edge_patching(model, unpruned, clean, corrupted),
        atol=1e-5,
        rtol=0,
    )


def test_top_k_and_threshold_select_by_absolute_score():
    graph = Graph.from_model(tiny_hooked("gpt2"))
    graph.scores = torch.randn(graph.scores.shape, generator=torch.Generator().manual_seed(1))
    graph.top_k(graph.n_total_edges, prune=False)
    assert graph.n_edges == graph.n_total_edges
    graph.top_k(10, prune=False)
    kept = graph.scores[graph.in_graph].abs()
    assert len(kept) == 10 and kept.min() >= graph.scores[graph.valid & ~graph.in_graph].abs().max()
    graph.threshold(1.5, prune=False)
    assert (graph.scores[graph.in_graph].abs() >= 1.5).all()
    assert (graph.scores[graph.valid & ~graph.in_graph].abs() < 1.5).all()


def test_json_and_dot_export(tmp_path):
    graph = Graph.from_model(tiny_hooked("gpt2"))
    graph.scores[graph.valid] = 1.0
    graph.set_edges([("input", "a0.h1.v"), ("a0.h1", "a1.h2.q"), ("a1.h2", "logits")])
    data = json.loads(graph.to_json(tmp_path / "g.json"))
    assert {(e["from"], e["to"]) for e in data["edges"]} == {
        ("input", "a0.h1.v"),
        ("a0.h1", "a1.h2.q"),
        ("a1.h2", "logits"),
    }
    assert json.loads((tmp_path / "g.json").read_text()) == data
    dot = graph.to_dot()
    assert dot.startswith("digraph") and '"a0.h1" -> "a1.h2" [color=blue label="q"' in dot
    with pytest.raises(ValueError, match="not upstream"):
        graph.set_edges([("m1", "a0.h0.q")])


def scored_circuit(family: str = "gpt2"):
    """A graph of `family` with random scores and a pruned top-20 circuit."""
    model = tiny_hooked(family)
    graph = Graph.from_model(model)
    graph.scores = torch.randn(graph.scores.shape, generator=torch.Generator().manual_seed(0)) * graph.valid
    return model, graph.top_k(20)


@pytest.mark.parametrize("family", ["gpt2", "gemma_post_norm", "attn_only_shortformer", "neox_parallel"])
def test_save_and_load_round_trip_exactly(tmp_path, family):
    model, graph = scored_circuit(family)
    for loaded in (Graph.load(graph.save(tmp_path / "g.json")), Graph.load(tmp_path / "g.json", model)):
        assert loaded.senders == graph.senders and loaded.receivers == graph.receivers
        assert loaded.n_upstream == graph.n_upstream and loaded.receiver_sender == graph.receiver_sender
        assert torch.equal(loaded.scores, graph.scores) and loaded.scores.dtype == graph.scores.dtype
        assert torch.equal(loaded.in_graph, graph.in_graph)
        assert loaded.model_shape == graph.model_shape
    assert Graph.from_json(graph.to_json(in_graph_only=False)).edges() == graph.edges()


def test_to_json_lists_only_the_circuits_nodes_by_default():
    _, graph = scored_circuit()
    data = json.loads(graph.to_json())
    senders = {e["from"] for e in data["edges"]}
    receivers = {e["to"] for e in data["edges"]}
    assert set(data["senders"]) == senders and set(data["receivers"]) == receivers
    assert len(data["edges"]) == graph.n_edges == data["n_edges"] < data["n_total_edges"]
    assert len(data["senders"]) < len(graph.senders) and len(data["receivers"]) < len(graph.receivers)
    everything = json.loads(graph.to_json(in_graph_only=False))
    assert everything["senders"] == graph.senders and everything["receivers"] == graph.receivers
    assert len(everything["edges"]) == graph.n_total_edges
    assert sum(e["in_graph"] for e in everything["edges"]) == graph.n_edges


def test_circuit_only_file_reloads_the_circuit_and_warns_about_missing_scores(caplog):
    _, graph = scored_circuit()
    with caplog.at_level("WARNING", logger="hooked.circuits.graph"):
        loaded = Graph.from_json(graph.to_json())
    assert torch.equal(loaded.in_graph, graph.in_graph)
    assert torch.equal(loaded.scores[graph.in_graph], graph.scores[graph.in_graph])
    assert (loaded.scores[~graph.in_graph] == 0).all()
    assert f"other {graph.n_total_edges - graph.n_edges} edges' scores were not saved" in caplog.text


def test_loading_against_another_model_shape_is_refused(tmp_path):
    from hooked.core.errors import GraphMismatchError

    _, graph = scored_circuit("gpt2")
    path = graph.save(tmp_path / "g.json")
    with pytest.raises(GraphMismatchError, match=r"n_layers=2 \(model: 3\)"):
        Graph.load(path, tiny_hooked("gpt2", n_layers=3))
    with pytest.raises(GraphMismatchError, match="heads_are_senders=True"):
        Graph.load(path, tiny_hooked("gemma_post_norm"))
    with pytest.raises(InputError, match="not a saved hooked Graph"):
        Graph.from_json(json.dumps({"edges": []}))
    data = json.loads(graph.to_json())
    data["edges"][0]["to"] = "a9.h0.q"
    with pytest.raises(GraphMismatchError, match="a9.h0.q"):
        Graph.from_json(json.dumps(data))


def test_same_shape_other_name_loads_with_a_warning(tmp_path, caplog):
    _, graph = scored_circuit()
    path = graph.save(tmp_path / "g.json")
    other = tiny_hooked("gpt2", model_name="another-model")
    with caplog.at_level("WARNING", logger="hooked.circuits.graph"):
        loaded = Graph.load(path, other)
    assert torch.equal(loaded.scores, graph.scores) and "'another-model'" in caplog.text


def test_to_dot_to_an_image_path_points_to_graphviz_and_the_view(tmp_path):
    _, graph = scored_circuit()
    with pytest.raises(InputError, match=r"Graphviz \(optional.*circuit_graph"):
        graph.to_dot(tmp_path / "circuit.svg")
    assert not (tmp_path / "circuit.svg").exists()
    assert graph.to_dot(tmp_path / "circuit.dot") == (tmp_path / "circuit.dot").read_text()
