"""transformer_lens.evals IOIDataset / ioi_eval on a word-level toy tokenizer."""

from __future__ import annotations

import torch

from hooked.compat.evals import IOIDataset, ioi_eval


class Words:
    """One id per whitespace-separated word (ids from 1; 0 is BOS and padding)."""

    bos_token_id = 0

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab) + 1) for w in text.replace(".", " .").split()]


def test_prompts_end_with_the_indirect_object_and_swap_when_symmetric():
    tok = Words()
    data = IOIDataset(tok, num_samples=6, symmetric=True)
    assert len(data) == 6
    for i, item in enumerate(data):
        sample = data.samples[i]
        assert sample["text"].endswith(sample["IO"]) and item["prompt"][0] == 0
        assert item["prompt"][-1] == item["IO"][0] != item["S"][0]
    assert data.samples[0]["IO"] == data.samples[1]["S"] and data.samples[0]["S"] == data.samples[1]["IO"]


def test_ioi_eval_reads_the_logits_before_the_indirect_object():
    tok = Words()
    data = IOIDataset(tok, num_samples=4)

    def model(prompts, return_type):  # logit of token t at position p: +1 for IO, -2 for S, only at the last word
        logits = torch.zeros(*prompts.shape, 100)
        for row in range(prompts.shape[0]):
            item = data[row]
            position = len(item["prompt"]) - 2
            logits[row, position, item["IO"][0]], logits[row, position, item["S"][0]] = 1.0, -2.0
        return logits

    assert ioi_eval(model, dataset=data, batch_size=4) == {"Logit Difference": 3.0, "Accuracy": 1.0}
