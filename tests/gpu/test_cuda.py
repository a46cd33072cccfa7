"""On one CUDA device: parity with HF on the GPU, in float32 and half precision, and a model
placed by accelerate over the GPU, CPU RAM and disk.

Collected only where CUDA is available (tests/conftest.py); `make test-gpu` runs them and
fails if no GPU is visible. Multi-GPU splits are in tests/integration/test_offload.py
(needs >= 2 CUDA devices) and the NCCL pipeline in tests/gpu/test_nccl.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hooked import HookedTransformer
from hooked.analysis.patching import get_act_patch_block_every
from tests.acceptance.test_precision_parity import BITWISE
from tests.helpers import precision_rows
from tests.tiny_models import EVERY_FAMILY, hooked_from, tiny_hf, tokens

CUDA = torch.device("cuda:0")
EXACT = dict(atol=0.0, rtol=0.0)
#: where `make test-gpu` on the device machine collects the measured rows (the figures in docs/scaling-out.md
#: and docs/benchmarks.md)
REPORT = Path(os.environ.get("HOOKED_GPU_REPORT", "")) if os.environ.get("HOOKED_GPU_REPORT") else None


def _report(name: str, rows) -> None:
    if REPORT is not None:
        REPORT.mkdir(parents=True, exist_ok=True)
        (REPORT / f"{name}.json").write_text(json.dumps(rows, indent=1))


@pytest.mark.parametrize("family", list(EVERY_FAMILY))
def test_float32_on_cuda_matches_hf_on_cuda(family):
    """Tiny parity (logits atol 1e-5 vs HF eager, docs/numerics.md#tolerances), both models on the GPU."""
    hf = EVERY_FAMILY[family]().to(CUDA)
    ours = hooked_from(hf, device=CUDA)
    t = (tokens(2, 12) % 90).to(CUDA)
    with torch.no_grad():
        want = hf(t).logits
    got = ours(t)
    assert got.device == CUDA
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", list(EVERY_FAMILY))
def test_half_precision_on_cuda_matches_hf_on_cuda(family):
    """Unprocessed bf16/fp16 vs HF eager in the same dtype on the GPU: bitwise where the CPU is, else the
    half-precision bound of docs/numerics.md."""
    rows = precision_rows(family, [torch.bfloat16, torch.float16], tokens(2, 12) % 90, device=CUDA)
    _report(f"precision_{family}", rows)
    for row in rows:
        if family in BITWISE:
            assert row["bitwise"], row
        assert row["hooked_vs_hf"] <= max(row["hf_eager_vs_sdpa"] or 0.0, 1e-2), row


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt")
    tiny_hf("Llama", num_key_value_heads=2, num_hidden_layers=4).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def plain(checkpoint):
    return HookedTransformer.from_pretrained(str(checkpoint), device="cuda:0")


@pytest.fixture(scope="module")
def placed(checkpoint, tmp_path_factory):
    """Blocks 0-1 and the embedding on the GPU, block 2 in CPU RAM, block 3 and the unembedding on disk."""
    device_map = {"embed": 0, "blocks.0": 0, "blocks.1": 0, "blocks.2": "cpu", "blocks.3": "disk",
                  "ln_final": "disk", "unembed": "disk"}  # fmt: skip
    folder = tmp_path_factory.mktemp("offload")
    return HookedTransformer.from_pretrained(str(checkpoint), device_map=device_map, offload_folder=str(folder))


def test_placement_runs_every_part_on_the_gpu(placed):
    assert placed.hf_device_map["blocks.2"] == "cpu" and placed.hf_device_map["blocks.3"] == "disk"
    assert placed.blocks[0].attn.W_Q.device == CUDA
    assert placed.blocks[3].attn.W_Q.device.type == "meta"  # paged in per forward
    seen = {}
    placed.run_with_hooks(
        tokens().to(CUDA),
        fwd_hooks=[(lambda n: n.endswith("hook_resid_pre"), lambda x, hook: seen.update({hook.name: x.device}))],
    )
    assert set(seen.values()) == {CUDA} and len(seen) == 4  # offloaded parts execute on the main device


def test_placed_model_equals_the_plain_gpu_model(plain, placed):
    t = tokens().to(CUDA)
    torch.testing.assert_close(placed(t), plain(t), **EXACT)
    torch.testing.assert_close(placed(t, return_type="loss"), plain(t, return_type="loss"), **EXACT)
    _, cache = placed.run_with_cache(t, device="cpu")
    _, want = plain.run_with_cache(t, device="cpu")
    assert cache["blocks.3.hook_resid_post"].device.type == "cpu"
    for name in want:
        torch.testing.assert_close(cache[name], want[name], **EXACT, msg=name)
    torch.testing.assert_close(cache.accumulated_resid(), want.accumulated_resid(), **EXACT)
    torch.testing.assert_close(cache.decompose_resid(), want.decompose_resid(), **EXACT)


def test_hooks_that_patch_in_cpu_tensors_reach_each_layers_device(plain, placed):
    """A hook returns a CPU tensor into a GPU layer: it is moved there (TransformerLens #439/#968)."""
    t = tokens().to(CUDA)
    patch = torch.zeros(t.shape[0], t.shape[1], plain.cfg.d_model)  # on the CPU

    def replace(x, hook):
        return patch

    hooks = [("blocks.1.hook_resid_pre", replace), ("blocks.3.hook_resid_pre", replace)]
    torch.testing.assert_close(
        placed.run_with_hooks(t, fwd_hooks=hooks), plain.run_with_hooks(t, fwd_hooks=hooks), **EXACT
    )


def test_generate_and_patching_on_the_placed_model(plain, placed):
    t = tokens(2, 6).to(CUDA)
    kwargs = dict(max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False)
    torch.testing.assert_close(placed.generate(t, **kwargs), plain.generate(t, **kwargs), **EXACT)
    corrupted = tokens(2, 6, seed=1).to(CUDA)
    _, clean_cache = plain.run_with_cache(t)

    def metric(logits):
        return logits[:, -1, 5].sum() - logits[:, -1, 7].sum()

    got = get_act_patch_block_every(placed, corrupted, clean_cache, metric)
    want = get_act_patch_block_every(plain, corrupted, clean_cache, metric)
    torch.testing.assert_close(got, want, **EXACT)


def test_weight_views_of_the_placed_model(plain, placed):
    torch.testing.assert_close(placed.W_Q.to(CUDA), plain.W_Q, **EXACT)
    torch.testing.assert_close(placed.W_U.to(CUDA), plain.W_U, **EXACT)
    torch.testing.assert_close(placed.OV[3].AB.to(CUDA), plain.OV[3].AB, **EXACT)


def test_auto_map_with_a_small_gpu_budget_offloads_and_matches(checkpoint, plain, tmp_path):
    """`device_map="auto"` with `max_memory` of HF's meaning: the GPU fills first, then CPU, then disk."""
    weights = sum(p.numel() * 4 for p in plain.parameters())
    model = HookedTransformer.from_pretrained(
        str(checkpoint), device_map="auto", max_memory={0: weights // 3, "cpu": weights // 4},
        offload_folder=str(tmp_path / "o"),
    )  # fmt: skip
    assert {"cuda:0", "cpu", "disk"} <= set(model.hf_device_map.values()), model.hf_device_map
    t = tokens().to(CUDA)
    torch.testing.assert_close(model(t), plain(t), **EXACT)
