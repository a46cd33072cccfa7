"""Attention from text tokens to an image's patches, drawn over the image (image-text models).

Each image token of a `HookedVisionLanguageModel` holds one patch of the image (or of one of its
tiles); `model.image_positions` says which. For a chosen layer, this view paints, over the image
the model read, how much a text token's attention goes to each patch: hover a text token to
choose it, a head button to choose the head (or the mean over heads). The image is embedded as
raw pixels in the page; nothing is fetched.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import torch

from hooked.core.errors import InputError
from hooked.viz._common import floats, one_sequence, str_tokens_for, window
from hooked.viz._html import View, register_renderer

MAX_POS = 48
MAX_HEADS = 12


def attention_over_image(
    model,
    cache,
    layer: int,
    pixel_values,
    *,
    image_sizes: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    image: int = 0,
    tile: int = 0,
    heads: Sequence[int] | None = None,
    max_pos: int = MAX_POS,
    max_heads: int = MAX_HEADS,
    batch_index: int = 0,
) -> View:
    """Attention of each text token of `layer` to the image tokens of `image` (`tile`), drawn over that image.

    Args:
        model: a `HookedVisionLanguageModel` (its `image_positions` locates the patches).
        cache: the `ActivationCache` of `model.run_with_cache(tokens, pixel_values=...)` with `pattern` of `layer`.
        layer: the language model's layer whose heads are drawn.
        pixel_values: the run's pixels, `[images, C, H, W]` or `[images, tiles, C, H, W]` (shown min-max scaled),
            or the image itself (a PIL image or an `[H, W, 3]` uint8 array): Qwen2.5-VL's pixels are
            flattened patches, so pass the image you gave its processor.
        image_sizes: the run's `image_sizes` (any-resolution models).
        image_grid_thw: the run's `image_grid_thw` (Qwen2.5-VL).
        image: which image of the run.
        tile: 0 for the whole image; k >= 1 for the k-th tile of an any-resolution grid.
        heads: the heads offered besides their mean (None: all, up to `max_heads`).
        max_pos: offer at most this many text tokens as queries (the last ones).
        max_heads: offer at most this many heads.
        batch_index: which prompt of the batch.

    Returns:
        A `View`: renders in Jupyter, `.save(path)` writes one HTML file, `+` combines views.
    """
    tokens = getattr(cache, "tokens", None)
    if tokens is None:
        raise InputError("the cache has no tokens: run model.run_with_cache(tokens, pixel_values=...) on tokens")
    positions = model.image_positions(tokens, image_sizes, image_grid_thw=image_grid_thw)
    in_row = positions.batch == batch_index
    grid = _grid(positions, image, tile, in_row)  # [side, side] of key positions, -1 where none
    cache = one_sequence(cache, batch_index)
    n_layers = model.cfg.n_layers
    if not -n_layers <= layer < n_layers:
        raise InputError(f"layer={layer} is outside the model's layers [0, {n_layers})")
    layer = layer % n_layers
    pattern = cache["pattern", layer]  # [head, query, key]
    shown, notes = _heads(pattern.shape[0], heads, max_heads)
    is_image = torch.zeros(pattern.shape[1], dtype=torch.bool)
    is_image[positions.pos[in_row]] = True
    text = (~is_image).nonzero().flatten()  # the query positions: the text tokens
    keep, note = window(len(text), max_pos)
    notes += [note] if note else []
    queries = text[keep]
    labels = str_tokens_for(model, cache, tokens[batch_index])
    data = {
        "kind": "image_attention",
        "title": f"Attention to image {image}" + (f" (tile {tile})" if tile else "") + f", layer {layer}",
        "description": "The image the model read, with each patch tinted by the chosen text token's attention to "
        "it (full colour: that token's largest weight on this image). Hover a token to choose it; click a head to "
        "see one head, or the mean over heads. The share is the token's attention to this image's tokens.",
        "layer": layer,
        "heads": ["mean"] + [f"L{layer}H{h}" for h in shown],
        "positions": queries.tolist(),
        "tokens": [labels[int(q)] for q in queries],
        "rows": grid.shape[0],
        "cols": grid.shape[1],
        "weights": _weights(pattern, shown, queries, grid),  # [head entry, query, rows * cols]
        "share": _share(pattern, shown, queries, grid),  # [head entry, query]
        "image": _pixels(pixel_values, image, tile),
        "notes": notes,
    }
    return View([data], data["title"])


def _grid(positions, image: int, tile: int, in_row: torch.Tensor) -> torch.Tensor:
    """The key positions of the tile's patches (one image belongs to one prompt)."""
    grid = positions.grid(image, tile)
    if (grid >= 0).any() and not bool(in_row[positions.select(image, tile)].all()):
        raise InputError(f"image {image} is not in the batch row chosen by batch_index")
    return grid


