"""Run a model hosted by `hooked serve` as if it were local.

    from hooked import remote

    from hooked.analysis import interventions as iv
    model = remote.connect("https://course.example.org", token="...")
    hooks = [("blocks.3.attn.hook_z", iv.zero_ablate(heads=[5]))]
    logits = model.run_with_hooks("The Eiffel Tower is in", fwd_hooks=hooks)

`connect` returns a `RemoteModel`: the config, hook names and tokenizer arrive once, so
tokenization runs locally; forwards, caches, generation, patching sweeps and attribution
patching run on the server, with hooks given as `hooked.analysis.interventions` objects (data, never
code). A script written with `hooked.analysis.interventions` and `hooked.analysis.metrics` runs unchanged on a
local `HookedTransformer` or a `RemoteModel`.
"""

from hooked.remote.client import RemoteModel, connect

__all__ = ["RemoteModel", "connect"]
