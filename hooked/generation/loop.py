"""Text generation: a KV-cached decoding loop with hooks and activation caches across every step.

One call runs like this (docs/generation.md):

    prompt     --prefill, step 0-->   logits [b, V]  --sample-->  token 1
    token 1    --step 1 ---------->   logits [b, V]  --sample-->  token 2
    ...
    token N-1  --step N-1 -------->   logits [b, V]  --sample-->  token N   (never fed back)

Every forward appends its keys and values to a `HookedTransformerKeyValueCache`, so a
step costs one position instead of the whole sequence. `use_past_kv_cache=False`
re-runs the full sequence at every step instead: same tokens and logits, slower.

Hooks passed as `fwd_hooks` stay on the model for the whole call. With the KV cache
they see only the positions fed at that step (`[b, prompt, ...]` at the prefill, then
`[b, 1, ...]`), and `model.forward_state.step` says which step it is;
`hooked.core.utils.at_steps` restricts a hook to chosen steps. Without the cache every
step feeds (and hooks see) the whole sequence so far. `return_cache=True` stitches the
per-step activations into one `ActivationCache` equal to `run_with_cache` on the
sequence that was fed.

Batches are left-padded, so the last column is every row's newest real token; a row
that samples a stop token keeps running, with its later tokens forced to the pad EOS.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from tqdm.auto import tqdm

from hooked.analysis.activation_cache import ActivationCache
from hooked.components.rotary import longrope_switches
from hooked.core.errors import AttentionMaskError, GenerationHookError, InputError
from hooked.core.utils import USE_DEFAULT_VALUE, AtSteps
from hooked.core.validation import check_model_input, check_token_range, mask_dtype_check, mask_is_all_ones
from hooked.generation.kv_cache import HookedTransformerKeyValueCache, StaticKeyValueCache, check_static_supported
from hooked.generation.options import (  # noqa: F401  (RETURN_TYPES: importable from here)
    RETURN_TYPES,
    GenerateCall,
    GenerateSignature,
    GenerationOptions,
    check_eos_in_vocab,
)
from hooked.generation.sampling import (  # noqa: F401  (re-exported: they were importable from here)
    _check_sampling,
    apply_freq_penalty,
    apply_repetition_penalty,
    sample_next_token,
    token_counts,
    top_k_filter,
    top_p_filter,
)
from hooked.generation.static_cache import (
    DeviceStepGate,
    StaticCacheOptions,
    StaticRecorder,
    decode_step,
    is_compile_safe,
    warn_python_hooks,
)

logger = logging.getLogger(__name__)


# =========================================================================================
# The prompt: tokens or embeddings, always with a left-padding mask
# =========================================================================================
@dataclass
class Prompt:
    """What the prefill feeds: token ids or token embeddings, and a mask of its real positions.

    `kind` is the input's kind ("str", "list", "tokens" or "embeds"); it decides what
    `return_type="input"` gives back.
    """

    kind: str
    tokens: Int[torch.Tensor, "batch pos"] | None
    embeds: Float[torch.Tensor, "batch pos d_model"] | None
    mask: Int[torch.Tensor, "batch pos"]

    @property
    def input(self) -> torch.Tensor:
        if self.tokens is not None:
            return self.tokens
        assert self.embeds is not None  # a prompt is either tokens or embeddings
        return self.embeds

    @property
    def batch(self) -> int:
        return self.input.shape[0]

    @property
    def length(self) -> int:
        return self.input.shape[1]


def check_left_padded(mask: Int[torch.Tensor, "batch pos"]) -> None:
    """Raise unless every row is zeros then ones (left padding) with at least one real token."""
    right_padded = (mask[:, 1:] < mask[:, :-1]).any(dim=-1)  # a 1 followed by a 0
    if right_padded.any():
        rows = right_padded.nonzero().flatten().tolist()
        raise AttentionMaskError(
            f"generate needs left padding, but attention_mask rows {rows} have a 0 after a 1. "
            "Tokenize with padding_side='left' (list[str] input is always left-padded)."
        )
    if not mask[:, -1].all():
        raise AttentionMaskError("attention_mask has a row with no real token")


def prepare_prompt(
    model, input, prepend_bos=USE_DEFAULT_VALUE, padding_side=USE_DEFAULT_VALUE, attention_mask=None
) -> Prompt:
    """Tokenize text (always left-padded), add a batch axis to 1-D tokens, and settle the mask.

    Raw token input without a mask gets `forward`'s pad-id inference (only when the
    padding side resolves to left), else a mask of ones.
    """
    device = model.input_device
    tokens, embeds, mask = None, None, attention_mask
    unbatched_embeds = isinstance(input, torch.Tensor) and input.is_floating_point() and input.ndim == 2
    check_model_input(input[None] if unbatched_embeds else input, model.cfg.d_model)
    if mask is not None:
        mask_is_all_ones(mask_dtype_check(mask))
    if isinstance(input, (str, list)):
        kind = "str" if isinstance(input, str) else "list"
        tokens, text_mask = model.to_tokens(input, prepend_bos, padding_side="left", return_attention_mask=True)
        mask = text_mask if mask is None else mask
    elif input.is_floating_point():
        kind, embeds = "embeds", (input[None] if input.ndim == 2 else input).to(device)  # [batch, pos, d_model]
    else:
        kind, tokens = "tokens", (input[None] if input.ndim == 1 else input).to(device)  # [batch, pos]
        check_token_range(tokens, model.cfg.d_vocab, "input")
        if mask is None:
            mask = model._infer_mask(tokens, prepend_bos, padding_side, None, None)
    fed = tokens if tokens is not None else embeds
    assert fed is not None  # each input kind above sets tokens or embeds
    shape = fed.shape[:2]
    if shape[1] == 0:
        raise ValueError("generate needs at least one prompt position (pass prepend_bos=True for an empty string)")
    mask = torch.ones(shape, dtype=torch.long, device=device) if mask is None else mask.to(device).long()
    if mask.shape != shape:
        raise AttentionMaskError(f"attention_mask has shape {tuple(mask.shape)}, the prompt {tuple(shape)}")
    check_left_padded(mask)
    return Prompt(kind, tokens, embeds, mask)


# =========================================================================================
# One call: its options, and what they imply for this model and prompt
# =========================================================================================
@dataclass
class _Call:
    """A validated generate call: its `GenerationOptions`, read as they are by the loop and the static
    path, and what they imply for this model and prompt, each worked out once in `_prepare`.

    Attributes:
        options: the call's options.
        prompt: what the prefill feeds.
        stop_ids: `[n_stop]` ids that finish a row; None when the call does not stop at EOS.
        pad_id: what a finished row keeps emitting (set exactly when `stop_ids` is).
        generator: `options.generator`, or one on the prompt's device seeded with `options.seed`.
        compiles: whether the static path compiles its decode step on this device.
        hooks: the user's hooks, then the recorder's: attached for the whole call.
        recorder: what `return_cache` records into (None without it).
    """

    options: GenerationOptions
    prompt: Prompt
    stop_ids: Int[torch.Tensor, "n_stop"] | None
    pad_id: int | None
    generator: torch.Generator | None
    compiles: bool
    hooks: list
    recorder: _StepRecorder | StaticRecorder | None

    @property
    def freq_penalty(self) -> float:
        """The frequency penalty applied: TransformerLens applies it to token input only."""
        return self.options.freq_penalty if self.prompt.tokens is not None else 0.0

    @property
    def static_options(self) -> StaticCacheOptions:
        """The static cache's tuning (`options.static_options`, or the defaults)."""
        return StaticCacheOptions() if self.options.static_options is None else self.options.static_options


