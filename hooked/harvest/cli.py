"""`hooked harvest ...`: the command-line front of `hooked.harvest.harvest` (also under torchrun)."""

from __future__ import annotations

import argparse
import os


def add_parser(sub) -> None:
    p = sub.add_parser(
        "harvest",
        help="store hook activations over a corpus as sharded safetensors (resumable, torchrun data-parallel)",
        description="Run a model over a corpus and store the activations of the given hooks in --out. Rerunning "
        "the same command resumes; under torchrun each rank harvests its own shards.",
    )
    p.add_argument("--model", required=True, help="bundled name, local checkpoint directory or .gguf file")
    p.add_argument("--corpus", required=True,
                   help="text file, directory of .txt/.jsonl files, .pt/.safetensors token tensor or saved dataset")
    p.add_argument("--hooks", required=True,
                   help="comma-separated hook names or fnmatch globs, e.g. 'blocks.*.hook_resid_post'")
    p.add_argument("--out", required=True, help="output directory (shards + manifest.json)")
    p.add_argument("--context-length", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens (default: whole corpus)")
    p.add_argument("--dtype", default="float32", help="dtype of the stored activations (float32, float16, bfloat16)")
    p.add_argument("--positions", choices=("all", "skip_bos", "last"), default="all")
    p.add_argument("--tokenization", choices=("concat", "document"), default="concat",
                   help="concat: TransformerLens tokenize_and_concatenate; document: one document per context")
    p.add_argument("--text-field", default="text", help="JSONL / dataset field holding the text")
    p.add_argument("--batches-per-shard", type=int, default=None, help="default: shards of about 256 MB")
    p.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK if CUDA is available, else CPU")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors")


def run(args: argparse.Namespace) -> int:
    import torch

    from hooked import HookedTransformer
    from hooked.harvest import harvest

    device = args.device
    if device is None and torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    model = HookedTransformer.from_pretrained(args.model, device=device)
    harvest(
        model, args.corpus, args.hooks, args.out, context_length=args.context_length, batch_size=args.batch_size,
        max_tokens=args.max_tokens, dtype=args.dtype, positions=args.positions, tokenization=args.tokenization,
        batches_per_shard=args.batches_per_shard, text_field=args.text_field, model_id=args.model,
        progress=not args.no_progress,
    )
    return 0
