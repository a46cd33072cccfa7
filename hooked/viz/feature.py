"""A feature dashboard: the top-activating contexts of a direction or an SAE latent over a harvested dataset.

What SAE-Vis and Neuronpedia show for a latent, as one offline page: the activation histogram and
the contexts (from `hooked harvest` / `ActivationReader`) where the feature fires most, each drawn
as a window of tokens around its maximum, coloured by the feature's activation on every token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
from jaxtyping import Float

from hooked.core.errors import InputError, InputTypeError
from hooked.viz._common import floats
from hooked.viz._html import View, register_renderer

FeatureFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SAELatent:
    """One latent of an SAE encoder: `ReLU((x - b_dec) @ W_enc[:, index] + b_enc[index])` (SAELens's StandardSAE;
    leave `b_dec` None for an encoder that does not subtract it). `threshold` makes it JumpReLU (zero below)."""

    W_enc: Float[torch.Tensor, "d_in d_sae"]
    b_enc: Float[torch.Tensor, "d_sae"]
    index: int
    b_dec: Float[torch.Tensor, "d_in"] | None = None
    threshold: float | None = None

    def __call__(self, x: Float[torch.Tensor, "rows d_in"]) -> Float[torch.Tensor, "rows"]:
        if self.b_dec is not None:
            x = x - self.b_dec.to(x)
        pre = x @ self.W_enc[:, self.index].to(x) + self.b_enc[self.index].to(x)
        if self.threshold is not None:
            return torch.where(pre > self.threshold, pre, torch.zeros_like(pre))
        return pre.relu()


@dataclass
class DashboardOptions:
    """How much the dashboard shows: `top_k` contexts (one example per context), each as the `left` tokens before
    its maximum and the `right` after; `bins` histogram bars; rows read `batch_size` at a time."""

    top_k: int = 20
    left: int = 16
    right: int = 4
    bins: int = 40
    batch_size: int = 8192


def feature_dashboard(
    reader,
    hook: str,
    feature: Float[torch.Tensor, "d"] | SAELatent | tuple | FeatureFn,
    model_or_tokenizer=None,
    *,
    options: DashboardOptions | None = None,
    title: str | None = None,
) -> View:
    """Top-activating contexts and the activation histogram of `feature` on `hook`'s rows in `reader`.

    `feature` is a `[d]` direction (activation = row @ direction), an `SAELatent` (or a tuple
    `(W_enc, b_enc, index)`), or a callable from `[rows, *row_shape]` float32 rows to `[rows]` activations.
    `model_or_tokenizer` (a HookedTransformer, a HF tokenizer, or a callable from ids to strings) labels the
    tokens; without it they show as `#id`. Holds one activation and one context id per row in memory.
    """
    options = options or DashboardOptions()
    _check(reader, hook, options)
    fn, what = _feature_fn(feature, reader.row_shape(hook))
    acts, contexts = _activations(reader, hook, fn, options.batch_size)  # [rows] each
    rows = _top_rows(acts, contexts, options.top_k, reader.manifest["identity"]["context_length"])
    examples = _examples(reader, hook, fn, rows, acts, options, _labeller(model_or_tokenizer))
    data = {
        "kind": "feature",
        "title": title or f"Feature dashboard: {what} on {hook}",
        "hook": hook,
        "feature": what,
        "n_rows": int(acts.numel()),
        "max": float(acts.max()),
        "min": float(acts.min()),
        "density": float((acts > 0).float().mean()),
        "histogram": _histogram(acts, options.bins),
        "examples": examples,
        "notes": [],
    }
    return View([data], data["title"])


def _check(reader, hook: str, options: DashboardOptions) -> None:
    if hook not in reader.hooks:
        raise InputError(f"Unknown hook {hook!r}: this harvest holds {reader.hooks}.")
    if len(reader) == 0:
        raise InputError(f"The harvest in {reader.out} has no rows yet: run (or finish) `hooked harvest` first.")
    for name in ("top_k", "bins", "batch_size"):
        if getattr(options, name) < 1:
            raise InputError(f"DashboardOptions.{name}={getattr(options, name)} must be >= 1.")
    if options.left < 0 or options.right < 0:
        raise InputError(f"DashboardOptions left={options.left}, right={options.right} must be >= 0.")


def _feature_fn(feature, row_shape: tuple[int, ...]) -> tuple[FeatureFn, str]:
    """The feature as a function of `[rows, *row_shape]` rows, and its name on the page."""
    if isinstance(feature, tuple) and len(feature) == 3:
        feature = SAELatent(*feature)
    if isinstance(feature, SAELatent):
        d_in = feature.W_enc.shape[0]
        if feature.W_enc.ndim != 2 or (d_in,) != row_shape or not 0 <= feature.index < feature.W_enc.shape[1]:
            raise InputError(
                f"SAELatent: W_enc {tuple(feature.W_enc.shape)} must be [d_in={row_shape}, d_sae] and "
                f"index {feature.index} within d_sae; harvest the hook the SAE was trained on."
            )
        return feature, f"SAE latent {feature.index}"
    if isinstance(feature, torch.Tensor):
        if tuple(feature.shape) != row_shape or len(row_shape) != 1:
            raise InputError(
                f"A direction must be [d] with d = the hook's row shape {row_shape}; got "
                f"{tuple(feature.shape)}. For other hooks pass a callable."
            )
        direction = feature.detach().float().cpu()
        return (lambda x: x @ direction), "direction"
    if callable(feature):
        return cast(FeatureFn, feature), getattr(feature, "__name__", "feature").replace("<lambda>", "feature")
    raise InputTypeError(
        f"feature must be a [d] tensor, an SAELatent, (W_enc, b_enc, index) or a callable; got "
        f"{type(feature).__name__}."
    )


def _apply(fn: FeatureFn, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = torch.as_tensor(fn(x.float())).float().reshape(-1)
    if out.shape[0] != x.shape[0]:
        raise InputError(
            f"The feature function returned {out.shape[0]} values for {x.shape[0]} rows: return one "
            f"activation per row ([rows])."
        )
    return out.cpu()


def _activations(reader, hook: str, fn: FeatureFn, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The feature's activation and the context id of every row, in stored order."""
    acts, contexts = [], []
    for batch in reader.batches(batch_size, [hook, "context_index"]):
        acts.append(_apply(fn, batch[hook]))
        contexts.append(batch["context_index"])
    return torch.cat(acts), torch.cat(contexts)


