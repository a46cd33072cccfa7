"""Drive a `HookedTransformer` with nnsight's tracing: `HookedNNsight(model)`.

nnsight (`pip install 'hooked[nnsight]'`) wraps a module tree in envoys whose `.output`,
`.input`, `.skip` and `.grad` read and edit activations inside `with model.trace(...)`.
`NNsight(model)` alone already reaches every hook point of a `hooked` model (a `HookPoint`
runs nnsight's per-instance forward, and one nnsight waits on counts as an editing hook).
`HookedNNsight` adds what nnsight's `LanguageModel` adds for HuggingFace models:

- text prompts, tokenized as `model.to_tokens` does;
- several prompts in one batch (`tracer.invoke(...)`), left-padded with an attention mask;
- `with nm.generate(prompt, max_new_tokens=n)`: `hooked`'s KV-cached generation, one forward
  per token, so `tracer.iter[...]` / `tracer.all()` pick steps, with the prompt and then each
  step's tokens passing through `nm.generator.streamer` and the ids returned as `tracer.result`.

    from hooked.compat.nnsight import HookedNNsight
    nm = HookedNNsight(model)
    with nm.trace("The Eiffel Tower is in") as tracer:
        z = nm.blocks[0].attn.hook_z.output.save()

nnsight runs a `hooked` model locally: `remote=True` (NDIF's remote execution) and a
`hooked.remote.RemoteModel` are refused with an error that points to `hooked.remote`, where a
model on a server is driven with interventions (docs/nnsight.md, "Remote execution").
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any, cast

import torch
from jaxtyping import Int

from hooked.core.errors import InputError, InputTypeError
from hooked.generation.loop import generate_stream
from hooked.models.tokenization import pad_rows

if TYPE_CHECKING:
    from hooked.models.hooked_transformer import HookedTransformer


def _load_anyio_before_nnsight() -> None:
    """nnsight mounts `.save()` on every Python object when imported, and anyio (the async layer under
    `hooked serve`'s Starlette and uvicorn) then refuses to define its typed-attribute classes (`TypeError:
    Attribute 'save' is missing its type annotation`), so a server started in this process afterwards would
    fail on its first request. Loading anyio's asyncio backend before nnsight avoids that."""
    if "nnsight" in sys.modules or importlib.util.find_spec("anyio") is None:
        return
    importlib.import_module("anyio._backends._asyncio")


_load_anyio_before_nnsight()

try:
    from nnsight import NNsight
    from nnsight.intervention.envoy import traceable
    from nnsight.modeling.transformers import Generator, GeneratorEnvoy
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "hooked.compat.nnsight needs nnsight: pip install 'hooked[nnsight]' (or pip install nnsight)"
    ) from e

# HuggingFace's `generate` decodes greedily unless asked to sample; hooked's samples by default.
GENERATE_DEFAULTS = dict(do_sample=False, verbose=False)

#: where a remote user goes instead (named by both errors below)
REMOTE_DOCS = "docs/nnsight.md, section 'Remote execution'"
_REMOTE_WAY = (
    "Remote work goes through hooked.remote, with interventions instead of traced code: "
    "model = hooked.remote.connect(url, token=...), then model.run_with_cache(prompt, names_filter=...) to save "
    "activations, and model.run_with_hooks(...) or model.generate(...) with fwd_hooks=[(hook_name, "
    "hooked.analysis.interventions.add(...) / zero_ablate(...) / patch_cache(...))] to edit them. Each remote "
    f"recipe of nnsight is translated in {REMOTE_DOCS}."
)


def _refuse_remote(remote: bool | str, where: str) -> None:
    """`remote=False` (ARENA's `remote=REMOTE` with `REMOTE = False`) is accepted and means what it always does."""
    if remote is not False and remote is not None:
        raise InputError(
            f"{where}(..., remote={remote!r}): nnsight runs hooked models locally; its remote execution (NDIF) "
            "serves HuggingFace checkpoints, not hooked models. Drop remote= to trace this model here. " + _REMOTE_WAY
        )


def _check_wrappable(model: Any) -> None:
    """Only a local model (a `torch.nn.Module`) can be traced: a `RemoteModel` runs on its server."""
    if isinstance(model, torch.nn.Module):
        return
    from hooked.remote.client import RemoteModel

    if isinstance(model, RemoteModel):
        raise InputTypeError(
            "HookedNNsight(remote model): nnsight runs hooked models locally, tracing the modules of a model in this "
            "process, and a hooked.remote.RemoteModel has none here (its model runs on the server). Call the remote "
            "model directly. " + _REMOTE_WAY
        )
    raise InputTypeError(f"HookedNNsight wraps a HookedTransformer (a torch.nn.Module), got {type(model).__name__}")


class HookedNNsight(NNsight):
    """An nnsight envoy over a `HookedTransformer`, with text input, batched invokes and generation.

    Module paths are the model's own (`nm.blocks[0].attn.hook_pattern`, `nm.ln_final`,
    `nm.unembed`): the names of `model.hook_dict` are the envoy paths of its hook points.
    """

    def __init__(self, model: torch.nn.Module, **kwargs: Any) -> None:
        _check_wrappable(model)
        super().__init__(model, **kwargs)
        # As nnsight's LanguageModel: generated ids pass through a standalone module whose
        # `streamer` child sees the prompt, then each step's new tokens.
        self.generator = GeneratorEnvoy(
            Generator(), path=f"{self.path}.generator", interleaver=self.interleaver, parent=self
        )
        self._children.append(self.generator)

    @property
    def tokenizer(self):
        return self._module.tokenizer

    # -- local only: remote= is refused, naming hooked.remote ---------------------------------
    def trace(self, *inputs: Any, remote: bool | str = False, **kwargs: Any) -> Any:
        """nnsight's `trace` (and, through it, `generate`), run locally; `remote=True` raises (see `REMOTE_DOCS`)."""
        _refuse_remote(remote, getattr(kwargs.get("fn"), "__name__", "trace"))  # (generate passes fn=generate)
        return super().trace(*inputs, **kwargs)

    def session(self, *args: Any, remote: bool | str = False, **kwargs: Any) -> Any:
        """nnsight's `session`, run locally; `remote=True` raises (see `REMOTE_DOCS`)."""
        _refuse_remote(remote, "session")
        return super().session(*args, **kwargs)

    # -- batching: one (args, kwargs) for the model from the invokes' inputs --------
    def _batch_size(self, *inputs: Any, **kwargs: Any) -> int:
        data = inputs[0] if inputs else kwargs.get("input")
        if data is None:
            return 0
        if isinstance(data, str) or (isinstance(data, torch.Tensor) and data.ndim == 1):
            return 1
        return len(data)

    def _batch(self, invokes: list[tuple], fn: Any) -> tuple:
        """One invoke of tokens goes to the model as given; text, or several invokes, become
        left-padded tokens with an `attention_mask` (only when some row is padded)."""
        if not invokes:
            return tuple(), {}
        if len(invokes) == 1 and invokes[0][0] and isinstance(invokes[0][0][0], torch.Tensor):
            return invokes[0]
        rows: list[list[int]] = []
        shared: dict[str, Any] = {}
        for inputs, kwargs in invokes:
            kwargs = dict(kwargs)
            data = inputs[0] if inputs else kwargs.pop("input")
            rows.extend(self._rows(data, kwargs.pop("attention_mask", None), kwargs))
            shared.update(kwargs)
        tokens, mask = self._pad(rows)
        if bool(mask.all()):
            return (tokens,), shared
        return (tokens,), {**shared, "attention_mask": mask}

    def _rows(self, data: Any, mask: torch.Tensor | None, kwargs: dict) -> list[list[int]]:
        """The unpadded token ids of each row of one invoke's input."""
        if isinstance(data, (str, list)):
            prepend_bos = kwargs.pop("prepend_bos", None)
            options = {} if prepend_bos is None else {"prepend_bos": prepend_bos}
            model = cast("HookedTransformer", self._module)
            data, mask = model.to_tokens(data, padding_side="left", return_attention_mask=True, **options)
        if not isinstance(data, torch.Tensor) or data.is_floating_point():
            kind = "float tensor" if isinstance(data, torch.Tensor) else type(data).__name__
            raise InputTypeError(
                f"HookedNNsight batches text and token ids, not a {kind}: trace embeddings or residuals "
                "as a single input with no tracer.invoke (nm.trace(embeds)), or pass token ids"
            )
        tokens = data[None] if data.ndim == 1 else data  # [batch, pos]
        keep = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.reshape(tokens.shape).bool()
        return [row[m].tolist() for row, m in zip(tokens.cpu(), keep.cpu(), strict=True)]

    def _pad(self, rows: list[list[int]]) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        tokenizer = self._module.tokenizer
        pad_id = getattr(tokenizer, "pad_token_id", None)
        return pad_rows(rows, 0 if pad_id is None else pad_id, "left")  # padded positions are masked out

    # -- generation ----------------------------------------------------------------
    @traceable
    def generate(self, *inputs: Any, **kwargs: Any) -> Int[torch.Tensor, "batch pos"]:
        """Generate with `hooked`'s KV-cached `generate`, traced step by step: the prefill is
        step 0 and each later forward feeds one token, so `tracer.iter[i]` is the forward
        that picks new token `i`. Greedy unless `do_sample=True` (HuggingFace's default).

        Returns the prompt and the new tokens, `[batch, pos + new]` (also `tracer.result`).
        """
        options = {**GENERATE_DEFAULTS, **kwargs, "return_type": "tokens", "max_tokens_per_yield": 1}
        tokens = inputs[0] if inputs else options.pop("input")
        if isinstance(tokens, (str, list)):
            (tokens,), extra = self._batch([((tokens,), {})], None)
            options.update(extra)
        streamer = self.generator.streamer._module
        streamer.put(tokens)
        stream = generate_stream(self._module, tokens, **options)
        while True:
            try:
                new = next(stream)  # [batch, 1]
            except StopIteration as done:
                output = done.value
                break
            assert isinstance(new, torch.Tensor)  # return_type="tokens" streams token tensors
            streamer.put(new[:, 0])
        return self.generator(output, hook=True)