def _heads(n_heads: int, heads: Sequence[int] | None, max_heads: int) -> tuple[list[int], list[str]]:
    chosen = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in chosen if not 0 <= h < n_heads]
    if bad:
        raise InputError(f"heads {bad} are outside the layer's heads [0, {n_heads})")
    if len(chosen) <= max_heads:
        return chosen, []
    return chosen[:max_heads], [f"offering {max_heads} of {len(chosen)} heads; pass heads=[...] to choose others"]


def _per_head_and_mean(pattern: torch.Tensor, shown: list[int]) -> torch.Tensor:
    pattern = pattern.float()
    return torch.cat([pattern.mean(0, keepdim=True), pattern[shown]])  # [1 + heads, query, key]


def _weights(pattern: torch.Tensor, shown: list[int], queries: torch.Tensor, grid: torch.Tensor) -> list:
    rows = _per_head_and_mean(pattern, shown)[:, queries]  # [entry, query, key]
    flat = grid.flatten()
    values = rows[:, :, flat.clamp(min=0)]  # [entry, query, rows * cols]
    values = values.masked_fill((flat < 0)[None, None], float("nan"))  # no token there: drawn untinted
    return floats(values, digits=5)  # type: ignore[return-value]


def _share(pattern: torch.Tensor, shown: list[int], queries: torch.Tensor, grid: torch.Tensor) -> list:
    keys = grid.flatten()
    keys = keys[keys >= 0]
    return floats(_per_head_and_mean(pattern, shown)[:, queries][:, :, keys].sum(-1), digits=5)  # type: ignore[return-value]


def _pixels(pixel_values, image: int, tile: int) -> dict:
    """The tile's pixels as base64 RGB bytes, each channel min-max scaled to 0..255 (the processor normalized
    them); an image given as such (PIL or `[H, W, 3]` uint8) is drawn as it is."""
    if not isinstance(pixel_values, torch.Tensor):
        import numpy as np

        rgb = np.asarray(pixel_values.convert("RGB") if hasattr(pixel_values, "convert") else pixel_values)
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise InputError(f"an image to draw must be RGB uint8 [H, W, 3], got {rgb.dtype} {tuple(rgb.shape)}")
        return {"height": rgb.shape[0], "width": rgb.shape[1], "rgb": base64.b64encode(rgb.tobytes()).decode("ascii")}
    pixels = pixel_values[image, tile] if pixel_values.ndim == 5 else pixel_values[image]  # [C, H, W]
    if pixels.ndim != 3 or pixels.shape[0] not in (1, 3):
        raise InputError(
            f"pixel_values[{image}] has shape {tuple(pixels.shape)}; expected [channels, height, width] (Qwen2.5-VL's "
            "are flattened patches: pass the image itself)"
        )
    x = pixels.detach().float().cpu()
    low, high = x.amin(dim=(1, 2), keepdim=True), x.amax(dim=(1, 2), keepdim=True)
    x = ((x - low) / (high - low).clamp(min=1e-12) * 255).round().to(torch.uint8)  # [C, H, W]
    x = x.expand(3, -1, -1) if x.shape[0] == 1 else x
    rgb = x.permute(1, 2, 0).contiguous().numpy().tobytes()  # [H, W, 3] bytes
    return {"height": int(x.shape[1]), "width": int(x.shape[2]), "rgb": base64.b64encode(rgb).decode("ascii")}


