"""`HookedEncoder`: a BERT-style bidirectional encoder with a hook on every activation (TransformerLens API).

    model = HookedEncoder.from_pretrained("path/to/bert")          # a local HF checkpoint
    logits = model(tokens, one_zero_attention_mask=mask)          # masked-LM logits
    resid = model.encoder_output(tokens, token_type_ids, mask)    # final residual stream

Padding is masked on the keys only, as in HuggingFace: every position, padding included,
attends to the real tokens of its row, so a padded batch gives each prompt's values alone.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.analysis.activation_cache import ActivationCache  # noqa: F401  (TransformerLens imports it from this module)
from hooked.components.bert import BertBlock, BertEmbed, BertMLMHead, BertNSPHead, BertPooler, encoder_state
from hooked.components.unembed import Unembed
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError, TokenError
from hooked.core.hook_points import HookedRootModule, HookPoint  # noqa: F401  (TransformerLens imports it from this module)
from hooked.core.validation import check_token_range
from hooked.models.hooked_model import HookedModel
from hooked.models.weight_views_mixin import WeightViewsMixin

logger = logging.getLogger(__name__)

HEADS = ("mlm", "pooler", "nsp")  # the optional parts a checkpoint may lack


class HookedEncoder(WeightViewsMixin, HookedModel):
    """A BERT encoder with masked-LM, pooler and next-sentence heads.

    Arguments:
        cfg: a `HookedTransformerConfig` or a dict of its fields (`attention_dir` is honoured;
            `from_pretrained` sets `"bidirectional"`).
        tokenizer: a HuggingFace tokenizer; without one, `cfg.d_vocab` must be set.
    """

    def __init__(self, cfg, tokenizer=None, move_to_device: bool = True, **kwargs):
        super().__init__()
        if isinstance(cfg, str):
            raise InputError(
                "HookedEncoder takes a config (dict or HookedTransformerConfig); "
                "to load a checkpoint use HookedEncoder.from_pretrained(name_or_path)."
            )
        self.cfg = cfg = HookedTransformerConfig.unwrap(cfg)
        if cfg.n_devices != 1:
            raise InputError("HookedEncoder runs on one device: set n_devices=1")
        if tokenizer is None and cfg.tokenizer_name is not None:
            from hooked.loading import load_tokenizer

            tokenizer = load_tokenizer(cfg.tokenizer_name)
        self.tokenizer = tokenizer
        if cfg.d_vocab == -1:
            if tokenizer is None:
                raise InputError(
                    "Must provide a tokenizer if d_vocab is not provided (set cfg.d_vocab or pass tokenizer=)"
                )
            cfg.d_vocab = max(tokenizer.get_vocab().values()) + 1
        if cfg.d_vocab_out == -1:
            cfg.d_vocab_out = cfg.d_vocab
        self.embed = BertEmbed(cfg)
        self.blocks = nn.ModuleList([BertBlock(cfg, layer) for layer in range(cfg.n_layers)])
        self.mlm_head = BertMLMHead(cfg)
        self.unembed = Unembed(cfg)
        self.nsp_head = BertNSPHead(cfg)
        self.pooler = BertPooler(cfg)
        self.hook_full_embed = HookPoint()  # [batch, pos, d_model]
        self.missing_heads: set[str] = set()  # parts the loaded checkpoint did not have
        self.init_weights()
        self._place_on_device(move_to_device)
        self.setup()

    def init_weights(self) -> None:
        """Matrices ~ N(0, initializer_range), biases 0, norm gains 1 (a checkpoint overwrites them)."""
        if self.cfg.seed is not None:
            torch.manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("W"):
                nn.init.normal_(p, std=self.cfg.initializer_range)
            elif leaf == "w":
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        hf_model=None,
        device: str | None = None,
        tokenizer=None,
        move_to_device: bool = True,
        dtype=torch.float32,
        **from_pretrained_kwargs,
    ) -> HookedEncoder:
        """Load a BERT checkpoint: a local HF directory (safetensors), a hub id in the HF cache, or `hf_model=`.

        Accepts BERT (`BertForPreTraining`, `BertForMaskedLM`, `BertForNextSentencePrediction`,
        `BertModel`) and DistilBERT; heads the checkpoint lacks are listed in
        `model.missing_heads` and refuse to run. No weight processing is applied (post-LN
        blocks have nothing to fold), as in TransformerLens.
        """
        from hooked.loading.encoders import load_encoder

        if checkpoint_index is not None or checkpoint_value is not None:
            raise NotImplementedError("HookedEncoder has no training checkpoints to choose from: drop checkpoint_*")
        return load_encoder(
            cls,
            model_name,
            hf_model=hf_model,
            tokenizer=tokenizer,
            device=device,
            move_to_device=move_to_device,
            dtype=dtype,
            **from_pretrained_kwargs,
        )

    # -- tokens ------------------------------------------------------------------------
    def to_tokens(
        self, input: str | list[str] | list[list[str]], move_to_device: bool = True, truncate: bool = True
    ) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        """`(tokens, token_type_ids, attention_mask)`, padded as the tokenizer pads (BERT: right),
        truncated to `n_ctx`."""
        if self.tokenizer is None:
            raise InputError("Cannot use to_tokens without a tokenizer: pass tokenizer= to HookedEncoder")
        enc = self.tokenizer(
            input,
            return_tensors="pt",
            padding=True,
            truncation=truncate,
            max_length=self.cfg.n_ctx if truncate else None,
        )
        types = enc.get("token_type_ids")  # tokenizers without segments (RoBERTa-style) return none: all 0
        out = (enc["input_ids"], torch.zeros_like(enc["input_ids"]) if types is None else types, enc["attention_mask"])
        if not move_to_device:
            return out
        tokens, token_types, mask = (t.to(self.cfg.device) for t in out)
        return tokens, token_types, mask

    # -- forward -----------------------------------------------------------------------
    def encoder_output(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        token_type_ids: Int[torch.Tensor, "batch pos"] | None = None,
        one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """The residual stream after the last block (before any head)."""
        device = self.embed.embed.W_E.device
        tokens = _check_ids(tokens, self.cfg.d_vocab, "tokens").to(device)
        if token_type_ids is not None:
            n_types = self.embed.token_type_embed.W_token_type.shape[0]
            token_type_ids = _check_ids(token_type_ids, n_types, "token_type_ids", tokens.shape).to(device)
        if one_zero_attention_mask is not None:
            one_zero_attention_mask = _check_mask(one_zero_attention_mask, tokens).to(device)
        resid = self.hook_full_embed(self.embed(tokens, token_type_ids))  # [batch, pos, d_model]
        state = encoder_state(resid, one_zero_attention_mask, self.cfg.attention_dir == "causal")
        for block in self.blocks:
            resid = block(resid, state=state)
        return resid

    def forward(
        self,
        input: str | list[str] | Int[torch.Tensor, "batch pos"],
        return_type: Literal["logits", "predictions"] | None = "logits",
        token_type_ids: Int[torch.Tensor, "batch pos"] | None = None,
        one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ):
        """Masked-LM logits `[batch, pos, d_vocab]`, the predicted words at `[MASK]` ("predictions"), or None.

        Text input is tokenized (its token types and padding mask are used unless given).
        """
        if isinstance(input, (str, list)):
            tokens, types, mask = self.to_tokens(input)
            token_type_ids = types if token_type_ids is None else token_type_ids
            one_zero_attention_mask = mask if one_zero_attention_mask is None else one_zero_attention_mask
        else:
            tokens = input
        if return_type is not None:
            self._need_head("mlm", "masked-LM logits")
        resid = self.encoder_output(tokens, token_type_ids, one_zero_attention_mask)
        if "mlm" in self.missing_heads:  # return_type=None on a base model: run for the hooks only
            return None
        logits = self.unembed(self.mlm_head(resid))  # [batch, pos, d_vocab]
        if return_type == "predictions":
            return self._predictions(tokens, logits)
        return None if return_type is None else logits

    def _predictions(self, tokens, logits) -> str | list[str]:
        if self.tokenizer is None:
            raise InputError("return_type='predictions' needs a tokenizer")
        at_mask = logits[tokens.to(logits.device) == self.tokenizer.mask_token_id]  # [n_masks, d_vocab]
        predictions = self.tokenizer.decode(at_mask.log_softmax(dim=-1).argmax(dim=-1))
        if " " in predictions:  # several masks: one entry each, as TransformerLens
            return [f"Prediction {i}: {p}" for i, p in enumerate(predictions.split(" "))]
        return predictions

    def _need_head(self, head: str, what: str) -> None:
        if head in self.missing_heads:
            raise InputError(
                f"{what} need the {head!r} head, which this checkpoint ({self.cfg.original_architecture}) "
                "does not have; "
                "use encoder_output(), or load a checkpoint with that head (BertForPreTraining has all of them)."
            )

    # -- weights (run_with_cache, to: hooked/models/hooked_model.py) ---------------------
    @property
    def W_E(self) -> Float[torch.Tensor, "d_vocab d_model"]:
        return self.embed.embed.W_E

    @property
    def W_pos(self) -> Float[torch.Tensor, "n_ctx d_model"]:
        return self.embed.pos_embed.W_pos


def _check_ids(ids: torch.Tensor, n: int, name: str, shape: torch.Size | None = None) -> torch.Tensor:
    """`[batch, pos]` integer ids in `[0, n)` (and of the tokens' shape, for token types)."""
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.ndim != 2:
        what = type(ids).__name__ if not isinstance(ids, torch.Tensor) else f"{ids.dtype} {tuple(ids.shape)}"
        raise TokenError(f"{name} must be a [batch, pos] integer tensor, got {what}")
    if shape is not None and ids.shape != shape:
        raise TokenError(f"{name} has shape {tuple(ids.shape)}; the tokens are {tuple(shape)}")
    if ids.numel():
        check_token_range(ids, n, name)
    return ids


def _check_mask(mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    if mask.shape != tokens.shape:
        raise InputError(f"one_zero_attention_mask has shape {tuple(mask.shape)}; the tokens are {tuple(tokens.shape)}")
    if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
        raise InputError("one_zero_attention_mask must hold only 0 (padding) and 1 (real token)")
    return mask.long()
