"""Exact edge patching: the full graph is the clean run, the empty graph the corrupted run, on every family."""

import pytest
import torch

from hooked.circuits import Graph, edge_patching, faithfulness, faithfulness_curve
from tests.helpers import last_token_metric, logit_diff, right_padding_mask
from tests.tiny_models import HOOKED_FAMILIES, tiny_hooked, token_pair

torch.set_num_threads(1)
ATOL = 1e-5


def empty(graph: Graph) -> Graph:
    out = graph.copy()
    out.in_graph = torch.zeros_like(out.valid)
    return out


@pytest.mark.parametrize("family", list(HOOKED_FAMILIES))
def test_full_graph_is_clean_and_empty_graph_is_corrupted(family):
    model = tiny_hooked(family)
    clean, corrupted = token_pair()
    graph = Graph.from_model(model)
    with torch.no_grad():
        clean_logits, corrupted_logits = model(clean), model(corrupted)
    assert (clean_logits - corrupted_logits).abs().max() > 1e-2
    torch.testing.assert_close(edge_patching(model, graph, clean, corrupted), clean_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(
        edge_patching(model, empty(graph), clean, corrupted), corrupted_logits, atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa"])
def test_padded_batches(family):
    model = tiny_hooked(family)
    clean, corrupted = token_pair(batch=3, pos=6)
    mask = right_padding_mask(3, 6)
    graph = Graph.from_model(model)
    with torch.no_grad():
        clean_logits = model(clean, attention_mask=mask)
        corrupted_logits = model(corrupted, attention_mask=mask)
    valid = mask.bool()
    full = edge_patching(model, graph, clean, corrupted, attention_mask=mask)
    none = edge_patching(model, empty(graph), clean, corrupted, attention_mask=mask)
    torch.testing.assert_close(full[valid], clean_logits[valid], atol=ATOL, rtol=0)
    torch.testing.assert_close(none[valid], corrupted_logits[valid], atol=ATOL, rtol=0)
    metric = last_token_metric(mask)
    assert faithfulness(model, graph, clean, corrupted, metric, attention_mask=mask) == pytest.approx(1.0, abs=1e-4)


def test_one_removed_edge_equals_a_hand_written_hook():
    # removing a0.h1 -> a1.h2.q: head 2 of layer 1 reads its query from the residual with
    # head (0, 1)'s clean output swapped for its corrupted output; nothing else changes
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair()
    graph = Graph.from_model(model)
    graph.in_graph[graph.sender_index["a0.h1"], graph.receiver_index["a1.h2.q"]] = False
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    W_O = model.blocks[0].attn.W_O[1]  # [d_head, d_model]
    delta = (clean_cache["blocks.0.attn.hook_z"][:, :, 1] - corrupted_cache["blocks.0.attn.hook_z"][:, :, 1]) @ W_O

    def hook(q_input, hook):
        q_input[:, :, 2] -= delta

    model.set_use_split_qkv_input(True)
    try:
        expected = model.run_with_hooks(clean, fwd_hooks=[("blocks.1.hook_q_input", hook)])
    finally:
        model.set_use_split_qkv_input(False)
    torch.testing.assert_close(edge_patching(model, graph, clean, corrupted), expected, atol=ATOL, rtol=0)
    assert (expected - model(clean)).abs().max() > 1e-4


def test_mean_ablation_of_the_empty_graph_gives_the_logits_the_mean_corrupted_residual():
    # every sender's output is its batch mean, so the residual the logits read is the mean one
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair()
    _, cache = model.run_with_cache(corrupted)
    mean_resid = cache["blocks.1.hook_resid_post"].mean(0, keepdim=True).expand(3, -1, -1)  # [batch, pos, d_model]
    with torch.no_grad():
        expected = model.unembed(model.ln_final(mean_resid))
    got = edge_patching(model, empty(Graph.from_model(model)), clean, corrupted, ablation="mean")
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_faithfulness_of_full_and_empty_circuits():
    model = tiny_hooked("llama_gqa")
    clean, corrupted = token_pair()
    graph = Graph.from_model(model)
    assert faithfulness(model, graph, clean, corrupted, logit_diff) == pytest.approx(1.0, abs=1e-4)
    assert faithfulness(model, empty(graph), clean, corrupted, logit_diff) == pytest.approx(0.0, abs=1e-4)
    assert model.cfg.use_split_qkv_input is False and model.cfg.use_hook_mlp_in is False  # flags restored


def test_faithfulness_curve_matches_faithfulness_of_each_circuit():
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair()
    graph = Graph.from_model(model)
    graph.scores = torch.randn(graph.scores.shape, generator=torch.Generator().manual_seed(0))
    curve = faithfulness_curve(model, graph, clean, corrupted, logit_diff, [10, 40, graph.n_total_edges])
    for (n, f), k in zip(curve, [10, 40, graph.n_total_edges], strict=True):
        circuit = graph.copy().top_k(k)
        assert n == circuit.n_edges
        assert f == pytest.approx(faithfulness(model, circuit, clean, corrupted, logit_diff), abs=1e-6)
    assert curve[-1][1] == pytest.approx(1.0, abs=1e-4)
