"""Running one model over several processes with torch.distributed: a pipeline of stages,
collectives that name both sides of a mismatch, caches shared across ranks.

Placement inside one process (device maps, offload) is `hooked.placement`. This package
plugs into the model through its declared seams: it registers the `pipeline=True` loader
of `HookedTransformer.from_pretrained`, and its `PipelineTransformer` overrides
`generate_step` and `agree_on_tokens`.
"""

from hooked.models.hooked_transformer import HookedTransformer
from hooked.scale.pipeline import PipelineTransformer, from_pretrained_pipeline

HookedTransformer.register_placement_loader("pipeline", from_pretrained_pipeline)

__all__ = ["PipelineTransformer", "from_pretrained_pipeline"]
