"""The residual computational graph of a `HookedTransformer`: nodes, edges, edge scores, circuits.

Senders write to the residual stream, receivers read from it, and every sender upstream
of a receiver has an edge into it:

    senders    "input" (the residual entering block 0: token + position embeddings),
               "a{l}.h{h}" (head h's output, `hook_z @ W_O[h]`), "m{l}" (`hook_mlp_out`)
    receivers  "a{l}.h{h}.q" / ".k" / ".v" (`hook_q_input` / `hook_k_input` / `hook_v_input`,
               per query head: grouped K/V are ungrouped so each head has its own k/v input),
               "m{l}" (`hook_mlp_in`), "logits" (the last block's `hook_resid_post`,
               which `ln_final` and the unembedding read)

A recurrent layer of a state-space or hybrid model (Mamba, gated DeltaNet, LFM2's short convolution)
is one node "r{l}": a receiver reading `hook_mixer_in` and a sender writing `hook_mixer_out`.
A mixture of experts is one node `m{l}` (router and experts together: their summed output
`hook_mlp_out`). Where the attention output is normalized after the heads are summed
(Gemma 2/3 `ln1_post`, OLMo-2/3 post-norm blocks), head outputs do not add up to the
layer's write, so the layer is one sender "a{l}" (output `hook_attn_out`, after the norm);
its heads stay separate receivers. Attention biases `b_O` belong to no head: they are
equal in every run and cancel from every difference.

Senders are in forward order and each receiver reads a prefix of them (`n_upstream`), so
scores and circuits are `[n_senders, n_receivers]` matrices.

A graph depends on the model only through its shape (`model_shape`: layers, heads, width,
block layout), so a saved graph (`save` / `to_json`) reloads without the model
(`Graph.load` / `Graph.from_json`), and is checked against a model when one is given.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from jaxtyping import Bool, Float

from hooked.core.errors import GraphMismatchError, InputError

logger = logging.getLogger(__name__)
FORMAT = "hooked.circuits.Graph"
FORMAT_VERSION = 1
IMAGE_SUFFIXES = (".svg", ".png", ".pdf", ".jpg", ".jpeg", ".html")
#: the config fields that fix a graph's nodes and edges (`model_name` is recorded but only warned about)
SHAPE_FIELDS = ("n_layers", "n_heads", "d_model", "attn_only", "parallel_attn_mlp", "heads_are_senders")
#: what fixes the nodes of a state-space or hybrid model (recorded only for them, so older files still load)
HYBRID_FIELDS = ("layer_types", "single_sublayer_blocks")


def heads_are_senders(cfg) -> bool:
    """True where the attention layer's write is the plain sum of its heads' outputs (no norm follows it)."""
    return not cfg.has_post_sublayer_norms


def model_shape(cfg) -> dict:
    """What a graph's nodes and edges depend on, plus the model's name: a JSON-able dict."""
    shape = {f: getattr(cfg, f) for f in SHAPE_FIELDS if f != "heads_are_senders"}
    shape["heads_are_senders"] = heads_are_senders(cfg)
    hybrid = {}
    if getattr(cfg, "layer_types", None) is not None:
        hybrid = dict(layer_types=list(cfg.layer_types), single_sublayer_blocks=cfg.single_sublayer_blocks)
    return {**{f: shape[f] for f in SHAPE_FIELDS}, **hybrid, "model_name": getattr(cfg, "model_name", None)}


def block_nodes(shape, layer: int) -> tuple[str, bool]:
    """`(token mixer kind, has an MLP)` of block `layer` of a model of this shape (a namespace of `model_shape`)."""
    kinds = getattr(shape, "layer_types", None)
    kind = "attention" if kinds is None else kinds[layer]
    single = getattr(shape, "single_sublayer_blocks", False)
    return kind, not shape.attn_only and (kind == "mlp" if single else True)


@dataclass
class Graph:
    """Edges between senders and receivers, with scores and the circuit (`in_graph`) chosen from them."""

    senders: list[str]
    receivers: list[str]
    n_upstream: list[int]  # receivers[r] reads senders[: n_upstream[r]]
    receiver_sender: list[int]  # the sender whose output node receivers[r] feeds (-1: logits)
    # None (the default) is replaced in __post_init__: zero scores, every edge in the graph
    scores: Float[torch.Tensor, "n_senders n_receivers"] = field(default=None, repr=False)  # pyright: ignore[reportAssignmentType]
    in_graph: Bool[torch.Tensor, "n_senders n_receivers"] = field(default=None, repr=False)  # pyright: ignore[reportAssignmentType]
    model_shape: dict | None = field(default=None, repr=False)  # `model_shape(cfg)` of the model it was made for

    def __post_init__(self) -> None:
        n_s, n_r = len(self.senders), len(self.receivers)
        upstream = torch.tensor(self.n_upstream)
        self.valid = torch.arange(n_s)[:, None] < upstream[None, :]  # [n_senders, n_receivers]
        if self.scores is None:
            self.scores = torch.zeros(n_s, n_r)
        if self.in_graph is None:
            self.in_graph = self.valid.clone()
        self.sender_index = {name: i for i, name in enumerate(self.senders)}
        self.receiver_index = {name: i for i, name in enumerate(self.receivers)}

    @classmethod
    def from_model(cls, model) -> Graph:
        """The full graph of `model` (every edge in the circuit, scores zero)."""
        return cls._from_shape(model_shape(model.cfg))

    @classmethod
    def _from_shape(cls, shape: dict) -> Graph:
        cfg = SimpleNamespace(**shape)
        senders, receivers, n_upstream, receiver_sender = ["input"], [], [], []
        per_head = cfg.heads_are_senders
        for layer in range(cfg.n_layers):
            before_layer = len(senders)
            mixer, has_mlp = block_nodes(cfg, layer)
            heads = [f"a{layer}.h{h}" for h in range(cfg.n_heads)] if mixer == "attention" else []
            attn_senders = heads if per_head else [f"a{layer}"]
            first_attn = len(senders)
            for kind in "qkv":
                for h, head in enumerate(heads):
                    receivers.append(f"{head}.{kind}")
                    n_upstream.append(before_layer)
                    receiver_sender.append(first_attn + (h if per_head else 0))
            if heads:
                senders.extend(attn_senders)
            elif mixer != "mlp":  # a recurrent layer: one node, its mixer (input and output)
                receivers.append(f"r{layer}")
                n_upstream.append(before_layer)
                receiver_sender.append(len(senders))
                senders.append(f"r{layer}")
            if has_mlp:
                receivers.append(f"m{layer}")
                n_upstream.append(before_layer if cfg.parallel_attn_mlp else len(senders))
                receiver_sender.append(len(senders))
                senders.append(f"m{layer}")
        receivers.append("logits")
        n_upstream.append(len(senders))
        receiver_sender.append(-1)
        return cls(senders, receivers, n_upstream, receiver_sender, model_shape=dict(shape))

    # -- sizes and listing -------------------------------------------------------------
    @property
    def n_edges(self) -> int:
        """Edges in the circuit."""
        return int(self.in_graph.sum())

    @property
    def n_total_edges(self) -> int:
        """Edges in the full graph."""
        return int(self.valid.sum())

    def edges(self, in_graph_only: bool = True) -> list[tuple[str, str, float]]:
        """`(sender, receiver, score)` triples sorted by |score|, largest first."""
        s_list, r_list, v_list, _ = self._edge_lists(in_graph_only)
        return [(self.senders[s], self.receivers[r], v) for s, r, v in zip(s_list, r_list, v_list, strict=True)]

    def _edge_lists(self, in_graph_only: bool) -> tuple[list[int], list[int], list[float], list[bool]]:
        """Sender and receiver indices, scores and in-circuit flags of the edges, largest |score| first."""
        mask = self.in_graph & self.valid if in_graph_only else self.valid
        s_idx, r_idx = mask.nonzero(as_tuple=True)
        vals = self.scores[s_idx, r_idx]
        order = vals.abs().argsort(descending=True, stable=True)
        s_idx, r_idx = s_idx[order], r_idx[order]
        return s_idx.tolist(), r_idx.tolist(), vals[order].tolist(), self.in_graph[s_idx, r_idx].tolist()

    def copy(self) -> Graph:
        return Graph(
            list(self.senders), list(self.receivers), list(self.n_upstream), list(self.receiver_sender),
            self.scores.clone(), self.in_graph.clone(), None if self.model_shape is None else dict(self.model_shape),
        )  # fmt: skip

    # -- choosing a circuit ------------------------------------------------------------
    def top_k(self, k: int, absolute: bool = True, prune: bool = True) -> Graph:
        """Keep the `k` edges with the largest (absolute) scores, then (by default) `prune`.

        Ties are broken by position (`edge_order`), so the top-`k` circuits are nested as `k` grows.
        """
        keep = torch.zeros(self.valid.numel(), dtype=torch.bool)
        keep[self.edge_order(absolute)[:k]] = True
        self.in_graph = keep.view_as(self.valid)
        return self.prune() if prune else self

    def edge_order(self, absolute: bool = True) -> torch.Tensor:
        """Flat indices of the graph's edges, highest (absolute) score first, ties in index order."""
        scores = self.scores.abs() if absolute else self.scores.clone()
        scores = scores.masked_fill(~self.valid, float("-inf")).flatten()
        return scores.argsort(descending=True, stable=True)[: self.n_total_edges]

    def threshold(self, t: float, absolute: bool = True, prune: bool = True) -> Graph:
        """Keep edges whose (absolute) score is at least `t`, then (by default) `prune`."""
        scores = self.scores.abs() if absolute else self.scores
        self.in_graph = self.valid & (scores >= t)
        return self.prune() if prune else self

    def set_edges(self, edges: list[tuple[str, str]], prune: bool = False) -> Graph:
        """The circuit made of exactly these `(sender, receiver)` edges."""
        self.in_graph = torch.zeros_like(self.valid)
        for sender, receiver in edges:
            s, r = self.sender_index[sender], self.receiver_index[receiver]
            if not self.valid[s, r]:
                raise ValueError(f"{sender} -> {receiver} is not an edge: {sender} is not upstream of {receiver}")
            self.in_graph[s, r] = True
        return self.prune() if prune else self

    def prune(self) -> Graph:
        """Drop edges not on a path from "input" to "logits".

        Exact for edge patching: a node none of whose inputs is in the circuit outputs
        its corrupted value, so its outgoing edges change nothing; an edge into a node
        whose output reaches no logit changes nothing either.
        """
        graph = self.in_graph & self.valid
        edges = graph.cpu().numpy()  # [n_senders, n_receivers]; numpy: a few hundred tiny steps, no per-op overhead
        n_s = len(self.senders)
        receiver_sender = np.asarray(self.receiver_sender)
        feeds = [np.flatnonzero(receiver_sender == s) for s in range(n_s)]  # receivers whose input is sender s's
        receiver_alive = receiver_sender < 0  # receiver's node reaches the logits
        for s in range(n_s - 1, -1, -1):
            if (edges[s] & receiver_alive).any():  # sender s's output reaches the logits
                receiver_alive[feeds[s]] = True
        fed = np.zeros(n_s, dtype=bool)  # sender reached from the input
        fed[0] = True
        for s in range(1, n_s):
            fed[s] = (edges[:s, feeds[s]] & fed[:s, None]).any()  # [s, receivers of s]
        fed, receiver_alive = torch.from_numpy(fed).to(graph.device), torch.from_numpy(receiver_alive).to(graph.device)
        self.in_graph = graph & fed[:, None] & receiver_alive[None, :]
        return self

    # -- saving and loading --------------------------------------------------------------
    def circuit_nodes(self) -> tuple[list[str], list[str]]:
        """The senders with an edge out of the circuit and the receivers with an edge into it."""
        graph = self.in_graph & self.valid
        senders = [self.senders[i] for i in graph.any(1).nonzero()[:, 0].tolist()]
        receivers = [self.receivers[i] for i in graph.any(0).nonzero()[:, 0].tolist()]
        return senders, receivers

    def to_json(self, path: str | Path | None = None, in_graph_only: bool = True) -> str:
        """The graph as JSON, written to `path` if given; `Graph.from_json` reads it back.

        By default only the circuit: its nodes and its edges with their scores (a small,
        readable file). `in_graph_only=False` keeps every node and every edge, each with its
        score and `in_graph` flag, so the reloaded graph equals this one exactly (what `save` does).
        """
        edges = []
        for s, r, score, flag in zip(*self._edge_lists(in_graph_only), strict=True):
            edge = {"from": self.senders[s], "to": self.receivers[r], "score": score}
            if not in_graph_only:
                edge["in_graph"] = flag
            edges.append(edge)
        senders, receivers = self.circuit_nodes() if in_graph_only else (self.senders, self.receivers)
        data = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "model": self.model_shape,
            "scores": "circuit" if in_graph_only else "all",
            "n_edges": self.n_edges,
            "n_total_edges": self.n_total_edges,
            "senders": senders,
            "receivers": receivers,
            "edges": edges,
        }
        text = json.dumps(data, indent=None if len(edges) > 10_000 else 1)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    def save(self, path: str | Path) -> Path:
        """Write every score and the circuit to `path` (JSON): `Graph.load(path)` gives this graph back exactly."""
        self.to_json(path, in_graph_only=False)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, model=None) -> Graph:
        """The graph saved at `path` (by `save` or `to_json`); see `from_json` for `model`."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"), model)

    @classmethod
    def from_json(cls, text: str, model=None) -> Graph:
        """The graph written by `to_json`: its scores and circuit, on the nodes of the model it was made for.

        Given `model`, the graph must have been made for a model of the same shape (else
        `GraphMismatchError`). A circuit-only file (`to_json()`'s default) has no scores for
        the edges outside the circuit: they load as 0, and a warning says so.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError("not a saved hooked Graph: write it with graph.save(path) or graph.to_json(path)")
        if data["version"] > FORMAT_VERSION:
            raise InputError(
                f"graph file version {data['version']} is newer than this hooked ({FORMAT_VERSION}): upgrade hooked"
            )
        shape = data["model"]
        if shape is None:
            raise InputError("this graph was not made by Graph.from_model, so its nodes cannot be rebuilt")
        if model is not None:
            _check_shape(shape, model_shape(model.cfg))
        graph = cls._from_shape(shape)
        edges = data["edges"]
        s, r = graph._edge_indices([e["from"] for e in edges], [e["to"] for e in edges])
        graph.scores[s, r] = torch.tensor([e["score"] for e in edges], dtype=torch.float64).to(graph.scores.dtype)
        graph.in_graph = torch.zeros_like(graph.valid)
        graph.in_graph[s, r] = torch.tensor([bool(e.get("in_graph", True)) for e in edges], dtype=torch.bool)
        if data["scores"] == "circuit" and graph.n_total_edges > len(data["edges"]):
            logger.warning(
                "the graph file holds only the circuit's %d edges: the other %d edges' scores were not saved "
                "and load as 0 (save every score with graph.save(path))",
                len(data["edges"]), graph.n_total_edges - len(data["edges"]),
            )  # fmt: skip
        return graph

    def _edge_indices(self, senders: list[str], receivers: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sender and receiver indices of named edges; every one must be an edge of this graph."""
        s = torch.tensor([self.sender_index.get(name, -1) for name in senders], dtype=torch.long)
        r = torch.tensor([self.receiver_index.get(name, -1) for name in receivers], dtype=torch.long)
        ok = (s >= 0) & (r >= 0)
        ok[ok.clone()] = self.valid[s[ok], r[ok]]
        if not ok.all():
            bad = int((~ok).nonzero()[0])
            raise GraphMismatchError(
                f"the graph file names an edge {senders[bad]} -> {receivers[bad]} that its model's graph does not "
                "have: the file is damaged or was edited"
            )
        return s, r

    # -- export ------------------------------------------------------------------------
    def to_dot(self, path: str | Path | None = None) -> str:
        """The circuit as Graphviz dot text: blue edges raise the metric, red ones lower it.

        This writes text only. Drawing it needs Graphviz (`dot -Tsvg circuit.dot`), which is
        optional and not installed with hooked; `hooked.viz.circuit_graph(graph)` draws the
        circuit without it (an offline HTML page: `.save("circuit.html")`).
        """
        if path is not None and Path(path).suffix.lower() in IMAGE_SUFFIXES:
            raise InputError(
                f"to_dot writes Graphviz dot text, not an image ({path}): write circuit.dot and render it with "
                "Graphviz (optional, not installed with hooked: dot -Tsvg circuit.dot -o circuit.svg), or draw it "
                "without Graphviz: hooked.viz.circuit_graph(graph).save('circuit.html')"
            )
        lines = ["digraph circuit {", "  rankdir=BT;", "  node [shape=box, fontsize=10];"]
        for s, r, score in self.edges():
            target = r.rsplit(".", 1)[0] if r.count(".") == 2 else r
            label = f' label="{r.rsplit(".", 1)[1]}"' if r.count(".") == 2 else ""
            color = "blue" if score >= 0 else "red"
            lines.append(f'  "{s}" -> "{target}" [color={color}{label}, tooltip="{score:.4g}"];')
        lines.append("}")
        text = "\n".join(lines)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text


def _check_shape(saved: dict, current: dict) -> None:
    """A graph saved for one model must not be loaded against another's nodes."""
    fields = SHAPE_FIELDS + HYBRID_FIELDS
    diff = [f"{f}={saved.get(f)!r} (model: {current.get(f)!r})" for f in fields if saved.get(f) != current.get(f)]
    if diff:
        raise GraphMismatchError(
            f"the graph was made for {saved.get('model_name')!r} and the model is {current['model_name']!r}, "
            f"of another shape: {', '.join(diff)}. Load it with the model it was scored on "
            "(or without a model: Graph.load(path))"
        )
    if saved.get("model_name") != current["model_name"]:
        logger.warning(
            "the graph was made for %r and is loaded against %r (same shape: the nodes line up)",
            saved.get("model_name"), current["model_name"],
        )  # fmt: skip
