"""`PipelineTransformer`: one `HookedTransformer` split into contiguous stages over torch.distributed ranks.

SPMD: every rank runs the same script. Rank 0 owns the embedding, the last rank
`ln_final` and the unembedding, and each rank a contiguous run of blocks; weights a rank
does not own stay on the `meta` device. A forward call goes:

1. rank 0 tokenizes and embeds, and broadcasts the tokens and mask (every rank builds the
   same `ForwardState`);
2. the batch is cut into `micro_batches` slices (GPipe): each stage runs its blocks on a
   slice and sends the residual `[batch, pos, d_model]` to the next stage, so stages work
   on different slices at the same time;
3. all ranks exchange an ok/error flag (a failure anywhere raises the same `PipelineError`
   on every rank), then the last stage broadcasts the logits (or loss): `model(x)` returns
   the same tensor on every rank.

Hooks run on the rank that owns their hook point (with micro-batching, once per slice).

Every rank must make the same pipelined calls in the same order: a forward, a cache read
(`cache[name]` broadcasts from the rank that holds it), a weight view, a generate step and
a backward are each a collective. Each starts with a check-in (collectives.py): ranks that
called different operations fail at once, every rank naming both; a rank that never
arrives is reported after `timeout_s` (300 s by default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from jaxtyping import Float, Int

from hooked.analysis import patching
from hooked.components.forward_state import ForwardState
from hooked.core.errors import InputError
from hooked.core.validation import check_residual_input, mask_dtype_check
from hooked.loading.options import LoadOptions
from hooked.models.forward_call import ForwardCall
from hooked.models.hooked_transformer import HookedTransformer, Output
from hooked.scale.collectives import (
    PipelineError,
    agree,
    broadcast_object,
    broadcast_tensor,
    check_in,
    describe,
    init_group,
    recv_tensor,
    secondary,
    send_tensor,
)
from hooked.scale.distributed_cache import DistributedCacheDict, SliceParts
from hooked.scale.pipeline_grad import CheckInBackward, GradMailbox, RecvGradFromNext, SendGradBack
from hooked.scale.stage_loading import Stage, owner_of
from hooked.scale.stage_model import load_stage

logger = logging.getLogger(__name__)


def from_pretrained_pipeline(
    model_name: str,
    *,
    micro_batches: int = 1,
    timeout_s: float | None = None,
    pipeline: bool = True,
    options: LoadOptions | None = None,
    **kwargs,
) -> PipelineTransformer:
    """`HookedTransformer.from_pretrained(model_name, pipeline=True, ...)` under torchrun.

    Starts the process group if needed (gloo on CPU, NCCL on GPU, every collective
    bounded by `timeout_s`, 300 s by default: a rank that stops answering, or calls
    nothing, is reported after that long; pass e.g. `timeout_s=30` for interactive work),
    gives this rank its stage, and reads from the checkpoint only that stage's tensors.
    Ranks that opened different checkpoints fail at once. `micro_batches` is the default
    number of slices a forward cuts the batch into (see `PipelineTransformer.forward`).
    The other keywords are `from_pretrained`'s; `options=` (a `LoadOptions`) replaces them all.
    """
    if options is None:
        options = LoadOptions.from_keywords(pipeline=True, micro_batches=micro_batches, timeout_s=timeout_s, **kwargs)
    elif kwargs or micro_batches != 1 or timeout_s is not None:
        raise InputError(
            "from_pretrained_pipeline got options= and keywords: pass every setting in options "
            "(dataclasses.replace(options, ...)) or every setting as a keyword"
        )
    elif not options.pipeline:
        options = dataclasses.replace(options, pipeline=True)  # validated for a pipeline (no device=)
    rank, world_size, device = init_group(options.timeout_s)
    micro = 1 if options.micro_batches is None else options.micro_batches
    with check_in("in from_pretrained(pipeline=True)", device):
        return _load_pipeline(model_name, rank, world_size, device, micro, options)


def _load_pipeline(model_name: str, rank: int, world_size: int, device, micro_batches: int, options: LoadOptions):
    model, error = None, None
    try:
        model = load_stage(PipelineTransformer, model_name, rank, world_size, device, options)
    except Exception as e:  # reported to every rank, so none waits for the others
        error = e
    errors = [None] * world_size
    dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None and len(set(errors)) == 1:
        raise error  # the same refusal on every rank (e.g. more ranks than blocks): raise it as is
    agree(error, f"loading {model_name!r}")
    assert model is not None  # agree() raised if this rank failed to load
    model.micro_batches = micro_batches
    fingerprints = [None] * world_size
    dist.all_gather_object(fingerprints, model.fingerprint)
    if len(set(fingerprints)) > 1:
        groups = {fp: [r for r, f in enumerate(fingerprints) if f == fp] for fp in fingerprints}
        raise PipelineError(
            f"the ranks loaded different checkpoints (ranks grouped by checkpoint: {list(groups.values())}): "
            f"give every rank the same files and revision of {model_name!r}",
            secondary=rank != 0,  # the same message on every rank: rank 0's traceback is enough
        )
    return model


def _checked_in(what):
    """Decorate a collective method: every rank checks in with `what` (a string, or a function of the call's
    arguments) before it runs, so ranks that called different operations fail at once (collectives.check_in)."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            with check_in(what if isinstance(what, str) else what(*args, **kwargs), self.device):
                return method(self, *args, **kwargs)

        return wrapper

    return decorate


