"""Command-line options every benchmark shares: threads and denormal flushing, applied to both sides."""

from __future__ import annotations

import argparse

import torch


def machine_parser(description: str, repeats: int, threads: int | None = None) -> argparse.ArgumentParser:
    """A parser with `--repeats`, `--threads` and `--flush-denormal`; add a benchmark's own options to it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=threads, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--flush-denormal", action="store_true", help="torch.set_flush_denormal(True) for both sides (CPU speed-up)"
    )
    return parser


def apply_machine_options(args: argparse.Namespace) -> None:
    """Set what `machine_parser`'s options ask for; they apply to hooked and HF alike."""
    if args.flush_denormal:
        torch.set_flush_denormal(True)
        print("flush-denormal on (both libraries)")
    if args.threads:
        torch.set_num_threads(args.threads)