def _stop_tokens(model, stop_at_eos: bool, eos_token_id) -> tuple[list[int] | None, int | None]:
    """(stop ids, pad id) as TransformerLens: an int is its own pad; a list pads with the tokenizer EOS."""
    if not stop_at_eos:
        return None, None
    tokenizer_eos = None if model.tokenizer is None else model.tokenizer.eos_token_id
    if eos_token_id is None:
        if tokenizer_eos is None:
            raise ValueError("stop_at_eos=True needs eos_token_id= when the model has no tokenizer EOS")
        eos_token_id = tokenizer_eos
    if isinstance(eos_token_id, int):
        return [eos_token_id], eos_token_id
    ids = [int(i) for i in eos_token_id]
    return ids, tokenizer_eos if tokenizer_eos is not None else ids[0]


@dataclass
class _Progress:
    """Everything fed or generated so far, in buffers sized for the whole call.

    `tokens` and `mask` are `[batch, prompt + max_new_tokens]`; the first `length`
    columns are filled. For embeddings input the prompt columns of `tokens` are
    placeholders (0).
    """

    prompt: Prompt
    tokens: Int[torch.Tensor, "batch total"]
    mask: Int[torch.Tensor, "batch total"]
    finished: Bool[torch.Tensor, "batch"]
    length: int
    logits: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def start(cls, prompt: Prompt, max_new_tokens: int) -> _Progress:
        b, p, device = prompt.batch, prompt.length, prompt.mask.device
        tokens = torch.zeros(b, p + max_new_tokens, dtype=torch.long, device=device)
        if prompt.tokens is not None:
            tokens[:, :p] = prompt.tokens
        mask = torch.cat([prompt.mask, torch.ones(b, max_new_tokens, dtype=torch.long, device=device)], dim=1)
        return cls(prompt, tokens, mask, torch.zeros(b, dtype=torch.bool, device=device), p)

    @property
    def n_new(self) -> int:
        return self.length - self.prompt.length

    @property
    def new_tokens(self) -> Int[torch.Tensor, "batch new"]:
        return self.tokens[:, self.prompt.length : self.length]

    def history(self) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        """The tokens the penalties look at (embeddings input: only the generated ones) and their mask."""
        start = 0 if self.prompt.tokens is not None else self.prompt.length
        return self.tokens[:, start : self.length], self.mask[:, start : self.length]

    def sequences(self) -> Int[torch.Tensor, "batch pos"]:
        """Prompt + generated tokens (left padding kept); only the generated ones for embeddings input."""
        return self.tokens[:, : self.length] if self.prompt.tokens is not None else self.new_tokens

    def append(self, next_tokens: Int[torch.Tensor, "batch"], stop_ids: torch.Tensor | None) -> None:
        self.tokens[:, self.length] = next_tokens
        self.length += 1
        if stop_ids is not None:
            self.finished |= torch.isin(next_tokens, stop_ids)


