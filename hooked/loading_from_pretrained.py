"""TransformerLens's `loading_from_pretrained` module path, served by the `loading` package."""

from hooked.loading import *  # noqa: F401,F403
from hooked.loading import __all__  # noqa: F401