def _top_rows(acts: torch.Tensor, contexts: torch.Tensor, k: int, context_length: int) -> list[int]:
    """The `k` rows of highest activation (ties: the earlier row), at most one per context (a context
    has <= context_length rows, so the top k * context_length rows always hold k distinct contexts
    when there are that many)."""
    order = torch.sort(acts, descending=True, stable=True).indices[: k * context_length]  # ties: earlier row first
    rows, seen = [], set()
    for r in order.tolist():
        c = int(contexts[r])
        if c not in seen:
            seen.add(c)
            rows.append(r)
            if len(rows) == k:
                break
    return rows


def _examples(reader, hook, fn, rows: list[int], acts, options: DashboardOptions, label) -> list[dict]:
    """Each top row's window of tokens in its context (contexts never span shards), with the feature on each.
    Rows are visited shard by shard, so each shard is read once; the result keeps the rows' order."""
    starts = torch.tensor([0] + [s["rows"] for s in reader.shards]).cumsum(0)  # [shards + 1]: first row of each
    shard_of = {r: int(torch.searchsorted(starts, torch.tensor(r), right=True)) - 1 for r in rows}
    found: dict[int, dict] = {}
    for s in sorted(set(shard_of.values())):
        shard = reader.read_shard(s, [hook, "tokens", "context_index", "pos_index", "doc_index"])
        for r in (r for r in rows if shard_of[r] == s):
            found[r] = _window(shard, r, r - int(starts[s]), hook, fn, options, label)
            found[r]["value"] = float(acts[r])
    return [found[r] for r in rows]


def _window(shard: dict, row: int, local: int, hook: str, fn, options: DashboardOptions, label) -> dict:
    """The rows of `local`'s context from `left` positions before it to `right` after, and the feature on them."""
    pos, context = int(shard["pos_index"][local]), shard["context_index"][local]
    near = (
        (shard["context_index"] == context)
        & (shard["pos_index"] >= pos - options.left)
        & (shard["pos_index"] <= pos + options.right)
    )
    idx = near.nonzero()[:, 0]  # the window's rows, in position order
    ids = shard["tokens"][idx].tolist()
    return {
        "row": row,
        "context_index": int(context),
        "doc_index": int(shard["doc_index"][local]),
        "pos": pos,
        "positions": shard["pos_index"][idx].tolist(),
        "token_ids": ids,
        "tokens": label(ids),
        "values": floats(_apply(fn, shard[hook][idx])),
        "max_at": int((idx == local).nonzero()[0, 0]),
    }


