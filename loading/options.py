"""`LoadOptions`: every option of `from_pretrained` in one validated object.

`HookedTransformer.from_pretrained(name, fold_ln=False, dtype="bfloat16")` gathers its keywords
(TransformerLens's names and order, plus the HuggingFace loading arguments and the pipeline
ones) into a `LoadOptions`, checked once when built, and hands it to `load_pretrained` or, for
`pipeline=True`, to the pipeline loader. `load_pretrained(HookedTransformer, name, options)`
loads with an options object built beforehand.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from hooked.core.errors import InputError
from hooked.loading.validation import check_loading_kwarg_names, merge_torch_dtype, refuse_remote_code, to_dtype

#: The weight-processing flags, as `load_and_process_state_dict` takes them.
PROCESSING_FLAGS = (
    "fold_ln",
    "center_writing_weights",
    "center_unembed",
    "fold_value_biases",
    "refactor_factored_attn_matrices",
)
#: The HuggingFace hub arguments passed on to the checkpoint lookup (when set).
HUB_ARGS = ("revision", "token", "cache_dir", "local_files_only")


@dataclass(frozen=True)
class LoadOptions:
    """How `from_pretrained` finds, converts, processes and places a checkpoint (its docstring has the details).

    Attributes:
        fold_ln: fold each norm's gain (and bias) into the weights that read it.
        center_writing_weights: remove the mean over d_model from every residual write (LayerNorm models).
        center_unembed: remove the mean over the vocabulary from `W_U` (log-probs unchanged).
        refactor_factored_attn_matrices: rebalance `W_Q`/`W_K` and `W_V`/`W_O` by SVD.
        checkpoint_index: a Pythia training checkpoint, by index in TransformerLens's list.
        checkpoint_value: a Pythia training checkpoint, by step.
        checkpoint_label: alias of `checkpoint_value`, as in TransformerLens.
        hf_model: an HF model already in memory: its weights are converted (never written).
        device: where the model lives ("cpu", "cuda", ...).
        n_devices: split the blocks evenly and contiguously over `cuda:0` ... `cuda:{n-1}`.
        tokenizer: a tokenizer to use instead of the checkpoint's.
        move_to_device: move the model to `device` after loading.
        fold_value_biases: fold each head's value bias into the output bias.
        default_prepend_bos: whether text gets a BOS token by default (None: the family's default).
        default_padding_side: "right" or "left", for batches of text.
        dtype: the weights' dtype; processing always runs in float32 before the cast
            (a `torch_dtype` given with it is merged in here).
        first_n_layers: load only the first n blocks.
        n_ctx: the context length (default: the checkpoint's `max_position_embeddings`).
        device_map: "auto", "balanced", "sequential" or `{part: device}`, as in HF.
        max_memory: `{device: bytes or "200MB"}` budgets for `device_map`, as in HF.
        offload_folder: where parts placed on "disk" are written.
        revision: the hub revision (branch, tag or commit) to load.
        token: the hub token, for gated or private repos.
        cache_dir: the HF cache to look in (default: `$HF_HUB_CACHE`).
        local_files_only: accepted for HF compatibility (`HF_HUB_OFFLINE=1` decides).
        trust_remote_code: must stay False: no code shipped with a checkpoint is ever run.
        torch_dtype: HF's name for `dtype`; it becomes `dtype` (None afterwards).
        pipeline: under `torchrun`, give each rank one stage of blocks (needs `import hooked.scale`).
        micro_batches: with `pipeline`, the default number of slices a forward cuts the batch into (None: 1).
        timeout_s: with `pipeline`, how long a rank waits for the others (None: 300 s).
    """

    fold_ln: bool = True
    center_writing_weights: bool = True
    center_unembed: bool = True
    refactor_factored_attn_matrices: bool = False
    checkpoint_index: int | None = None
    checkpoint_value: int | None = None
    checkpoint_label: int | None = None
    hf_model: Any = None
    device: str | torch.device | None = None
    n_devices: int = 1
    tokenizer: Any = None
    move_to_device: bool = True
    fold_value_biases: bool = True
    default_prepend_bos: bool | None = None
    default_padding_side: str = "right"
    dtype: str | torch.dtype = "float32"
    first_n_layers: int | None = None
    n_ctx: int | None = None
    device_map: str | dict | None = None
    max_memory: dict | None = None
    offload_folder: str | None = None
    revision: str | None = None
    token: str | bool | None = None
    cache_dir: str | None = None
    local_files_only: bool | None = None
    trust_remote_code: bool = False
    torch_dtype: str | torch.dtype | None = None
    pipeline: bool = False
    micro_batches: int | None = None
    timeout_s: float | None = None

    def __post_init__(self):
        refuse_remote_code(self.trust_remote_code)
        if self.torch_dtype is not None:
            object.__setattr__(self, "dtype", merge_torch_dtype(self.dtype, self.torch_dtype))
            object.__setattr__(self, "torch_dtype", None)  # merged: `dataclasses.replace` then sees one dtype
        to_dtype(self.dtype)
        if not self.pipeline and (self.micro_batches is not None or self.timeout_s is not None):
            raise TypeError(
                "micro_batches= and timeout_s= configure pipeline loading: pass pipeline=True (under torchrun, "
                "after `import hooked.scale`) or leave them out"
            )
        if self.pipeline and (self.n_devices != 1 or self.device is not None):
            raise InputError("pipeline=True places each stage on its rank's device: do not pass device= or n_devices=")

    @classmethod
    def from_keywords(cls, **keywords) -> LoadOptions:
        """`LoadOptions(**keywords)`, refusing an unknown name as `from_pretrained` does (with close matches)."""
        check_loading_kwarg_names(keywords, OPTION_NAMES)
        return cls(**keywords)

    @property
    def processing(self) -> dict[str, bool]:
        """The weight-processing flags, as keyword arguments of `load_and_process_state_dict`."""
        return {name: getattr(self, name) for name in PROCESSING_FLAGS}

    @property
    def checkpoints(self) -> dict[str, Any]:
        """`checkpoint_index`, `checkpoint_value`, `checkpoint_label`, as `resolve_checkpoint` takes them."""
        return {name: getattr(self, name) for name in ("checkpoint_index", "checkpoint_value", "checkpoint_label")}

    @property
    def placement(self) -> dict[str, Any]:
        """`device_map`, `max_memory`, `offload_folder`, as `load_placed` takes them."""
        return {name: getattr(self, name) for name in ("device_map", "max_memory", "offload_folder")}

    @property
    def hub_kwargs(self) -> dict[str, Any]:
        """The hub arguments that were set, for the checkpoint lookup."""
        return {name: getattr(self, name) for name in HUB_ARGS if getattr(self, name) is not None}


OPTION_NAMES = tuple(f.name for f in fields(LoadOptions))
