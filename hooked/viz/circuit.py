"""A circuit as a layered graph: the input at the top, each layer's heads then its MLP, the logits at the bottom.

Drawn as inline SVG by the page's own script (no Graphviz, nothing fetched). Edge width
and opacity grow with |score|; blue edges raise the metric, red ones lower it. Hovering
an edge shows its sender, receiver and score; hovering a node shows the summed scores of
its circuit edges in and out, and lights up those edges.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from hooked.circuits.graph import Graph
from hooked.core.errors import InputError, InputTypeError
from hooked.viz._html import View, register_renderer

MAX_EDGES = 300
_NODE = re.compile(r"a(\d+)(?:\.h(\d+))?$|m(\d+)$")
_HEAD_INPUT = re.compile(r"a(\d+)\.h(\d+)\.q$")


def circuit_graph(graph: Graph, *, max_edges: int = MAX_EDGES, title: str | None = None) -> View:
    """The circuit of `graph` (its `in_graph` edges) as an interactive layered graph.

    With more than `max_edges` edges the largest by |score| are drawn, and a note says so.
    Node scores (shown on hover) sum every circuit edge, drawn or not.
    """
    if not isinstance(graph, Graph):
        raise InputTypeError(f"circuit_graph takes a hooked.circuits.Graph, got {type(graph).__name__}")
    if max_edges < 1:
        raise InputError(f"max_edges must be >= 1, got {max_edges}")
    edges = graph.edges()  # (sender, receiver, score), largest |score| first
    notes = [] if edges else ["the circuit is empty: choose edges with graph.top_k(k) or smallest_circuit(...)"]
    if len(edges) > max_edges:
        notes.append(f"showing the {max_edges} largest of {len(edges)} edges by |score|; raise max_edges to see all")
    shown = edges[:max_edges]
    node_of = _receiver_nodes(graph)
    names = {"logits"} | {s for s, _, _ in shown} | {node_of[r] for _, r, _ in shown}
    layout = _Layout.of(graph)
    data = {
        "kind": "circuit",
        "title": title or f"Circuit: {graph.n_edges} of {graph.n_total_edges} edges",
        "rows": layout.row_labels(),
        "n_cols": layout.n_cols,
        "nodes": [_node(graph, name, node_of, layout) for name in sorted(names, key=layout.position)],
        "edges": [
            {"from": s, "to": r, "node": node_of[r], "port": _port(r), "score": _finite(score)} for s, r, score in shown
        ],
        "n_edges": graph.n_edges,
        "n_total_edges": graph.n_total_edges,
        "notes": notes,
    }
    return View([data], data["title"])


def _finite(x: float) -> float | None:
    """JSON has no NaN or infinity: those scores are embedded as null (shown as n/a)."""
    return x if math.isfinite(x) else None


def _receiver_nodes(graph: Graph) -> dict[str, str]:
    """Each receiver's node: the sender its input feeds (a head, a post-norm layer's attention, an MLP) or "logits"."""
    return {
        r: "logits" if s < 0 else graph.senders[s] for r, s in zip(graph.receivers, graph.receiver_sender, strict=True)
    }


def _port(receiver: str) -> str:
    """ "q", "k" or "v" for a head's inputs, "" for an MLP or the logits."""
    return receiver.rsplit(".", 1)[1] if receiver.count(".") == 2 else ""