class PipelineTransformer(HookedTransformer):
    """A `HookedTransformer` whose blocks are spread over the ranks of a process group (see module doc)."""

    stage: Stage
    device: torch.device
    micro_batches: int = 1
    _call_micro_batches: int | None = None  # this forward call's `micro_batches=` (None: the model's default)
    fingerprint: str = ""
    requested_keys: list[str]

    @property
    def input_device(self) -> torch.device:
        return self.device

    @property
    def rank(self) -> int:
        return self.stage.rank

    # -- forward ---------------------------------------------------------------------------
    # `forward` is HookedTransformer's template: this class replaces how the input enters the
    # blocks (`_enter_blocks`: rank 0 embeds, every rank builds the same state) and how the blocks
    # run (`_run_blocks`: stage by stage, micro-batch by micro-batch, the head on the last stage).
    @_checked_in("in forward()")
    def forward(self, *args, micro_batches: int | None = None, **kwargs):
        """As `HookedTransformer.forward`, pipelined; a collective: every rank must call it.

        `micro_batches` cuts the batch into that many slices. Left out, the model's default
        (`from_pretrained(..., micro_batches=M)`) is used, capped at the batch size: a batch
        of 2 on a model loaded with `micro_batches=4` runs as 2 slices of one row. Passed
        explicitly, it must not exceed the batch. With a KV cache the batch is not cut. Rank 0's
        input is used. With `stop_at_layer` the stages after that layer stay idle and its owner
        broadcasts the residual; with
        `start_at_layer` rank 0 sends the residual to the owner of that block and the stages
        before it stay idle (gradients then stay on each rank: nothing is sent back).
        """
        self._call_micro_batches = micro_batches
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._call_micro_batches = None

    def _enter_blocks(self, input, call: ForwardCall, tokens, shortformer_pos_embed, attention_mask):
        """Rank 0 embeds (or takes the residual entering block `call.start`); every rank gets the tokens and
        mask and builds the same `ForwardState`. The residual is None on the other ranks."""
        if shortformer_pos_embed is not None:
            raise InputError("shortformer_pos_embed is not supported on a pipelined model")
        if call.past_kv_cache is not None:
            self._release_other_stages_kv(call.past_kv_cache)
        residual, state = self._start(input, call, tokens, attention_mask)
        return residual, state.tokens, None

    def _run_blocks(self, residual, state: ForwardState, call: ForwardCall, tokens, shortformer_pos_embed):
        """The stages' blocks over micro-batches, the head on the last stage, its result on every rank."""
        batch = residual_batch(state)
        n_micro = 1 if call.past_kv_cache is not None else (self._call_micro_batches or min(self.micro_batches, batch))
        slices = _micro_slices(batch, n_micro)
        track = torch.is_grad_enabled() and call.stop is None and call.start is None  # gradients cross ranks
        end_rank = self.stage.world_size - 1 if call.stop is None else self._owner_of_residual(call.stop)
        start_rank = 0 if call.start is None else self._owner_of_block(call.start)
        if call.start is not None and start_rank != 0:  # rank 0 sends the residual to the stage that starts
            if self.rank == 0:
                send_tensor(residual, start_rank, self.device)  # [batch, pos, d_model]
            elif self.rank == start_rank:
                residual = recv_tensor(0, self.cfg.dtype, self.device)
        error, result, stage_outs = self._run_stages(residual, state, slices, call, track, (start_rank, end_rank))
        agree(error, "pipelined forward")
        self.forward_state = state
        if call.stop is not None:
            return broadcast_tensor(result, end_rank, self.device)  # [batch, pos, d_model]
        return self._tie_gradients(self._share_result(result, call.return_type), stage_outs, call, track)

    def _tie_gradients(self, result, stage_outs: list[torch.Tensor], call: ForwardCall, track: bool):
        """The shared result, wired so that `backward()` on it runs on every rank (see pipeline_grad.py)."""
        if not track:
            return result
        if not self.stage.is_last and stage_outs and all(out.requires_grad for out in stage_outs):
            if call.return_type == "both":
                assert isinstance(result, Output)  # _share_result gives an Output for "both"
                return Output(result.logits, self._check_in_backward(self._tie_to_stage(result.loss, stage_outs)))
            result = self._tie_to_stage(result, stage_outs) if isinstance(result, torch.Tensor) else None
        elif self.stage.is_last and call.return_type == "both":
            assert isinstance(result, Output)  # _share_result gives an Output for "both"
            return Output(result.logits, self._check_in_backward(result.loss))
        return self._check_in_backward(result) if isinstance(result, torch.Tensor) else result

    def _check_in_backward(self, result: torch.Tensor) -> torch.Tensor:
        """`result`, whose backward first checks in (every rank calls `backward()` on the same result)."""
        return CheckInBackward.apply(result, self.device) if result.requires_grad else result

    def _tie_to_stage(self, result: torch.Tensor, stage_outs: list[torch.Tensor]) -> torch.Tensor:
        return RecvGradFromNext.apply(result, self.rank + 1, self.device, *stage_outs)

    def _release_other_stages_kv(self, past_kv_cache) -> None:
        """A KV cache is built for every layer; on this rank only this stage's layers are ever filled."""
        for layer, entry in enumerate(past_kv_cache.entries):
            if layer not in self.stage.layers and entry._keys.shape[1]:
                entry._keys = entry._keys[:, :0].clone()  # [batch, 0, kv_head, d_head]
                entry._values = entry._values[:, :0].clone()

    def _start(self, input, call: ForwardCall, tokens, attention_mask):
        """Rank 0 embeds (or takes the residual entering block `call.start`); every rank gets the tokens and
        mask and builds the same `ForwardState`."""
        residual, info, first_error = None, None, None
        if self.stage.is_first:
            try:
                if call.start is None:
                    residual, tokens, _, mask = self.input_to_embed(
                        input, call.prepend_bos, call.padding_side, attention_mask, call.past_kv_cache, step=call.step
                    )
                else:
                    check_residual_input(input, call.start, tokens, self.cfg.d_model)
                    residual = input.to(self.device, self.cfg.dtype)  # [batch, pos, d_model]: what the stages exchange
                    mask = None if attention_mask is None else mask_dtype_check(attention_mask).long()
                batch, n_new = residual.shape[:2]
                info = dict(batch=batch, n_new=n_new, mask=mask, tokens=tokens)
            except Exception as e:  # reported to every rank below
                info, first_error = describe(0, e), e
        info = broadcast_object(info, 0)
        if isinstance(info, str) and self.stage.is_first:
            raise PipelineError(f"pipelined forward: {info}") from first_error
        if isinstance(info, str):
            raise secondary(f"pipelined forward: {info}", [0]) from None
        if not self.stage.is_first or call.start is not None:  # (rank 0's embedding built its state already)
            mask = None if info["mask"] is None else info["mask"].to(self.device)
            self.forward_state = self._make_state(
                info["batch"], info["n_new"], mask, call.past_kv_cache, step=call.step
            )
            self.forward_state.tokens = None if info["tokens"] is None else info["tokens"].to(self.device)
        state = self.forward_state
        assert state is not None  # input_to_embed (rank 0) or _make_state (above) has just set it
        return residual, state

    def _owner_of_block(self, layer: int) -> int:
        """The rank running block `layer` (the last rank, holding `ln_final`, for `n_layers`)."""
        if layer >= self.cfg.n_layers:
            return self.stage.world_size - 1
        return owner_of(f"blocks.{layer}", self.stage.world_size, self.cfg.n_layers)

    def _owner_of_residual(self, stop: int) -> int:
        """The rank holding the residual that enters block `stop` (the embedding's rank for 0)."""
        return 0 if stop == 0 else owner_of(f"blocks.{stop - 1}", self.stage.world_size, self.cfg.n_layers)

    def _run_stages(
        self, residual, state, slices, call: ForwardCall, track: bool, ranks: tuple[int, int]
    ) -> tuple[BaseException | None, Any, list[torch.Tensor]]:
        """This rank's part of every micro-batch; returns `(error or None, end stage's result, sent slices)`.

        The pipeline runs from `start_rank` (rank 0, or the owner of block `call.start`) to
        `end_rank` (the last rank, or the owner of `call.stop`'s residual); other ranks stay idle.
        With `track`, each received slice records a `SendGradBack` node (see pipeline_grad.py).
        """
        start_rank, end_rank = ranks
        if not start_rank <= self.rank <= end_rank:
            return None, None, []
        is_start, is_end = self.rank == start_rank, self.rank == end_rank
        error, upstream_failed, outs, sent = None, False, [], []
        mailbox = GradMailbox(len(slices), self.rank - 1, self.device) if track and not is_start else None
        for i, sl in enumerate(slices):
            x = residual[sl] if is_start else recv_tensor(self.rank - 1, self.cfg.dtype, self.device)
            upstream_failed = upstream_failed or x is None
            if mailbox is not None and x is not None:
                x = SendGradBack.apply(x.requires_grad_(), mailbox, i)
            if error is None and not upstream_failed and x is not None:  # (x is None only if upstream failed)
                try:
                    x = self._run_stage_blocks(x, _slice_state(state, sl), call)
                    if is_end and (call.stop is not None or call.return_type is not None):
                        outs.append(x if call.stop is not None else self._final_logits(x, call))
                except Exception as e:
                    error = e
            if not is_end:
                send_tensor(None if (error or upstream_failed) else x, self.rank + 1, self.device)
                sent.append(x)
        self.forward_state = state
        if error is not None or upstream_failed:
            return error, None, []
        if not is_end:
            return None, None, sent
        return self._end_result(outs, state, call)

    def _end_result(
        self, outs: list[torch.Tensor], state: ForwardState, call: ForwardCall
    ) -> tuple[BaseException | None, Any, list[torch.Tensor]]:
        """The end stage's slices joined: the residual at `call.stop`, or the head's output."""
        if call.stop is not None:
            return None, torch.cat(outs), []  # [batch, pos, d_model]
        if call.return_type is None:
            return None, None, []
        try:
            return None, self._output(torch.cat(outs), state.tokens, state, call), []
        except Exception as e:
            return e, None, []

    def _run_stage_blocks(self, x: Float[torch.Tensor, "batch pos d_model"], state: ForwardState, call: ForwardCall):
        """This stage's blocks (within `call.start`..`call.stop`) on one micro-batch slice."""
        self.forward_state = state
        for layer in self.stage.layers:
            if call.start is not None and layer < call.start:
                continue
            if call.stop is not None and layer >= call.stop:
                break
            x = self.blocks[layer](x, state, None)  # [batch, pos, d_model]
        return x

    def _share_result(self, result, return_type):
        """Collective: the last stage's logits / loss on every rank."""
        last = self.stage.world_size - 1
        if return_type is None:
            return None
        if return_type == "both":
            logits, loss = result if result is not None else (None, None)
            return Output(broadcast_tensor(logits, last, self.device), broadcast_tensor(loss, last, self.device))
        return broadcast_tensor(result, last, self.device)

    # -- generation --------------------------------------------------------------------------
    # `generate` is HookedTransformer's: each call is a collective, each stage keeps its blocks' KV
    # cache, and with `return_cache=True` each rank records its own hook points at every step.
    def shared_cache_dict(self, local: dict[str, torch.Tensor]) -> DistributedCacheDict:
        """Collective: each activation stays on its owner; reading one broadcasts it."""
        return DistributedCacheDict(local, self)

    @contextlib.contextmanager
    def generate_step(self, step: int) -> Iterator[None]:
        """Collective: step `step` of `generate` checks in once (its forward and token choice run inside)."""
        with check_in(f"in generate() step {step}", self.device):
            yield

    @_checked_in("in generate(), sharing the sampled tokens")
    def agree_on_tokens(self, next_tokens: Int[torch.Tensor, "batch"]) -> Int[torch.Tensor, "batch"]:
        """Collective: the last stage's sampled tokens on every rank (used by `generate`)."""
        return broadcast_tensor(next_tokens, self.stage.world_size - 1, self.device)

    # -- caches (run_with_cache: hooked/models/hooked_model.py) ----------------------------------
    @_checked_in("in run_with_cache()")
    def run_with_cache(self, *model_args, **kwargs):
        """Collective. Each activation stays on the rank that computed it; `cache[name]` broadcasts it.

        Every rank must index the cache in the same order (SPMD), since reading an
        activation is a broadcast from its owner. Micro-batch slices are concatenated.
        """
        return super().run_with_cache(*model_args, **kwargs)

    def _new_cache_store(self) -> SliceParts:
        """Each hook records one value per micro-batch slice (gradients placed by their forward call)."""
        return SliceParts(self.hook_dict)

    def _cache_dict_from(self, store: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's activations, each slice list joined along the batch."""
        return cast(SliceParts, store).assemble()

    # -- weights of other stages ---------------------------------------------------------------
    def _from_rank(self, owner: int, read, what: str) -> torch.Tensor:
        """Collective: `read()` on rank `owner`, broadcast to every rank."""
        with check_in(f"reading weight {what}", self.device):
            value, error = None, None
            if self.rank == owner:
                try:
                    value = read()
                except Exception as e:  # reported to every rank
                    error = e
            agree(error, what)
            return broadcast_tensor(value, owner, self.device)

    def block_weight(self, layer: int, name: str) -> torch.Tensor:
        """Collective: `blocks[layer].<name>` from the rank running that block (weight views, cache methods)."""
        owner = self._owner_of_block(layer)
        read = lambda: super(PipelineTransformer, self).block_weight(layer, name)  # noqa: E731
        return self._from_rank(owner, read, f"blocks.{layer}.{name}")

    def part_weight(self, part: str, name: str) -> torch.Tensor:
        """Collective: the embedding's weights from rank 0, the unembedding's from the last rank."""
        owner = 0 if part in ("embed", "pos_embed") else self.stage.world_size - 1
        return self._from_rank(
            owner, lambda: super(PipelineTransformer, self).part_weight(part, name), f"{part}.{name}"
        )


# each patch runs the whole pipelined forward: a rank cannot start it at a middle layer from a recorded residual
patching.RESUMES_AT_LAYER.register(PipelineTransformer, False)


def residual_batch(state: ForwardState) -> int:
    return state.positions.shape[0] if state.attention_mask is None else state.attention_mask.shape[0]


def _micro_slices(batch: int, n_micro: int) -> list[slice]:
    if n_micro < 1:
        raise InputError(f"micro_batches must be >= 1, got {n_micro}")
    if batch < n_micro:
        raise InputError(
            f"a batch of {batch} cannot be cut into micro_batches={n_micro} slices: pass a batch of at least "
            f"{n_micro} or fewer micro_batches"
        )
    bounds = torch.arange(n_micro + 1) * batch // n_micro
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _slice_state(state: ForwardState, sl: slice) -> ForwardState:
    """The `ForwardState` of rows `sl` of the batch."""
    if sl == slice(0, residual_batch(state)):
        return state

    def rows(t):
        return None if t is None else (t if t.shape[0] == 1 else t[sl])

    return ForwardState(
        rows(state.attention_mask),
        state.positions if state.positions.shape[0] == 1 else state.positions[sl],
        state.n_queries,
        state.n_keys,
        state.causal,
        state.step,
        state.past_kv_cache,
        rows(state.tokens),
    )
