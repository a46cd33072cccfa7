"""`RemoteModel`: the client side of `hooked serve` (httpx)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import inspect
import json
import tempfile
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hooked.analysis import interventions, patching
from hooked.circuits import attribution
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError, RemoteError, WireError
from hooked.core.utils import USE_DEFAULT_VALUE, lm_cross_entropy_loss
from hooked.generation import loop
from hooked.generation.options import GenerateSignature, GenerationOptions
from hooked.models.hooked_model import activation_cache
from hooked.models.hooked_transformer import HookedTransformer, Output
from hooked.models.tokenizer_mixin import TokenizerMixin
from hooked.models.weight_views_mixin import WeightViewsMixin
from hooked.serve import schema, wire

#: What a client accepts from its server: large, but still bounded.
RESPONSE_LIMITS = wire.Limits(
    max_body_bytes=2**36,
    max_header_bytes=2**28,
    max_json_depth=32,
    max_tensors=2**20,
    max_ndim=8,
    max_tensor_elements=2**34,
)


#: The remote `generate`'s signature: the local one, and `on_token`, a callback for each step's tokens.
_GENERATE = dataclasses.replace(
    loop.GENERATE,
    first="self",
    extra=(
        inspect.Parameter(
            "on_token", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Callable[[dict], None] | None
        ),
    ),
)
#: The remote `generate_stream`'s: the local one.
_STREAM = dataclasses.replace(loop.STREAM, first="self")


class _HookInfo:
    """What the client knows of a server hook point: its name and position axis."""

    requires = None

    def __init__(self, name: str, pos_axis: int | None):
        self.name, self.pos_axis = name, pos_axis


class _LazyBlocks:
    """`model.blocks[l]`: a block whose weights are fetched from the server on first use and kept."""

    def __init__(self, remote: RemoteModel):
        self.remote = remote

    def __len__(self) -> int:
        return self.remote.cfg.n_layers

    def __getitem__(self, layer: int):
        if not -len(self) <= layer < len(self):
            raise IndexError(f"block {layer} out of range for {len(self)} layers")
        return self.remote._materialized(f"blocks.{layer % len(self)}")

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class RemoteModel(TokenizerMixin, WeightViewsMixin):
    blocks: _LazyBlocks  # fetched on use, not a ModuleList
    """A model on a `hooked serve` server, with the `HookedTransformer` calls a course script uses.

    Hooks must be `hooked.analysis.interventions` objects; metrics of patching and attribution must be
    `hooked.analysis.metrics` objects. Weights that cache analyses read (norm gains, `W_U`, `W_O`, ...)
    are fetched per block on first use and kept.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 300.0, client=None):
        import httpx

        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = client or httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        info = self._json("GET", "/v1/model")
        cfg = dict(info["cfg"], device="cpu", n_devices=1)
        self.cfg = HookedTransformerConfig.from_dict(cfg)
        self.hook_dict = {n: _HookInfo(n, info["pos_axes"].get(n)) for n in info["hook_names"]}
        self._inactive = set(info.get("inactive", ()))
        self.tokenizer: Any = None  # a HF tokenizer or None (HF's stubs type decode() as str | list[str])
        if info["tokenizer_files"]:
            self.set_tokenizer(_tokenizer_from_files(info["tokenizer_files"]), info.get("padding_side", "right"))
        self.forward_state = None
        self.last_job_id: str | None = None
        self._pending: list[list[tuple[str, Any]]] = []
        self._shadow = None
        self._parts: dict[str, torch.nn.Module] = {}
        self.blocks = _LazyBlocks(self)

    # -- transport ---------------------------------------------------------------------------
    def _check(self, response) -> None:
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except (ValueError, AttributeError):
                message = response.text
            raise RemoteError(f"server answered {response.status_code}: {message}", response.status_code)

    def _json(self, method: str, path: str) -> dict:
        response = self._http.request(method, path)
        self._check(response)
        return response.json()

    def _post(self, body: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
        response = self._http.post(
            "/v1/run", content=wire.encode(body, tensors), headers={"content-type": wire.CONTENT_TYPE}
        )
        self._check(response)
        return wire.decode(response.content, RESPONSE_LIMITS, finite=False)

    def _stream(self, body: dict, tensors: dict, on_event: Callable[[dict], None] | None):
        events = self._events(body, tensors)
        while True:
            try:
                event = next(events)
            except StopIteration as done:
                return done.value
            if on_event is not None:
                on_event(event)

    def _events(self, body: dict, tensors: dict):
        """Yield the server's progress events; return the decoded result."""
        with self._http.stream(
            "POST", "/v1/stream", content=wire.encode(body, tensors), headers={"content-type": wire.CONTENT_TYPE}
        ) as response:
            if response.status_code >= 400:
                response.read()
                self._check(response)
            for line in response.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                if "result" in event:
                    return wire.decode(base64.b64decode(event["result"]), RESPONSE_LIMITS, finite=False)
                if "error" in event:
                    raise RemoteError(
                        f"server answered {event.get('status')}: {event['error']}", event.get("status", 500)
                    )
                if "job" in event:
                    self.last_job_id = event["job"]  # for GET/DELETE /v1/jobs/{id}
                    continue
                yield event
        raise RemoteError("the server closed the stream without a result", 502)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- inputs and hooks ---------------------------------------------------------------------
    def _inputs(
        self,
        input,
        prepend_bos=USE_DEFAULT_VALUE,
        padding_side=USE_DEFAULT_VALUE,
        attention_mask=None,
        prefix: str = "",
    ) -> dict[str, torch.Tensor]:
        """Token ids (and a mask) for the server: text is tokenized here, as the local model would."""
        if isinstance(input, (str, list)):
            tokens, mask = self.to_tokens(input, prepend_bos, padding_side, return_attention_mask=True)
            attention_mask = mask if attention_mask is None and not bool(mask.all()) else attention_mask
        elif isinstance(input, torch.Tensor) and not input.is_floating_point():
            tokens = input[None] if input.ndim == 1 else input
        else:
            raise InputError("a remote model takes text or token ids [batch, pos] (embeddings stay on the server)")
        out = {f"{prefix}tokens": tokens.long().cpu()}
        if attention_mask is not None:
            out[f"{prefix}attention_mask"] = attention_mask.long().cpu()
        return out

    def _hook_specs(self, fwd_hooks) -> tuple[list, dict]:
        pairs = [p for level in self._pending for p in level] + list(fwd_hooks)
        expanded = []
        for name, fn in pairs:
            names = [name] if isinstance(name, str) else [n for n in self.hook_dict if name(n)]
            expanded += [(n, fn) for n in names]
        return interventions.specs_of(expanded)

    @contextlib.contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False):
        """Interventions applied to every call inside the `with` block (as `HookedTransformer.hooks`)."""
        if bwd_hooks:
            raise InputError("a remote model takes no backward hooks: use attribution_patch, which runs server-side")
        self._pending.append(list(fwd_hooks))
        try:
            yield self
        finally:
            self._pending.pop()

    def _names_from_filter(self, names_filter) -> list[str]:
        if names_filter is None:
            return [n for n in self.hook_dict if n not in self._inactive]
        if isinstance(names_filter, str):
            names = [names_filter]
        elif callable(names_filter):
            return [n for n in self.hook_dict if n not in self._inactive and names_filter(n)]
        else:
            names = list(names_filter)
        unknown = [n for n in names if n not in self.hook_dict]
        if unknown:
            raise KeyError(
                f"No hook point named {unknown[0]!r} on the server's model (model.hook_dict lists all names)"
            )
        return names

    # -- forward passes -------------------------------------------------------------------------
    def forward(self, *args, fwd_hooks=(), **kwargs):
        """`HookedTransformer.forward` on the server (its signature and results: logits, a loss computed
        here from them, `Output(logits, loss)` or None), with any active interventions."""
        call = self._forward_call(args, kwargs)
        tensors = self._inputs(call["input"], call["prepend_bos"], call["padding_side"], call["attention_mask"])
        hooks, hook_tensors = self._hook_specs(fwd_hooks)
        body = _body(schema.FORWARD, hooks=hooks, return_logits=call["return_type"] is not None)
        _, out = self._post(body, {**tensors, **hook_tensors})
        return _forward_output(out.get("logits"), tensors, call)

    __call__ = forward

    def _forward_call(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """`forward`'s arguments bound to the local signature; those a server cannot take must keep their defaults."""
        bound = _FORWARD_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        call = {k: v for k, v in bound.arguments.items() if k != "self"}
        parameters = _FORWARD_SIGNATURE.parameters
        local_only = [k for k, v in call.items() if k not in _REMOTE_FORWARD and v is not parameters[k].default]
        if local_only:
            raise InputError(
                f"a remote forward cannot take {', '.join(local_only)}: residuals, embeddings and KV caches stay on "
                "the server (run_with_cache returns any activation; patching sweeps run server-side)"
            )
        if call["return_type"] not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, got {call['return_type']!r}")
        return call

    def run_with_hooks(self, *args, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, clear_contexts=False, **kwargs):
        if bwd_hooks:
            raise InputError("a remote model takes no backward hooks")
        return self.forward(*args, fwd_hooks=fwd_hooks, **kwargs)

    def run_with_cache(
        self,
        *model_args,
        return_cache_object: bool = True,
        remove_batch_dim: bool = False,
        names_filter=None,
        device=None,
        incl_bwd: bool = False,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        pos_slice=None,
        fwd_hooks=(),
        **model_kwargs,
    ):
        """`HookedTransformer.run_with_cache` on the server: `(output, ActivationCache)` of the named hook points."""
        if incl_bwd or pos_slice is not None:
            raise InputError("a remote run_with_cache takes neither incl_bwd nor pos_slice: slice the cache it returns")
        self.to(device)
        call = self._forward_call(model_args, model_kwargs)
        names = self._names_from_filter(names_filter)
        tensors = self._inputs(call["input"], call["prepend_bos"], call["padding_side"], call["attention_mask"])
        hooks, hook_tensors = self._hook_specs(fwd_hooks)
        body = _body(schema.FORWARD, hooks=hooks, cache=names, return_logits=call["return_type"] is not None)
        _, out = self._post(body, {**tensors, **hook_tensors})
        output = _forward_output(out.get("logits"), tensors, call)
        cache_dict = {k[6:]: v for k, v in out.items() if k.startswith("cache/")}
        if remove_batch_dim:
            cache_dict = {k: v[0] for k, v in cache_dict.items()}
        if not return_cache_object:
            return output, cache_dict
        return output, activation_cache(
            cache_dict, self, remove_batch_dim, (tensors["tokens"], tensors.get("attention_mask"))
        )

    # -- generation --------------------------------------------------------------------------
    @_GENERATE.surface
    def generate(self, *args, **kwargs):
        """`HookedTransformer.generate` on the server: the same arguments and result. `on_token(event)`
        sees each step's tokens (`{"step": t, "tokens": [...]}`) as they arrive."""
        request = self._generation_request(_GENERATE, args, kwargs)
        _, out = self._stream(request.body, request.tensors, request.on_token)
        return request.finish(out)

    @_STREAM.surface
    def generate_stream(self, *args, **kwargs) -> Generator[torch.Tensor | str | list[str], None, Any]:
        """`HookedTransformer.generate_stream` on the server: the same arguments, the same chunks (at most
        `max_tokens_per_yield` new tokens each, text for text input), then `generate`'s result."""
        request = self._generation_request(_STREAM, args, kwargs)
        if request.per_yield < 1:
            raise ValueError(f"max_tokens_per_yield must be >= 1, got {request.per_yield}")
        events, chunk = self._events(request.body, request.tensors), []
        while True:
            try:
                event = next(events)
            except StopIteration as done:
                answer = done.value
                break
            if "tokens" in event:
                chunk.append(torch.tensor(event["tokens"]))
                if len(chunk) == request.per_yield:
                    yield self._stream_chunk(request.kind, chunk)
                    chunk = []
        if chunk:
            yield self._stream_chunk(request.kind, chunk)
        return request.finish(answer[1])

    def _stream_chunk(self, kind: str, chunk: list[torch.Tensor]):
        tokens = torch.stack(chunk, dim=1)  # [batch, chunk]
        if kind == "tokens":
            return tokens
        texts = [self.tokenizer.decode(row, skip_special_tokens=True) for row in tokens]
        return texts[0] if kind == "str" else texts

    def _generation_request(self, signature: GenerateSignature, args: tuple, kwargs: dict) -> _GenerationRequest:
        """Bind a call to the local signature, gather its `GenerationOptions` and write the request."""
        bound = signature.bind(self, *args, **kwargs)
        options = bound.resolve()
        _check_remote_options(options)
        input = bound.input
        if isinstance(input, (str, list)):
            tokens, mask = self.to_tokens(input, options.prepend_bos, padding_side="left", return_attention_mask=True)
            tensors = {"tokens": tokens, "attention_mask": mask}
            kind = "str" if isinstance(input, str) else "list"
        else:
            tensors, kind = self._inputs(input, attention_mask=bound.attention_mask), "tokens"
        hooks, hook_tensors = self._hook_specs(options.fwd_hooks)
        names = self._names_from_filter(options.names_filter) if options.return_cache else None
        fields = {name: getattr(options, name) for name in schema.GENERATION_FIELDS}
        body = _body(schema.GENERATE, hooks=hooks, names_filter=names, **fields)
        return _GenerationRequest(
            body,
            {**tensors, **hook_tensors},
            kind,
            bound.extra.get("max_tokens_per_yield", 1),
            bound.extra.get("on_token"),
            lambda out: self._finish(out, kind, options),
        )

    def _finish(self, out: dict, kind: str, options: GenerationOptions):
        """`generate`'s result from the server's answer: tokens, text or a `GenerationOutput`, as locally."""
        if options.return_cache or options.output_logits:
            return self._generation_output(out)
        sequences = out["sequences"]
        kind_out = (
            ("str" if kind in ("str", "list") else "tokens") if options.return_type == "input" else options.return_type
        )
        if kind_out == "tokens":
            return sequences
        if kind_out != "str":
            raise InputError(f"a remote generate returns 'input', 'str' or 'tokens', got {options.return_type!r}")
        if self.tokenizer is None:
            raise InputError("return_type='str' needs a tokenizer and the server sent none: use return_type='tokens'")
        texts = [self.tokenizer.decode(row, skip_special_tokens=True) for row in sequences]
        return texts[0] if kind == "str" or (kind != "list" and len(texts) == 1) else texts

    def _generation_output(self, out: dict):
        from hooked.generation.loop import GenerationOutput

        cache = None
        cache_dict = {k[6:]: v for k, v in out.items() if k.startswith("cache/")}
        if cache_dict:
            cache = activation_cache(
                cache_dict, self, False, (out.get("cache_tokens"), out.get("cache_attention_mask"))
            )
        sequences = out["sequences"]
        logits = tuple(out["logits"].unbind(1)) if "logits" in out else None
        text = [self.tokenizer.decode(r, skip_special_tokens=True) for r in sequences] if self.tokenizer else None
        return GenerationOutput(
            sequences=sequences,
            text=text,
            logits=logits,
            cache=cache,
            attention_mask=out["attention_mask"],
            finished=out["finished"],
        )

    # -- server-side sweeps ---------------------------------------------------------------------
    def remote_activation_patch(
        self,
        corrupted_tokens,
        clean_cache,
        patching_metric,
        patch_setter,
        activation_name: str,
        index_axis_names=None,
        index_df=None,
        return_index_df: bool = False,
        batch_size=1,
        verbose: bool = True,
    ):
        """`hooked.analysis.patching.generic_activation_patch` run by the server (it calls this for a remote model)."""
        from hooked.analysis import metrics, patching

        if not isinstance(patching_metric, metrics.Metric):
            raise InputError(
                "a remote patching sweep needs a hooked.analysis.metrics metric (logit_diff, log_prob, "
                "projection): the server never runs a function you wrote"
            )
        if index_df is None and index_axis_names is None:
            raise ValueError("Pass index_axis_names or index_df")
        axis_names = list(index_axis_names or ())  # (used only without index_df, where it is given)
        if getattr(clean_cache, "tokens", None) is None:
            raise InputError("clean_cache must come from this remote model's run_with_cache (it records the tokens)")
        metric, metric_tensors = patching_metric.to_spec()
        body = _body(
            schema.PATCH,
            metric=metric,
            setter=getattr(patch_setter, "__name__", ""),
            activation=activation_name,
            axes=None if index_df is not None else axis_names,
            batch_size=batch_size,
        )
        tensors = {
            "tokens": corrupted_tokens if corrupted_tokens.ndim == 2 else corrupted_tokens[None],
            "clean_tokens": clean_cache.tokens,
            **metric_tensors,
        }
        if clean_cache.attention_mask is not None:
            tensors["clean_attention_mask"] = clean_cache.attention_mask
        rows = None
        if index_df is not None:
            rows = patching._index_rows(index_df)
            tensors["index"] = torch.tensor(rows, dtype=torch.long).reshape(len(rows), -1)
        bar = _progress_bar(verbose, f"patching {activation_name} (remote)")
        try:
            _, out = self._stream(body, tensors, lambda e: bar.update(e.get("progress", 0.0)))
        finally:
            bar.close()
        result = out["result"]
        if not return_index_df:
            return result
        if index_df is None:
            import itertools

            shape = result.shape
            rows = list(itertools.product(*(range(n) for n in shape)))
            index_df = patching._make_index_df(rows, axis_names)
        return result, index_df

    def remote_attribution_patch(
        self,
        clean,
        corrupted,
        metric,
        names_filter,
        method="atp",
        steps=32,
        sum_batch=False,
        attention_mask=None,
        recompute_softmax=False,
        grad_drop=False,
        steps_per_forward=None,
    ) -> dict[str, torch.Tensor]:
        """`hooked.circuits.attribution_patch` run by the server."""
        from hooked.analysis import metrics

        if not isinstance(metric, metrics.Metric):
            raise InputError(
                "a remote attribution_patch needs a hooked.analysis.metrics metric (logit_diff, log_prob, projection)"
            )
        spec, metric_tensors = metric.to_spec()
        body = _body(
            schema.ATTRIBUTION,
            metric=spec,
            names=self._names_from_filter(names_filter),
            method=method,
            steps=steps,
            sum_batch=sum_batch,
            recompute_softmax=recompute_softmax,
            grad_drop=grad_drop,
            steps_per_forward=steps_per_forward,
        )
        tensors = {"clean_tokens": clean, "tokens": corrupted, **metric_tensors}
        if attention_mask is not None:
            tensors["attention_mask"] = attention_mask
        _, out = self._stream(body, tensors, None)
        return {k[5:]: v for k, v in out.items() if k.startswith("attr/")}

    # -- weights for cache analysis ---------------------------------------------------------------
    @property
    def input_device(self) -> torch.device:
        return torch.device("cpu")

    def to(self, device=None, *args, **kwargs):
        if device is not None and torch.device(device).type != "cpu":
            raise InputError("a remote model's local side (fetched weights, caches) stays on the CPU")
        return self

    def _materialized(self, part: str) -> torch.nn.Module:
        """The shadow module `part` with the server's weights (fetched once)."""
        if part not in self._parts:
            if self._shadow is None:
                with torch.device("meta"):
                    self._shadow = HookedTransformer(self.cfg.replace(device="meta"))
            module = self._shadow.get_submodule(part)
            response = self._http.get(f"/v1/weights/{part}")
            self._check(response)
            _, state = wire.decode(response.content, RESPONSE_LIMITS, finite=False)
            module.to_empty(device="cpu")
            module.load_state_dict(state, strict=False)
            self._parts[part] = module
        return self._parts[part]

    def block_weight(self, layer: int, name: str) -> torch.Tensor:
        return _attr(self.blocks[layer], name)

    def part_weight(self, part: str, name: str) -> torch.Tensor:
        return _attr(self._materialized(part), name)

    @property
    def unembed(self):
        return self._materialized("unembed")

    @property
    def ln_final(self):
        return self._materialized("ln_final")

    def __repr__(self) -> str:
        return f"RemoteModel({self._http.base_url}, {self.cfg.model_name}, {self.cfg.n_layers} layers)"


@dataclass
class _GenerationRequest:
    """A remote `generate` call, written: its body and tensors, how chunks and the result are formed."""

    body: dict
    tensors: dict[str, torch.Tensor]
    kind: str  # "str", "list" or "tokens": what the input was
    per_yield: int  # max_tokens_per_yield (generate_stream)
    on_token: Callable[[dict], None] | None  # generate's progress callback
    finish: Callable[[dict], Any]


#: `forward`'s arguments a remote call takes; the others (layers, embeddings, KV caches) must keep their defaults.
_REMOTE_FORWARD = ("input", "return_type", "loss_per_token", "prepend_bos", "padding_side", "attention_mask")
_FORWARD_SIGNATURE = inspect.signature(HookedTransformer.forward)


def _forward_output(logits, tensors: dict[str, torch.Tensor], call: dict):
    """What a local `forward` returns for `call["return_type"]`; the loss is computed here from the logits."""
    return_type = call["return_type"]
    if return_type in (None, "logits"):
        return logits if return_type else None
    loss = lm_cross_entropy_loss(logits, tensors["tokens"], tensors.get("attention_mask"), call["loss_per_token"])
    return loss if return_type == "loss" else Output(logits, loss)


def _check_remote_options(options: GenerationOptions) -> None:
    """Options that are not data cannot travel: refuse them unless left at their defaults."""
    defaults = GenerationOptions()
    for name in schema.LOCAL_ONLY_GENERATION:
        if getattr(options, name) is not getattr(defaults, name) and getattr(options, name) != getattr(defaults, name):
            hint = "pass seed= instead" if name == "generator" else "the server decodes with its own dynamic KV cache"
            raise InputError(f"a remote generate cannot take {name}={getattr(options, name)!r}: {hint}")
    if options.return_type == "embeds":
        raise InputError("a remote generate returns 'input', 'str' or 'tokens' (embeddings stay on the server)")


def _body(op: schema.Op, **values) -> dict:
    """The request body of `op` (a value the server would refuse raises InputError here)."""
    try:
        return op.body(**values)
    except WireError as e:
        raise InputError(f"{op.name}: {e}") from None


def _attr(module, name: str) -> Any:
    for part in name.split("."):
        module = getattr(module, part)
    return module


class _Bar:
    def __init__(self, bar):
        self.bar, self.done = bar, 0.0

    def update(self, fraction: float) -> None:
        if self.bar is not None:
            self.bar.update(max(0.0, fraction - self.done))
            self.done = max(self.done, fraction)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress_bar(verbose: bool, desc: str) -> _Bar:
    if not verbose:
        return _Bar(None)
    from tqdm.auto import tqdm

    return _Bar(tqdm(total=1.0, desc=desc, bar_format="{desc}: {percentage:3.0f}%|{bar}|"))


def _tokenizer_from_files(files: dict[str, str]):
    """The server's tokenizer, rebuilt from its files (plain names only: nothing outside a temp folder)."""
    from hooked.loading.checkpoint import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            if Path(name).name != name or name.startswith("."):
                raise RemoteError(f"the server sent a tokenizer file with a path {name!r}", 502)
            (Path(tmp) / name).write_bytes(base64.b64decode(data))
        return load_tokenizer(tmp)


def connect(url: str, token: str | None = None, timeout: float = 300.0) -> RemoteModel:
    """A `RemoteModel` for the `hooked serve` server at `url` (e.g. "http://127.0.0.1:8000")."""
    return RemoteModel(url, token=token, timeout=timeout)


# the analysis methods a served model computes on its server (hooked.analysis.model_kinds)
patching.COMPUTED_ELSEWHERE.register(RemoteModel, RemoteModel.remote_activation_patch)
attribution.COMPUTED_ELSEWHERE.register(RemoteModel, RemoteModel.remote_attribution_patch)

__all__ = ["RemoteModel", "connect"]
