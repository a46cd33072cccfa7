"""One rank of tests/gpu/test_nccl.py: the pipeline on this machine's process group vs the plain model.

`python -m torch.distributed.run --nproc-per-node N nccl_worker.py CHECKPOINT OUT_DIR`; each rank writes
`OUT_DIR/rank<r>.json` with the backend, its device and the largest differences it measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hooked import HookedTransformer


def main(checkpoint: str, out: Path) -> None:
    model = HookedTransformer.from_pretrained(checkpoint, pipeline=True, timeout_s=60)
    plain = HookedTransformer.from_pretrained(checkpoint, device=model.device)
    t = torch.randint(3, model.cfg.d_vocab - 3, (4, 10), generator=torch.Generator().manual_seed(0))
    t = t.to(model.device)
    diffs = {}
    diffs["logits"] = (model(t) - plain(t)).abs().max().item()
    micro = model(t, micro_batches=2)
    diffs["logits_micro_batched"] = (micro - plain(t)).abs().max().item()
    _, cache = model.run_with_cache(t)
    _, want = plain.run_with_cache(t)
    diffs["cache"] = max((cache[name].to(want[name].device) - want[name]).abs().max().item() for name in want)
    diffs["accumulated_resid"] = (cache.accumulated_resid() - want.accumulated_resid()).abs().max().item()
    kwargs = dict(max_new_tokens=5, do_sample=False, verbose=False, stop_at_eos=False)
    same_tokens = torch.equal(model.generate(t, **kwargs).cpu(), plain.generate(t, **kwargs).cpu())
    report = dict(
        backend=dist.get_backend(), world=dist.get_world_size(), device=str(model.device),
        logits_device=str(model(t).device), diffs=diffs, same_greedy_tokens=same_tokens,
    )  # fmt: skip
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
