"""Which hooks to harvest (exact names or globs) and how far the forward pass must run for them."""

from __future__ import annotations

import difflib
import fnmatch
import re

from hooked.core.errors import InputError

GLOB_CHARS = "*?["


def resolve_hooks(model, hooks: str | list[str]) -> list[str]:
    """Hook names from exact names or fnmatch globs (`blocks.*.hook_resid_post`), comma-separated or a list.

    Names come back in the model's hook order; an unknown name or a glob matching nothing raises
    with the closest names.
    """
    items = [h.strip() for h in (hooks.split(",") if isinstance(hooks, str) else hooks) if h.strip()]
    if not items:
        raise InputError("No hooks given: pass hook names such as blocks.0.hook_resid_post (or a glob).")
    names = [n for n, hp in model.hook_dict.items() if model.is_active(hp)]
    chosen = set()
    for item in items:
        matches = fnmatch.filter(names, item) if any(c in item for c in GLOB_CHARS) else [item] * (item in names)
        if not matches:
            close = difflib.get_close_matches(item, names, n=5, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise InputError(
                f"No hook point matches {item!r}.{hint} (model.hook_dict lists all names; "
                f"use a glob such as 'blocks.*.hook_resid_post' for several.)"
            )
        chosen.update(matches)
    for name in chosen:
        pos_axis = model.hook_dict[name].pos_axis
        if pos_axis != 1:
            raise InputError(
                f"Hook {name!r} is not a per-token activation [batch, pos, ...] (its position axis is "
                f"{pos_axis}); harvest stores one row per token. Pick a hook such as hook_z or hook_q."
            )
    return [n for n in names if n in chosen]


def stop_layer(hooks: list[str], n_layers: int) -> int | None:
    """The `stop_at_layer` that still runs every hook: last block index + 1, 0 for embeddings, None after blocks."""
    stop = 0
    for name in hooks:
        m = re.match(r"blocks\.(\d+)\.", name)
        if m:
            stop = max(stop, int(m.group(1)) + 1)
        elif not name.startswith(("hook_embed", "hook_pos_embed", "hook_tokens")):
            return None  # ln_final / unembed hooks need the whole model
    return stop