@dataclass
class _Layout:
    """Rows: input 0, layer l's attention 1 + 2l, its MLP 2 + 2l, logits last. Columns: head h in
    column h, the MLPs in the last column, the input and logits (and a post-norm layer's attention) centred."""

    n_layers: int
    n_heads: int

    @classmethod
    def of(cls, graph: Graph) -> _Layout:
        if graph.model_shape:
            return cls(graph.model_shape["n_layers"], graph.model_shape["n_heads"])
        heads = [m for m in map(_HEAD_INPUT.match, graph.receivers) if m]  # every head has a q input
        return cls(1 + max(int(m.group(1)) for m in heads), 1 + max(int(m.group(2)) for m in heads))

    @property
    def n_cols(self) -> int:
        return self.n_heads + 1

    def row_labels(self) -> list[str]:
        rows = ["input"]
        for layer in range(self.n_layers):
            rows += [f"layer {layer} attention", f"layer {layer} MLP"]
        return rows + ["logits"]

    def position(self, name: str) -> tuple[int, float]:
        """(row, column) of a node."""
        centre = (self.n_cols - 1) / 2
        if name == "input":
            return 0, centre
        if name == "logits":
            return 2 * self.n_layers + 1, centre
        m = _NODE.match(name)
        if m is None:
            raise ValueError(f"{name!r} is not a node of a circuit graph")
        if m.group(3) is not None:
            return 2 + 2 * int(m.group(3)), self.n_heads
        return 1 + 2 * int(m.group(1)), centre if m.group(2) is None else int(m.group(2))


def _node(graph: Graph, name: str, node_of: dict[str, str], layout: _Layout) -> dict:
    """A node with its place and the summed scores of its circuit edges in and out."""
    circuit = graph.in_graph & graph.valid
    r_idx = [graph.receiver_index[r] for r, node in node_of.items() if node == name]
    s_idx = graph.sender_index.get(name)
    score_in = graph.scores[:, r_idx][circuit[:, r_idx]].double().sum() if r_idx else torch.tensor(0.0)
    score_out = graph.scores[s_idx][circuit[s_idx]].double().sum() if s_idx is not None else torch.tensor(0.0)
    row, col = layout.position(name)
    return {
        "name": name,
        "row": row,
        "col": col,
        "score_in": _finite(float(score_in)),
        "score_out": _finite(float(score_out)),
        "n_in": int(circuit[:, r_idx].sum()) if r_idx else 0,
        "n_out": int(circuit[s_idx].sum()) if s_idx is not None else 0,
    }


_CIRCUIT_CSS = """
.hv svg.circuit{display:block;background:#fff;border:1px solid #eee}
.hv svg.circuit .node rect{fill:#f4f6fa;stroke:#888;stroke-width:1}
.hv svg.circuit .node.hl rect{stroke:#d33;stroke-width:2}
.hv svg.circuit .node text{font-size:10px;font-family:ui-monospace,Menlo,Consolas,monospace;pointer-events:none}
.hv svg.circuit .row-label{font-size:10px;fill:#888}
.hv svg.circuit .edge .hit{stroke:transparent;stroke-width:9;fill:none;pointer-events:stroke}
.hv svg.circuit .edge .line{fill:none;pointer-events:none}
.hv svg.circuit .edge.hl .line{stroke:#f0a000 !important;stroke-opacity:1 !important}
.hv svg.circuit .edge.dim{opacity:.15}
"""

