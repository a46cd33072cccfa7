"""One self-contained HTML page: inline CSS, a small vanilla-JS renderer, data as embedded JSON.

Every view is a dict `{"kind": ..., ...}`; the page's script draws each kind into its own
`<section>`. Nothing is fetched from the network, so a saved file opens offline.
"""

from __future__ import annotations

import html
import json
import uuid
from pathlib import Path

DATA_ID_PREFIX = "hooked-viz-data-"
#: CSS rules (scoped under `.hv`) of views whose renderer lives in their own module (`register_renderer`).
EXTRA_CSS: list[str] = []

_CSS = """
.hv{font-family:system-ui,-apple-system,Segoe UI,sans-serif;font-size:13px;color:#222;max-width:100%;overflow-x:auto}
.hv section{margin:0 0 18px 0}
.hv h3{font-size:15px;margin:4px 0 6px 0}
.hv .note{color:#8a5a00;background:#fff6e0;border:1px solid #f0d9a0;padding:3px 6px;margin:4px 0;display:inline-block}
.hv .tok{display:inline-block;padding:1px 3px;margin:1px;border:1px solid #ddd;border-radius:3px;cursor:default;
 white-space:pre;font-family:ui-monospace,Menlo,Consolas,monospace}
.hv .tok.hl{outline:2px solid #d33}
.hv .grid{border-collapse:collapse;margin:4px 8px 8px 0;display:inline-table;vertical-align:top}
.hv .grid td,.hv .grid th{padding:0;font-weight:normal;font-size:10px}
.hv .grid td.c{width:14px;height:14px;border:1px solid #fff}
.hv .grid td.c.hl{border:1px solid #d33}
.hv canvas.pattern{display:block;cursor:crosshair}
.hv .grid td.wide{width:34px;text-align:center;font-size:9px}
.hv .grid th.r{text-align:right;padding-right:4px;white-space:pre;font-family:ui-monospace,Menlo,Consolas,monospace}
.hv .grid th.col{writing-mode:vertical-rl;transform:rotate(180deg);white-space:pre;height:auto;
 font-family:ui-monospace,Menlo,Consolas,monospace}
.hv .head{display:inline-block;vertical-align:top;margin-right:6px}
.hv .info{min-height:1.4em;color:#333;font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre}
.hv .bar-row{display:flex;align-items:center;height:16px}
.hv .bar-label{width:110px;text-align:right;padding-right:6px;font-family:ui-monospace,Menlo,Consolas,monospace}
.hv .bar-track{position:relative;width:360px;height:12px;background:#f4f4f4}
.hv .bar{position:absolute;top:0;height:12px}
.hv .bar-val{padding-left:6px;font-family:ui-monospace,Menlo,Consolas,monospace}
.hv p.desc{margin:2px 0 6px 0;max-width:900px;color:#333;line-height:1.35}
.hv .grid th.rh{text-align:right;padding-right:4px;color:#777;font-style:italic}
.hv .grid th.col.input{color:#777}
.hv .grid th.col.target{font-weight:bold;color:#123}
.hv .pgrid{display:grid;align-items:start}
.hv .pgrid .keys{display:flex;align-self:end}
.hv .pgrid .k{writing-mode:vertical-rl;transform:rotate(180deg);white-space:pre;overflow:hidden;max-height:90px;
 text-align:left;font-family:ui-monospace,Menlo,Consolas,monospace}
.hv .pgrid .queries{display:flex;flex-direction:column;align-items:flex-end;padding-right:3px}
.hv .pgrid .q{white-space:pre;overflow:hidden;max-width:110px;font-family:ui-monospace,Menlo,Consolas,monospace}
.hv .legend{display:flex;align-items:center;gap:6px;margin:2px 0 4px 0;font-size:11px;color:#444}
.hv .legend-bar{display:inline-block;width:160px;height:10px;border:1px solid #ccc;
 background:linear-gradient(to right,rgba(210,50,40,1),rgba(210,50,40,0) 50%,rgba(30,90,200,0) 50%,rgba(30,90,200,1))}
.hv .legend-bar.pos{background:linear-gradient(to right,rgba(30,90,200,0),rgba(30,90,200,1))}
"""

