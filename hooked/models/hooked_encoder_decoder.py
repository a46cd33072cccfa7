"""`HookedEncoderDecoder`: a T5 encoder-decoder with a `HookPoint` on every activation.

The encoder reads the prompt bidirectionally; the decoder attends causally to its own
tokens and, through cross-attention, to the encoder's output. Names follow TransformerLens
2.18 (`encoder.{l}.*`, `decoder.{l}.cross_attn.*`, `encoder_final_ln`, `decoder_final_ln`).
Unlike TransformerLens 2.18, the decoder's self-attention is causal with unidirectional
position buckets (as HF), and `generate` caches the decoder's keys and values.
"""

from __future__ import annotations

import logging
from itertools import chain
from typing import Any, cast

import torch
import torch.nn as nn
import tqdm
from jaxtyping import Float, Int

from hooked.analysis.activation_cache import ActivationCache  # noqa: F401  (TransformerLens imports it from this module)
from hooked.components.embed import Embed
from hooked.components.norms import RMSNorm
from hooked.components.t5 import T5Block
from hooked.components.unembed import Unembed
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookedRootModule, HookPoint  # noqa: F401  (TransformerLens imports it from this module)
from hooked.generation.kv_cache import HookedTransformerKeyValueCacheEntry
from hooked.generation.sampling import sample_next_token
from hooked.models.hooked_model import HookedModel
from hooked.models.stacked_weights_mixin import StackedWeights, StackedWeightsMixin  # noqa: F401  (StackedWeights: importable from here before)

logger = logging.getLogger(__name__)


