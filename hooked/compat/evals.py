"""`transformer_lens.evals`: quick loss evaluations (the data loaders read small HF datasets)."""

from __future__ import annotations

import torch

SANITY_TEXT = (
    "Many important transition points in the history of science have been moments when science 'zoomed in.' "
    "At these points, we develop a visualization or tool that allows us to see the world in a new level of detail, "
    "and a new field of science develops to study the world through this lens."
)

# name -> (load_dataset arguments, text column)
DATASETS = {
    "wiki": (("wikitext", "wikitext-2-v1"), "text"),
    "owt": (("stas/openwebtext-10k",), "text"),
    "pile": (("NeelNanda/pile-10k",), "text"),
    "code": (("codeparrot/codeparrot-valid-v2-near-dedup",), "content"),
}
DATASET_NAMES = list(DATASETS)


def sanity_check(model) -> torch.Tensor:
    """The loss on one paragraph: below ~5 the model is probably fine, above ~7 something is wrong."""
    return model(SANITY_TEXT, return_type="loss")


def _data_loader(name: str, tokenizer, batch_size: int = 8):
    from datasets import load_dataset
    from torch.utils.data import DataLoader

    from hooked.compat.utils import tokenize_and_concatenate

    args, column = DATASETS[name]
    dataset = tokenize_and_concatenate(load_dataset(*args, split="train"), tokenizer, column_name=column)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)


def make_wiki_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("wiki", tokenizer, batch_size)


def make_owt_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("owt", tokenizer, batch_size)


def make_pile_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("pile", tokenizer, batch_size)


def make_code_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("code", tokenizer, batch_size)


DATASET_LOADERS = [make_wiki_data_loader, make_owt_data_loader, make_pile_data_loader, make_code_data_loader]


@torch.inference_mode()
def evaluate_on_dataset(model, data_loader, truncate: int = 100, device=None) -> float:
    """Mean loss over the batches of a loader of `{"tokens": ...}` (at most `truncate + 1` batches, as TL)."""
    device = device or model.cfg.device
    losses = []
    for batch in data_loader:
        losses.append(model(batch["tokens"].to(device), return_type="loss").mean().item())
        if len(losses) > truncate:
            break
    return sum(losses) / len(losses)


@torch.inference_mode()
def induction_loss(model, tokenizer=None, batch_size: int = 4, subseq_len: int = 384, prepend_bos=None, device=None):
    """Loss on the second half of (BOS +) a random sequence repeated twice: low iff the model does induction."""
    device = device or model.cfg.device
    bos = model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    tokens = torch.randint(100, 20000, (batch_size, subseq_len), device=device) % model.cfg.d_vocab
    repeated = torch.cat([tokens, tokens], dim=1)
    if bos:
        bos_id = (tokenizer or model.tokenizer).bos_token_id
        repeated = torch.cat([torch.full((batch_size, 1), bos_id, device=device), repeated], dim=1)
    loss = model(repeated, return_type="loss", loss_per_token=True)
    return loss[:, subseq_len + int(bos) :].mean()


def evaluate(model, truncate: int = 100, batch_size: int = 8, tokenizer=None) -> dict[str, float]:
    """`{"<name>_loss": loss}` on each of the four datasets."""
    tokenizer = tokenizer or model.tokenizer
    return {
        f"{name}_loss": evaluate_on_dataset(model, loader(tokenizer=tokenizer, batch_size=batch_size), truncate)
        for name, loader in zip(DATASET_NAMES, DATASET_LOADERS)
    }