# =========================================================================================
# Recording activations across steps
# =========================================================================================
class _StepRecorder:
    """Caching hooks that keep every step's activations, then stitch them into one cache.

    With the KV cache, step t's activations cover only its new positions, so per-position
    hooks are concatenated along their position axis, and the `[b, H, q_new, k_total]`
    attention scores/patterns are placed as row blocks of a `[b, H, P, P]` square whose
    never-computed upper triangle is what the full forward has there (-inf scores, 0
    pattern). Without the KV cache the last forward already covers every position.
    """

    def __init__(self, model, names_filter, device, incremental: bool):
        self.names = model._names_from_filter(names_filter)
        self.pos_axis = {name: model.hook_dict[name].pos_axis for name in self.names}
        self.device, self.incremental = device, incremental
        self.chunks: dict[str, list[torch.Tensor]] = defaultdict(list)

    def hooks(self) -> list[tuple[str, Callable]]:
        return [(name, self._save) for name in self.names]

    def _save(self, tensor: torch.Tensor, *, hook) -> None:
        t = tensor.detach() if self.device is None else tensor.detach().to(self.device)
        if self.incremental:
            self.chunks[hook.name].append(t)
        else:
            self.chunks[hook.name] = [t]

    def assemble(self) -> dict[str, torch.Tensor]:
        return {name: self._stitch(name, chunks) for name, chunks in self.chunks.items()}

    def _stitch(self, name: str, chunks: list[torch.Tensor]) -> torch.Tensor:
        if name.endswith(QUERY_BY_KEY_HOOKS):
            fill = 0.0 if name.endswith("hook_pattern") else float("-inf")
            if chunks[0].ndim == 3:  # DSA's indexer scores, one "head": [batch, q_new, k_total]
                return stitch_attention([c[:, None] for c in chunks], fill)[:, 0]
            return stitch_attention(chunks, fill)
        return torch.cat(chunks, dim=self.pos_axis[name] or 0)


