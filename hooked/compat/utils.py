"""`transformer_lens.utils`: everything in `hooked.core.utils`, plus TransformerLens 2.x's other helpers.

The helpers here follow TransformerLens's semantics (same arguments, defaults and
results); they are written for `hooked` and used only through the alias.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.components import xielu as _xielu
from hooked.components.activations import solu
from hooked.core.factored_matrix import FactoredMatrix
from hooked.core.utils import *  # noqa: F401,F403
from hooked.core.utils import (  # noqa: F401
    USE_DEFAULT_VALUE,
    Slice,
    get_act_name,
    lm_accuracy,
    lm_cross_entropy_loss,
    positions_from_mask,
    to_numpy,
)

logger = logging.getLogger(__name__)

SliceInput = Any  # int | tuple | list | Tensor | ndarray | slice | None, as Slice accepts


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def __getattr__(name: str):
    if name == "CACHE_DIR":
        return _cache_dir()
    raise AttributeError(f"module 'transformer_lens.utils' has no attribute {name!r}")


# -- activation functions -------------------------------------------------------------
def gelu_new(input: Float[torch.Tensor, "*batch d_mlp"]) -> Float[torch.Tensor, "*batch d_mlp"]:
    """GPT-2's tanh approximation of GELU."""
    return 0.5 * input * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


def gelu_fast(input: Float[torch.Tensor, "*batch d_mlp"]) -> Float[torch.Tensor, "*batch d_mlp"]:
    return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input * input)))


def gelu_pytorch_tanh(input: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(input, approximate="tanh")


XIELU = _xielu.XIELU


def xielu(input: Float[torch.Tensor, "*batch d_mlp"]) -> Float[torch.Tensor, "*batch d_mlp"]:
    """xIELU with its default parameters (alpha_p = alpha_n = 0.8, beta = 0.5)."""
    return _xielu.xielu(input, 0.8, 0.8, 0.5, -1e-6)


ACTIVATION_FN_DICT: dict[str, Callable] = {
    "xielu": xielu,
    "solu": solu,
    "solu_ln": solu,
    "gelu_new": gelu_new,
    "gelu_fast": gelu_fast,
    "silu": nn.functional.silu,
    "relu": nn.functional.relu,
    "gelu": nn.functional.gelu,
    "gelu_pytorch_tanh": gelu_pytorch_tanh,
}


# -- small tensor helpers -------------------------------------------------------------
def get_corner(tensor, n: int = 3):
    """The top-left `n x n x ...` corner of a tensor (a FactoredMatrix's is materialised)."""
    index = tuple(slice(n) for _ in range(tensor.ndim))
    return tensor[index].AB if isinstance(tensor, FactoredMatrix) else tensor[index]


def transpose(tensor: Float[torch.Tensor, "... a b"]) -> Float[torch.Tensor, "... b a"]:
    return tensor.transpose(-1, -2)


def composition_scores(left: FactoredMatrix, right: FactoredMatrix, broadcast_dims: bool = True) -> torch.Tensor:
    """`|L R|_F / (|L|_F |R|_F)`; with `broadcast_dims` the leading axes of left and right are crossed."""
    if broadcast_dims:
        l_leading, r_leading = left.ndim - 2, right.ndim - 2
        for i in range(l_leading):
            right = right.unsqueeze(i)
        for i in range(r_leading):
            left = left.unsqueeze(i + l_leading)
    if left.rdim != right.ldim:
        from hooked.core.errors import ShapeMismatchError

        raise ShapeMismatchError(
            f"Composition scores require left.rdim==right.ldim, shapes were left: {left.shape}, right:{right.shape}"
        )
    new_right, new_left = right.collapse_r(), left.collapse_l()
    r_norms, l_norms = new_right.norm(dim=[-2, -1]), new_left.norm(dim=[-2, -1])
    return (new_left @ new_right).norm(dim=[-2, -1]) / r_norms / l_norms


def get_offset_position_ids(past_kv_pos_offset: int, attention_mask: Int[torch.Tensor, "batch offset_pos"]):
    return positions_from_mask(attention_mask)[:, past_kv_pos_offset:]


def get_cumsum_along_dim(tensor: torch.Tensor, dim: int, reverse: bool = False) -> torch.Tensor:
    if reverse:
        return tensor.flip(dims=(dim,)).cumsum(dim=dim).flip(dims=(dim,))
    return tensor.cumsum(dim=dim)


def repeat_along_head_dimension(tensor: Float[torch.Tensor, "batch pos d_model"], n_heads: int, clone_tensor=True):
    repeated = tensor.unsqueeze(2).expand(*tensor.shape[:2], n_heads, tensor.shape[-1])  # [batch, pos, head, d_model]
    return repeated.clone() if clone_tensor else repeated


def get_nested_attr(obj, attr_str: str):
    for attr in attr_str.split("."):
        obj = getattr(obj, attr)
    return obj


def set_nested_attr(obj, attr_str: str, value) -> None:
    *path, leaf = attr_str.split(".")
    for attr in path:
        obj = getattr(obj, attr)
    setattr(obj, leaf, value)


def override_or_use_default_value(default_flag, override=None):
    return override if override is not None else default_flag


def check_structure(t1: torch.Tensor, t2: torch.Tensor, *, verbose: bool = False) -> None:
    """Print whether two square matrices order their adjacent rows and columns the same way."""
    assert t1.ndim == 2 and t1.shape == t2.shape
    rows = [i for i in range(t1.shape[0] - 1) if (t1[i].ge(t1[i + 1]) != t2[i].ge(t2[i + 1])).any()]
    cols = [j for j in range(t1.shape[1] - 1) if (t1[:, j].ge(t1[:, j + 1]) != t2[:, j].ge(t2[:, j + 1])).any()]
    if not rows and not cols:
        print("PASSED")
    elif rows:
        print(f"row mismatch: {rows}")
    else:
        print(f"column mismatch: {cols}")


# -- initialisation (TransformerLens's fan convention: [d_in, d_out], [head, d_model, d_head]) --
def calc_fan_in_and_fan_out(tensor: torch.Tensor) -> tuple[int, int]:
    shape = tensor.shape
    if len(shape) == 0:
        raise ValueError("Fan in and fan out can not be computed for scalars.")
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) == 3:
        return shape[1], shape[0] * shape[2]
    raise ValueError(f"Fan in and fan out can not be computed for shape {shape} tensors.")


