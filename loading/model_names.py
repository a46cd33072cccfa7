"""TransformerLens's official model names and aliases, and hub checkpoints in the local HF cache.

`get_official_model_name("gpt2-small") == "gpt2"`; any other name is taken as a hub repo
id. `hub_checkpoint_dir(repo_id, revision)` returns a local snapshot directory through
`huggingface_hub`: downloaded when online, read from the HF cache when `HF_HUB_OFFLINE=1`.
Only names of architectures `hooked` converts are listed here.
"""

from __future__ import annotations

import os
from pathlib import Path

_PYTHIA_SIZES = ("14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b")

# official name (a hub repo id) -> TransformerLens's aliases
MODEL_ALIASES: dict[str, list[str]] = {
    "gpt2": ["gpt2-small", "gpt-2-small", "gpt2_small", "gpt2"],
    "gpt2-medium": ["gpt2-medium", "gpt-2-medium", "gpt2_medium"],
    "gpt2-large": ["gpt2-large", "gpt-2-large", "gpt2_large"],
    "gpt2-xl": ["gpt2-xl", "gpt-2-xl", "gpt2_xl"],
    "distilgpt2": ["distillgpt2", "distill-gpt2", "distil-gpt2", "gpt2-xs"],
    **{f"EleutherAI/pythia-{s}": [f"pythia-{s}"] for s in _PYTHIA_SIZES},
    **{f"EleutherAI/pythia-{s}-deduped": [f"pythia-{s}-deduped"] for s in _PYTHIA_SIZES if s not in ("14m", "31m")},
    "meta-llama/Llama-2-7b-hf": ["Llama-2-7b", "meta-llama/Llama-2-7b-hf"],
    "meta-llama/Llama-3.2-1B": ["Llama-3.2-1B"],
    "meta-llama/Llama-3.2-1B-Instruct": ["Llama-3.2-1B-Instruct"],
    "meta-llama/Meta-Llama-3-8B": ["Meta-Llama-3-8B"],
    "mistralai/Mistral-7B-v0.1": ["mistral-7b"],
    "mistralai/Mistral-7B-Instruct-v0.1": ["mistral-7b-instruct"],
    "Qwen/Qwen2-0.5B": ["qwen2-0.5b"],
    "Qwen/Qwen2.5-0.5B": ["qwen2.5-0.5b"],
    "Qwen/Qwen2.5-0.5B-Instruct": ["qwen2.5-0.5b-instruct"],
    "Qwen/Qwen3-0.6B": ["qwen3-0.6b"],
    "google/gemma-2b": ["gemma-2b"],
    "google/gemma-2-2b": ["gemma-2-2b"],
    **{
        f"google/gemma-3-{s}": [f"gemma-3-{s}"]
        for s in ("270m", "270m-it", "1b-pt", "1b-it", "4b-pt", "4b-it", "12b-pt", "12b-it", "27b-pt", "27b-it")
    },
    **{f"google/medgemma-{s}": [f"medgemma-{s}"] for s in ("4b-pt", "4b-it", "27b-it", "27b-text-it")},
    "HuggingFaceTB/SmolLM2-135M": ["smollm2-135m-base"],
}
OFFICIAL_MODEL_NAMES: list[str] = list(MODEL_ALIASES)
NAME_TO_OFFICIAL = {alias.lower(): name for name, aliases in MODEL_ALIASES.items() for alias in [name, *aliases]}

# what `snapshot_download` fetches: configs, tokenizer files and safetensors weights (no pickles)
_CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]


def get_official_model_name(model_name: str) -> str:
    """The hub repo id for a TransformerLens name or alias; any other name is returned as given (a repo id)."""
    return NAME_TO_OFFICIAL.get(model_name.lower(), model_name)


def hub_checkpoint_dir(repo_id: str, revision: str | None = None, cache_dir=None, token=None, **_) -> Path:
    """A local directory holding `repo_id` at `revision` (downloaded, or from the HF cache when offline).

    `cache_dir` defaults to `$HF_HUB_CACHE` (read at call time); `HF_HUB_OFFLINE=1` never
    touches the network.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache_dir = cache_dir or os.environ.get("HF_HUB_CACHE") or None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            allow_patterns=_CHECKPOINT_FILES,
            local_files_only=offline,
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError) as err:
        where = "in the local HF cache (HF_HUB_OFFLINE is set)" if offline else "on the hub or in the local HF cache"
        raise FileNotFoundError(
            f"{repo_id!r} is not a local checkpoint directory, a .gguf file or a bundled model, and as a hub repo id"
            f"{'' if revision is None else f' at revision {revision!r}'} it was not found {where}. "
            "Pass a local path, a hub id in the cache, or hf_model=."
        ) from err
    return Path(path)
