"""The residual computational graph of a `HookedTransformer`: nodes, edges, edge scores, circuits.

Senders write to the residual stream, receivers read from it, and every sender upstream
of a receiver has an edge into it:

    senders    "input" (the residual entering block 0: token + position embeddings),
               "a{l}.h{h}" (head h's output, `hook_z @ W_O[h]`), "m{l}" (`hook_mlp_out`)
    receivers  "a{l}.h{h}.q" / ".k" / ".v" (`hook_q_input` / `hook_k_input` / `hook_v_input`,
               per query head: grouped K/V are ungrouped so each head has its own k/v input),
               "m{l}" (`hook_mlp_in`), "logits" (the last block's `hook_resid_post`,
               which `ln_final` and the unembedding read)

A mixture of experts is one node `m{l}` (router and experts together: their summed output
`hook_mlp_out`). Where the attention output is normalized after the heads are summed
(Gemma 2/3 `ln1_post`, OLMo-2/3 post-norm blocks), head outputs do not add up to the
layer's write, so the layer is one sender "a{l}" (output `hook_attn_out`, after the norm);
its heads stay separate receivers. Attention biases `b_O` belong to no head: they are
equal in every run and cancel from every difference.

Senders are in forward order and each receiver reads a prefix of them (`n_upstream`), so
scores and circuits are `[n_senders, n_receivers]` matrices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float


def heads_are_senders(cfg) -> bool:
    """True where the attention layer's write is the plain sum of its heads' outputs."""
    return not (cfg.use_normalization_before_and_after or cfg.post_sublayer_norm)


@dataclass
class Graph:
    """Edges between senders and receivers, with scores and the circuit (`in_graph`) chosen from them."""

    senders: list[str]
    receivers: list[str]
    n_upstream: list[int]  # receivers[r] reads senders[: n_upstream[r]]
    receiver_sender: list[int]  # the sender whose output node receivers[r] feeds (-1: logits)
    scores: Float[torch.Tensor, "n_senders n_receivers"] = field(default=None, repr=False)
    in_graph: Bool[torch.Tensor, "n_senders n_receivers"] = field(default=None, repr=False)

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
        cfg = model.cfg
        senders, receivers, n_upstream, receiver_sender = ["input"], [], [], []
        per_head = heads_are_senders(cfg)
        for layer in range(cfg.n_layers):
            before_layer = len(senders)
            heads = [f"a{layer}.h{h}" for h in range(cfg.n_heads)]
            attn_senders = heads if per_head else [f"a{layer}"]
            first_attn = len(senders)
            for kind in "qkv":
                for h, head in enumerate(heads):
                    receivers.append(f"{head}.{kind}")
                    n_upstream.append(before_layer)
                    receiver_sender.append(first_attn + (h if per_head else 0))
            senders.extend(attn_senders)
            if not cfg.attn_only:
                receivers.append(f"m{layer}")
                n_upstream.append(before_layer if cfg.parallel_attn_mlp else len(senders))
                receiver_sender.append(len(senders))
                senders.append(f"m{layer}")
        receivers.append("logits")
        n_upstream.append(len(senders))
        receiver_sender.append(-1)
        return cls(senders, receivers, n_upstream, receiver_sender)

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
        mask = self.in_graph if in_graph_only else self.valid
        s_idx, r_idx = mask.nonzero(as_tuple=True)
        vals = self.scores[s_idx, r_idx]
        order = vals.abs().argsort(descending=True)
        return [(self.senders[s_idx[i]], self.receivers[r_idx[i]], float(vals[i])) for i in order.tolist()]

    def copy(self) -> Graph:
        return Graph(
            list(self.senders), list(self.receivers), list(self.n_upstream), list(self.receiver_sender),
            self.scores.clone(), self.in_graph.clone(),
        )  # fmt: skip

    # -- choosing a circuit ------------------------------------------------------------
    def top_k(self, k: int, absolute: bool = True, prune: bool = True) -> Graph:
        """Keep the `k` edges with the largest (absolute) scores, then (by default) `prune`."""
        scores = self.scores.abs() if absolute else self.scores.clone()
        scores = scores.masked_fill(~self.valid, float("-inf")).flatten()
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep[scores.topk(min(k, self.n_total_edges)).indices] = True
        self.in_graph = keep.view_as(self.valid)
        return self.prune() if prune else self

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
        n_s = len(self.senders)
        receiver_sender = torch.tensor(self.receiver_sender)
        alive = torch.zeros(n_s, dtype=torch.bool)  # sender's output reaches the logits
        receiver_alive = receiver_sender < 0
        for s in range(n_s - 1, -1, -1):
            alive[s] = bool((graph[s] & receiver_alive).any())
            if alive[s]:
                receiver_alive |= receiver_sender == s
        fed = torch.zeros(n_s, dtype=torch.bool)  # sender reached from the input
        fed[0] = True
        for s in range(1, n_s):
            fed[s] = bool(graph[:s, receiver_sender == s][fed[:s]].any())
        self.in_graph = graph & fed[:, None] & receiver_alive[None, :]
        return self

    # -- export ------------------------------------------------------------------------
    def to_json(self, path: str | None = None, in_graph_only: bool = True) -> str:
        """The graph as JSON (`nodes`, `edges` with scores); written to `path` if given."""
        edges = [{"from": s, "to": r, "score": score} for s, r, score in self.edges(in_graph_only)]
        text = json.dumps({"senders": self.senders, "receivers": self.receivers, "edges": edges}, indent=1)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def to_dot(self, path: str | None = None) -> str:
        """The circuit as Graphviz dot: blue edges raise the metric, red ones lower it."""
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
