"""`transformer_lens.lit`'s model and dataset wrappers, as far as `hooked` provides them.

`hooked` ships the LIT integration's helpers (`utils`, `constants`) but not its LIT
wrappers: every class here raises on construction, with an `ImportError` when lit-nlp is
missing (as TransformerLens does) and a `NotImplementedError` naming the gap when it is
installed. `HookedTransformerLITConfig` is a plain settings record and works.
"""

from __future__ import annotations

from dataclasses import dataclass

from hooked.compat.lit.constants import DEFAULTS, ERRORS
from hooked.compat.lit.utils import check_lit_installed


def _unavailable(name: str):
    if not check_lit_installed():
        raise ImportError(ERRORS.LIT_NOT_INSTALLED)
    raise NotImplementedError(
        f"{name}: hooked's transformer_lens alias does not implement the LIT wrappers; "
        "use transformer_lens itself for LIT, or read activations with run_with_cache."
    )


@dataclass
class HookedTransformerLITConfig:
    """What a LIT model wrapper computes per example."""

    max_seq_length: int = DEFAULTS.MAX_SEQ_LENGTH
    batch_size: int = DEFAULTS.BATCH_SIZE
    top_k: int = DEFAULTS.TOP_K
    compute_gradients: bool = DEFAULTS.COMPUTE_GRADIENTS
    output_attention: bool = DEFAULTS.OUTPUT_ATTENTION
    output_embeddings: bool = DEFAULTS.OUTPUT_EMBEDDINGS
    output_all_layers: bool = DEFAULTS.OUTPUT_ALL_LAYERS
    embedding_layers: list[int] | None = None
    prepend_bos: bool = DEFAULTS.PREPEND_BOS
    device: str | None = DEFAULTS.DEVICE


class _Unavailable:
    def __init__(self, *args, **kwargs):
        _unavailable(type(self).__name__)

    @classmethod
    def from_strings(cls, *args, **kwargs):
        _unavailable(cls.__name__)


class HookedTransformerLIT(_Unavailable):
    """A `HookedTransformer` as a LIT model (not provided by hooked: see the module docstring)."""


class SimpleTextDataset(_Unavailable):
    """A LIT dataset of texts (not provided by hooked)."""


class PromptCompletionDataset(_Unavailable):
    """A LIT dataset of prompt/completion pairs (not provided by hooked)."""


class IOIDataset(_Unavailable):
    """A LIT indirect-object-identification dataset (not provided by hooked)."""


class InductionDataset(_Unavailable):
    """A LIT induction dataset (not provided by hooked)."""


class LITWidget(_Unavailable):
    """LIT in a notebook (not provided by hooked)."""


def wrap_for_lit(dataset):
    _unavailable("wrap_for_lit")


def serve(models, datasets, port: int = 5432, host: str = "localhost", page_title: str = "", **kwargs) -> None:
    """Start a LIT server (not provided by hooked)."""
    _unavailable("serve")