def _histogram(acts: torch.Tensor, bins: int) -> dict:
    """Counts of the nonzero activations (most of an SAE latent's are exactly 0) in `bins` equal bins."""
    nonzero = acts[acts != 0]
    if nonzero.numel() == 0:
        return {"edges": [], "counts": [], "of": "nonzero activations", "zeros": int(acts.numel())}
    lo, hi = float(nonzero.min()), float(nonzero.max())
    hi = hi if hi > lo else lo + 1.0
    counts = torch.histc(nonzero.double(), bins=bins, min=lo, max=hi)  # [bins]
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    return {
        "edges": edges.tolist(),
        "counts": [int(c) for c in counts],
        "of": "nonzero activations",
        "zeros": int(acts.numel() - nonzero.numel()),
    }


def _labeller(model_or_tokenizer) -> Callable[[list[int]], list[str]]:
    """ids -> strings: a HookedTransformer's to_str_tokens, a HF tokenizer's per-id decode, a callable, or `#id`."""
    m = model_or_tokenizer
    if m is None or (hasattr(m, "to_str_tokens") and getattr(m, "tokenizer", None) is None):
        return lambda ids: [f"#{i}" for i in ids]
    if hasattr(m, "to_str_tokens"):
        return lambda ids: list(m.to_str_tokens(torch.tensor(ids, dtype=torch.long)))
    if hasattr(m, "decode"):
        return lambda ids: [m.decode([i]) for i in ids]
    if callable(m):
        decode = cast(Callable[[list[int]], Iterable[Any]], m)  # a user's ids -> labels function
        return lambda ids: [str(t) for t in decode(ids)]
    raise InputTypeError(
        f"model_or_tokenizer must be a HookedTransformer, a tokenizer or a callable; got {type(m).__name__}."
    )


_JS = r"""
R.feature=function(v,sec){
  const m=v.max>0?v.max:1e-12;
  sec.appendChild(el('div','fd-stats',v.n_rows+' rows · max '+fmt(v.max)+' · min '+fmt(v.min)+
    ' · density '+(100*v.density).toFixed(3)+'% of rows > 0'));
  const h=v.histogram, hist=el('div','fd-hist'), peak=Math.max(1,...h.counts);
  h.counts.forEach((c,i)=>{const b=el('div','fd-bin');b.style.height=(100*c/peak).toFixed(1)+'%';
    b.dataset.count=c;b.title='['+fmt(h.edges[i])+', '+fmt(h.edges[i+1])+']: '+c;hist.appendChild(b);});
  sec.appendChild(el('div','fd-label','histogram of the '+h.of+' ('+h.zeros+' rows are 0)'));
  sec.appendChild(hist);
  if(h.edges.length)sec.appendChild(el('div','fd-axis',fmt(h.edges[0])+' … '+fmt(h.edges[h.edges.length-1])));
  sec.appendChild(el('div','fd-label',
    'top '+v.examples.length+' contexts (one example per context), max token outlined'));
  sec.appendChild(legend(m,v.min<0,'the largest activation'));
  const info=el('div','info','hover a token for its activation');
  v.examples.forEach((ex,n)=>{
    const row=el('div','fd-ex');row.dataset.rank=n;row.appendChild(el('span','fd-val',fmt(ex.value)));
    const strip=tokenStrip(ex.tokens.map(visible),ex.values.map(x=>diverging(x,m)),i=>{
      info.textContent='#'+(n+1)+' context '+ex.context_index+' pos '+ex.positions[i]+' '+JSON.stringify(ex.tokens[i])+
        ': '+(ex.values[i]===null?'n/a':ex.values[i]);},i=>fmt(ex.values[i]));
    strip.querySelectorAll('.tok')[ex.max_at].classList.add('max');
    row.appendChild(strip);sec.appendChild(row);});
  sec.appendChild(info);
  const st=document.createElement('style');st.textContent=`
.hv .fd-hist{display:flex;align-items:flex-end;height:80px;width:480px;border-bottom:1px solid #999;gap:1px}
.hv .fd-bin{flex:1;background:#1e5ac8;min-height:0}
.hv .fd-axis,.hv .fd-stats,.hv .fd-label{font-size:11px;color:#444;margin:2px 0}
.hv .fd-ex{display:flex;align-items:center}
.hv .fd-ex .strip{display:inline-block}
.hv .fd-val{width:70px;text-align:right;padding-right:6px;font-family:ui-monospace,Menlo,Consolas,monospace}
.hv .tok.max{outline:2px solid #222;font-weight:bold}`;
  sec.appendChild(st);
};
"""

register_renderer("feature", _JS)