_CIRCUIT_JS = r"""function(v,sec){
  // the HTML parser gives <svg> its namespace: no namespace URL needs to appear in the page
  const holder=document.createElement('div');holder.innerHTML='<svg></svg>';const NS=holder.firstChild.namespaceURI;
  function s(tag,attrs,parent){const e=document.createElementNS(NS,tag);
    for(const k in attrs)e.setAttribute(k,attrs[k]);if(parent)parent.appendChild(e);return e;}
  sec.appendChild(el('div','',
    v.n_edges+' edges in the circuit (of '+v.n_total_edges+
    '); blue raises the metric, red lowers it, width ~ |score|'));
  const info=el('div','info','hover an edge or a node for its score');
  const used=[...new Set(v.nodes.map(n=>n.row))].sort((a,b)=>a-b), rowY={};
  const RH=64, NW=58, NH=22, LEFT=130, TOP=24;
  used.forEach((r,i)=>rowY[r]=TOP+i*RH);
  // head h in column h, MLPs in the last column: an edge skipping rows bends aside instead of crossing nodes
  const COL=NW+14, W=LEFT+Math.max(520,v.n_cols*COL), H=TOP+used.length*RH, step=(W-LEFT)/v.n_cols;
  const svg=s('svg',{class:'circuit',width:W,height:H,viewBox:'0 0 '+W+' '+H});
  const pos={}, rowIndex={};used.forEach((r,i)=>rowIndex[r]=i);
  v.nodes.forEach(n=>{pos[n.name]={x:LEFT+step*(n.col+0.5),y:rowY[n.row],i:rowIndex[n.row]};});
  const centre=LEFT+(W-LEFT)/2;
  used.forEach(r=>{const t=s('text',{class:'row-label',x:6,y:rowY[r]+4},svg);t.textContent=v.rows[r];});
  const m=Math.max(1e-12,...v.edges.map(e=>Math.abs(e.score||0))), PORT={q:-16,k:0,v:16,'':0};
  const edgeEls=[];  // drawn weakest first, so the strongest edges lie on top
  v.edges.map((e,i)=>[e,i]).reverse().forEach(([e,i])=>{
    const a=pos[e.from],b=pos[e.node],sc=e.score||0,w=Math.abs(sc)/m;
    const x1=a.x,y1=a.y+NH/2,x2=b.x+PORT[e.port],y2=b.y-NH/2,ym=(y1+y2)/2;
    const skip=b.i-a.i-1, bend=skip>0?Math.min(step*1.5,10+8*skip)*(x1>centre?-1:1):0;
    const d='M'+x1+' '+y1+' C'+(x1+bend)+' '+ym+','+(x2+bend)+' '+ym+','+x2+' '+y2;
    const g=s('g',{class:'edge','data-from':e.from,'data-to':e.to,'data-index':i},svg);
    s('path',{class:'line',d:d,stroke:sc>=0?'#1e5ac8':'#d23228','stroke-width':(0.75+5*w).toFixed(2),
      'stroke-opacity':(0.3+0.7*w).toFixed(3)},g);
    const hit=s('path',{class:'hit',d:d},g);s('title',{},hit).textContent=e.from+' → '+e.to+': '+sc;
    g.addEventListener('mouseenter',()=>{info.textContent=e.from+' → '+e.to+': score '+fmt(e.score)+' ('+e.score+')';
      highlight(edgeEls,x=>x===g);highlight(nodeEls,x=>x.dataset.name===e.from||x.dataset.name===e.node);});
    edgeEls.push(g);});
  edgeEls.reverse();  // edgeEls[i] draws v.edges[i]
  const nodeEls=[];
  v.nodes.forEach(n=>{const p=pos[n.name];
    const g=s('g',{class:'node','data-name':n.name,transform:'translate('+(p.x-NW/2)+','+(p.y-NH/2)+')'},svg);
    s('rect',{width:NW,height:NH,rx:4},g);
    const t=s('text',{x:NW/2,y:NH/2+4,'text-anchor':'middle'},g);t.textContent=n.name;
    s('title',{},g).textContent=n.name+': in '+n.score_in+', out '+n.score_out;
    g.addEventListener('mouseenter',()=>{
      info.textContent=n.name+': in '+fmt(n.score_in)+' ('+n.n_in+' edges), out '+fmt(n.score_out)+
        ' ('+n.n_out+' edges)';
      highlight(nodeEls,x=>x===g);
      edgeEls.forEach(x=>{const on=x.dataset.from===n.name||v.edges[+x.dataset.index].node===n.name;
        x.classList.toggle('hl',on);x.classList.toggle('dim',!on);});});
    nodeEls.push(g);});
  svg.addEventListener('mouseleave',()=>{edgeEls.forEach(x=>x.classList.remove('hl','dim'));highlight(nodeEls,()=>false);});
  sec.appendChild(info);sec.appendChild(svg);
}"""

register_renderer("circuit", f"R.circuit={_CIRCUIT_JS};", _CIRCUIT_CSS)
