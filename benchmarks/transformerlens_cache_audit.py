"""Every argument combination of the `ActivationCache` helpers on TransformerLens 2.x and on `hooked`, side by side.

    python benchmarks/transformerlens_cache_audit.py /path/where/transformer_lens/2.x/imports
    (e.g. the transformer-lens 2.18 wheel unzipped, beside better_abc, fancy_einsum and typeguard)

The two libraries run in this process: `transformer_lens` from the given path (not `hooked`'s
alias), `hooked` from this checkout. For a few tiny configs (LayerNorm, LayerNorm folded to
LNPre, RMSNorm with rotary and a gated MLP, an attention-only shortformer without norms) it
builds TransformerLens's model, copies its random weights into `hooked`'s, caches the same
tokens in both (with and without `remove_batch_dim`), and calls `accumulated_resid`,
`decompose_resid`, `stack_head_results`, `stack_neuron_results`, `get_neuron_results`,
`get_full_resid_decomposition`, `apply_ln_to_stack` (stacks with and without a component axis)
and `logit_attrs` over every layer, `pos_slice`, `batch_slice`, mode and flag. It prints how many
calls agree, how many fail in both, succeed only in `hooked`, fail only in `hooked` (each a bug
unless listed as a deliberate difference in docs/transformerlens-migration.md), or give other
numbers, grouped by helper with an example. No TransformerLens code is copied into this repository.

Against transformer-lens 2.18.0 (2026-11-28; about 33,000 calls): no call that TransformerLens runs fails
in `hooked` except `batch_slice` on a model without norms (TransformerLens ignores it there), and every
difference in the numbers is one of the checklist's `differs` rows: a shortformer's `pos_embed` is no
component, `remainder` at `layer=0` is `resid_pre` 0, `logit_attrs` applies an unfolded `ln_final` gain, and
tokens `[batch]` against a stack of as many positions are one per sequence.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import warnings
from collections import defaultdict
from functools import partial

import torch

BASE = dict(d_model=32, d_head=8, n_layers=3, n_ctx=16, d_vocab=50, d_mlp=48, seed=0)
CONFIGS = {
    "ln": dict(act_fn="gelu"),
    "lnpre": dict(act_fn="gelu", normalization_type="LNPre"),
    "rms_rotary_gated": dict(
        normalization_type="RMS", positional_embedding_type="rotary", act_fn="silu", gated_mlp=True
    ),
    "attn_only_shortformer": dict(attn_only=True, positional_embedding_type="shortformer", normalization_type=None),
}
POS = [None, -1, 0, 2, [0, 2], (1, 4), slice(1, 5)]
BATCH = [None, 0, -1, [0, 2], (0, 2)]
LAYERS = [None, -1, 0, 1, 2, 3]


def build(tl, hooked, name: str):
    kw = {**BASE, **CONFIGS[name]}
    tl_model = tl.HookedTransformer(tl.HookedTransformerConfig(**kw))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param_name, p in tl_model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
            if kw.get("gated_mlp") and param_name.endswith("mlp.b_in"):
                p.zero_()  # TransformerLens adds a gated MLP's b_in after the product: outside this audit
    hooked_model = hooked.HookedTransformer(hooked.HookedTransformerConfig(**kw))
    hooked_model.load_state_dict(tl_model.state_dict())
    return tl_model, hooked_model


class Tally:
    def __init__(self):
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.examples: dict[tuple[str, str], str] = {}

    def run(self, helper: str, label: str, calls: tuple, method: str, *args, **kwargs) -> None:
        """`calls` = (TransformerLens's cache, hooked's cache), or pairs `(cache, first argument)` for a stack."""
        bound = []
        for call in calls:
            cache, first = call if isinstance(call, tuple) else (call, None)
            head = () if first is None else (first.clone(),)
            bound.append(partial(getattr(cache, method), *head, *args, **kwargs))
        outcome = self._outcome(*bound)
        self.counts[helper][outcome[0]] += 1
        if outcome[1]:
            self.examples.setdefault((helper, outcome[0]), f"{label}: {outcome[1]}")

    @staticmethod
    def _outcome(on_tl, on_hooked) -> tuple[str, str]:
        results = []
        for fn in (on_tl, on_hooked):
            try:
                results.append((fn(), None))
            except Exception as e:  # noqa: BLE001  (either library's refusal is an outcome)
                results.append((None, f"{type(e).__name__}: {str(e)[:160]}"))
        (tl_out, tl_err), (hk_out, hk_err) = results
        if tl_err and hk_err:
            return "both refuse", ""
        if tl_err:
            return "only hooked works", tl_err
        if hk_err:
            return "only TransformerLens works", hk_err
        for a, b in zip(*(r if isinstance(r, tuple) else (r,) for r in (tl_out, hk_out)), strict=True):
            same = (
                a == b if not isinstance(a, torch.Tensor) else a.shape == b.shape and torch.allclose(a, b, 1e-4, 1e-4)
            )
            if not same:
                shown = f"{tuple(a.shape)} vs {tuple(b.shape)}" if isinstance(a, torch.Tensor) else f"{a} vs {b}"
                return "different numbers", shown
        return "agree", ""


def sweep(tally: Tally, tag: str, ct, ch) -> None:
    """Every combination, on the caches `ct` (TransformerLens) and `ch` (hooked) of the same run."""
    both = (ct, ch)
    for layer, pos, mid, ln, mlp in itertools.product(LAYERS, POS, (0, 1), (0, 1), (0, 1)):
        kw = dict(layer=layer, incl_mid=bool(mid), apply_ln=bool(ln), pos_slice=pos, mlp_input=bool(mlp))
        tally.run("accumulated_resid", f"{tag} {kw}", both, "accumulated_resid", **kw)
    modes = ("all", "attn", "mlp")
    for layer, pos, mode, ln, mlp, emb in itertools.product(LAYERS, POS, modes, (0, 1), (0, 1), (0, 1)):
        kw = dict(layer=layer, mode=mode, apply_ln=bool(ln), pos_slice=pos, mlp_input=bool(mlp), incl_embeds=bool(emb))
        tally.run("decompose_resid", f"{tag} {kw}", both, "decompose_resid", **kw)
    for layer, pos, rem, ln in itertools.product(LAYERS, POS, (0, 1), (0, 1)):
        kw = dict(layer=layer, pos_slice=pos, incl_remainder=bool(rem), apply_ln=bool(ln), return_labels=True)
        tally.run("stack_head_results", f"{tag} {kw}", both, "stack_head_results", **kw)
    if not ch.model.cfg.attn_only:
        for layer, pos, ns, rem, ln in itertools.product(LAYERS, POS, [None, 3, [1, 5], (2, 7)], (0, 1), (0, 1)):
            kw = dict(layer=layer, pos_slice=pos, neuron_slice=ns, incl_remainder=bool(rem), apply_ln=bool(ln))
            tally.run("stack_neuron_results", f"{tag} {kw}", both, "stack_neuron_results", **kw)
            tally.run("get_neuron_results", f"{tag} layer=2 {ns} {pos}", both, "get_neuron_results", 2, ns, pos)
    for layer, pos, exp, ln, mlp in itertools.product(LAYERS, POS, (0, 1), (0, 1), (0, 1)):
        kw = dict(layer=layer, pos_slice=pos, expand_neurons=bool(exp), apply_ln=bool(ln), mlp_input=bool(mlp))
        tally.run("get_full_resid_decomposition", f"{tag} {kw}", both, "get_full_resid_decomposition", **kw)
    for pos, bs, layer, mlp, shape in itertools.product(POS, BATCH, LAYERS, (0, 1), STACKS):
        kw = dict(layer=layer, pos_slice=pos, batch_slice=bs, mlp_input=bool(mlp), has_batch_dim=ch.has_batch_dim)
        try:
            st, sh = (STACKS[shape](c.decompose_resid(layer=layer, pos_slice=pos, mlp_input=bool(mlp))) for c in both)
        except Exception:  # noqa: BLE001  (no such stack to scale)
            continue
        tally.run(f"apply_ln_to_stack, {shape}", f"{tag} {kw}", ((ct, st), (ch, sh)), "apply_ln_to_stack", **kw)
    for pos, bs, kind, wrong in itertools.product(POS, BATCH, TOKENS, (0, 1)):
        tk = TOKENS[kind](ct)
        st, sh = ct.decompose_resid(pos_slice=pos), ch.decompose_resid(pos_slice=pos)
        kw = dict(
            pos_slice=pos, batch_slice=bs, has_batch_dim=ch.has_batch_dim, incorrect_tokens=tk + 1 if wrong else None
        )
        tally.run(f"logit_attrs, tokens {kind}", f"{tag} {kw}", ((ct, st), (ch, sh)), "logit_attrs", tk, **kw)


#: stacks given to apply_ln_to_stack, made from decompose_resid's
STACKS = {
    "[component, ...]": lambda s: s,
    "no component axis": lambda s: s.sum(0),
    "[1, component, ...]": lambda s: s[None],
}
#: tokens given to logit_attrs, for a cache
TOKENS = {
    "int": lambda cache: 3,
    "0-d": lambda cache: torch.tensor(3),
    "[batch]": lambda cache: torch.tensor([3, 4, 5][: cache["embed"].shape[0] if cache.has_batch_dim else 1]),
    "[batch, pos]": lambda cache: torch.randint(
        0, 50, cache["embed"].shape[:-1], generator=torch.Generator().manual_seed(2)
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tl_path", help="a directory from which transformer_lens 2.x imports")
    args = parser.parse_args()
    sys.path.insert(0, args.tl_path)
    import transformer_lens as tl

    import hooked

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    tokens = torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(1))
    tally = Tally()
    for name in CONFIGS:
        tl_model, hooked_model = build(tl, hooked, name)
        for remove_batch_dim in (False, True):
            batch = tokens[:1] if remove_batch_dim else tokens
            with torch.no_grad():
                (_, ct), (_, ch) = (
                    m.run_with_cache(batch, remove_batch_dim=remove_batch_dim) for m in (tl_model, hooked_model)
                )
            sweep(tally, f"{name} remove_batch_dim={remove_batch_dim}", ct, ch)
    print(f"TransformerLens {tl.__file__}")
    for helper, counts in tally.counts.items():
        print(f"{helper}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for outcome in ("only TransformerLens works", "different numbers"):
            if (helper, outcome) in tally.examples:
                print(f"    {outcome}, e.g. {tally.examples[helper, outcome]}")


if __name__ == "__main__":
    main()
