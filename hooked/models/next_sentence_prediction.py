"""`BertNextSentencePrediction`: a `HookedEncoder` read through its pooler and next-sentence head.

    nsp = BertNextSentencePrediction(HookedEncoder.from_pretrained("path/to/bert"))
    nsp(["She went to the store.", "She bought an apple."], return_type="predictions")

Logit 0 means "sentence B follows sentence A", logit 1 "B is a random sentence", as in HF.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Literal

import torch
from jaxtyping import Float, Int

from hooked.analysis.activation_cache import ActivationCache  # noqa: F401  (TransformerLens imports it from this module)

PREDICTIONS = ("The sentences are sequential", "The sentences are NOT sequential")


class BertNextSentencePrediction:
    """Next-sentence prediction over a wrapped `HookedEncoder` (`self.model`), which holds every weight and hook."""

    def __init__(self, model):
        self.model = model

    def __call__(
        self,
        input,
        return_type: Literal["logits", "predictions"] | None = "logits",
        token_type_ids=None,
        one_zero_attention_mask=None,
    ):
        return self.forward(
            input,
            return_type=return_type,
            token_type_ids=token_type_ids,
            one_zero_attention_mask=one_zero_attention_mask,
        )

    def to_tokens(
        self, input: list[str], move_to_device: bool = True, truncate: bool = True
    ) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        """`(tokens, token_type_ids, attention_mask)` of the pair `[sentence_a, sentence_b]`."""
        if len(input) != 2:
            raise ValueError(
                "Next sentence prediction task requires exactly two sentences: pass [sentence_a, sentence_b]."
            )
        cfg = self.model.cfg
        enc = self.model.tokenizer(
            input[0],
            input[1],
            return_tensors="pt",
            padding=True,
            truncation=truncate,
            max_length=cfg.n_ctx if truncate else None,
        )
        out = (enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
        return tuple(t.to(cfg.device) for t in out) if move_to_device else out

    def forward(
        self,
        input: list[str] | Int[torch.Tensor, "batch pos"],
        return_type: Literal["logits", "predictions"] | None = "logits",
        token_type_ids: Int[torch.Tensor, "batch pos"] | None = None,
        one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch 2"] | str | None:
        """NSP logits `[batch, 2]`, a sentence saying which class wins ("predictions"), or None.

        Token input needs `token_type_ids` (which tokens are sentence B); text input gets them from the tokenizer.
        """
        if isinstance(input, list):
            if self.model.tokenizer is None:
                raise ValueError("Text input needs a tokenizer: pass tokenizer= to the HookedEncoder")
            tokens, types, mask = self.to_tokens(input)
            token_type_ids = types if token_type_ids is None else token_type_ids
            one_zero_attention_mask = mask if one_zero_attention_mask is None else one_zero_attention_mask
        elif token_type_ids is None:
            raise ValueError(
                "You are using the NSP task without specifying token_type_ids: the model would read the input as "
                "one sentence. Pass token_type_ids (0 for sentence A, 1 for sentence B) or a list of two strings."
            )
        else:
            tokens = input
        if hasattr(self.model, "_need_head"):
            self.model._need_head("pooler", "next-sentence logits")
            self.model._need_head("nsp", "next-sentence logits")
        resid = self.model.encoder_output(tokens, token_type_ids, one_zero_attention_mask)
        logits = self.model.nsp_head(self.model.pooler(resid))  # [batch, 2]
        if return_type == "predictions":
            return PREDICTIONS[logits.log_softmax(dim=-1).argmax(dim=-1).item()]
        return None if return_type is None else logits

    def run_with_cache(self, *model_args, return_cache_object: bool = True, remove_batch_dim: bool = False, **kwargs):
        """`(nsp_logits, cache)`: the wrapped model's `run_with_cache` with this forward in place of the MLM one."""
        with self._forward_as_nsp():
            return self.model.run_with_cache(
                *model_args, return_cache_object=return_cache_object, remove_batch_dim=remove_batch_dim, **kwargs
            )

    @contextmanager
    def _forward_as_nsp(self):
        previous = vars(self.model).get("forward")
        self.model.forward = self.forward  # nn.Module.__call__ reads the instance attribute first
        try:
            yield
        finally:
            if previous is None:
                del self.model.forward
            else:
                self.model.forward = previous