#: hooks whose last two axes are (new queries, every key): stitched as rows of a square, -inf (scores) or 0 above
QUERY_BY_KEY_HOOKS = ("hook_attn_scores", "hook_pattern", "indexer.hook_scores")


def stitch_attention(
    chunks: Sequence[Float[torch.Tensor, "batch head _q_new _k_total"]], fill: float
) -> Float[torch.Tensor, "batch head pos pos"]:
    """Place each step's query rows `[k_total - q_new, k_total)` of a square, the rest `fill`."""
    n = chunks[-1].shape[-1]
    square = chunks[0].new_full((*chunks[0].shape[:2], n, n), fill)  # [batch, head, query, key]
    for chunk in chunks:
        k_total, q_new = chunk.shape[-1], chunk.shape[-2]
        square[:, :, k_total - q_new : k_total, :k_total] = chunk
    return square


# =========================================================================================
# The decoding loop
# =========================================================================================
def _forward_step(model, progress: _Progress, step: int, kv_cache) -> Float[torch.Tensor, "batch d_vocab"]:
    """Last-position logits after feeding what this step needs.

    With the KV cache: the prompt at step 0, then only the newest token (its mask, 1,
    is appended by the cache). Without it: the whole sequence so far, every step.
    """
    prompt = progress.prompt
    if kv_cache is not None and step > 0 and longrope_switches(model.cfg, kv_cache.n_cached, progress.length):
        kv_cache = _restart(kv_cache)  # LongRoPE's long factors from here on: recompute every key, as HF
        fed = (
            progress.sequences()
            if prompt.embeds is None
            else torch.cat([prompt.embeds, model.embed(progress.new_tokens)], 1)
        )
        return model(fed, attention_mask=progress.mask[:, : progress.length], past_kv_cache=kv_cache, logits_to_keep=1)[
            :, -1
        ]
    if kv_cache is not None and step > 0:
        newest = progress.tokens[:, progress.length - 1 : progress.length]  # [batch, 1]
        return model(newest, past_kv_cache=kv_cache, logits_to_keep=1)[:, -1]
    if kv_cache is not None:
        return model(prompt.input, attention_mask=prompt.mask, past_kv_cache=kv_cache, logits_to_keep=1)[:, -1]
    fed = progress.sequences()
    if prompt.embeds is not None:  # embeddings of the prompt, then of the generated tokens
        fed = torch.cat([prompt.embeds, model.embed(progress.new_tokens)], dim=1)  # [batch, length, d_model]
    return model(fed, attention_mask=progress.mask[:, : progress.length], step=step, logits_to_keep=1)[:, -1]


def _restart(kv_cache):
    """Empty the cache in place (its buffers are kept)."""
    for entry in kv_cache.entries:
        entry.length = 0
    kv_cache.previous_attention_mask = kv_cache.previous_attention_mask[:, :0]
    return kv_cache


def _next_tokens(logits: Float[torch.Tensor, "batch d_vocab"], progress: _Progress, call: _Call):
    """Sample (or argmax) one token per row with the call's options; rows already finished emit the pad EOS."""
    history, history_mask = progress.history()
    o = call.options
    next_tokens = sample_next_token(
        logits, history, history_mask, do_sample=o.do_sample, top_k=o.top_k, top_p=o.top_p,
        temperature=o.temperature, freq_penalty=call.freq_penalty, repetition_penalty=o.repetition_penalty,
        generator=call.generator,
    )  # fmt: skip
    if call.stop_ids is not None:
        assert call.pad_id is not None  # _stop_tokens sets both or neither
        next_tokens = next_tokens.masked_fill(progress.finished, call.pad_id)
    return next_tokens


@contextlib.contextmanager
def _name_decode_hook_errors(step: int, one_position: bool):
    """Turn a hook's shape or index error at a decode step into one naming the hook, the step and the fix.

    With the KV cache a decode step feeds only the new token, so a hook that indexes fixed
    prompt positions (`resid[:, 1:4] += v`) works at the prefill and fails at step 1.
    """
    try:
        yield
    except (RuntimeError, IndexError) as e:
        hook_point, hook_fn = getattr(e, "hook_point_name", None), getattr(e, "hook_fn_name", None)
        if step == 0 or not one_position or hook_point is None:
            raise
        raise GenerationHookError(
            f"Hook {hook_fn!r} on {hook_point!r} failed at generation step {step}: decode steps feed only "
            f"the newest token, so activations there are [batch, 1, ...] ({type(e).__name__}: {e}). To edit the "
            "prompt only, wrap the hook: hooked.core.utils.at_steps(hook, 0); to edit every step, index positions "
            "from the end (act[:, -1]) or use model.forward_state.positions."
        ) from e


