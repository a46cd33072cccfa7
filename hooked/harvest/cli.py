"""`hooked harvest ...`: the command-line front of `hooked.harvest.harvest` (also under torchrun)."""

from __future__ import annotations

import argparse
import os


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to options that have a real default (not None, not a bare flag)."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            text += " (default: %(default)s)"
        return text


def add_parser(sub) -> None:
    p = sub.add_parser(
        "harvest",
        help="store hook activations over a corpus as sharded safetensors (resumable, torchrun data-parallel)",
        description="Run a model over a corpus and store the activations of the given hooks in --out. Rerunning "
        "the same command resumes after a crash, kill or Ctrl-C: complete shards are kept and only the shards not "
        "yet written are redone. Under torchrun each rank harvests its own shards.",
        epilog="Corpus: a .txt file is ONE document (the whole file; with --tokenization concat documents are "
        'joined with EOS anyway); for one document per line, write a .jsonl file with one {"text": ...} per '
        "line. A directory is read in sorted path order, every .txt/.jsonl/.pt/.safetensors file under it. "
        "Read the result with hooked.harvest.ActivationReader(OUT).",
        formatter_class=_DefaultsFormatter,
    )
    p.add_argument("--model", required=True, help="bundled name, local checkpoint directory or .gguf file")
    p.add_argument(
        "--corpus",
        required=True,
        help="a .txt file (one document: the whole file), a .jsonl file (one document per line, field "
        "--text-field), a directory of such files, a .pt/.safetensors token tensor (one document per row) "
        "or a saved `datasets` dataset",
    )
    p.add_argument(
        "--hooks", required=True, help="comma-separated hook names or fnmatch globs, e.g. 'blocks.*.hook_resid_post'"
    )
    p.add_argument("--out", required=True, help="output directory (shards + manifest.json)")
    p.add_argument("--context-length", type=int, required=True, help="tokens per context, BOS included")
    p.add_argument("--batch-size", type=int, default=8, help="contexts per forward pass")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens (None: the whole corpus)")
    p.add_argument("--dtype", default="float32", help="dtype of the stored activations (float32, float16, bfloat16)")
    p.add_argument(
        "--positions",
        choices=("all", "skip_bos", "last"),
        default="all",
        help="which positions of each context to store",
    )
    p.add_argument(
        "--tokenization",
        choices=("concat", "document"),
        default="concat",
        help="concat: TransformerLens tokenize_and_concatenate (documents joined with EOS, BOS at each "
        "context's start); document: each document from BOS, split at the context length, padding not stored",
    )
    p.add_argument("--text-field", default="text", help="JSONL / dataset field holding the text")
    p.add_argument(
        "--batches-per-shard",
        type=int,
        default=None,
        help="None: about 1/20 of the harvest per shard when its size is known (--max-tokens, or a corpus "
        "of at most 4M tokens, tokenized up front), kept between 4 and 64 MB, so a kill loses about 1/20 of "
        "the harvest (plus the batch in flight); 64 MB shards otherwise",
    )
    p.add_argument("--device", default=None, help="None: cuda:LOCAL_RANK if CUDA is available, else CPU")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors")


def run(args: argparse.Namespace) -> int:
    import torch

    from hooked.harvest import harvest
    from hooked.models.hooked_transformer import HookedTransformer

    device = args.device
    if device is None and torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    model = HookedTransformer.from_pretrained(args.model, device=device)
    harvest(
        model,
        args.corpus,
        args.hooks,
        args.out,
        context_length=args.context_length,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        dtype=args.dtype,
        positions=args.positions,
        tokenization=args.tokenization,
        batches_per_shard=args.batches_per_shard,
        text_field=args.text_field,
        model_id=args.model,
        progress=not args.no_progress,
    )
    return 0
