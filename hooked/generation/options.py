"""`GenerationOptions`: every option of `generate` / `generate_stream` in one validated, reusable object,
and TransformerLens's keyword signature mapped onto it (`GenerateSignature`).

`model.generate(prompt, max_new_tokens=20, do_sample=False)` and
`model.generate(prompt, options=GenerationOptions(max_new_tokens=20, do_sample=False))` are the
same call: the keywords (TransformerLens's names and order) are gathered into a
`GenerationOptions`, which checks them once, when it is built. Build one to reuse a setting
across calls, or to pass it through code of your own without repeating 25 parameters.

`GenerationOptions` is the one list of generation options. `generate`, `generate_stream`, the
vision-language `generate`, the remote client and the server's wire schema are built from its
fields: each takes `(*args, **kwargs)` and binds them with a `GenerateSignature`, the
TransformerLens signature derived from the fields (what `inspect.signature` and `help()` show).
"""

from __future__ import annotations

import functools
import inspect
import numbers
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from jaxtyping import Float, Int

from hooked.core.errors import InputError, InputTypeError
from hooked.core.utils import USE_DEFAULT_VALUE
from hooked.core.validation import check_generate_args, check_hook_pairs, check_names_filter
from hooked.generation.static_cache import StaticCacheOptions

RETURN_TYPES = ("input", "str", "tokens", "embeds")


@dataclass(frozen=True)
class GenerationOptions:
    """How `generate` samples, stops, hooks and reports; checked once when built (docs/generation.md).

    The fields are `generate`'s keywords, with its defaults: `generate`'s signature is built from
    them (`GenerateSignature`), the fields up to `verbose` in TransformerLens's positional order.
    Only the prompt (`input`) and its `attention_mask` stay outside, so one object serves many
    prompts. A bad value raises the same error `generate` raises for it. The eos ids are checked
    against the model's vocabulary when a call uses them (the vocabulary is the model's, not the
    options').

    Attributes:
        max_new_tokens: the most tokens to add; fewer if every row stops early.
        stop_at_eos: finish a row when it samples a stop id; it then emits the pad EOS.
        eos_token_id: the stop id, or a list of them (None: the tokenizer's EOS).
        do_sample: sample (the default, as in TransformerLens) or take the argmax (False).
        top_k: keep only the k most likely tokens before sampling.
        top_p: keep the smallest set of most likely tokens whose probability reaches `top_p`.
        temperature: divide the logits by it; 0 means greedy.
        freq_penalty: subtract `freq_penalty * count` for each token already in the row.
        use_past_kv_cache: feed one token per step (True) or the whole sequence each step.
        prepend_bos: add BOS to text input (None: the model's default).
        padding_side: pad inference for raw tokens without a mask (text is left-padded regardless).
        return_type: "input" (the input's kind), "str", "tokens" or "embeds".
        verbose: show a tqdm progress bar.
        repetition_penalty: divide positive (multiply negative) logits of tokens already in the row.
        fwd_hooks: `(name or filter, fn)` pairs active from the prefill to the last step,
            removed afterwards (also on error); stored as a list of pairs once checked.
            `model.forward_state.step` is 0 at the prefill and t at step t; see
            `hooked.core.utils.at_steps`.
        return_cache: record the activations of every fed position after all interventions,
            as `run_with_cache(sequence[:, :-1])` would.
        names_filter: which hooks `return_cache` records (as `run_with_cache`).
        device: where `return_cache` stores the activations.
        output_logits: also return each step's pre-sampling logits `[batch, d_vocab]`.
        generator: the `torch.Generator` to sample with.
        seed: make a generator seeded with this value (a fresh one for every call).
        cache_implementation: None/"dynamic" (a cache that grows) or "static" (HF's name): a
            preallocated cache of prompt + max_new_tokens positions and fixed-shape decode
            steps (`hooked.generation.static_cache`, docs/compiled.md).
        compile: with the static cache, `torch.compile` the decode step (None: True on CUDA,
            False elsewhere). Hooks that are not declarative keep the steps eager.
        static_options: `StaticCacheOptions` of the static cache: stop-check interval, compile
            mode (None: the defaults).
    """

    max_new_tokens: int = 10
    stop_at_eos: bool = True
    eos_token_id: int | list[int] | None = None
    do_sample: bool = True
    top_k: int | None = None
    top_p: float | None = None
    temperature: float = 1.0
    freq_penalty: float = 0.0
    use_past_kv_cache: bool = True
    prepend_bos: bool | None = USE_DEFAULT_VALUE
    padding_side: str | None = USE_DEFAULT_VALUE
    return_type: str = "input"
    verbose: bool = True
    repetition_penalty: float = 1.0
    fwd_hooks: Sequence[tuple[str | Callable[[str], bool], Callable]] = ()
    return_cache: bool = False
    names_filter: Any = None
    device: Any = None
    output_logits: bool = False
    generator: torch.Generator | None = None
    seed: int | None = None
    cache_implementation: str | None = None
    compile: bool | None = None
    static_options: StaticCacheOptions | None = field(default=None)

    def __post_init__(self):
        if self.return_type not in RETURN_TYPES:
            raise InputError(f"return_type must be one of {RETURN_TYPES}, got {self.return_type!r}")
        # The vocabulary is the model's: eos ids are range-checked against it in `check_eos_in_vocab`.
        check_generate_args(
            self.max_new_tokens, self.temperature, self.top_k, self.top_p, self.freq_penalty,
            self.repetition_penalty, self.seed, self.eos_token_id, None,
        )  # fmt: skip
        object.__setattr__(self, "fwd_hooks", check_hook_pairs(self.fwd_hooks, "fwd_hooks"))
        if self.return_cache:
            object.__setattr__(self, "names_filter", check_names_filter(self.names_filter))
        if self.cache_implementation not in (None, "dynamic", "static"):
            raise InputError(
                f"cache_implementation must be None, 'dynamic' or 'static', got {self.cache_implementation!r}"
            )
        if self.cache_implementation != "static" and self.compile:
            raise InputError("compile=True compiles the static-cache decode step: pass cache_implementation='static'")
        if self.cache_implementation == "static" and not self.use_past_kv_cache:
            raise InputError("cache_implementation='static' is a KV cache: it needs use_past_kv_cache=True")

    @property
    def static(self) -> bool:
        """Whether the call decodes with the preallocated static cache."""
        return self.cache_implementation == "static"

    def compiles(self, device) -> bool:
        """Whether the static path compiles its decode step on `device` (`compile=None`: only on CUDA)."""
        if not self.static:
            return False
        return (torch.device(device).type == "cuda") if self.compile is None else bool(self.compile)