def _decode(model, call: _Call) -> Generator[torch.Tensor, None, _Progress]:
    """Yield each step's `[batch]` tokens; return the final `_Progress`.

    The call's hooks (the user's, then any recorder's) stay on the model from the first
    step until the generator finishes, fails or is closed. Inference mode is entered per
    step, never across a `yield`, so a consumer of `generate_stream` is unaffected.
    """
    opts, prompt = call.options, call.prompt
    if opts.static:
        return (yield from _decode_static(model, call))
    progress = _Progress.start(prompt, opts.max_new_tokens)
    at_steps_hooks = [fn for _, fn in call.hooks if isinstance(fn, AtSteps)]
    for fn in at_steps_hooks:
        fn.model = model
        fn.reset()
    kv_cache = None
    if opts.use_past_kv_cache:
        capacity = prompt.length + opts.max_new_tokens
        kv_cache = HookedTransformerKeyValueCache.init_cache(
            model.cfg, prompt.mask.device, prompt.batch, capacity=capacity
        )
    bar = tqdm(total=opts.max_new_tokens, disable=not opts.verbose, desc="generate")
    try:
        with model.hooks(call.hooks):
            for step in range(opts.max_new_tokens):
                with (
                    torch.inference_mode(),
                    _name_decode_hook_errors(step, kv_cache is not None),
                    model.generate_step(step),
                ):
                    logits = _forward_step(model, progress, step, kv_cache)
                    next_tokens = _next_tokens(logits, progress, call)
                    next_tokens = model.agree_on_tokens(next_tokens)  # a pipeline: the last stage's, on every rank
                    if opts.output_logits:
                        progress.logits.append(logits.clone())
                    progress.append(next_tokens, call.stop_ids)
                bar.update(1)
                yield next_tokens
                if call.stop_ids is not None and bool(progress.finished.all()):
                    break
    finally:
        bar.close()
        model.forward_state = None  # release the KV cache it references
    for fn in at_steps_hooks:
        fn.check()
    return progress


# =========================================================================================
# The static-cache loop: fixed shapes, an optionally compiled decode step
# =========================================================================================
def _static_hooks(model, hooks: list, n_steps: int, device) -> tuple[list, list, list]:
    """`(hooks to attach, device step gates, Python hooks)`: `at_steps` around compile-safe hooks becomes a gate."""
    attached, gates, python = [], [], []
    for name, fn in hooks:
        if isinstance(fn, AtSteps) and is_compile_safe(fn):
            fn.model = model
            fn.reset()
            gate = DeviceStepGate(fn, model, n_steps, device)
            attached.append((name, gate))
            gates.append(gate)
            continue
        if isinstance(fn, AtSteps):
            fn.model = model
            fn.reset()
        attached.append((name, fn))
        if not is_compile_safe(fn):
            python.append((name, fn))
    python += [
        (hp.name, fn) for hp in model.hook_dict.values() for fn in hp._fwd_fns.values() if not is_compile_safe(fn)
    ]
    return attached, gates, python


def _check_static(model, prompt: Prompt, capacity: int) -> None:
    check_static_supported(model.cfg)
    if longrope_switches(model.cfg, prompt.length, capacity):
        raise InputError(
            "cache_implementation='static' cannot cross LongRoPE's switch to its long factors (at "
            f"{model.cfg.rotary_scaling['original_max_position_embeddings']} positions; this call may reach "
            f"{capacity}): the cached keys would need recomputing. Use the default cache, or fewer max_new_tokens."
        )


