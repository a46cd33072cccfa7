"""Interactive HTML views of a model's activations, offline and self-contained.

Each function returns a `View`: it renders in Jupyter, `.save(path)` writes one HTML
file (style, script and data inlined, nothing fetched), and `a + b` puts views on one page.
`feature_dashboard` shows where a direction or an SAE latent fires over a `hooked harvest` dataset;
`attention_over_image` draws a text token's attention to an image's patches over the image.
"""

from hooked.viz._html import View, embedded_data
from hooked.viz.attention import attention_patterns
from hooked.viz.attribution import direct_logit_attribution
from hooked.viz.circuit import circuit_graph
from hooked.viz.feature import DashboardOptions, SAELatent, feature_dashboard
from hooked.viz.image_attention import attention_over_image
from hooked.viz.logit_lens import logit_lens
from hooked.viz.text import activations_over_text

__all__ = [
    "DashboardOptions",
    "SAELatent",
    "View",
    "activations_over_text",
    "attention_over_image",
    "attention_patterns",
    "circuit_graph",
    "direct_logit_attribution",
    "embedded_data",
    "feature_dashboard",
    "logit_lens",
]
