"""Circuit discovery: attribution patching (AtP, AtP*, IG), edge attribution patching (EAP, EAP-IG),
exact edge patching and faithfulness, and path patching, on the residual graph of any `HookedTransformer`.

    from hooked.circuits import edge_attribution_patching, faithfulness
    graph = edge_attribution_patching(model, clean, corrupted, metric, method="eap-ig", steps=5)
    graph.top_k(200)
    faithfulness(model, graph, clean, corrupted, metric)
    found = smallest_circuit(model, graph, clean, corrupted, metric, target=0.8)  # found.circuit, found.n_edges
    graph.save("scores.json"); Graph.load("scores.json", model)
"""

from hooked.circuits.attribution import attribution_patch
from hooked.circuits.eap import edge_attribution_patching
from hooked.circuits.edge_patching import edge_patching, faithfulness, faithfulness_curve
from hooked.circuits.graph import Graph
from hooked.circuits.path_patching import path_patching
from hooked.circuits.search import CircuitSearch, smallest_circuit

__all__ = [
    "CircuitSearch",
    "Graph",
    "attribution_patch",
    "edge_attribution_patching",
    "edge_patching",
    "faithfulness",
    "faithfulness_curve",
    "path_patching",
    "smallest_circuit",
]