def check_eos_in_vocab(eos_token_id, d_vocab: int) -> None:
    """The stop ids (already checked as ints by `GenerationOptions`) must be token ids of the model."""
    if eos_token_id is None:
        return
    ids = [eos_token_id] if isinstance(eos_token_id, numbers.Integral) else list(eos_token_id)
    bad = [i for i in ids if not 0 <= int(i) < d_vocab]
    if bad:
        raise InputError(f"eos_token_id {bad[0]} is outside the vocabulary [0, {d_vocab})")


OPTION_NAMES = tuple(f.name for f in fields(GenerationOptions))


def resolve_options(options: GenerationOptions | None, keywords: Mapping[str, Any], defaults: Mapping[str, Any]):
    """The call's `GenerationOptions`: built from `keywords`, or `options` when given.

    With `options=`, a keyword left at its default (`defaults`, the calling function's)
    defers to it; one set to another value must agree with it, else the call is refused,
    since either choice would silently drop the other.
    """
    if options is None:
        return GenerationOptions(**keywords)
    if not isinstance(options, GenerationOptions):
        raise InputTypeError(f"options must be a GenerationOptions, got {type(options).__name__}")
    clashes = [
        name
        for name, value in keywords.items()
        if not _same(value, defaults[name]) and not _same(value, getattr(options, name))
    ]
    if clashes:
        shown = ", ".join(f"{n}={keywords[n]!r} (options has {getattr(options, n)!r})" for n in clashes)
        raise InputError(
            f"generate got both options= and keywords that disagree with it: {shown}. Pass each setting once: "
            f"in options (dataclasses.replace(options, {clashes[0]}=...)) or as a keyword without options=."
        )
    return options


def _same(a, b) -> bool:
    """Identity, or equality of plain values and of lists of them (tensors, generators, functions: identity)."""
    if a is b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return False  # True is not 1 here: a flag and a count never agree
    if isinstance(a, numbers.Number) and isinstance(b, numbers.Number):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return False


# =========================================================================================
# TransformerLens's signature, built from the fields and bound onto a GenerationOptions
# =========================================================================================
#: `generate`'s prompt: text, a list of texts (left-padded), tokens `[batch, pos]` or `[pos]`, or
#: embeddings `[batch, pos, d_model]`.
PromptInput = str | list[str] | Int[torch.Tensor, "*batch pos"] | Float[torch.Tensor, "batch pos d_model"]

#: The options TransformerLens's `generate` takes by position after `input`, in its order: the fields
#: up to `verbose` (the dataclass lists them first, in that order, for this reason).
POSITIONAL_OPTIONS = OPTION_NAMES[: OPTION_NAMES.index("verbose") + 1]

