"""`transformer_lens.evals`: the self-contained evaluations (induction loss, IOI-style metrics)."""

from __future__ import annotations

import torch


@torch.inference_mode()
def induction_loss(model, tokenizer=None, batch_size: int = 4, subseq_len: int = 384, prepend_bos=None, device=None):
    """Loss on the second half of BOS + a random sequence repeated twice (low iff the model does induction)."""
    device = device or model.cfg.device
    bos = model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    tokens = torch.randint(100, 20000, (batch_size, subseq_len), device=device) % model.cfg.d_vocab
    repeated = torch.cat([tokens, tokens], dim=1)
    if bos:
        bos_id = (tokenizer or model.tokenizer).bos_token_id
        repeated = torch.cat([torch.full((batch_size, 1), bos_id, device=device), repeated], dim=1)
    loss = model(repeated, return_type="loss", loss_per_token=True)
    return loss[:, subseq_len + int(bos) :].mean()


@torch.inference_mode()
def evaluate_on_dataset(model, data_loader, truncate: int = 100, device=None):
    """Mean loss over the first `truncate` batches of a loader of `{"tokens": ...}` batches."""
    device = device or model.cfg.device
    losses = []
    for i, batch in enumerate(data_loader):
        losses.append(model(batch["tokens"].to(device), return_type="loss").item())
        if i + 1 >= truncate:
            break
    return sum(losses) / len(losses)