def _decode_static(model, call: _Call) -> Generator[torch.Tensor, None, _Progress]:
    """`_decode` with a `StaticKeyValueCache`: an eager prefill, then fixed-shape (compiled) decode steps.

    Tokens are sampled on the device; whether every row has stopped is read once every
    `stop_check_interval` steps, and steps past the stop are dropped, so tokens are yielded
    in chunks at those checks.
    """
    opts, prompt = call.options, call.prompt
    progress = _Progress.start(prompt, opts.max_new_tokens)
    device, capacity = prompt.mask.device, prompt.length + opts.max_new_tokens
    _check_static(model, prompt, capacity)
    cache = StaticKeyValueCache(model.cfg, prompt.batch, capacity, device)
    hooks, gates, python = _static_hooks(model, call.hooks, opts.max_new_tokens, device)
    if call.compiles and python:
        warn_python_hooks(python)
    step_fn = decode_step(cache, call.compiles and not python, call.static_options)
    all_done = torch.zeros(opts.max_new_tokens, dtype=torch.bool, device=device)  # [step]: every row stopped
    pending: list[torch.Tensor] = []
    interval = call.static_options.stop_check_interval
    bar = tqdm(total=opts.max_new_tokens, disable=not opts.verbose, desc="generate")
    try:
        with model.hooks(hooks):
            for step in range(opts.max_new_tokens):
                with torch.inference_mode(), _name_decode_hook_errors(step, True):
                    if step == 0:
                        logits = model(prompt.input, attention_mask=prompt.mask, past_kv_cache=cache, logits_to_keep=1)
                        logits = logits[:, -1]  # [batch, d_vocab]
                    else:
                        logits = step_fn(model, next_tokens[:, None], cache)  # [batch, d_vocab]
                    next_tokens = _next_tokens(logits, progress, call)
                    if opts.output_logits:
                        progress.logits.append(logits.clone())
                    progress.append(next_tokens, call.stop_ids)
                    if call.stop_ids is not None:
                        all_done[step] = progress.finished.all()
                pending.append(next_tokens)
                bar.update(1)
                if (step + 1) % interval and step < opts.max_new_tokens - 1:
                    continue
                stopped_at = _first_stop(all_done[: step + 1]) if call.stop_ids is not None else None
                if stopped_at is not None:
                    yield from pending[: len(pending) - (step - stopped_at)]
                    _trim(progress, prompt.length + stopped_at + 1)
                    break
                yield from pending
                pending = []
    finally:
        bar.close()
        model.forward_state = None
    for gate in gates:
        gate.record_ran(progress.n_new)
    for fn in [fn for _, fn in hooks if isinstance(fn, AtSteps)] + [gate.at for gate in gates]:
        fn.check()
    return progress


def _first_stop(all_done: Bool[torch.Tensor, "step"]) -> int | None:
    """The first step after which every row had stopped, or None (one host sync)."""
    if not bool(all_done.any()):
        return None
    return int(all_done.int().argmax())


def _trim(progress: _Progress, length: int) -> None:
    """Drop the tokens (and logits) generated after every row had stopped."""
    progress.logits = progress.logits[: length - progress.prompt.length]
    progress.length = length


# =========================================================================================
# Outputs
# =========================================================================================
@dataclass
class GenerationOutput:
    """The structured result of `generate(..., output_logits=True)` or `return_cache=True`.

    Attributes:
        sequences: `[b, prompt + new]` tokens, left padding kept (embeddings input:
            `[b, new]`).
        text: each row of `sequences` decoded with `skip_special_tokens=True` (None
            without a tokenizer).
        logits: one `[b, V]` tensor per generated token: the last-position logits it
            was sampled from (after the output soft-cap, before any sampling step).
        cache: with `return_cache`, the activations of every fed position (docs/generation.md).
        attention_mask: `[b, prompt + new]`, 1 for real tokens.
        finished: `[b]`, True for rows that produced a stop token.
    """

    sequences: Int[torch.Tensor, "batch pos"]
    text: list[str] | None
    logits: tuple[Float[torch.Tensor, "batch d_vocab"], ...] | None
    cache: ActivationCache | None
    attention_mask: Int[torch.Tensor, "batch pos"]
    finished: Bool[torch.Tensor, "batch"]


def _decode_text(model, tokens: Int[torch.Tensor, "batch pos"]) -> list[str]:
    return [model.tokenizer.decode(row, skip_special_tokens=True) for row in tokens]