_JS = r"""
R.image_attention=function(v,sec){
  const W=v.image.width, H=v.image.height, S=Math.max(224,Math.min(448,4*Math.max(W,H)))/Math.max(W,H);
  const DW=Math.round(W*S), DH=Math.round(H*S), rows=v.rows, cols=v.cols, cw=DW/cols, ch=DH/rows;
  const info=el('div','info','hover a text token: its attention to each patch');
  let head=0, query=v.positions.length-1;
  const bar=el('div','heads');
  const buttons=v.heads.map((h,i)=>{const b=el('button','hbtn',h);b.dataset.head=i;
    b.addEventListener('click',()=>{head=i;draw();});bar.appendChild(b);return b;});
  const strip=tokenStrip(v.tokens,null,i=>{query=i;draw();});
  const toks=Array.from(strip.querySelectorAll('.tok'));
  const raw=atob(v.image.rgb);
  const off=document.createElement('canvas');off.width=W;off.height=H;
  const img=off.getContext('2d').createImageData(W,H);
  for(let p=0;p<W*H;p++){img.data[4*p]=raw.charCodeAt(3*p);img.data[4*p+1]=raw.charCodeAt(3*p+1);
    img.data[4*p+2]=raw.charCodeAt(3*p+2);img.data[4*p+3]=255;}
  off.getContext('2d').putImageData(img,0,0);
  const cv=el('canvas','image-attention');cv.width=DW;cv.height=DH;
  function draw(){
    const ctx=cv.getContext('2d');ctx.imageSmoothingEnabled=false;ctx.clearRect(0,0,DW,DH);ctx.drawImage(off,0,0,DW,DH);
    const w=v.weights[head][query];let m=0;w.forEach(x=>{if(x!==null&&x>m)m=x;});
    for(let r=0;r<rows;r++)for(let c=0;c<cols;c++){const x=w[r*cols+c];if(x===null||m<=0)continue;
      ctx.fillStyle='rgba(255,40,0,'+(0.8*x/m).toFixed(3)+')';ctx.fillRect(c*cw,r*ch,cw,ch);}
    cv.dataset.head=v.heads[head];cv.dataset.query=String(v.positions[query]);cv.dataset.vmax=m;
    highlight(buttons,b=>+b.dataset.head===head);highlight(toks,n=>+n.dataset.pos===query);
    info.textContent=v.heads[head]+' from '+JSON.stringify(v.tokens[query])+' (pos '+v.positions[query]+
      '): '+pct(v.share[head][query])+' of its attention on this image, largest patch '+fmt(m);
  }
  cv.addEventListener('mousemove',e=>{const b=cv.getBoundingClientRect();
    const c=Math.min(cols-1,Math.floor((e.clientX-b.left)/cw)),r=Math.min(rows-1,Math.floor((e.clientY-b.top)/ch));
    const x=v.weights[head][query][r*cols+c];
    info.textContent=v.heads[head]+': '+JSON.stringify(v.tokens[query])+' → patch ('+r+', '+c+') '+
      (x===null?'(no token)':fmt(x));});
  sec.appendChild(strip);sec.appendChild(bar);sec.appendChild(cv);sec.appendChild(info);draw();
};
"""
_CSS = """
.hv .heads{margin:4px 0}
.hv .hbtn{font-size:11px;margin:0 3px 3px 0;padding:1px 6px;border:1px solid #bbb;background:#f6f6f6;cursor:pointer}
.hv .hbtn.hl{background:#1e5ac8;color:#fff;border-color:#1e5ac8}
.hv canvas.image-attention{display:block;border:1px solid #ccc;cursor:crosshair;image-rendering:pixelated}
"""

register_renderer("image_attention", _JS, _CSS)