class HookedEncoderDecoder(StackedWeightsMixin, HookedModel):
    """T5 (`T5ForConditionalGeneration`), computing exactly what HF computes in eager mode."""

    def __init__(self, cfg: HookedTransformerConfig | dict, tokenizer=None, move_to_device: bool = True, **kwargs: Any):
        super().__init__()
        if isinstance(cfg, str):
            raise ValueError("Pass a config; to load a checkpoint use HookedEncoderDecoder.from_pretrained(name)")
        self.cfg = cfg = HookedTransformerConfig.unwrap(cfg)
        if cfg.n_devices != 1:
            raise ValueError("HookedEncoderDecoder runs on one device (n_devices=1)")
        self.tokenizer = tokenizer
        if cfg.d_vocab == -1:
            if tokenizer is None:
                raise ValueError("d_vocab=-1 needs a tokenizer to infer the vocabulary size from")
            cfg.d_vocab = len(tokenizer)
        if cfg.d_vocab_out == -1:
            cfg.d_vocab_out = cfg.d_vocab
        self.embed = Embed(cfg)
        self.encoder = nn.ModuleList([T5Block(cfg, layer, is_decoder=False) for layer in range(cfg.n_layers)])
        self.encoder_final_ln = RMSNorm(cfg)
        self.decoder = nn.ModuleList([T5Block(cfg, layer, is_decoder=True) for layer in range(cfg.n_layers)])
        self.decoder_final_ln = RMSNorm(cfg)
        self.unembed = Unembed(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.init_weights:
            self.init_weights()
        if move_to_device and cfg.device is not None:
            self.to(cfg.device)
        self.setup()

    def blocks_for_weights(self):
        return chain(self.encoder, self.decoder)

    def all_head_labels(self) -> list[str]:
        """`EL{l}H{h}` for encoder heads, then `DL{l}H{h}` for decoder heads."""
        n, H = self.cfg.n_layers, self.cfg.n_heads
        return [f"EL{layer}H{h}" for layer in range(n) for h in range(H)] + [
            f"DL{layer}H{h}" for layer in range(n) for h in range(H)
        ]

    @property
    def W_pos(self):
        raise NotImplementedError("T5 has no absolute position embedding: it adds a relative bias to the scores")

    # -- inputs --------------------------------------------------------------------
    def to_tokens(
        self, input: str | list[str], move_to_device: bool = True, truncate: bool = True
    ) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        """`(tokens, attention_mask)` of a string or a batch of strings, right-padded."""
        if self.tokenizer is None:
            raise ValueError("to_tokens needs a tokenizer: pass tokenizer= to from_pretrained or the constructor")
        enc = self.tokenizer(
            input,
            return_tensors="pt",
            padding=True,
            truncation=truncate,
            max_length=self.cfg.n_ctx if truncate else None,
        )
        tokens, mask = enc.input_ids, enc.attention_mask
        if move_to_device:
            tokens, mask = tokens.to(self.device), mask.to(self.device)
        return tokens, mask

    @property
    def device(self) -> torch.device:
        return self.embed.W_E.device

    def _start_tokens(self, batch: int) -> Int[torch.Tensor, "batch 1"]:
        start = self.cfg.decoder_start_token_id
        if start is None:
            if self.tokenizer is None:
                raise ValueError("No decoder_start_token_id in the config and no tokenizer to take its pad token from")
            start = self.tokenizer.pad_token_id
        return torch.full((batch, 1), start, dtype=torch.long, device=self.device)

    # -- forward -------------------------------------------------------------------
    def forward(
        self,
        input: str | list[str] | Int[torch.Tensor, "batch pos"],
        decoder_input: Int[torch.Tensor, "batch decoder_pos"] | None = None,
        return_type: str | None = "logits",
        one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch decoder_pos d_vocab"] | None:
        """Logits of the decoder over `decoder_input`, given the encoder's `input`.

        Strings are tokenized (with their padding mask); for them `decoder_input` defaults
        to the decoder start token. A token input needs `decoder_input`.
        """
        if isinstance(input, (str, list)):
            input, mask = self.to_tokens(input)
            one_zero_attention_mask = mask if one_zero_attention_mask is None else one_zero_attention_mask
            if decoder_input is None:
                decoder_input = self._start_tokens(input.shape[0])
        elif decoder_input is None:
            raise ValueError("Pass decoder_input (e.g. the decoder start token) with a token input")
        encoder_resid, encoder_mask = self.encode(input, one_zero_attention_mask)
        logits = self.decode(decoder_input.to(self.device), encoder_resid, encoder_mask)
        return logits if return_type == "logits" else None

    def encode(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> tuple[Float[torch.Tensor, "batch pos d_model"], Float[torch.Tensor, "batch 1 1 pos"] | None]:
        """The encoder's output (after `encoder_final_ln`) and the additive padding mask over its positions."""
        tokens = tokens.to(self.device)
        resid = self.hook_embed(self.embed(tokens))  # [batch, pos, d_model]
        additive = None
        if one_zero_attention_mask is not None:
            keep = one_zero_attention_mask.to(self.device)[:, None, None, :]  # [batch, 1, 1, pos]
            additive = (1.0 - keep.to(self.cfg.dtype)) * torch.finfo(self.cfg.dtype).min
        n = tokens.shape[1]
        bias = cast(T5Block, self.encoder[0]).attn.compute_relative_attention_bias(n, n, device=self.device)
        for block in self.encoder:
            resid = block(resid, additive_attention_mask=additive, position_bias=bias)
        return self.encoder_final_ln(resid), additive

    def decode(
        self,
        decoder_tokens: Int[torch.Tensor, "batch decoder_pos"],
        encoder_resid: Float[torch.Tensor, "batch pos d_model"] | None,
        encoder_mask: Float[torch.Tensor, "batch 1 1 pos"] | None = None,
        caches: list[HookedTransformerKeyValueCacheEntry] | None = None,
        cross_key_values: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> Float[torch.Tensor, "batch decoder_pos d_vocab"]:
        """Decoder logits; with `caches` the tokens continue the cached ones."""
        past = caches[0].length if caches else 0
        n = decoder_tokens.shape[1]
        resid = self.embed(decoder_tokens)  # [batch, decoder_pos, d_model]
        first = cast(T5Block, self.decoder[0])
        bias = first.attn.compute_relative_attention_bias(n, past + n, device=self.device, past_length=past)
        for layer, block in enumerate(self.decoder):
            resid = block(
                resid,
                position_bias=bias,
                encoder_hidden_states=encoder_resid,
                encoder_additive_attention_mask=encoder_mask,
                past_kv_cache_entry=caches[layer] if caches else None,
                cross_key_value=cross_key_values[layer] if cross_key_values else None,
            )
        resid = self.decoder_final_ln(resid)
        if self.cfg.tie_word_embeddings:  # Mesh TensorFlow rescales before the tied unembedding
            resid = resid * self.cfg.d_model**-0.5
        return self.unembed(resid)

    # -- generation ----------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        input: str | Int[torch.Tensor, "batch pos"] = "",
        one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        max_new_tokens: int = 10,
        stop_at_eos: bool = True,
        eos_token_id: int | list[int] | None = None,
        do_sample: bool = True,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float = 1.0,
        freq_penalty: float = 0.0,
        return_type: str | None = "input",
        verbose: bool = True,
        use_past_kv_cache: bool = True,
    ) -> Int[torch.Tensor, "batch decoder_pos"] | str:
        """Decode from the start token, one token per step (greedy with `do_sample=False`).

        The encoder runs once and each decoder layer's cross-attention keys and values are
        computed once; with `use_past_kv_cache` the decoder's self-attention keys and values
        are cached, so each step runs the decoder on one token. Finished rows are padded with EOS.

        This is not the decoder-only `generate` and does not take `GenerationOptions`: its
        arguments are TransformerLens's `HookedEncoderDecoder.generate` (the encoder's mask second,
        so positional calls keep their meaning), and its loop, which starts the decoder from the
        start token rather than continuing the prompt, implements only the options above. The
        shared surface would accept options this loop would ignore (hooks across steps, caches of
        the run, repetition penalty, seeds, the static cache).
        """
        as_string = isinstance(input, str)
        if as_string:
            input, mask = self.to_tokens(input)
            one_zero_attention_mask = mask if one_zero_attention_mask is None else one_zero_attention_mask
        stop_tokens = self._stop_tokens(eos_token_id) if stop_at_eos else []
        encoder_resid, encoder_mask = self.encode(input, one_zero_attention_mask)
        batch = encoder_resid.shape[0]
        decoder_input = self._start_tokens(batch)
        caches = cross = None
        if use_past_kv_cache:
            caches = [
                HookedTransformerKeyValueCacheEntry(
                    batch, self.cfg.n_heads, self.cfg.d_head, self.device, self.cfg.dtype
                )
                for _ in self.decoder
            ]
            cross = [cast(T5Block, block).cross_attn.project_kv(encoder_resid) for block in self.decoder]
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        self.eval()
        for _ in tqdm.tqdm(range(max_new_tokens), disable=not verbose):
            step = decoder_input[:, caches[0].length :] if caches else decoder_input
            logits = self.decode(step, encoder_resid, encoder_mask, caches, cross)[:, -1]  # [batch, d_vocab]
            next_tokens = sample_next_token(
                logits,
                decoder_input,
                do_sample=do_sample,
                top_k=top_k,
                top_p=top_p,
                temperature=temperature,
                freq_penalty=freq_penalty,
            )
            if stop_tokens:
                next_tokens[finished] = stop_tokens[0]
                finished |= torch.isin(next_tokens, torch.tensor(stop_tokens, device=self.device))
            decoder_input = torch.cat([decoder_input, next_tokens[:, None]], dim=-1)  # [batch, decoder_pos]
            if stop_tokens and bool(finished.all()):
                break
        if return_type == "str" or (return_type == "input" and as_string):
            if self.tokenizer is None:
                raise ValueError("return_type='str' needs a tokenizer: pass tokenizer= or use return_type='tokens'")
            return self.tokenizer.decode(decoder_input[0], skip_special_tokens=True)
        return decoder_input

    def _stop_tokens(self, eos_token_id: int | list[int] | None) -> list[int]:
        if eos_token_id is None:
            eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        if eos_token_id is None:
            raise ValueError("stop_at_eos needs eos_token_id= (or a tokenizer with an EOS token)")
        return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)

    # -- loading (run_with_cache, to: hooked/models/hooked_model.py) ---------------------
    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        checkpoint_index=None,
        checkpoint_value=None,
        hf_model=None,
        device: str | None = None,
        tokenizer=None,
        move_to_device: bool = True,
        dtype=torch.float32,
        **from_pretrained_kwargs: Any,
    ) -> HookedEncoderDecoder:
        """Load a T5 checkpoint (a local directory, a hub name cached offline, or `hf_model=`)."""
        from hooked.loading.checkpoint import load_tokenizer
        from hooked.loading.encoder_checkpoints import checkpoint_source, finish_loading
        from hooked.loading.t5 import T5

        if checkpoint_index is not None or checkpoint_value is not None:
            raise ValueError("T5 has no training checkpoints to choose from")
        cfg, source = checkpoint_source(T5, model_name, hf_model, dtype, device, **from_pretrained_kwargs)
        if tokenizer is None and source.tokenizer_path is not None:
            tokenizer = load_tokenizer(source.tokenizer_path)
        model = cls(cfg, tokenizer, move_to_device=False)
        return finish_loading(model, T5.weights(source.state, cfg), device, move_to_device, model_name)