def _format(model, progress: _Progress, return_type: str):
    """The tokens, text or token embeddings that `return_type` asks for.

    Runs outside inference mode and returns fresh tensors, so results can feed later
    autograd-tracked forwards (inference-mode tensors cannot).
    """
    prompt = progress.prompt
    if return_type == "input":
        return_type = {"str": "str", "list": "str", "tokens": "tokens", "embeds": "embeds"}[prompt.kind]
    if return_type == "tokens":
        return progress.sequences().clone()
    if return_type == "str":
        texts = _decode_text(model, progress.sequences())
        if prompt.kind == "str" or (prompt.kind != "list" and len(texts) == 1):
            return texts[0]
        return texts
    with torch.no_grad():
        if prompt.embeds is None:
            return model.embed(progress.sequences().clone())  # [batch, prompt + new, d_model]
        new_embeds = model.embed(progress.new_tokens.clone())  # [batch, new, d_model]
        return torch.cat([prompt.embeds, new_embeds], dim=1)  # [batch, prompt + new, d_model]


def _structured(model, progress: _Progress, recorder: _StepRecorder | StaticRecorder | None) -> GenerationOutput:
    """Assemble the `GenerationOutput` (outside inference mode: every tensor is a fresh, ordinary one)."""
    cache = None
    if recorder is not None:
        n_fed = progress.length - 1  # the last sampled token is never fed
        recorded = recorder.assemble(n_fed) if isinstance(recorder, StaticRecorder) else recorder.assemble()
        cache = ActivationCache(model.shared_cache_dict(recorded), model)
        cache.attention_mask = progress.mask[:, :n_fed].clone()
        cache.tokens = progress.tokens[:, :n_fed].clone() if progress.prompt.tokens is not None else None
    sequences = progress.sequences().clone()
    return GenerationOutput(
        sequences=sequences,
        text=_decode_text(model, sequences) if model.tokenizer is not None else None,
        logits=tuple(t.clone() for t in progress.logits) if progress.logits else None,
        cache=cache,
        attention_mask=progress.mask[:, : progress.length].clone(),
        finished=progress.finished.clone(),
    )


# =========================================================================================
# Public entry points
# =========================================================================================
def _prepare(model, input, attention_mask, options: GenerationOptions) -> _Call:
    """The validated call: `options` were checked when built; here what depends on the model and the prompt."""
    check_eos_in_vocab(options.eos_token_id, model.cfg.d_vocab_out)
    if any(hp.bwd_hooks for hp in model.hook_dict.values()):
        raise ValueError(
            "generate runs under torch.inference_mode, where backward hooks never fire: remove them first "
            "(model.reset_hooks(direction='bwd'))."
        )
    prompt = prepare_prompt(model, input, options.prepend_bos, options.padding_side, attention_mask)
    device = prompt.mask.device
    generator = options.generator
    if generator is None and options.seed is not None:
        generator = torch.Generator(device=device).manual_seed(options.seed)
    stop_ids, pad_id = _stop_tokens(model, options.stop_at_eos, options.eos_token_id)
    stop_tensor = None if stop_ids is None else torch.tensor(stop_ids, device=device)  # [n_stop]
    recorder = None
    if options.return_cache and options.static:
        names = model._names_from_filter(options.names_filter)
        recorder = StaticRecorder(model, names, prompt.length + options.max_new_tokens, options.device)
    elif options.return_cache:
        recorder = _StepRecorder(model, options.names_filter, options.device, options.use_past_kv_cache)
    hooks = list(options.fwd_hooks) + (recorder.hooks() if recorder is not None else [])
    return _Call(options, prompt, stop_tensor, pad_id, generator, options.compiles(device), hooks, recorder)


def _drain(steps: Generator[Any, None, _Progress]) -> _Progress:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


#: `generate`'s signature: TransformerLens's, built from `GenerationOptions` (`help(generate)` shows it).
GENERATE = GenerateSignature()
#: `generate_stream`'s: `generate`'s, with `verbose=False` and `max_tokens_per_yield` (new tokens per chunk).
STREAM = GenerateSignature(
    name="generate_stream",
    verbose=False,
    extra=(inspect.Parameter("max_tokens_per_yield", inspect.Parameter.KEYWORD_ONLY, default=25, annotation=int),),
)