_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_MASK = inspect.Parameter(
    "attention_mask",
    _KEYWORD,
    default=None,
    annotation=typing.Optional[Int[torch.Tensor, "batch pos"]],  # noqa: UP045  (pyright: no `|` on Annotated)
)  # the prompt's, not an option: one GenerationOptions serves many prompts
_OPTIONS = inspect.Parameter("options", _KEYWORD, default=None, annotation=GenerationOptions | None)


@dataclass(frozen=True)
class GenerateCall:
    """One call bound to a `GenerateSignature`: the prompt, its mask, the option keywords and the caller's own.

    `resolve()` gathers the keywords into the call's `GenerationOptions` (or checks them against
    `options=`); it is separate so that `generate_stream` checks them when the stream starts, as
    a generator does.
    """

    input: Any
    attention_mask: torch.Tensor | None
    keywords: dict[str, Any]  # every GenerationOptions field, as passed or defaulted
    defaults: dict[str, Any]  # the signature's defaults of those fields (the stream's `verbose` is False)
    given: GenerationOptions | None  # `options=`
    extra: dict[str, Any]  # the caller's own parameters (`max_tokens_per_yield`, `on_token`, images)

    def resolve(self) -> GenerationOptions:
        """The call's `GenerationOptions`: built from the keywords, or `options=` if they agree with it."""
        return resolve_options(self.given, self.keywords, self.defaults)


@dataclass(frozen=True)
class GenerateSignature:
    """TransformerLens's `generate` signature, derived from `GenerationOptions`, and the binding of calls to it.

    The parameters are `(first, input, <the positional options>, *, <extra>, <the other options,
    attention_mask after the first of them>, options)`: TransformerLens's names, order and
    defaults, with this library's options keyword-only. A function taking `(*args, **kwargs)`
    is given the signature with `@signature.surface` and binds its arguments with `bind`, so a
    field added to `GenerationOptions` is a keyword of every generate at once.

    Attributes:
        name: the function's name, for the errors of a wrong call.
        first: the receiver's name ("model" for the loop's functions, "self" for methods).
        verbose: the default of `verbose` (`generate_stream` shows no bar by default).
        extra: the caller's own keyword-only parameters, placed before the options.
    """

    name: str = "generate"
    first: str = "model"
    verbose: bool = True
    extra: tuple[inspect.Parameter, ...] = ()

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The parameters a call binds to (and `inspect.signature` shows)."""
        head = [
            inspect.Parameter(self.first, inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("input", inspect.Parameter.POSITIONAL_OR_KEYWORD, default="", annotation=PromptInput),
        ]
        positional = [self._option(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in POSITIONAL_OPTIONS]
        keyword = [self._option(name, _KEYWORD) for name in OPTION_NAMES if name not in POSITIONAL_OPTIONS]
        keyword.insert(1, _MASK)  # where it stood before the signature was derived
        return inspect.Signature([*head, *positional, *self.extra, *keyword, _OPTIONS])

    def _option(self, name: str, kind) -> inspect.Parameter:
        default = self.verbose if name == "verbose" else _FIELDS[name].default
        return inspect.Parameter(name, kind, default=default, annotation=_HINTS[name])

    @functools.cached_property
    def defaults(self) -> dict[str, Any]:
        """The default of each option under this signature."""
        return {name: self.signature.parameters[name].default for name in OPTION_NAMES}

    def bind(self, *args, **kwargs) -> GenerateCall:
        """Bind a call as Python binds one to `signature` (a TypeError naming a wrong argument)."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}() {e}") from None  # as Python words it: "generate() got an ..."
        bound.apply_defaults()
        values = bound.arguments
        return GenerateCall(
            input=values["input"],
            attention_mask=values["attention_mask"],
            keywords={name: values[name] for name in OPTION_NAMES},
            defaults=self.defaults,
            given=values["options"],
            extra={p.name: values[p.name] for p in self.extra},
        )

    def surface(self, fn):
        """Give `fn` (which takes `*args, **kwargs` and calls `bind`) this signature, and append the
        options' documentation to its docstring: `help()`, `inspect.signature` and the editors that
        inspect live objects (IPython, Jupyter) show every parameter."""
        fn.__signature__ = self.signature
        fn.__doc__ = f"{inspect.cleandoc(fn.__doc__ or '')}\n\n{OPTIONS_DOC}"
        return fn


_FIELDS = {f.name: f for f in fields(GenerationOptions)}
_HINTS = typing.get_type_hints(GenerationOptions)


def _options_doc() -> str:
    """The per-option documentation, written once in `GenerationOptions`' docstring, for `help(generate)`."""
    doc = inspect.cleandoc(GenerationOptions.__doc__ or "")
    attributes = doc[doc.index("Attributes:") + len("Attributes:") :]
    return "Options (the fields of `GenerationOptions`; `options=` passes them as one object):" + attributes


OPTIONS_DOC = _options_doc()