_JS = r"""
(function(){
const root=document.getElementById(ROOT_ID), data=JSON.parse(document.getElementById(DATA_ID).textContent);
function el(tag,cls,text){const e=document.createElement(tag);if(cls)e.className=cls;
  if(text!==undefined)e.textContent=text;return e;}
function show(s){return s.replace(/\n/g,'\\n');}
function blue(v){const a=Math.max(0,Math.min(1,v));return 'rgba(30,90,200,'+a.toFixed(3)+')';}
function diverging(v,m){const a=m>0?Math.min(1,Math.abs(v)/m):0;
  return v>=0?'rgba(30,90,200,'+a.toFixed(3)+')':'rgba(210,50,40,'+a.toFixed(3)+')';}
function pct(x){if(x===null||x===undefined)return 'n/a';const p=x*100;return (p>=9.5?p.toFixed(0):p.toFixed(1))+'%';}
function fmt(v){if(v===null||v===undefined)return 'n/a';
  return Math.abs(v)>=1e-3||v===0?v.toFixed(4):v.toExponential(2);}
function notes(sec,v){(v.notes||[]).forEach(n=>sec.appendChild(el('div','note',n)));}
function tokenStrip(toks,colors,onHover,title){
  const strip=el('div','strip');
  toks.forEach((t,i)=>{const s=el('span','tok',show(t));s.dataset.pos=i;if(colors)s.style.background=colors[i];
    if(title)s.title=title(i);s.addEventListener('mouseenter',()=>onHover(i));strip.appendChild(s);});
  return strip;
}
function highlight(nodes,pred){nodes.forEach(n=>n.classList.toggle('hl',pred(n)));}
const R={};
R.attention=function(v,sec){
  // one canvas per head (a DOM cell per weight would freeze the page on long prompts)
  const info=el('div','info',
    'hover a token: its row (what it attends to) and column (who attends to it) in every head');
  const P=v.tokens.length, C=Math.max(4,Math.min(14,Math.floor(448/P))), F=Math.max(6,Math.min(11,C-3)), heads=[];
  function labels(cls,axis){const box=el('div',axis);v.tokens.forEach(t=>{const s=el('span',cls,show(t));
    s.style.fontSize=F+'px';s.style.lineHeight=C+'px';if(cls==='k')s.style.width=C+'px';else s.style.height=C+'px';
    box.appendChild(s);});return box;}
  function draw(hd,sel){const ctx=hd.cv.getContext('2d');ctx.clearRect(0,0,hd.cv.width,hd.cv.height);
    ctx.drawImage(hd.base,0,0);hd.cv.dataset.highlight=sel===null?'':String(sel);
    if(sel===null)return;ctx.strokeStyle='#d33';ctx.lineWidth=2;
    ctx.strokeRect(1,sel*C,P*C-2,C);ctx.strokeRect(sel*C,1,C,P*C-2);}
  let stripToks=null;
  function select(i){heads.forEach(hd=>draw(hd,i));highlight(stripToks,n=>+n.dataset.pos===i);
    const parts=v.heads.map((h,hi)=>{const row=v.patterns[hi][i];let b=0;for(let k=1;k<P;k++)if(row[k]>row[b])b=k;
      return h+'→'+JSON.stringify(v.tokens[b])+' '+fmt(row[b]);});
    info.textContent='from '+JSON.stringify(v.tokens[i])+': '+parts.slice(0,8).join('  ')+(parts.length>8?' …':'');}
  const strip=tokenStrip(v.tokens,null,select);stripToks=Array.from(strip.querySelectorAll('.tok'));
  sec.appendChild(strip);sec.appendChild(info);
  v.heads.forEach((h,hi)=>{
    const box=el('div','head');box.appendChild(el('div','',h));
    const cv=el('canvas','pattern');cv.width=cv.height=P*C;cv.dataset.head=h;
    const base=document.createElement('canvas');base.width=base.height=P*C;const bx=base.getContext('2d');
    for(let q=0;q<P;q++)for(let k=0;k<P;k++){const w=v.patterns[hi][q][k];if(!w)continue;
      bx.fillStyle=blue(w);bx.fillRect(k*C,q*C,C-(C>5?1:0),C-(C>5?1:0));}
    const hd={cv:cv,base:base};heads.push(hd);draw(hd,null);
    cv.addEventListener('mousemove',e=>{const r=cv.getBoundingClientRect();
      const q=Math.min(P-1,Math.floor((e.clientY-r.top)/C)),k=Math.min(P-1,Math.floor((e.clientX-r.left)/C));
      info.textContent=h+': '+JSON.stringify(v.tokens[q])+' → '+JSON.stringify(v.tokens[k])+' '+
        fmt(v.patterns[hi][q][k]);});
    // rows: the query (attending) token; columns: the key (attended-to) token
    const g=el('div','pgrid');g.style.gridTemplateColumns='auto '+(P*C)+'px';
    g.appendChild(el('div',''));g.appendChild(labels('k','keys'));g.appendChild(labels('q','queries'));g.appendChild(cv);
    box.appendChild(g);sec.appendChild(box);
  });
};
R.logit_lens=function(v,sec){
  const info=el('div','info','hover a cell: the top token the layer predicts there');
  const cells=[], P=v.tokens.length, rank=v.mode==='rank', cols=v.tokens.map(()=>[]);let lit=[];
  function light(list){lit.forEach(c=>c.classList.remove('hl'));list.forEach(c=>c.classList.add('hl'));lit=list;}
  const strip=tokenStrip(v.tokens,null,i=>{light(cols[i]);
    highlight(strip.querySelectorAll('.tok'),n=>+n.dataset.pos===i);});
  sec.appendChild(strip);
  // built as one HTML string: thousands of cells through the DOM API take seconds
  const esc=t=>t.replace(/&/g,'&amp;').replace(/</g,'&lt;').replace(/>/g,'&gt;');
  // two header rows: each column's input token, then its target (the token whose probability the column shows)
  const rows=['<tr><th class="rh">input</th>'+
    v.tokens.map(t=>'<th class="col input">'+esc(show(t))+'</th>').join('')+'</tr>',
    '<tr><th class="rh">target</th>'+v.targets.map(t=>'<th class="col target">'+esc(show(t))+'</th>').join('')+'</tr>'];
  v.layers.forEach((lab,l)=>{const r=['<tr><th class="r" title="'+esc(v.layer_help[l])+'">'+esc(lab)+'</th>'];
    for(let p=0;p<P;p++){const x=v.values[l][p];
      const bg=rank?blue(1-Math.log10(1+x)/Math.log10(1+v.d_vocab)):blue(x);
      r.push('<td class="c wide" data-l="'+l+'" data-p="'+p+'" style="background:'+bg+'">'+
        (rank?String(x):pct(x))+'</td>');}
    rows.push(r.join('')+'</tr>');});
  const tb=el('table','grid');tb.innerHTML=rows.join('');
  tb.querySelectorAll('td.c').forEach(td=>{cells.push(td);cols[+td.dataset.p].push(td);});
  // one listener for the table (thousands of cells): the message is built for the hovered cell only
  tb.addEventListener('mouseover',e=>{const td=e.target.closest('td.c');if(!td)return;
    const l=+td.dataset.l,p=+td.dataset.p,x=v.values[l][p];
    info.textContent=v.layers[l]+' @ '+JSON.stringify(v.tokens[p])+': '+v.target_label(p)+' '+
      (rank?'rank '+x:'p='+fmt(x))+' | top '+JSON.stringify(v.top_tokens[l][p])+' p='+fmt(v.top_probs[l][p]);
    light([td]);});
  sec.appendChild(tb);sec.appendChild(info);
};
R.bars=function(v,sec){
  const m=Math.max(1e-12,...v.values.map(Math.abs)), rows=[];
  const info=el('div','info','hover a bar for its exact value');
  v.labels.forEach((lab,i)=>{const row=el('div','bar-row');row.dataset.i=i;
    row.appendChild(el('span','bar-label',lab));const tr=el('div','bar-track');const b=el('div','bar');
    const w=Math.abs(v.values[i])/m*50;b.style.width=w+'%';b.style.left=(v.values[i]>=0?50:50-w)+'%';
    b.style.background=v.values[i]>=0?'#1e5ac8':'#d23228';tr.appendChild(b);row.appendChild(tr);
    row.appendChild(el('span','bar-val',fmt(v.values[i])));
    row.addEventListener('mouseenter',()=>{info.textContent=lab+': '+v.values[i];highlight(rows,r=>r===row);});
    rows.push(row);sec.appendChild(row);});
  sec.appendChild(info);
};
function visible(t){return /^\s+$/.test(t)?t.replace(/ /g,'\u2423').replace(/\t/g,'\u21e5'):t;}
function legend(m,signed,note){
  // the colour key: full colour at +m (and -m), transparent at 0
  const g=el('div','legend');g.dataset.vmax=m;
  g.appendChild(el('span','',signed?fmt(-m):fmt(0)));g.appendChild(el('span','legend-bar'+(signed?'':' pos')));
  g.appendChild(el('span','',fmt(m)));
  g.appendChild(el('span','','full colour at '+(signed?'±':'')+fmt(m)+(note?' ('+note+')':'')));
  return g;
}
R.text=function(v,sec){
  const m=v.scale>0?v.scale:1e-12;
  sec.appendChild(legend(m,true,v.scale_note));
  const info=el('div','info','hover a token for its value');
  const strip=tokenStrip(v.tokens.map(visible),v.values.map(x=>diverging(x,m)),i=>{
    info.textContent=JSON.stringify(v.tokens[i])+': '+(v.values[i]===null?'n/a':v.values[i]);
    highlight(strip.querySelectorAll('.tok'),n=>+n.dataset.pos===i);},i=>fmt(v.values[i]));
  sec.appendChild(strip);sec.appendChild(info);
};
/*RENDERERS*/
data.views.forEach((v,n)=>{
  const sec=el('section');sec.dataset.kind=v.kind;sec.dataset.index=n;sec.appendChild(el('h3','',v.title));
  if(v.description)sec.appendChild(el('p','desc',v.description));notes(sec,v);
  if(v.kind==='logit_lens'){const t=v.targets;v.target_label=p=>JSON.stringify(t[p]);}
  R[v.kind](v,sec);root.appendChild(sec);
});
})();
"""


