"""Small shared utilities: hook-name shorthands, the LM loss, padding masks."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int, Shaped

from hooked.core.errors import InputError, MissingStepsError

logger = logging.getLogger(__name__)


# An argument left at this value uses the model's default (`None`, as in TransformerLens).
USE_DEFAULT_VALUE = None

_NAME_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_mid": "mid",
    "mlp_post": "post",
}
_LAYER_TYPE_ALIASES = {"a": "attn", "attention": "attn", "m": "mlp", "b": None, "block": None, "blocks": None}
_ATTN_NAMES = {"q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores"}
_MLP_NAMES = {"pre", "post", "mid", "pre_linear"}
# a recurrent layer's own hooks (`blocks.{l}.mixer.hook_*`) that no other sublayer has
_MIXER_NAMES = {"ssm_state", "delta", "log_decay", "conv_in", "conv_out", "beta"}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """Expand a shorthand into a full hook name: `("pattern", 0)` -> `blocks.0.attn.hook_pattern`.

    Accepts compact forms like `"k6"` and `"scale4ln1"`; a full name (with a dot or a
    `hook_` prefix) and no layer is returned unchanged.
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    match = re.fullmatch(r"([a-z_]+)(\d+)([a-z_0-9]*)", name)
    if match is not None and layer is None:
        name, layer, layer_type = match.group(1), int(match.group(2)), match.group(3) or None
    name = _NAME_ALIASES.get(name, name)
    if layer_type is not None:
        layer_type = _LAYER_TYPE_ALIASES.get(layer_type, layer_type)
    if layer_type is None and name in _ATTN_NAMES:
        layer_type = "attn"
    elif layer_type is None and name in _MLP_NAMES:
        layer_type = "mlp"
    elif layer_type is None and name in _MIXER_NAMES:
        layer_type = "mixer"
    if layer is None:
        return f"ln_final.hook_{name}" if name in ("scale", "normalized") else f"hook_{name}"
    return f"blocks.{layer}.{layer_type + '.' if layer_type else ''}hook_{name}"


