"""Training checkpoints by revision: `checkpoint_index` / `checkpoint_value` -> a hub revision (Pythia `step{N}`).

As in TransformerLens, Pythia's checkpoints are labelled by training step: 0, the powers of
two 1 ... 512, then every 1000 steps up to 143000 (154 in all). `checkpoint_value` names a
step; `checkpoint_index` indexes that list. The revision `step{N}` is resolved by
`loading.model_names.hub_checkpoint_dir`: with `HF_HUB_OFFLINE` set, from the local HF cache
(`models--EleutherAI--pythia-70m/refs/step{N}` -> `snapshots/<commit>/`), else through the hub
(which reuses the cache). Model names may be TransformerLens names (`pythia-70m`) or repo ids.
"""

from __future__ import annotations

import os
from pathlib import Path

PYTHIA_CHECKPOINTS: list[int] = [0, *(2**i for i in range(10)), *range(1000, 143001, 1000)]


def pythia_repo_id(model_name: str) -> str | None:
    """`EleutherAI/pythia-70m` for `pythia-70m` or `EleutherAI/pythia-70m(-deduped)`; None for other models."""
    from hooked.loading.model_names import get_official_model_name

    repo = get_official_model_name(model_name)
    repo = repo if "/" in repo else f"EleutherAI/{repo}"
    org, name = repo.split("/", 1)
    return repo if org.lower() == "eleutherai" and name.lower().startswith("pythia-") else None


def checkpoint_revision(
    model_name: str, checkpoint_index: int | None = None, checkpoint_value: int | None = None
) -> str | None:
    """The hub revision of a training checkpoint (`step{N}`), or None when none was asked for."""
    if checkpoint_index is None and checkpoint_value is None:
        return None
    if checkpoint_index is not None and checkpoint_value is not None:
        raise ValueError("Pass checkpoint_index or checkpoint_value (alias checkpoint_label), not both")
    if pythia_repo_id(model_name) is None:
        raise ValueError(
            f"Training checkpoints are available for the Pythia models (EleutherAI/pythia-*), not {model_name!r}"
        )
    if checkpoint_index is not None:
        n = len(PYTHIA_CHECKPOINTS)
        if not -n <= checkpoint_index < n:
            raise ValueError(f"checkpoint_index {checkpoint_index} is out of range: Pythia has {n} checkpoints")
        return f"step{PYTHIA_CHECKPOINTS[checkpoint_index]}"
    if checkpoint_value not in PYTHIA_CHECKPOINTS:
        raise ValueError(
            f"Pythia has no checkpoint at step {checkpoint_value}; the steps are 0, 1, 2, 4, ..., 512, "
            "then every 1000 up to 143000 (see loading.checkpoints.PYTHIA_CHECKPOINTS)"
        )
    return f"step{checkpoint_value}"


def hf_hub_cache(cache_dir: str | os.PathLike | None = None) -> Path:
    """The HF hub cache: `cache_dir`, else `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else huggingface_hub's default."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_revisions(repo_id: str, cache_dir: str | os.PathLike | None = None) -> list[str]:
    """The named revisions of `repo_id` present in the HF cache (its `refs/`)."""
    refs = hf_hub_cache(cache_dir) / f"models--{repo_id.replace('/', '--')}" / "refs"
    return sorted(p.name for p in refs.iterdir()) if refs.is_dir() else []


def revision_dir(repo_id: str, revision: str, cache_dir=None, token=None) -> Path:
    """The snapshot directory of `repo_id` at `revision`, through `loading.model_names.hub_checkpoint_dir`
    (the HF cache when `HF_HUB_OFFLINE` is set, else the hub); a missing revision names the cached ones."""
    from hooked.loading.model_names import hub_checkpoint_dir

    cache = hf_hub_cache(cache_dir)
    try:
        return hub_checkpoint_dir(repo_id, revision, cache_dir=cache, token=token)
    except FileNotFoundError as err:
        cached = ", ".join(cached_revisions(repo_id, cache)) or "none"
        raise FileNotFoundError(
            f"Revision {revision!r} of {repo_id} could not be loaded: it is not in the HF cache {cache} "
            f"(cached revisions: {cached}) and the hub could not be used ({err}). Download it once with "
            f"`huggingface-cli download {repo_id} --revision {revision}`, or unset HF_HUB_OFFLINE."
        ) from err


def resolve_checkpoint(
    model_name: str, checkpoint_index=None, checkpoint_value=None, checkpoint_label=None, hf_model=None, **hf_kwargs
) -> tuple[str, dict]:
    """`(where to load from, config provenance fields)` for `from_pretrained`'s checkpoint arguments.

    Without a checkpoint this is `(model_name, {})`. With one, it is the local snapshot
    directory of that revision, and the fields `from_checkpoint`, `checkpoint_index`,
    `checkpoint_value` and `checkpoint_label_type`.
    """
    if checkpoint_value is not None and checkpoint_label is not None:
        raise ValueError("checkpoint_label is an alias of checkpoint_value: pass one of them, not both")
    value = checkpoint_value if checkpoint_value is not None else checkpoint_label
    revision = checkpoint_revision(model_name, checkpoint_index, value)
    if revision is None:
        return model_name, {}
    if hf_model is not None:
        raise ValueError("checkpoint_index/checkpoint_value pick weights from the hub; they cannot apply to hf_model=")
    step = int(revision.removeprefix("step"))
    fields = dict(
        from_checkpoint=True,
        checkpoint_index=PYTHIA_CHECKPOINTS.index(step),
        checkpoint_value=step,
        checkpoint_label_type="step",
    )
    repo_id = pythia_repo_id(model_name)
    assert repo_id is not None  # checkpoint_revision found a revision: the model is a Pythia model
    directory = revision_dir(repo_id, revision, hf_kwargs.get("cache_dir"), hf_kwargs.get("token"))
    return str(directory), fields