def _safe_json(data) -> str:
    """JSON that cannot close its `<script>` tag early."""
    return json.dumps(data, allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_RENDERERS: dict[str, str] = {}  # kind -> `R.kind=function(v,sec){...}` from the module that makes that kind


def register_renderer(kind: str, js: str, css: str = "") -> None:
    """Add the page-side drawing code of a view kind defined outside this module.

    `js` assigns `R.kind=function(v,sec){...}`, drawing the view `v` into its `<section>` `sec`
    (this script's helpers `el`, `fmt`, `highlight` are in scope); `css` holds its style rules.
    """
    _RENDERERS[kind] = js
    if css and css not in EXTRA_CSS:
        EXTRA_CSS.append(css)


def shared_scales(views: list[dict]) -> list[dict]:
    """Views with a `scale_group` and no `vmax` of their own share one colour scale: the largest `abs_max` among
    them; with `vmax` a view keeps it. Each gets `scale` (full colour) and `scale_note` (what it is shared with)."""
    groups: dict[str, list[dict]] = {}
    for v in views:
        if v.get("scale_group") and v.get("vmax") is None:
            groups.setdefault(v["scale_group"], []).append(v)
    out = []
    for v in views:
        if v.get("scale_group") is None:
            out.append(v)
        elif v.get("vmax") is not None:
            out.append(dict(v, scale=v["vmax"], scale_note="vmax set"))
        else:
            group = groups[v["scale_group"]]
            note = (
                f"shared by the {len(group)} strips on this page" if len(group) > 1 else "this strip's largest |value|"
            )
            out.append(dict(v, scale=max(g["abs_max"] for g in group), scale_note=note))
    return out


def render_fragment(views: list[dict], title: str = "hooked") -> str:
    """A `<div>` with its style, data and script: embeddable in Jupyter or in a page."""
    uid = uuid.uuid4().hex[:12]
    root_id, data_id = f"hooked-viz-{uid}", f"{DATA_ID_PREFIX}{uid}"
    script = _JS.replace("ROOT_ID", json.dumps(root_id)).replace("DATA_ID", json.dumps(data_id))
    script = script.replace("/*RENDERERS*/", "\n".join(_RENDERERS.values()))
    views = shared_scales(views)
    return (
        f'<div class="hv" id="{root_id}"><style>{_CSS}{"".join(EXTRA_CSS)}</style>'
        f'<script type="application/json" id="{data_id}">{_safe_json({"title": title, "views": views})}</script>'
        f"<script>{script}</script></div>"
    )


def render_page(views: list[dict], title: str = "hooked") -> str:
    """A complete HTML document around `render_fragment`."""
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
        f"<body>{render_fragment(views, title)}</body></html>"
    )


def embedded_data(page: str) -> list[dict]:
    """The views embedded in a page or fragment (for tests and tooling): the parsed JSON."""
    start = page.index(f'id="{DATA_ID_PREFIX}')
    start = page.index(">", start) + 1
    return json.loads(page[start : page.index("</script>", start)])["views"]


class View:
    """A rendered figure: shows itself in Jupyter, and `.save(path)` writes a self-contained page."""

    def __init__(self, views: list[dict], title: str):
        self.views = views
        self.title = title

    @property
    def data(self) -> dict:
        """The (first) view's embedded data, as the page receives it."""
        return self.views[0]

    @property
    def html(self) -> str:
        return render_page(self.views, self.title)

    def _repr_html_(self) -> str:
        return render_fragment(self.views, self.title)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.html, encoding="utf-8")
        return path

    def __add__(self, other: View) -> View:
        """Two views on one page: `(attention + lens).save("both.html")`."""
        return View(self.views + other.views, self.title)

    def __repr__(self) -> str:
        return f"View({', '.join(v['kind'] for v in self.views)}: {self.title!r})"