def lm_cross_entropy_loss(
    logits: Float[torch.Tensor, "batch pos d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    per_token: bool = False,
) -> Float[torch.Tensor, ""] | Float[torch.Tensor, "batch pos_minus_1"]:
    """Next-token cross-entropy in float32, averaged over kept pairs (t, t+1).

    A pair is kept iff both tokens are real (`mask[t] & mask[t+1]`). Per-token loss is
    0 at dropped positions.
    """
    if tokens.shape[-1] < 2:
        raise InputError(
            f"a next-token loss needs at least 2 tokens per sequence, got tokens of shape {tuple(tokens.shape)} "
            f"({tokens.shape[-1]} token): pass a longer input"
        )
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [batch, pos-1]
    if attention_mask is None:
        return nll if per_token else nll.mean()
    keep = (attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()).to(nll.dtype)
    nll = nll * keep
    return nll if per_token else nll.sum() / keep.sum().clamp(min=1)


def lm_accuracy(
    logits: Float[torch.Tensor, "batch pos d_vocab"], tokens: Int[torch.Tensor, "batch pos"], per_token: bool = False
):
    """Fraction of positions whose argmax is the next token."""
    correct = logits[:, :-1].argmax(-1) == tokens[:, 1:]
    return correct if per_token else correct.float().mean()


def get_attention_mask(tokenizer, tokens: Int[torch.Tensor, "batch pos"], prepend_bos: bool) -> torch.Tensor:
    """Infer a left-padding mask from pad ids (TransformerLens's rule for raw tokens).

    Leading pad tokens are masked; when BOS equals the pad token, the BOS just before
    the first real token is kept.
    """
    pad = tokenizer.pad_token_id
    is_real = tokens.ne(pad)
    mask = is_real.cumsum(dim=-1) > 0
    if prepend_bos and tokenizer.bos_token_id == pad:
        first_real = is_real.long().argmax(dim=-1)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        mask[rows, (first_real - 1).clamp(min=0)] = True
    return mask.long()


def positions_from_mask(mask: Int[torch.Tensor, "batch pos"]) -> Int[torch.Tensor, "batch pos"]:
    """Position ids `cumsum(mask) - 1`, clamped at 0, so left-padded rows start at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def remove_batch_dim(x: torch.Tensor) -> torch.Tensor:
    return x[0] if x.shape[0] == 1 else x


# -- hooks restricted to generation steps ------------------------------------------------
class AtSteps:
    """A hook that calls `fn` only at chosen forward steps and passes the activation through otherwise.

    The step is `model.forward_state.step`: 0 for the prefill of a generation (or any
    forward without a KV cache), t for the t-th KV-cached forward. `generate` binds
    the model and checks the steps for you; in a hand-written loop, pass `model=` and
    use the hook as a context manager (`with hook: ...`), which checks on exit.

    Arguments:
        fn: the hook, `fn(tensor, *, hook) -> Tensor | None`.
        steps: an int, an iterable of ints, or a slice (`slice(2, None)` = step 2 on).
        strict: at the end, raise `MissingStepsError` if a requested step never ran
            (otherwise log a warning). For a slice without a stop, "requested" means
            its first step; otherwise every listed step.
    """

    def __init__(self, fn: Callable, steps: int | Iterable[int] | slice, strict: bool = False, model=None):
        self.fn, self.strict, self.model = fn, strict, model
        self.steps = _normalize_steps(steps)
        self.ran: set[int] = set()
        self.__name__ = f"at_steps({getattr(fn, '__name__', 'fn')}, {steps!r})"

    def selects(self, step: int) -> bool:
        if isinstance(self.steps, slice):
            start, stop, stride = self.steps.start or 0, self.steps.stop, self.steps.step or 1
            return step >= start and (stop is None or step < stop) and (step - start) % stride == 0
        return step in self.steps

    def required(self) -> set[int]:
        """The steps that must run for `check()` to pass."""
        if not isinstance(self.steps, slice):
            return set(self.steps)
        start, stop, stride = self.steps.start or 0, self.steps.stop, self.steps.step or 1
        return {start} if stop is None else set(range(start, stop, stride))

    def __call__(self, tensor: torch.Tensor, *, hook) -> torch.Tensor | None:
        if self.model is None:
            raise RuntimeError(
                f"{self.__name__} does not know its model: use it in generate(fwd_hooks=...), "
                "or pass at_steps(..., model=model)."
            )
        step = self.model.forward_state.step
        if not self.selects(step):
            return None
        self.ran.add(step)
        return self.fn(tensor, hook=hook)

    def reset(self) -> None:
        self.ran = set()

    def check(self) -> None:
        """Raise (strict) or warn if some requested step never ran."""
        missing = sorted(self.required() - self.ran)
        if not missing:
            return
        message = f"{self.__name__}: step(s) {missing} never ran (steps that ran: {sorted(self.ran)})"
        if self.strict:
            raise MissingStepsError(message)
        logger.warning(message)

    def __enter__(self) -> AtSteps:
        self.reset()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.check()


def _normalize_steps(steps) -> frozenset[int] | slice:
    if isinstance(steps, slice):
        if any(v is not None and v < 0 for v in (steps.start, steps.stop)) or (steps.step or 1) <= 0:
            raise ValueError(f"at_steps takes a slice of non-negative steps with a positive stride, got {steps}")
        return steps
    if isinstance(steps, (int, np.integer)):
        return frozenset([int(steps)])
    return frozenset(int(s) for s in steps)


def at_steps(fn: Callable, steps: int | Iterable[int] | slice, strict: bool = False, *, model=None) -> AtSteps:
    """Wrap a hook so it runs only when `model.forward_state.step` is in `steps` (0 = prefill).

    Example: zero head 3 of layer 1 only at the second generated step:

        model.generate(prompt, fwd_hooks=[("blocks.1.attn.hook_z", at_steps(zero_head_3, 2))])
    """
    return AtSteps(fn, steps, strict, model)


# -- slices and positions ------------------------------------------------------------------
SliceInput = Union[None, int, tuple, slice, list, np.ndarray, torch.Tensor, "Slice"]


class Slice:
    """TransformerLens's index over one axis.

    `None` keeps the axis whole, an `int` selects one index and **drops** the axis,
    a `(start, stop[, step])` tuple or a `slice` keeps a range, and a list, array or
    tensor picks those indices. `mode` is "empty", "int", "slice" or "array".
    """

    def __init__(self, input_slice: SliceInput = None):
        if isinstance(input_slice, Slice):
            self.slice, self.mode = input_slice.slice, input_slice.mode
        elif input_slice is None:
            self.slice, self.mode = slice(None), "empty"
        elif (isinstance(input_slice, (int, np.integer)) and not isinstance(input_slice, bool)) or (
            isinstance(input_slice, torch.Tensor) and input_slice.ndim == 0
        ):
            self.slice, self.mode = int(input_slice), "int"
        elif isinstance(input_slice, tuple):
            self.slice, self.mode = slice(*input_slice), "slice"
        elif isinstance(input_slice, slice):
            self.slice, self.mode = input_slice, "slice"
        elif isinstance(input_slice, (list, np.ndarray, torch.Tensor)):
            self.slice, self.mode = torch.as_tensor(np.asarray(to_numpy(input_slice)), dtype=torch.long), "array"
        else:
            raise ValueError(f"Invalid slice input {input_slice!r}")

    @classmethod
    def unwrap(cls, input_slice: SliceInput) -> Slice:
        return input_slice if isinstance(input_slice, Slice) else cls(input_slice)

    def apply(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Index `tensor` along `dim` (an int drops that axis)."""
        index: list[Any] = [slice(None)] * tensor.ndim
        index[dim] = (
            self.slice.to(tensor.device) if isinstance(self.slice, torch.Tensor) else self.slice
        )  # "array" mode
        return tensor[tuple(index)]

    def indices(self, max_ctx: int | None = None) -> Int[torch.Tensor, "n"]:
        """The selected indices as a Long tensor (`max_ctx` is needed for ranges)."""
        if self.mode == "int":
            return torch.tensor([self.slice])
        if max_ctx is None:  # as TransformerLens: also for an index list, whose range check needs it
            raise ValueError("max_ctx is needed to list the indices of a range or an index list")
        return torch.arange(max_ctx)[self.slice]

    def __repr__(self) -> str:
        return f"Slice({self.slice!r}, mode={self.mode!r})"


def token_index(
    idx: int | Int[torch.Tensor, "batch"], attention_mask: Int[torch.Tensor, "batch pos"]
) -> Int[torch.Tensor, "batch"]:
    """Map a per-row logical token index to an absolute column, whatever the padding side.

    Logical index 0 is each row's first real token (BOS included), and a negative index
    counts from its last real token, so under left padding -1 is always column -1.
    """
    mask = attention_mask.bool()
    n_real = mask.sum(-1)  # [batch]
    first = mask.long().argmax(-1)  # [batch], first real column
    idx = torch.as_tensor(idx, device=mask.device).long().expand(n_real.shape)
    logical = torch.where(idx < 0, idx + n_real, idx)
    if bool(((logical < 0) | (logical >= n_real)).any()):
        raise IndexError(f"token index {idx.tolist()} is out of range for rows with {n_real.tolist()} real tokens")
    return first + logical


def gather_pos(
    x: Shaped[torch.Tensor, "batch ..."], index: Int[torch.Tensor, "batch *k"], axis: int = 1
) -> torch.Tensor:
    """Pick, for each batch row b, position `index[b]` of `x` along `axis`.

    `index` is `[batch]` (the axis is dropped) or `[batch, k]` (the axis becomes k, moved
    to axis 1). The other axes keep their order.
    """
    moved = x.movedim(axis, 1)  # [batch, pos, ...rest]
    rows = torch.arange(x.shape[0], device=x.device)
    index = index.to(x.device)
    if index.ndim == 2:
        rows = rows[:, None]  # [batch, 1], broadcast against [batch, k]
    return moved[rows, index]


def row_patch_hook(
    src_rows: int | Sequence[int] | Int[torch.Tensor, "n"],
    dst_rows: int | Sequence[int] | Int[torch.Tensor, "n"],
    src_pos: int | Sequence[int] | Int[torch.Tensor, "*n_pos"] | None = None,
    dst_pos: int | Sequence[int] | Int[torch.Tensor, "*n_pos"] | None = None,
) -> Callable:
    """A hook that copies `act[src_rows, src_pos]` into `act[dst_rows, dst_pos]` in the same pass.

    This is activation patching across prompts of one batch: the destination rows see the
    source rows' activation, as if it had been cached in a first pass. Positions count on
    the hook's position axis (`hook.pos_axis`); None copies every position. It equals the
    two-pass version as long as nothing upstream modified the source rows.
    """
    src_at, dst_at = _as_index(src_rows), _as_index(dst_rows)
    src_cols = slice(None) if src_pos is None else _as_index(src_pos)
    dst_cols = slice(None) if dst_pos is None else _as_index(dst_pos)

    def hook(act: torch.Tensor, hook) -> torch.Tensor:
        if act.requires_grad:
            act = act.clone()
        moved = act.movedim(getattr(hook, "pos_axis", None) or 1, 1)  # [batch, pos, ...], a view of act
        moved[dst_at, dst_cols] = moved[src_at, src_cols].clone()
        return act

    return hook


def _as_index(x) -> int | torch.Tensor:
    if isinstance(x, (int, np.integer)):
        return int(x)
    return torch.as_tensor(to_numpy(x), dtype=torch.long)


def test_prompt(
    prompt: str,
    answer: str | list[str],
    model,
    prepend_space_to_answer: bool = True,
    print_details: bool = True,
    prepend_bos=None,
    top_k: int = 10,
) -> None:
    """Print how the model ranks the answer token(s) after a prompt (a quick sanity check).

    The prompt is tokenized with the model's BOS setting (or `prepend_bos`) and each
    answer without BOS; with several answers only each one's first token is scored.
    For every answer position it prints the answer token's rank, logit and probability
    and the top-k tokens, then the list of ranks.
    """
    from rich import print as rprint

    answers = [answer] if isinstance(answer, str) else list(answer)
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    bos = USE_DEFAULT_VALUE if prepend_bos is None else prepend_bos
    prompt_tokens = model.to_tokens(prompt, prepend_bos=bos)  # [1, prompt_len]
    answer_rows = [model.to_tokens(a, prepend_bos=False)[0] for a in answers]
    if len(answers) > 1:
        answer_rows = [row[:1] for row in answer_rows]  # several answers: first tokens only
    prompt_str = model.to_str_tokens(prompt_tokens[0])
    if print_details:
        print("Tokenized prompt:", prompt_str)
        print("Tokenized answers:", [model.to_str_tokens(row) for row in answer_rows])
    n_prompt, all_ranks = prompt_tokens.shape[1], []
    for row in answer_rows:
        tokens = torch.cat([prompt_tokens[0], row.to(prompt_tokens.device)])[None]  # [1, prompt_len + answer_len]
        with torch.no_grad():
            logits = model(tokens)[0].float()  # [pos, d_vocab]
        ranks = []
        for offset, token in enumerate(row.tolist()):
            step_logits = logits[n_prompt + offset - 1]  # the prediction for this answer token
            probs = step_logits.softmax(-1)
            rank = int((step_logits > step_logits[token]).sum())
            token_str = model.to_single_str_token(token)
            ranks.append((token_str, rank))
            if print_details:
                rprint(
                    "Performance on answer token:\n"
                    f"[b]Rank: {rank: <8} Logit: {step_logits[token].item():5.2f} "
                    f"Prob: {probs[token].item():6.2%} Token: |{token_str}|[/b]"
                )
                top_probs, top_ids = probs.topk(min(top_k, probs.shape[-1]))
                for i, (p, t) in enumerate(zip(top_probs.tolist(), top_ids.tolist(), strict=True)):
                    print(
                        f"Top {i}th token. Logit: {step_logits[t].item():5.2f} Prob: {p:6.2%} "
                        f"Token: |{model.to_single_str_token(t)}|"
                    )
        all_ranks.append(ranks)
    rprint(f"[b]Ranks of the answer tokens:[/b] {all_ranks[0] if len(all_ranks) == 1 else all_ranks}")


test_prompt.__test__ = False  # not a pytest test, despite the name


def is_square(x: torch.Tensor) -> bool:
    """True for a 2-D tensor with as many rows as columns."""
    return x.ndim == 2 and x.shape[0] == x.shape[1]


def is_lower_triangular(x: torch.Tensor) -> bool:
    """True for a square matrix with nothing above the diagonal."""
    return is_square(x) and bool(x.equal(x.tril()))
