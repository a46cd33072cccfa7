"""Greedy generate on a shared CPU: torch's default thread count against fewer threads (wall clock).

PyTorch starts one intra-op thread per core. When other processes keep those cores busy (a
shared VM, a course server, several notebooks), every op waits for its slowest thread, and a
local `model.generate` slows by an order of magnitude; `torch.set_num_threads(1)` (or the
number of cores that are really free) avoids it. This script loads the bundled SmolLM2-135M,
then times greedy KV-cached generation at each thread count, interleaving the counts
(alternating which goes first) so that the machine's load falls on both alike, and prints
the median milliseconds per token, the ratio to the default thread count, and the load
average before and after. Measured in wall-clock time: the waiting is what the user sees.
`--busy N` starts N busy-looping processes for the duration of the run (stopped at the end),
to reproduce a loaded machine on an idle one.

    python benchmarks/threads.py [--threads-list 1] [--new-tokens 16] [--repeats 5] [--busy 0]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch

PROMPT = "The capital of France is"


def ms_per_token(model, tokens: torch.Tensor, n_new: int, threads: int) -> float:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    model.generate(tokens, max_new_tokens=n_new, do_sample=False, stop_at_eos=False, verbose=False)
    return (time.perf_counter() - start) * 1000 / n_new


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads-list", type=int, nargs="+", default=[1], help="counts to compare to the default")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="busy-looping processes to run alongside")
    args = parser.parse_args()
    from hooked import HookedTransformer

    default = torch.get_num_threads()
    counts = [default, *[n for n in args.threads_list if n != default]]
    model = HookedTransformer.from_pretrained("smollm2-135m")
    tokens = model.to_tokens(PROMPT)
    ms_per_token(model, tokens, 2, default)  # warm-up
    load_before = os.getloadavg()[0]
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    times: dict[int, list[float]] = {n: [] for n in counts}
    try:
        for repeat in range(args.repeats):
            for n in counts if repeat % 2 == 0 else counts[::-1]:
                times[n].append(ms_per_token(model, tokens, args.new_tokens, n))
    finally:
        for process in busy:
            process.terminate()
            process.join()
    load_after = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, torch default {default} threads, {args.busy} busy processes")
    print(f"load average {load_before:.1f} -> {load_after:.1f}; {args.new_tokens} greedy tokens, "
          f"median of {args.repeats} interleaved repeats")  # fmt: skip
    base = statistics.median(times[default])
    for n in counts:
        median = statistics.median(times[n])
        print(f"  {n} thread(s): {median:8.1f} ms/token   default / this: {base / median:5.2f}x")


if __name__ == "__main__":
    main()