@GENERATE.surface
def generate(model, *args, **kwargs):
    """Sample `max_new_tokens` tokens after `input`, as TransformerLens's `generate` (docs/generation.md).

    Each step runs one forward over the newest position only (the KV cache holds the rest), samples
    a token from the last position's logits, and feeds it back. Hooks stay active on every step.

    The arguments are TransformerLens's, in its order: `input`, then the options it takes by
    position, then the others by keyword. Every option is a field of `GenerationOptions`, which
    documents it; `inspect.signature(generate)` lists them all, with their defaults.

    Args:
        model: the `HookedTransformer` to sample from.
        *args: `input`, then TransformerLens's positional options, in its order.
        **kwargs: any of them, and every other option, by name.

    Other Parameters:
        input: text, a list of texts (always left-padded), tokens `[batch, pos]` or `[pos]`
            (with an optional left-padding `attention_mask`), or embeddings `[batch, pos, d_model]`.
        attention_mask: `[batch, pos]` 0/1 mask of left-padded token input.
        options: a `GenerationOptions` holding every option: keywords left at their defaults
            defer to it, a keyword that disagrees with it is refused.

    The sampling steps run in the order given in docs/generation.md ("Sampling order").

    Returns:
        The `return_type` output, or a `GenerationOutput` if `output_logits` or
        `return_cache` is set.
    """
    bound = GENERATE.bind(model, *args, **kwargs)
    options = bound.resolve()
    call = _prepare(model, bound.input, bound.attention_mask, options)
    with torch.inference_mode():
        progress = _drain(_decode(model, call))
    return _result(model, progress, call)


@STREAM.surface
def generate_stream(model, *args, **kwargs) -> Generator[torch.Tensor | str | list[str], None, Any]:
    """`generate`, yielding the new tokens in chunks of at most `max_tokens_per_yield` as they come.

    Each chunk is `[b, <= max_tokens_per_yield]` token ids, or its decoded text for text
    input (a str for str input, a list for list input). When the stream is exhausted its
    return value (`StopIteration.value`, or the result of `yield from`) is what
    `generate` would have returned. Hooks stay attached until the stream ends or is
    closed. The arguments are `generate`'s (`verbose` defaults to False here) plus
    `max_tokens_per_yield`; the options are checked when the stream starts.

    Args:
        model: the `HookedTransformer` to sample from.
        *args: as `generate`'s.
        **kwargs: as `generate`'s, and `max_tokens_per_yield`.
    """
    return _stream(model, STREAM.bind(model, *args, **kwargs))  # a wrong argument raises here, at the call


def _stream(model, bound: GenerateCall) -> Generator[torch.Tensor | str | list[str], None, Any]:
    per_yield = bound.extra["max_tokens_per_yield"]
    if per_yield < 1:
        raise ValueError(f"max_tokens_per_yield must be >= 1, got {per_yield}")
    call = _prepare(model, bound.input, bound.attention_mask, bound.resolve())
    steps = _decode(model, call)
    chunk: list[torch.Tensor] = []
    while True:
        try:
            chunk.append(next(steps))
        except StopIteration as done:
            progress = done.value
            break
        if len(chunk) == per_yield:
            yield _stream_chunk(model, call.prompt, chunk)
            chunk = []
    if chunk:
        yield _stream_chunk(model, call.prompt, chunk)
    return _result(model, progress, call)


def _result(model, progress: _Progress, call: _Call):
    """What `generate` returns: a `GenerationOutput` with `output_logits`/`return_cache`, else `return_type`'s."""
    if call.options.output_logits or call.options.return_cache:
        return _structured(model, progress, call.recorder)
    return _format(model, progress, call.options.return_type)


def _stream_chunk(model, prompt: Prompt, chunk: list[torch.Tensor]):
    tokens = torch.stack(chunk, dim=1)  # [batch, chunk]
    if prompt.kind == "str":
        return model.tokenizer.decode(tokens[0], skip_special_tokens=True)
    if prompt.kind == "list":
        return _decode_text(model, tokens)
    return tokens
