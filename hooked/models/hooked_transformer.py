"""`HookedTransformer`: a decoder-only language model built from hooked components.

The forward pass is embed -> blocks -> ln_final -> unembed, with a `HookPoint` on every
activation. Loading from HuggingFace lives in `loading/`; this module only knows
configs and state dicts in TransformerLens format.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.analysis.activation_cache import ActivationCache  # noqa: F401  (TransformerLens imports it from this module)
from hooked.components import Embed, PosEmbed, Unembed
from hooked.components.altup import AltUpStreams
from hooked.components.forward_state import ForwardState
from hooked.components.norms import make_norm
from hooked.components.per_layer_inputs import PerLayerEmbed
from hooked.components.post_norm_block import block_class
from hooked.core.config import HookedTransformerConfig
from hooked.core.dtypes import cast_parameter, parameter_requires_grad
from hooked.core.errors import AttentionMaskError, ConfigError, InputError, TokenError
from hooked.core.hook_points import HookedRootModule, HookPoint  # noqa: F401  (TransformerLens imports it from this module)
from hooked.core.utils import USE_DEFAULT_VALUE, get_attention_mask, lm_cross_entropy_loss, positions_from_mask
from hooked.core.validation import (
    check_kv_cache,
    check_model_input,
    check_residual_input,
    check_token_range,
    mask_dtype_check,
    mask_is_all_ones,
)
from hooked.generation import loop as _generation
from hooked.generation.kv_cache import StaticKeyValueCache
from hooked.models.forward_call import ForwardCall
from hooked.models.hooked_model import CacheInputs, HookedModel
from hooked.models.tokenizer_mixin import TokenIndexMixin, TokenizerMixin  # noqa: F401  (TokenIndexMixin: importable from here before)
from hooked.models.weight_processing_mixin import WeightProcessingMixin
from hooked.models.weight_views_mixin import WeightViewsMixin
from hooked.placement.dispatch import execution_device
from hooked.processing.steps import final_norm_kind

logger = logging.getLogger(__name__)

_LEGACY_BUFFERS = ("attn.mask", "attn.IGNORE", "attn.rotary_sin", "attn.rotary_cos")


# TransformerLens's loss type aliases and dtype names
SingleLoss = Float[torch.Tensor, ""]
LossPerToken = Float[torch.Tensor, "batch pos-1"]
Loss = SingleLoss | LossPerToken
DTYPE_FROM_STRING = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


class Output(NamedTuple):
    logits: Float[torch.Tensor, "batch pos d_vocab_out"]
    loss: torch.Tensor


_GQA_ATTN_IN = (
    "hook_attn_in (one input copy per query head) is not supported with grouped-query attention. "
    "Call model.set_use_split_qkv_input(True) and hook blocks.{layer}.hook_q_input [batch, pos, head, d_model] "
    "and hook_k_input / hook_v_input [batch, pos, kv_head, d_model] instead."
)


class HookedTransformer(TokenizerMixin, WeightViewsMixin, WeightProcessingMixin, HookedModel):
    """A transformer language model with a hook on every activation (TransformerLens API).

    The model is built from `hooked.components` (embedding, blocks, final norm, unembedding); every
    activation passes through a `HookPoint` named as in TransformerLens (`blocks.3.attn.hook_pattern`),
    so it can be cached, read or replaced. Most code builds one with `from_pretrained`.

    Args:
        cfg: a `HookedTransformerConfig` or a dict of its fields.
        tokenizer: a HuggingFace tokenizer; without one, `cfg.d_vocab` must be set.
        move_to_device: move the new model to `cfg.device`.
        default_padding_side: padding used when a call does not choose one ("right" or "left").
    """

    def __init__(self, cfg, tokenizer=None, move_to_device: bool = True, default_padding_side: str = "right"):
        super().__init__()
        self.cfg = cfg = HookedTransformerConfig.unwrap(cfg)
        if cfg.positional_embedding_type == "relative_positional_bias":  # T5's: only the encoder-decoder has it
            raise ConfigError("relative_positional_bias is T5's position scheme: build a HookedEncoderDecoder")
        self._attach_tokenizer(tokenizer, default_padding_side)
        self._build_modules(cfg)
        self.forward_state: ForwardState | None = None
        if cfg.init_weights:
            self.init_weights()
        self._place_on_device(move_to_device)
        self.setup()

    def _attach_tokenizer(self, tokenizer, default_padding_side: str) -> None:
        """The given tokenizer, or the config's `tokenizer_name`; without one, `cfg.d_vocab` must be set."""
        self.tokenizer = None
        self.default_padding_side = default_padding_side
        if tokenizer is None and self.cfg.tokenizer_name is not None:
            from hooked.loading import load_tokenizer

            tokenizer = load_tokenizer(self.cfg.tokenizer_name)
        if tokenizer is not None:
            self.set_tokenizer(tokenizer, default_padding_side)
        if self.cfg.d_vocab == -1:
            raise InputError("cfg.d_vocab is -1 and no tokenizer was given: set d_vocab or pass a tokenizer")

    def _build_modules(self, cfg: HookedTransformerConfig) -> None:
        """embed -> (pos_embed) -> blocks -> ln_final -> unembed, and the hook points between them."""
        self.embed = Embed(cfg)
        if cfg.d_per_layer_input:  # Gemma 3n/4: an input of its own for every layer
            self.per_layer_embed = PerLayerEmbed(cfg)
        self.hook_tokens = HookPoint(requires="use_hook_tokens")  # [batch, pos]
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.positional_embedding_type in ("standard", "shortformer"):
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([block_class(cfg)(cfg, layer) for layer in range(cfg.n_layers)])
        if cfg.uses_altup:  # Gemma 3n: the residual stream is several streams between the embedding and ln_final
            self.altup_streams = AltUpStreams(cfg)
        if cfg.normalization_type is not None:
            self.ln_final = make_norm(cfg, final_norm_kind(cfg))
        self.unembed = Unembed(cfg)

    # -- construction ----------------------------------------------------------------
    def init_weights(self) -> None:
        """Matrices ~ N(0, initializer_range), biases 0, norm gains 1."""
        if self.cfg.seed is not None:
            torch.manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith(("W_", "_W_")) or leaf in ("weight", "W"):  # nn.Linear (MoE); "W": a mixer's conv
                nn.init.normal_(p, std=self.cfg.initializer_range)
            elif leaf == "w":
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        checkpoint_index=None,
        checkpoint_value=None,
        checkpoint_label=None,
        hf_model=None,
        device=None,
        n_devices: int = 1,
        tokenizer=None,
        move_to_device: bool = True,
        fold_value_biases: bool = True,
        default_prepend_bos=None,
        default_padding_side: str = "right",
        dtype="float32",
        first_n_layers=None,
        n_ctx=None,
        device_map=None,
        max_memory=None,
        offload_folder=None,
        **from_pretrained_kwargs,
    ) -> HookedTransformer:
        """Load a HuggingFace checkpoint (hub id, local directory, `.gguf`, or bundled name).

        Weights are converted without instantiating the HF model (unless `hf_model` is
        given), then processed as TransformerLens does by default (docs/numerics.md,
        "Weight processing"): the predictions are unchanged, the weights easier to read. `n_devices=N` splits the
        blocks evenly over N GPUs; `device_map` ("auto" or `{part: device}`), `max_memory`
        and `offload_folder` have HF's meaning (CPU and disk offload included): each part is
        then loaded straight to its device or offload file (see hooked/placement/dispatch.py). Under
        `torchrun`, `pipeline=True` (with `micro_batches=`, `timeout_s=`, 300 s by default)
        gives each rank one stage of blocks and reads only that stage's tensors
        (`hooked/scale/pipeline.py`).

        Bundled models load offline and are named for what they are: `"smollm2-135m"` (or
        `"SmolLM2-135M-Instruct"`) is SmolLM2-135M-Instruct; the base `"SmolLM2-135M"` is not
        bundled and is looked up in the HF cache like any hub id.

        `max_memory` budgets the weights each device keeps: the parameters and buffers of the
        parts placed there (`{"cpu": "200MB"}` keeps about 190 MiB of weights in RAM and writes
        the rest to `offload_folder`). The peak memory is higher by what the budget does not
        count: the tokenizer (about 110 MiB resident for SmolLM2's), and the part being
        converted, which is read, converted and processed in memory before it is placed; the
        largest is the embedding with the unembedding (two 108 MiB matrices for SmolLM2-135M,
        which `fold_ln` unties). Measured on SmolLM2-135M with `{"cpu": "200MB"}`: 189 MiB of
        weights kept, a peak of about 410 MiB above the imports, 286 MiB once loaded.

        Args:
            model_name: a bundled name ("smollm2-135m", "gemma-3-270m"), a TransformerLens
                official name or alias, a HF hub id, a local checkpoint directory or a `.gguf` file.
            fold_ln: fold each norm's gain (and bias) into the weights that read it.
            center_writing_weights: remove the mean over d_model from every residual write
                (LayerNorm models only).
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
            dtype: the weights' dtype; processing always runs in float32 before the cast.
            first_n_layers: load only the first n blocks.
            n_ctx: the context length (default: the checkpoint's `max_position_embeddings`).
            device_map: "auto", "balanced", "sequential" or `{part: device}` over `embed`,
                `pos_embed`, `blocks.{i}`, `ln_final`, `unembed` (devices, "cpu" or "disk"), as in HF.
            max_memory: `{device: bytes or "200MB"}` budgets for `device_map`, as in HF.
            offload_folder: where parts placed on "disk" are written.
            **from_pretrained_kwargs: `revision`, `torch_dtype`, and under `torchrun`
                `pipeline=True` with `micro_batches=` and `timeout_s=` (default 300 s): each rank
                loads one stage of blocks (docs/scaling-out.md).

        All of these are gathered into a `hooked.loading.options.LoadOptions`, checked once;
        `hooked.loading.load_pretrained(HookedTransformer, model_name, options)` loads with one built beforehand.

        Returns:
            The loaded `HookedTransformer`.
        """
        from hooked.loading import load_pretrained
        from hooked.loading.options import LoadOptions

        options = LoadOptions.from_keywords(
            fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices, checkpoint_index=checkpoint_index,
            checkpoint_value=checkpoint_value, checkpoint_label=checkpoint_label, hf_model=hf_model, device=device,
            n_devices=n_devices, tokenizer=tokenizer, move_to_device=move_to_device,
            fold_value_biases=fold_value_biases, default_prepend_bos=default_prepend_bos,
            default_padding_side=default_padding_side, dtype=dtype, first_n_layers=first_n_layers, n_ctx=n_ctx,
            device_map=device_map, max_memory=max_memory, offload_folder=offload_folder, **from_pretrained_kwargs,
        )  # fmt: skip
        if options.pipeline:  # one stage per torch.distributed rank
            return cls.placement_loader("pipeline")(model_name, options=options)
        return load_pretrained(cls, model_name, options)

    # A variant that a config calls for registers itself (`hooked.models.vision_language`): loading
    # asks `model_class_for(cfg)`, so the base class never imports its variants.
    _variants: ClassVar[list[tuple[Callable[[HookedTransformerConfig], bool], type[HookedTransformer]]]] = []

    @classmethod
    def register_variant(
        cls, needed_for: Callable[[HookedTransformerConfig], bool], model_class: type[HookedTransformer]
    ) -> None:
        """Let `model_class_for(cfg)` answer `model_class` for configs where `needed_for(cfg)` holds."""
        HookedTransformer._variants.append((needed_for, model_class))

    @classmethod
    def model_class_for(cls, cfg: HookedTransformerConfig) -> type[HookedTransformer]:
        """The class that builds a model of `cfg`: a registered variant it needs (an image-text config:
        `HookedVisionLanguageModel`), else this class."""
        if cls is HookedTransformer:
            for needed_for, model_class in HookedTransformer._variants:
                if needed_for(cfg):
                    return model_class
        return cls

    @classmethod
    def from_pretrained_no_processing(cls, model_name: str, **kwargs) -> HookedTransformer:
        flags = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
        kwargs.update({flag: False for flag in flags}, refactor_factored_attn_matrices=False)
        kwargs.setdefault("dtype", torch.float32)
        return cls.from_pretrained(model_name, **kwargs)

    def load_and_process_state_dict(
        self,
        state_dict: dict[str, torch.Tensor],
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        fold_value_biases: bool = True,
        refactor_factored_attn_matrices: bool = False,
        *,
        owned: bool = False,
        protected_storages: frozenset[int] = frozenset(),
    ) -> None:
        """Process a TransformerLens-format state dict (fp32, tensor by tensor) and take its tensors as weights.

        `owned=True` lets processing overwrite the given tensors in place (the loader
        read them for this model alone). Tensors sharing storage with
        `protected_storages` (a user's live HF model) are never written and are copied
        before the model adopts them; all others are adopted without a copy.
        """
        from hooked.processing.steps import process_state_dict

        state_dict, steps = process_state_dict(
            self.cfg,
            state_dict,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
            in_place=owned,
            protected_storages=protected_storages,
        )
        self.record_weight_processing(steps)
        self.assign_state_dict(state_dict, protected_storages=protected_storages)

    def assign_state_dict(
        self, state_dict: dict[str, torch.Tensor], clone: bool = False, protected_storages: frozenset[int] = frozenset()
    ) -> None:
        """Use the given tensors as parameters; tied W_U stays a view of W_E.

        A tensor is copied only with `clone`, or when its storage is in `protected_storages`.
        """
        expected = set(self.state_dict())
        missing, unexpected = expected - set(state_dict), set(state_dict) - expected
        if missing or unexpected:
            raise KeyError(f"State dict mismatch: missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}")
        tied = _shares_storage(state_dict["embed.W_E"], state_dict["unembed.W_U"])
        for name in list(state_dict):
            tensor = state_dict.pop(name)  # drop our reference as we go: one copy alive at a time
            if tied and name == "unembed.W_U":
                continue
            module_name, leaf = name.rsplit(".", 1)
            module = self.get_submodule(module_name)
            tensor = cast_parameter(module, leaf, tensor, self.cfg.dtype, self.cfg.device)
            if clone or tensor.untyped_storage().data_ptr() in protected_storages:
                tensor = tensor.clone()
            if leaf in module._buffers:  # a persistent buffer (xIELU's beta, eps)
                module._buffers[leaf] = tensor
                continue
            module._parameters[leaf] = nn.Parameter(tensor, requires_grad=parameter_requires_grad(module, leaf))
        if tied:
            self.unembed._parameters["W_U"] = nn.Parameter(self.embed.W_E.T)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """`nn.Module.load_state_dict` that also accepts TransformerLens 2.x checkpoints.

        Legacy buffers (`attn.mask`, `attn.IGNORE`, rotary tables) are dropped, and a
        checkpoint whose `W_U` differs from `W_E^T` unties a tied model.
        """
        state_dict = {k: v for k, v in state_dict.items() if not k.endswith(_LEGACY_BUFFERS)}
        for key, bias in self.state_dict().items():  # TransformerLens's GatedMLP has no gate bias: it is zero
            if key.endswith("mlp.b_gate") and key not in state_dict and key[: -len("b_gate")] + "W_gate" in state_dict:
                state_dict[key] = torch.zeros_like(bias)
        if (
            self.embeddings_tied()
            and "unembed.W_U" in state_dict
            and "embed.W_E" in state_dict
            and not torch.equal(state_dict["unembed.W_U"], state_dict["embed.W_E"].T)
        ):
            self.untie_embeddings()
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def embeddings_tied(self) -> bool:
        return _shares_storage(self.embed.W_E, self.unembed.W_U)

    def untie_embeddings(self) -> None:
        """Give `unembed.W_U` its own storage (before writing to it)."""
        if self.embeddings_tied():
            self.unembed.W_U = nn.Parameter(self.unembed.W_U.detach().clone())

    # -- optional hooks --------------------------------------------------------------
    def set_use_attn_result(self, use: bool) -> None:
        """`hook_result` materialises `[batch, pos, head, d_model]` per layer."""
        self.cfg.use_attn_result = use

    def set_use_split_qkv_input(self, use: bool) -> None:
        self.cfg.use_split_qkv_input = use

    def set_use_hook_mlp_in(self, use: bool) -> None:
        if self.cfg.attn_only:
            raise InputError("hook_mlp_in does not exist in attention-only models")
        self.cfg.use_hook_mlp_in = use

    def set_use_attn_in(self, use: bool) -> None:
        if self.cfg.uses_grouped_query_attention and use:
            raise InputError(_GQA_ATTN_IN)
        self.cfg.use_attn_in = use

    def hook_enable_hint(self, hp) -> str:
        if hp.requires == "use_attn_in" and self.cfg.uses_grouped_query_attention:
            return f"Hook point {hp.name!r} is disabled, and cannot be enabled here: {_GQA_ATTN_IN}"
        return super().hook_enable_hint(hp)

    def set_ungroup_grouped_query_attention(self, ungroup: bool) -> None:
        self.cfg.ungroup_grouped_query_attention = ungroup

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        input,
        return_type: str | None = "logits",
        loss_per_token: bool = False,
        prepend_bos=USE_DEFAULT_VALUE,
        padding_side=USE_DEFAULT_VALUE,
        start_at_layer: int | None = None,
        tokens: Int[torch.Tensor, "batch pos"] | None = None,
        shortformer_pos_embed: Float[torch.Tensor, "batch pos d_model"] | None = None,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        stop_at_layer: int | None = None,
        past_kv_cache=None,
        *,
        step: int | None = None,
        logits_to_keep: int = 0,
    ):
        """Run the model on text, tokens, token embeddings or (with `start_at_layer`) a residual.

        Args:
            input: a string, a list of strings (padded with the tokenizer's mask), tokens
                `[batch, pos]` or `[pos]`, token embeddings `[batch, pos, d_model]`, or with
                `start_at_layer` the residual stream `[batch, pos, d_model]` entering that block.
            return_type: "logits", "loss", "both" (`Output(logits, loss)`) or None.
            loss_per_token: return the loss per position `[batch, pos - 1]` instead of the mean.
            prepend_bos: add BOS to text input (default: the model's `cfg.default_prepend_bos`).
            padding_side: "left" or "right", for a list of strings.
            start_at_layer: run from this block on, taking `input` as its residual.
            tokens: the tokens `[batch, pos]` a loss needs when `input` is not tokens.
            shortformer_pos_embed: positional embeddings `[batch, pos, d_model]` of a shortformer
                model that starts at a later layer.
            attention_mask: `[batch, pos]` 0/1 mask of padded tokens (cached and new positions
                with a KV cache); text input builds it from the tokenizer.
            stop_at_layer: stop before this block and return the residual entering it.
            past_kv_cache: a `HookedTransformerKeyValueCache` to read and extend.
            step: sets `forward_state.step`, which hooks can read (default: the KV cache's
                forward count, else 0).
            logits_to_keep: `k > 0` unembeds only the last k positions (as HuggingFace's argument
                of that name; `generate` needs only the last).

        Returns:
            Logits `[batch, pos, d_vocab_out]` (`[batch, k, d_vocab_out]` with `logits_to_keep`),
            a loss, `Output(logits, loss)`, None, or with `stop_at_layer` the residual
            `[batch, pos, d_model]` entering that block.
        """
        call = ForwardCall.checked(
            self.cfg.n_layers, start_at_layer=start_at_layer, stop_at_layer=stop_at_layer, return_type=return_type,
            loss_per_token=loss_per_token, prepend_bos=prepend_bos, padding_side=padding_side,
            past_kv_cache=past_kv_cache, step=step, logits_to_keep=logits_to_keep,
        )  # fmt: skip
        residual, tokens, shortformer_pos_embed = self._enter_blocks(
            input, call, tokens, shortformer_pos_embed, attention_mask
        )
        state = self.forward_state
        assert state is not None  # _enter_blocks has just set it
        result = self._run_blocks(residual, state, call, tokens, shortformer_pos_embed)
        if (
            past_kv_cache is not None
            and not past_kv_cache.frozen
            and not getattr(past_kv_cache, "counts_own_forwards", False)
        ):
            past_kv_cache.n_forwards += 1
        return result

    # -- the template steps of forward (a pipeline replaces these two) ------------------------
    def _enter_blocks(self, input, call: ForwardCall, tokens, shortformer_pos_embed, attention_mask):
        """The residual entering block `call.start` (the embedded input, or `input` itself) and `forward_state`.

        Returns `(residual [batch, pos, d_model], tokens, shortformer_pos_embed)`.
        """
        if call.start is None:
            residual, tokens, shortformer_pos_embed, _ = self.input_to_embed(
                input, call.prepend_bos, call.padding_side, attention_mask, call.past_kv_cache, step=call.step
            )
            return residual, tokens, shortformer_pos_embed
        check_residual_input(input, call.start, tokens, self.cfg.d_model)
        state = self.forward_state = self._make_state(
            input.shape[0], input.shape[1], attention_mask, call.past_kv_cache, step=call.step
        )
        state.tokens = tokens
        if hasattr(self, "per_layer_embed") and tokens is not None:  # Gemma 3n/4: per-layer inputs from tokens
            state.per_layer_inputs = self.per_layer_embed(tokens, self.embed(tokens))
        return input, tokens, shortformer_pos_embed

    def _run_blocks(
        self,
        residual: Float[torch.Tensor, "batch pos d_model"],
        state: ForwardState,
        call: ForwardCall,
        tokens: Int[torch.Tensor, "batch pos"] | None,
        shortformer_pos_embed: Float[torch.Tensor, "batch pos d_model"] | None,
    ):
        """Blocks `call.start` to `call.stop` on `residual`, then (for a call that runs to the end) the head.

        Returns the residual entering block `call.stop`, or what `call.return_type` asks for.
        """
        for block in self.blocks[call.start : call.stop]:
            residual = block(residual, state, shortformer_pos_embed)
        if call.stop is not None:
            return residual
        logits = self._final_logits(residual, call)
        return None if logits is None else self._output(logits, tokens, state, call)

    def _final_logits(self, residual: Float[torch.Tensor, "batch pos d_model"], call: ForwardCall):
        """`ln_final` and the unembedding of the last block's residual (None for `return_type=None`)."""
        if hasattr(self, "altup_streams"):  # Gemma 3n: the streams become one again
            residual = self.altup_streams.collapse(residual)
        if self.cfg.normalization_type is not None:
            residual = self.ln_final(residual)
        if call.return_type is None:
            return None
        return self._unembed(residual, call.logits_to_keep)  # [batch, pos or logits_to_keep, d_vocab_out]

    def _output(
        self, logits: Float[torch.Tensor, "batch pos d_vocab_out"], tokens, state: ForwardState, call: ForwardCall
    ):
        """The logits, the loss or both, as `call.return_type` asks."""
        if call.return_type == "logits":
            return logits
        if tokens is None:
            raise ValueError("A loss needs tokens: pass tokens= when starting from embeddings or a residual")
        loss = lm_cross_entropy_loss(logits, tokens, state.new_mask(), per_token=call.loss_per_token)
        return loss if call.return_type == "loss" else Output(logits, loss)

    def _unembed(self, residual: Float[torch.Tensor, "batch pos d_model"], logits_to_keep: int) -> torch.Tensor:
        """`unembed(residual)`, as TransformerLens calls it; `logits_to_keep` goes only to hooked's own `Unembed`.

        A replacement unembed (a client's `forward(self, x)`) gets the last `logits_to_keep`
        positions of the residual instead.
        """
        if not logits_to_keep:
            return self.unembed(residual)
        if isinstance(self.unembed, Unembed):
            return self.unembed(residual, logits_to_keep)
        return self.unembed(residual[:, -logits_to_keep:])  # [batch, logits_to_keep, d_model]

    def loss_fn(self, logits, tokens, attention_mask=None, per_token: bool = False):
        return lm_cross_entropy_loss(logits, tokens, attention_mask, per_token)

    def input_to_embed(
        self,
        input,
        prepend_bos=USE_DEFAULT_VALUE,
        padding_side=USE_DEFAULT_VALUE,
        attention_mask=None,
        past_kv_cache=None,
        *,
        step: int | None = None,
    ):
        """Embed the input and set `self.forward_state`.

        Returns `(residual, tokens, shortformer_pos_embed, attention_mask)`.
        """
        tokens, embeds = None, None
        check_model_input(input, self.cfg.d_model)
        if isinstance(input, (str, list)):
            tokens, text_mask = self.to_tokens(input, prepend_bos, padding_side, return_attention_mask=True)
            _check_no_empty_text(input, text_mask)
            attention_mask = text_mask if attention_mask is None else attention_mask
        elif input.is_floating_point():
            embeds = input
        else:
            tokens = (input[None] if input.ndim == 1 else input).to(self.input_device)
            attention_mask = self._infer_mask(tokens, prepend_bos, padding_side, attention_mask, past_kv_cache)
        if tokens is not None:
            check_token_range(
                tokens, self.cfg.d_vocab, "input" if isinstance(input, torch.Tensor) else "input's tokens"
            )
        fed = tokens if tokens is not None else embeds
        assert fed is not None  # the input was tokens (or text) or embeddings
        batch, n_new = fed.shape[:2]
        state = self.forward_state = self._make_state(batch, n_new, attention_mask, past_kv_cache, step=step)
        if hasattr(self, "pos_embed") and state.n_keys > self.cfg.n_ctx:
            raise TokenError(
                f"the input has {state.n_keys} positions (cached + new), more than this model's learned "
                f"positions n_ctx={self.cfg.n_ctx}: shorten it (text input is truncated with truncate=True)"
            )
        state.tokens = tokens
        if tokens is not None:
            if self.cfg.use_hook_tokens:
                tokens = self.hook_tokens(tokens)
            embeds = self.embed(tokens)
        elif hasattr(self.embed, "ln"):  # given token embeddings still pass Bloom's post-embedding norm, as in HF
            embeds = self.embed.ln(embeds)
        embeds = self.hook_embed(embeds)  # [batch, pos, d_model]
        if hasattr(self, "per_layer_embed"):  # Gemma 3n/4: every layer's own input, from the tokens
            state.per_layer_inputs = self.per_layer_embed(tokens, embeds)
        new_mask = state.new_mask()
        residual, shortformer_pos_embed = self._add_pos_embed(embeds, state.positions, new_mask)
        if hasattr(self, "altup_streams"):  # Gemma 3n: [batch, pos, stream, d_model] from here to ln_final
            residual = self.altup_streams.expand(residual)
        return residual, tokens, shortformer_pos_embed, attention_mask

    def get_residual(
        self,
        embed: Float[torch.Tensor, "batch pos d_model"],
        pos_offset: int = 0,
        prepend_bos=USE_DEFAULT_VALUE,
        attention_mask: Int[torch.Tensor, "batch offset_pos"] | None = None,
        tokens: Int[torch.Tensor, "batch pos"] | None = None,
        return_shortformer_pos_embed: bool = True,
        device=None,
    ):
        """Add the position embedding to token embeddings, as the forward pass does.

        Arguments:
            embed: token embeddings (the output of `hook_embed`).
            pos_offset: number of positions already processed (cached) before `embed`.
            attention_mask: `[batch, pos_offset + pos]` padding mask over cached and new
                positions; positions then count real tokens only (left padding).
            prepend_bos, tokens, device: accepted for TransformerLens compatibility; the
                shapes come from `embed`.

        Returns:
            `(residual, shortformer_pos_embed)`, or only `residual` when
            `return_shortformer_pos_embed=False`. For rotary models the residual is `embed`:
            positions enter inside attention.
        """
        batch, n_new = embed.shape[:2]
        if attention_mask is None:
            positions = torch.arange(pos_offset, pos_offset + n_new, device=embed.device).expand(batch, n_new)
            new_mask = None
        else:
            mask = attention_mask.to(embed.device).long()  # [batch, pos_offset + pos]
            positions, new_mask = positions_from_mask(mask)[:, -n_new:], mask[:, -n_new:]  # [batch, pos]
        residual, shortformer_pos_embed = self._add_pos_embed(embed, positions, new_mask)
        return (residual, shortformer_pos_embed) if return_shortformer_pos_embed else residual

    def _add_pos_embed(self, embed, positions, new_mask):
        """`(residual, shortformer_pos_embed)` from token embeddings and position ids `[batch, pos]`."""
        if not hasattr(self, "pos_embed"):  # rotary / no positions: nothing added to the residual
            return embed, None
        pos_embed = self.hook_pos_embed(self.pos_embed.at_positions(positions, new_mask))  # [batch, pos, d_model]
        if self.cfg.positional_embedding_type == "shortformer":
            return embed, pos_embed
        return embed + pos_embed, None

    def _infer_mask(self, tokens, prepend_bos, padding_side, attention_mask, past_kv_cache):
        """TransformerLens's pad-id inference, used only for raw left-padded tokens without a mask."""
        if attention_mask is not None or past_kv_cache is not None or self.tokenizer is None:
            return attention_mask
        bos, side = self._tokenization_options(prepend_bos, padding_side)
        if side != "left" or not (tokens == self.tokenizer.pad_token_id).any():
            return None
        return get_attention_mask(self.tokenizer, tokens, bos)

    @property
    def input_device(self) -> torch.device:
        """Where the embedding computes: tokens, masks and positions start there (on a split model too)."""
        device = self.embed.W_E.device
        # (the embedding has a parameter, so execution_device finds a device)
        return device if device.type != "meta" else (execution_device(self.embed) or device)

    def _make_state(self, batch: int, n_new: int, attention_mask, past_kv_cache, step=None) -> ForwardState:
        device = self.input_device
        if past_kv_cache is not None:
            check_kv_cache(past_kv_cache, self.cfg, batch)
        causal = self.cfg.attention_dir == "causal"
        if isinstance(past_kv_cache, StaticKeyValueCache):  # fixed shapes: the cache builds the state
            mask = None if attention_mask is None else mask_dtype_check(attention_mask).to(device).long()
            return past_kv_cache.forward_state(batch, n_new, mask, causal, step)
        n_cached = past_kv_cache.n_cached if past_kv_cache is not None else 0
        mask = None if attention_mask is None else mask_dtype_check(attention_mask).to(device).long()
        if past_kv_cache is not None:
            new = torch.ones(batch, n_new, dtype=torch.long, device=device) if mask is None else mask[:, -n_new:]
            mask = past_kv_cache.append_attention_mask(new)
        if mask is not None and mask.shape != (batch, n_cached + n_new):
            raise AttentionMaskError(
                f"attention_mask has shape {tuple(mask.shape)}; expected [batch, pos] = {(batch, n_cached + n_new)}"
            )
        if mask is None or mask_is_all_ones(mask):
            positions = torch.arange(n_cached, n_cached + n_new, device=device).expand(batch, n_new)  # [batch, pos]
            mask = None
        else:
            positions = positions_from_mask(mask)[:, -n_new:]  # [batch, pos]
        if step is None:
            step = past_kv_cache.n_forwards if past_kv_cache is not None else 0
        return ForwardState(mask, positions, n_new, n_cached + n_new, causal, step, past_kv_cache)

    def get_pos_offset(self, past_kv_cache, batch_size: int) -> int:
        return 0 if past_kv_cache is None else past_kv_cache.n_cached

    # -- generation (hooked/generation/loop.py) ------------------------------------------------
    generate = _generation.generate
    generate_stream = _generation.generate_stream

    # -- seams for hooked.scale ------------------------------------------------------------
    # The model never imports `hooked.scale`; scale plugs in here instead. The defaults are
    # one process's behaviour; `hooked.scale.pipeline.PipelineTransformer` overrides them.
    _placement_loaders: ClassVar[dict[str, Callable[..., HookedTransformer]]] = {}

    @classmethod
    def register_placement_loader(cls, keyword: str, loader: Callable[..., HookedTransformer]) -> None:
        """Let `from_pretrained(..., <keyword>=True)` load through `loader` (`hooked.scale` registers "pipeline")."""
        if keyword in HookedTransformer._placement_loaders:
            raise ValueError(f"a placement loader for {keyword!r} is already registered")
        HookedTransformer._placement_loaders[keyword] = loader

    @classmethod
    def placement_loader(cls, keyword: str) -> Callable[..., HookedTransformer]:
        """The loader registered for `from_pretrained(..., <keyword>=True)`."""
        if keyword not in HookedTransformer._placement_loaders:
            raise ValueError(f"from_pretrained({keyword}=True) needs hooked.scale: `import hooked.scale` first")
        return HookedTransformer._placement_loaders[keyword]

    def generate_step(self, step: int) -> contextlib.AbstractContextManager[None]:
        """The scope of step `step` of `generate` (a pipeline's ranks check in once per step)."""
        return contextlib.nullcontext()

    def agree_on_tokens(self, next_tokens: Int[torch.Tensor, "batch"]) -> Int[torch.Tensor, "batch"]:
        """The tokens every process continues `generate` with (a pipeline: the last stage's)."""
        return next_tokens

    # -- caching (run_with_cache: hooked/models/hooked_model.py) --------------------------
    def _cache_inputs(self) -> CacheInputs:
        """The tokens and padding mask of the last forward, stored on `run_with_cache`'s cache."""
        if self.forward_state is None:
            return None, None
        return self.forward_state.tokens, self.forward_state.attention_mask


def _check_no_empty_text(input: str | list[str], text_mask: torch.Tensor) -> None:
    """Text that tokenizes to nothing (e.g. "" with prepend_bos=False) cannot be run."""
    empty = (text_mask.sum(-1) == 0).nonzero().flatten().tolist() if text_mask.shape[1] else list(range(len(text_mask)))
    if empty:
        texts = [input] if isinstance(input, str) else input
        raise TokenError(
            f"input {texts[empty[0]]!r} tokenizes to no tokens: pass non-empty text, "
            "or prepend_bos=True to run BOS alone"
        )


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
