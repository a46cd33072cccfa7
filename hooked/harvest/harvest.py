"""`harvest`: run a hooked model over a corpus and store chosen hook activations as sharded safetensors.

Batches come in a fixed order; consecutive batches form shards (shard k = batches
[k * batches_per_shard, (k + 1) * batches_per_shard)), so a shard's contents depend only on the
arguments. A resumed run skips shards the manifest lists; under torchrun rank r takes shards with
k % world_size == r. The forward stops after the last needed block and caches only the requested
hooks; while one batch runs, the previous batch's activations are copied to the host and a
background thread writes finished shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hooked.core.errors import InputError
from hooked.core.validation import to_dtype
from hooked.harvest import distributed, writer
from hooked.harvest.corpus import Batch, Corpus, iter_batches, iter_contexts, plan, special_ids
from hooked.harvest.hooks import resolve_hooks, stop_layer

logger = logging.getLogger(__name__)
POSITIONS = ("all", "skip_bos", "last")
SHARD_BYTES = 64 << 20  # the largest default shard (when the harvest's size is unknown)
MIN_SHARD_BYTES = 4 << 20  # the smallest default shard (fewer, larger files for tiny harvests)
SHARDS_PER_HARVEST = 20  # default shards per harvest of known size: a kill loses ~1/20 of it
PLAN_LIMIT_TOKENS = 4_000_000  # corpora up to this size are tokenized up front, to know the total


def harvest(
    model,
    corpus: Any,
    hooks: str | list[str],
    out: str | Path,
    context_length: int,
    batch_size: int = 8,
    max_tokens: int | None = None,
    dtype: str | torch.dtype = "float32",
    positions: str = "all",
    tokenization: str = "concat",
    batches_per_shard: int | None = None,
    text_field: str = "text",
    model_id: str | None = None,
    progress: bool = True,
) -> dict:
    """Harvest `hooks` over `corpus` into `out`; returns the manifest. Rerunning with the same arguments resumes.

    Only the blocks up to the last harvested hook run, and only those hooks are cached. Shards are
    written to a temporary file and renamed; the manifest lists only complete ones. Under `torchrun`,
    rank r writes the shards k with k % world_size == r.

    Args:
        model: the `HookedTransformer` to run.
        corpus: a text file, a directory of .txt/.jsonl (field `text_field`) files, a .pt/.safetensors
            token tensor, a saved `datasets` directory, a `datasets` dataset or a `Corpus`.
        hooks: exact hook names or `fnmatch` globs (`"blocks.*.hook_resid_post"`), one or a list.
        out: the output directory (an existing one must hold the same harvest, which then resumes).
        context_length: tokens per context.
        batch_size: contexts per forward.
        max_tokens: stop after this many tokens (None: the whole corpus).
        dtype: the stored dtype ("float16", "bfloat16", "float32").
        positions: "all", "skip_bos" or "last" (one row per context).
        tokenization: "concat" (TransformerLens's `tokenize_and_concatenate`: documents joined with
            EOS, no padding) or "document" (each document its own contexts; padding never stored).
        batches_per_shard: batches per shard file (default: about 256 MiB per shard).
        text_field: the JSONL / dataset field holding the text.
        model_id: the model name written to the manifest (default: the config's).
        progress: show a tqdm bar.

    Returns:
        The manifest (also `out/manifest.json`). Stored per hook: `[contexts, pos, ...]` (concat
        tokenization with positions "all"/"skip_bos") or `[rows, ...]` (padding excluded / "last").
    """
    hooks = resolve_hooks(model, hooks)
    dtype = to_dtype(dtype)
    _check_args(model, context_length, batch_size, max_tokens, positions, tokenization)
    corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus, text_field)
    out = Path(out)
    rank, world = distributed.setup()
    stop = stop_layer(hooks, model.cfg.n_layers)
    shapes = _feature_shapes(model, hooks, stop)
    if rank == 0:
        writer.check_writable(out)
    distributed.barrier()
    writer.check_writable(out)
    manifests = writer.read_manifests(out)
    planned = plan(iter_contexts(corpus, model.tokenizer, context_length, tokenization), max_tokens, PLAN_LIMIT_TOKENS)
    if batches_per_shard is None:
        n_batches = planned.n_batches(batch_size) or _estimate_batches(max_tokens, context_length, batch_size)
        batches_per_shard = _resumed_batches_per_shard(manifests) or default_batches_per_shard(
            shapes, dtype, context_length, batch_size, n_batches
        )
    args = dict(
        hooks=hooks,
        context_length=context_length,
        batch_size=batch_size,
        max_tokens=max_tokens,
        dtype=str(dtype).removeprefix("torch."),
        positions=positions,
        tokenization=tokenization,
        batches_per_shard=batches_per_shard,
        text_field=text_field,
    )
    identity = dict(
        model=model.cfg.model_name, config_sha256=config_hash(model.cfg), corpus_fingerprint=corpus.fingerprint, **args
    )
    writer.check_same_identity(out, manifests, identity)
    layout = "contexts" if tokenization == "concat" and positions != "last" else "rows"
    job = _Job(model, hooks, stop, dtype, args, layout, writer.completed_shards(manifests), rank, world)
    shard_writer = writer.ShardWriter(out, _new_manifest(job, identity, shapes, corpus, model_id), rank, world)
    total = planned.n_tokens if planned.n_tokens is not None else max_tokens
    start = time.perf_counter()
    stats = _run_keeping_shards(job, planned.contexts, corpus, shard_writer, progress, total, out)
    manifest = shard_writer.close(complete=True)
    elapsed = time.perf_counter() - start
    if world > 1:
        manifest = distributed.merge_manifests(out, rank, world)
    _summary(out, manifest, stats, elapsed)
    return manifest


@dataclass(frozen=True)
class _Job:
    """What one rank's batch loop needs, fixed for the whole harvest."""

    model: Any
    hooks: list[str]
    stop: int | None  # the forward stops after this block (None: every block)
    dtype: torch.dtype  # the stored dtype
    args: dict  # the harvest's arguments, as in the manifest's identity
    layout: str  # "contexts" ([contexts, pos, ...]) or "rows" ([rows, ...])
    done: dict  # shard index -> its manifest entry, for shards a previous run completed
    rank: int
    world: int


def _new_manifest(job: _Job, identity: dict, shapes: dict, corpus: Corpus, model_id: str | None) -> dict:
    """This rank's manifest before its first new shard: the completed shards it owns (with world 1: every one)."""
    cfg = job.model.cfg
    return dict(
        format=writer.FORMAT,
        identity=identity,
        model=dict(name=cfg.model_name, id=model_id, revision=getattr(cfg, "revision", None)),
        layout=job.layout,
        stop_at_layer=job.stop,
        hooks={h: dict(row_shape=list(s)) for h, s in shapes.items()},
        corpus=str(corpus.source),
        world_size=job.world,
        rank=job.rank,
        shards=[s for s in job.done.values() if s["index"] % job.world == job.rank],
        complete=False,
    )


def _run_keeping_shards(job: _Job, contexts, corpus, shard_writer, progress: bool, total: int | None, out: Path):
    """`_run`, and on any failure the shards already written kept in the manifest (Ctrl-C: say how to resume)."""
    try:
        return _run(job, contexts, corpus, shard_writer, progress, total)
    except KeyboardInterrupt:
        kept = shard_writer.abort()
        raise writer.HarvestInterrupted(_interrupted_message(out, kept, total)) from None
    except BaseException:
        shard_writer.abort()
        raise


def default_batches_per_shard(
    shapes: dict, dtype: torch.dtype, context_length: int, batch_size: int, n_batches: int | None
) -> int:
    """About 1/SHARDS_PER_HARVEST of the harvest per shard when its size is known, kept between MIN_SHARD_BYTES and
    SHARD_BYTES: a killed run redoes only the shard in progress, so a small harvest loses a few percent at most."""
    row_bytes = sum(torch.Size(s).numel() for s in shapes.values()) * dtype.itemsize  # one token, every hook
    batch_bytes = max(1, row_bytes * context_length * batch_size)
    most = max(1, SHARD_BYTES // batch_bytes)
    if n_batches is None:
        return most
    least = max(1, MIN_SHARD_BYTES // batch_bytes)
    return min(most, max(least, -(-n_batches // SHARDS_PER_HARVEST)))


def _estimate_batches(max_tokens: int | None, context_length: int, batch_size: int) -> int | None:
    return None if max_tokens is None else -(-max_tokens // (context_length * batch_size))


def _resumed_batches_per_shard(manifests: list[dict]) -> int | None:
    """A resumed harvest keeps the shard size it started with (the default may have changed since)."""
    return manifests[0]["identity"].get("batches_per_shard") if manifests else None


def _interrupted_message(out: Path, kept: list[dict], total: int | None) -> str:
    tokens = sum(s["tokens"] for s in kept)
    of = f" of {total}" if total else ""
    return (
        f"{len(kept)} complete shards ({tokens}{of} tokens) are kept in {out}; rerun the same command to resume "
        f"from there"
    )


def _check_args(model, context_length, batch_size, max_tokens, positions, tokenization) -> None:
    n_ctx = model.cfg.n_ctx
    if not isinstance(context_length, int) or not 2 <= context_length <= n_ctx:
        raise InputError(f"context_length={context_length!r} must be an int in [2, {n_ctx}] (the model's n_ctx).")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r} must be a positive int.")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < context_length):
        raise InputError(f"max_tokens={max_tokens!r} must be None or at least context_length ({context_length}).")
    if positions not in POSITIONS:
        raise InputError(f"positions={positions!r}: choose one of {', '.join(POSITIONS)}.")
    if tokenization not in ("concat", "document"):
        raise InputError(f"tokenization={tokenization!r}: choose 'concat' or 'document'.")


def config_hash(cfg) -> str:
    """sha256 of the model config, without where it runs (device, n_devices)."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in ("device", "n_devices")}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def _feature_shapes(model, hooks: list[str], stop: int | None) -> dict[str, tuple[int, ...]]:
    """Each hook's per-token shape, from a 2-token probe forward (also checks that every hook fires)."""
    probe = torch.zeros((1, 2), dtype=torch.long, device=model.cfg.device)
    with torch.inference_mode():
        _, cache = model.run_with_cache(probe, names_filter=hooks, stop_at_layer=stop, return_type=None)
    silent = [h for h in hooks if h not in cache]
    if silent:
        raise InputError(f"Hooks {silent} did not fire in a forward pass of this model; harvest other hooks.")
    return {h: tuple(cache[h].shape[2:]) for h in hooks}


def _forward(model, batch: Batch, hooks, stop, dtype, layout: str, positions: str, first_context: int) -> dict:
    """One batch's kept rows, converted to `dtype` and copied (asynchronously on GPU) to host memory."""
    device = model.cfg.device
    tokens = batch.tokens.to(device, non_blocking=True)
    mask = None if bool(batch.mask.all()) else batch.mask.to(device).long()
    with torch.inference_mode():
        _, cache = model.run_with_cache(
            tokens, names_filter=hooks, stop_at_layer=stop, attention_mask=mask, return_type=None
        )
    b, p = batch.tokens.shape
    meta = dict(
        tokens=batch.tokens,
        doc_index=batch.doc_index,
        pos_index=torch.arange(p).expand(b, p),
        context_index=torch.arange(first_context, first_context + b).unsqueeze(1).expand(b, p),
    )
    start = 1 if positions == "skip_bos" else 0
    if layout == "contexts":  # [contexts, pos, ...]
        acts = {h: cache[h][:, start:] for h in hooks}
        meta = {k: v[:, start:] for k, v in meta.items()}
        meta["context_index"] = meta["context_index"][:, 0]
    else:  # [rows, ...]: padding (and with "last" every position but the last real one) dropped
        keep = batch.mask.clone()
        keep[:, :start] = False
        if positions == "last":
            keep = torch.zeros_like(keep)
            keep[torch.arange(b), batch.mask.sum(1) - 1] = True
        keep_dev = keep.to(device)
        acts = {h: cache[h][keep_dev] for h in hooks}
        meta = {k: v[keep] for k, v in meta.items()}
    acts = {h: a.to(dtype).to("cpu", non_blocking=True) for h, a in acts.items()}
    return dict(acts, **{k: v.contiguous() for k, v in meta.items()})


def _run(job: _Job, contexts, corpus, shard_writer, progress: bool, total: int | None) -> dict:
    """The batch loop with its progress bar; refuses a corpus too short for one context."""
    from tqdm.auto import tqdm

    _, _, pad = special_ids(job.model.tokenizer)
    batches = iter_batches(contexts, job.args["batch_size"], job.args["max_tokens"], pad)
    bar = tqdm(
        total=-(-total // job.world) if total else None,
        initial=sum(s["tokens"] for s in shard_writer.manifest["shards"]),
        unit="tok",
        unit_scale=True,
        disable=not progress,
        desc="harvest" if job.world == 1 else f"harvest rank {job.rank}",
    )
    stats = dict(tokens=0, rows=0, shards=0, skipped=0)
    try:
        n_contexts = _forward_batches(job, batches, _ShardParts(shard_writer, job, bar, stats), stats)
    finally:
        bar.close()
    if n_contexts == 0:
        raise InputError(
            f"The corpus {corpus.source!s} gives no context of {job.args['context_length']} tokens: it is "
            f"empty or shorter than one context. Use a larger corpus or a shorter --context-length."
        )
    return stats


def _forward_batches(job: _Job, batches, shards: _ShardParts, stats: dict) -> int:
    """Forward batch i while batch i-1 reaches the host (skipping other ranks' and done shards); returns contexts."""
    bps = job.args["batches_per_shard"]
    pending = None
    n_contexts = 0
    for i, batch in enumerate(batches):
        shard, first = i // bps, n_contexts
        n_contexts += batch.tokens.shape[0]
        if shard % job.world != job.rank or shard in job.done:
            stats["skipped"] += 1
            continue
        result = _forward(job.model, batch, job.hooks, job.stop, job.dtype, job.layout, job.args["positions"], first)
        result["n_tokens"] = batch.n_tokens
        event = torch.cuda.Event() if torch.device(job.model.cfg.device).type == "cuda" else None
        if event is not None:
            event.record()
        if pending is not None:
            shards.add(*pending)
        pending = (shard, result, event)
    if pending is not None:
        shards.add(*pending)
    shards.flush()
    return n_contexts


class _ShardParts:
    """Gathers consecutive batches' results into shards and hands each whole shard to the writer at once."""

    def __init__(self, shard_writer, job: _Job, bar, stats: dict) -> None:
        self.shard_writer, self.layout, self.bar, self.stats = shard_writer, job.layout, bar, stats
        self.batches_per_shard = job.args["batches_per_shard"]
        self.parts: list[dict] = []
        self.shard: int | None = None  # the shard the parts belong to

    def add(self, shard: int, result: dict, event) -> None:
        """One batch's result, once its copy to the host (`event`) is done."""
        if event is not None:
            event.synchronize()
        if self.parts and shard != self.shard:
            self.flush()
        self.parts.append(result)
        self.shard = shard
        self.bar.update(result["n_tokens"])
        self.stats["tokens"] += result["n_tokens"]
        if len(self.parts) == self.batches_per_shard:  # whole: to the writer now, so that a kill loses little
            self.flush()

    def flush(self) -> None:
        """Submit the parts gathered so far as their shard (nothing when there are none)."""
        if not self.parts:
            return
        parts = self.parts
        tensors = {k: torch.cat([p[k] for p in parts]) for k in parts[0] if k != "n_tokens"}
        record = dict(
            contexts=int(tensors["context_index"].unique().numel()),
            rows=_n_rows(tensors, self.layout),
            tokens=sum(p["n_tokens"] for p in parts),
        )
        self.shard_writer.submit(self.shard, tensors, record)
        self.stats["shards"] += 1
        self.stats["rows"] += record["rows"]
        self.parts = []


def _n_rows(tensors: dict, layout: str) -> int:
    shape = tensors["tokens"].shape
    return shape[0] * shape[1] if layout == "contexts" else shape[0]


def _summary(out: Path, manifest: dict, stats: dict, elapsed: float) -> None:
    rate = stats["tokens"] / elapsed if elapsed > 0 else 0.0
    logger.info(
        "harvest: %d tokens (%d rows, %d new shards, %d batches skipped as done or another rank's) in %.1f s "
        "(%.0f tokens/s); %d shards in %s",
        stats["tokens"],
        stats["rows"],
        stats["shards"],
        stats["skipped"],
        elapsed,
        rate,
        len(manifest["shards"]),
        out / writer.MANIFEST,
    )
