"""Where each node of a `Graph` lives in the model: the hooks that read senders' outputs and receivers' inputs.

Every circuit method runs the model in split-input mode (`split_inputs`): each head gets its
own copy of the residual for q, k and v (`hook_q_input`/`hook_k_input`/`hook_v_input`,
grouped K/V ungrouped to one copy per query head) and each MLP its own (`hook_mlp_in`), so
an edge can be patched into one receiver without touching the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from hooked.circuits.graph import Graph, block_nodes, heads_are_senders
from hooked.core.errors import PatchingError

#: fn(first_index, out) with out `[batch, pos, n, d_model]`: n consecutive senders' outputs.
SenderFn = Callable[[int, torch.Tensor], None]
#: fn(first_index, act) with act `[batch, pos, n, d_model]`: returns the new inputs or None.
ReceiverFn = Callable[[int, torch.Tensor], torch.Tensor | None]


@contextmanager
def split_inputs(model) -> Iterator[None]:
    """Turn on per-head q/k/v inputs (ungrouped) and `hook_mlp_in` for the duration."""
    cfg = model.cfg
    flags = ("use_split_qkv_input", "use_attn_in", "ungroup_grouped_query_attention", "use_hook_mlp_in")
    saved = {f: getattr(cfg, f) for f in flags}
    cfg.use_split_qkv_input, cfg.use_attn_in, cfg.ungroup_grouped_query_attention = True, False, True
    cfg.use_hook_mlp_in = not cfg.attn_only
    try:
        yield
    finally:
        for f, v in saved.items():
            setattr(cfg, f, v)


def sender_hooks(model, graph: Graph, fn: SenderFn) -> list[tuple[str, Callable]]:
    """Forward hooks calling `fn` with each sender group's output `[batch, pos, n, d_model]`."""
    cfg, index = model.cfg, graph.sender_index
    hooks: list[tuple[str, Callable]] = [("blocks.0.hook_resid_pre", lambda act, hook: fn(0, act[:, :, None]))]
    for layer in range(cfg.n_layers):
        block = model.blocks[layer]
        mixer, has_mlp = block_nodes(cfg, layer)
        if mixer == "attention" and heads_are_senders(cfg):
            first = index[f"a{layer}.h0"]

            def per_head(z, hook, first=first, W_O=block.attn.W_O):
                fn(first, torch.einsum("bphe,hed->bphd", z, W_O))  # [batch, pos, head, d_model]

            hooks.append((f"blocks.{layer}.attn.hook_z", per_head))
        elif mixer != "mlp":  # the layer's whole write: after a post-norm, or a recurrent layer's one node
            node, write = (f"a{layer}", "attn_out") if mixer == "attention" else (f"r{layer}", "mixer_out")
            first = index[node]
            hooks.append((f"blocks.{layer}.hook_{write}", lambda act, hook, i=first: fn(i, act[:, :, None])))
        if has_mlp:
            first = index[f"m{layer}"]
            hooks.append((f"blocks.{layer}.hook_mlp_out", lambda act, hook, i=first: fn(i, act[:, :, None])))
    return hooks


def receiver_hooks(model, graph: Graph, fn: ReceiverFn) -> list[tuple[str, Callable]]:
    """Forward hooks letting `fn` read and replace each receiver group's input `[batch, pos, n, d_model]`."""
    cfg, index = model.cfg, graph.receiver_index

    def wrap(first: int, per_head: bool):
        def hook(act, hook):
            x = act if per_head else act[:, :, None]  # [batch, pos, n, d_model]
            out = fn(first, x)
            if per_head:
                return out
            # the view itself flows on, so gradient hooks registered on it fire
            return (x if out is None else out)[:, :, 0]

        return hook

    hooks = []
    for layer in range(cfg.n_layers):
        mixer, has_mlp = block_nodes(cfg, layer)
        if mixer == "attention":
            for kind in "qkv":
                hooks.append((f"blocks.{layer}.hook_{kind}_input", wrap(index[f"a{layer}.h0.{kind}"], True)))
        elif mixer != "mlp":
            hooks.append((f"blocks.{layer}.hook_mixer_in", wrap(index[f"r{layer}"], False)))
        if has_mlp:
            hooks.append((f"blocks.{layer}.hook_mlp_in", wrap(index[f"m{layer}"], False)))
    hooks.append((f"blocks.{cfg.n_layers - 1}.hook_resid_post", wrap(index["logits"], False)))
    return hooks


def collect_sender_outputs(model, graph: Graph, tokens, attention_mask=None) -> torch.Tensor:
    """Every sender's output on `tokens`: `[n_senders, batch, pos, d_model]` (no gradient)."""
    return collect_outputs_and_inputs(model, graph, tokens, attention_mask)[0]


def collect_outputs_and_inputs(
    model, graph: Graph, tokens, attention_mask=None
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Senders' outputs `[n_senders, batch, pos, d_model]` and each receiver group's input `[batch, pos, d_model]`.

    The inputs are keyed by the group's first receiver index (all receivers of a group read
    the same residual in an unpatched run).
    """
    out: list[torch.Tensor | None] = [None]
    inputs: dict[int, torch.Tensor] = {}

    def save(first: int, act: torch.Tensor) -> None:
        if out[0] is None:
            out[0] = act.new_zeros(len(graph.senders), *act.shape[:2], act.shape[-1])
        out[0][first : first + act.shape[2]] = act.detach().permute(2, 0, 1, 3)  # [n, batch, pos, d_model]

    def save_input(first: int, act: torch.Tensor) -> None:
        inputs[first] = act[:, :, 0].detach().clone()  # [batch, pos, d_model]

    hooks = sender_hooks(model, graph, save) + receiver_hooks(model, graph, save_input)
    with torch.no_grad(), split_inputs(model):
        model.run_with_hooks(tokens, attention_mask=attention_mask, return_type=None, fwd_hooks=hooks)
    assert out[0] is not None  # the embedding sender's hook (blocks.0.hook_resid_pre) always runs
    return out[0], inputs


def check_pair(clean: torch.Tensor, corrupted: torch.Tensor) -> None:
    """Clean and corrupted token batches must line up position by position."""
    if not isinstance(clean, torch.Tensor) or not isinstance(corrupted, torch.Tensor):
        raise PatchingError(
            "clean and corrupted must be token tensors [batch, pos]: tokenize text with model.to_tokens"
        )
    if clean.shape != corrupted.shape:
        raise PatchingError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} tokens differ in shape: "
            "pad both to the same length (and pass the shared attention_mask)"
        )


def masked(x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Zero `x` `[n, batch, pos, ...]` at padding positions."""
    if attention_mask is None:
        return x
    mask = attention_mask.to(x.device, x.dtype)  # [batch, pos]
    return x * mask.view(1, *mask.shape, *([1] * (x.ndim - 3)))