def init_xavier_uniform_(param: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    fan_in, fan_out = calc_fan_in_and_fan_out(param)
    bound = gain * np.sqrt(6.0 / (fan_in + fan_out))
    return nn.init.uniform_(param, -bound, bound)


def init_xavier_normal_(param: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    fan_in, fan_out = calc_fan_in_and_fan_out(param)
    return nn.init.normal_(param, mean=0.0, std=gain * np.sqrt(2.0 / (fan_in + fan_out)))


def _kaiming_scale(param, a, nonlinearity, gain, mode) -> float:
    fan_in, fan_out = calc_fan_in_and_fan_out(param)
    return gain * nn.init.calculate_gain(nonlinearity, a) / np.sqrt(fan_in if mode == "fan_in" else fan_out)


def init_kaiming_uniform_(param, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0, mode: str = "fan_in"):
    bound = _kaiming_scale(param, a, nonlinearity, gain, mode) * np.sqrt(3.0)
    return nn.init.uniform_(param, -bound, bound)


def init_kaiming_normal_(param, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0, mode: str = "fan_in"):
    return nn.init.normal_(param, mean=0.0, std=_kaiming_scale(param, a, nonlinearity, gain, mode))


# -- sampling -------------------------------------------------------------------------
def sample_logits(
    final_logits: Float[torch.Tensor, "batch d_vocab"],
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float = 1.0,
    freq_penalty: float = 0.0,
    tokens: Int[torch.Tensor, "batch pos"] | None = None,
) -> Int[torch.Tensor, "batch"]:  # noqa: F405
    """One sampled token per row (temperature 0 is greedy), as TransformerLens samples."""
    from hooked.generation.sampling import sample_next_token

    if top_k is not None and top_k <= 0:
        from hooked.core.errors import InputError

        raise InputError(f"top_k has to be greater than 0, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        from hooked.core.errors import InputError

        raise InputError(f"top_p has to be in (0, 1], got {top_p}")
    return sample_next_token(
        final_logits, tokens, top_k=top_k, top_p=top_p, temperature=temperature, freq_penalty=freq_penalty
    )


# -- tokenizers and tokens ------------------------------------------------------------
def get_attention_mask(tokenizer, tokens: Int[torch.Tensor, "batch pos"], prepend_bos: bool) -> torch.Tensor:
    """TransformerLens's pad-id inference: leading pads masked if the tokenizer pads left, trailing otherwise."""
    from hooked.core.utils import get_attention_mask as left_padding_mask

    if tokenizer.padding_side == "left":
        return left_padding_mask(tokenizer, tokens, prepend_bos)
    is_real = tokens.ne(tokenizer.pad_token_id).long()
    mask = get_cumsum_along_dim(is_real, -1, reverse=True) > 0
    if prepend_bos and tokenizer.bos_token_id == tokenizer.pad_token_id:
        mask[..., 0] = True
    return mask.long()


def get_tokens_with_bos_removed(
    tokenizer, tokens: Int[torch.Tensor, "batch pos"]
) -> Int[torch.Tensor, "batch pos_minus_1"]:
    """Drop each row's BOS (the first token if padding is right, else the BOS after the leading pads)."""
    if tokenizer.padding_side == "right":
        return tokens[..., 1:]
    if tokenizer.bos_token_id == tokenizer.pad_token_id:
        leading_pads = (get_cumsum_along_dim(tokens.ne(tokenizer.pad_token_id), -1) == 0).sum(-1)
        bos_positions = leading_pads - 1
    else:
        bos_positions = (tokens == tokenizer.bos_token_id).int().argmax(-1)
    keep = torch.ones_like(tokens, dtype=torch.bool).scatter(-1, bos_positions.unsqueeze(-1), False)
    return tokens[keep].view(*tokens.shape[:-1], tokens.shape[-1] - 1)


def get_input_with_manually_prepended_bos(tokenizer, input: str | list[str]):
    return tokenizer.bos_token + input if isinstance(input, str) else [tokenizer.bos_token + s for s in input]


def get_tokenizer_with_bos(tokenizer):
    """The tokenizer itself: `hooked` adds BOS at the id level, never by reloading the tokenizer."""
    return tokenizer


def keep_single_column(dataset, col_name: str):
    """Remove every column but `col_name` from a HuggingFace dataset."""
    return dataset.remove_columns([c for c in dataset.features if c != col_name])


def tokenize_and_concatenate(
    dataset,
    tokenizer,
    streaming: bool = False,
    max_length: int = 1024,
    column_name: str = "text",
    add_bos_token: bool = True,
    num_proc: int = 10,
):
    """Tokenize a text dataset, join the texts with EOS and cut the stream into `[n, max_length]` rows.

    Each row starts with BOS when `add_bos_token`; the last incomplete row is dropped.
    Returns a dataset with one torch column, `tokens`.
    """
    dataset = keep_single_column(dataset, column_name)
    seq_len = max_length - 1 if add_bos_token else max_length
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token is not None else tokenizer.eos_token_id

    def tokenize(examples) -> dict[str, np.ndarray]:
        if tokenizer.eos_token is None:
            raise ValueError("tokenize_and_concatenate needs a tokenizer with an EOS token")
        text = tokenizer.eos_token.join(examples[column_name])
        if not text.strip():
            return {"tokens": np.zeros((0, max_length), dtype=np.int64)}
        tokens = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        n_rows = max(1, len(tokens) // seq_len)
        if len(tokens) < seq_len:
            tokens = np.concatenate([tokens, np.full(seq_len - len(tokens), pad_id, dtype=np.int64)])
        rows = tokens[: n_rows * seq_len].reshape(n_rows, seq_len)
        if add_bos_token:
            rows = np.concatenate([np.full((n_rows, 1), tokenizer.bos_token_id, dtype=np.int64), rows], axis=1)
        return {"tokens": rows}

    tokenized = dataset.map(
        tokenize, batched=True, num_proc=None if streaming else num_proc, remove_columns=[column_name]
    )
    tokenized.set_format(type="torch", columns=["tokens"])
    return tokenized


# -- environment ----------------------------------------------------------------------
_MPS_MIN_SAFE_TORCH_VERSION: tuple[int, ...] | None = None  # no torch release is known to fix MPS yet
_mps_warned = False


def _torch_version_tuple() -> tuple[int, ...]:
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _mps_is_safe() -> bool:
    if os.environ.get("TRANSFORMERLENS_ALLOW_MPS", "") == "1":
        return True
    return _MPS_MIN_SAFE_TORCH_VERSION is not None and _torch_version_tuple() >= _MPS_MIN_SAFE_TORCH_VERSION


def get_device() -> torch.device:
    """CUDA if available; MPS only when known safe or TRANSFORMERLENS_ALLOW_MPS=1; else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available() and torch.backends.mps.is_built() and _mps_is_safe():
        return torch.device("mps")
    return torch.device("cpu")


def warn_if_mps(device) -> None:
    """Warn once that MPS may give silently wrong results, unless it is known safe."""
    global _mps_warned
    device = device.type if isinstance(device, torch.device) else device
    if _mps_warned or device != "mps" or _mps_is_safe():
        return
    _mps_warned = True
    warnings.warn(
        f"MPS backend may produce silently incorrect results (PyTorch {torch.__version__}). "
        "Set TRANSFORMERLENS_ALLOW_MPS=1 to suppress this warning.",
        UserWarning,
        stacklevel=2,
    )


def is_library_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def select_compatible_kwargs(kwargs_dict: dict[str, Any], callable: Callable) -> dict[str, Any]:
    """The entries of `kwargs_dict` that `callable` accepts by name."""
    params = inspect.signature(callable).parameters
    return {k: v for k, v in kwargs_dict.items() if k in params}


def print_gpu_mem(step_name: str = "") -> None:
    if torch.cuda.is_available():
        print(f"{step_name} ~ {np.round(torch.cuda.memory_allocated() / 2e30, 2)} GiB allocated on GPU.")
    else:
        print(f"{step_name} ~ CUDA not available")


def download_file_from_hf(
    repo_name: str, file_name: str, subfolder: str = ".", cache_dir=None, force_is_torch=False, **kwargs
):
    """Download (or find in the local HF cache) one file of a hub repo; JSON is parsed, `.pt`/`.pth` loaded."""
    import json

    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id=repo_name, filename=file_name, subfolder=subfolder, cache_dir=cache_dir, **kwargs)
    if path.endswith((".pth", ".pt")) or force_is_torch:
        return torch.load(path, map_location="cpu", weights_only=True)
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    return path


def clear_huggingface_cache() -> None:
    """Delete the HuggingFace hub cache directory."""
    print("Deleting Hugging Face cache directory and all its contents.")
    shutil.rmtree(_cache_dir(), ignore_errors=True)


def get_dataset(dataset_name: str, **kwargs):
    """One of TransformerLens's small convenience datasets, through `datasets.load_dataset`."""
    from datasets import load_dataset

    names = {
        "openwebtext": "stas/openwebtext-10k",
        "owt": "stas/openwebtext-10k",
        "pile": "NeelNanda/pile-10k",
        "c4": "NeelNanda/c4-10k",
        "code": "NeelNanda/code-10k",
        "python": "NeelNanda/code-10k",
        "c4_code": "NeelNanda/c4-code-20k",
        "c4-code": "NeelNanda/c4-code-20k",
        "wiki": "NeelNanda/wiki-10k",
    }
    if dataset_name not in names:
        raise ValueError(f"Dataset {dataset_name} not supported; choose one of {sorted(names)}")
    return load_dataset(names[dataset_name], split="train", **kwargs)


class LocallyOverridenDefaults:
    """Context manager that temporarily sets `prepend_bos` / `padding_side` defaults of a model.

    `hooked` resolves these per call (nothing needs overriding); this sets
    `model.cfg.default_prepend_bos` and `model.tokenizer.padding_side` for code that relies on it.
    """

    _LOCATIONS = {"prepend_bos": ("cfg", "default_prepend_bos"), "padding_side": ("tokenizer", "padding_side")}

    def __init__(self, model, **overrides):
        for name in overrides:
            assert name in self._LOCATIONS, f"{name} is not a valid parameter to override."
        self.model, self.overrides, self._saved = model, overrides, {}

    def __enter__(self):
        for name, value in self.overrides.items():
            owner_name, attr = self._LOCATIONS[name]
            owner = getattr(self.model, owner_name)
            if owner is None or value is None:
                continue
            self._saved[name] = getattr(owner, attr)
            setattr(owner, attr, value)

    def __exit__(self, *exc):
        for name, value in self._saved.items():
            owner_name, attr = self._LOCATIONS[name]
            setattr(getattr(self.model, owner_name), attr, value)
