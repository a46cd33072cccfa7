"""The library's features on a CUDA model give what they give on the CPU (same weights, both float32).

Each tiny family (GPT-2, Llama/GQA, MoE, Gemma-style post-norms) is built on the CPU and copied
to `cuda:0`; results must live on the GPU and equal the CPU's within float32 kernel noise
(GPU and CPU matmuls sum in different orders: 1e-4 absolute and relative). Collected only where
CUDA is available (tests/conftest.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

from hooked import HookedEncoder
from hooked.analysis.patching import get_act_patch_resid_pre
from hooked.circuits import attribution_patch, edge_attribution_patching
from hooked.harvest import ActivationReader, harvest
from hooked.viz import attention_patterns, direct_logit_attribution, logit_lens
from hooked.viz._html import embedded_data
from tests.helpers import logit_diff
from tests.tiny_models import tiny_hooked, token_pair
from tests.unit.models.test_hooked_encoder import config as encoder_config
from tests.unit.models.test_hooked_encoder import make_wordpiece_tokenizer

CUDA = torch.device("cuda:0")
CLOSE = dict(atol=1e-4, rtol=1e-4)


def _close(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    assert got.device == CUDA, msg
    torch.testing.assert_close(got.cpu(), want, **CLOSE, msg=msg)


@pytest.fixture(scope="module", params=["gpt2", "llama_gqa", "moe", "gemma_post_norm"])
def pair(request):
    cpu = tiny_hooked(request.param, device="cpu")
    gpu = copy.deepcopy(cpu).to(CUDA)
    assert gpu.cfg.device in ("cuda", "cuda:0", CUDA)
    return cpu, gpu


def test_forward_with_left_padding_and_loss(pair):
    cpu, gpu = pair
    clean, _ = token_pair()
    mask = torch.ones_like(clean)
    mask[0, :2] = 0  # row 0 left-padded
    _close(gpu(clean.to(CUDA), attention_mask=mask.to(CUDA)), cpu(clean, attention_mask=mask), "logits")
    _close(gpu(clean.to(CUDA), return_type="loss"), cpu(clean, return_type="loss"), "loss")


def test_cache_and_its_analysis(pair):
    cpu, gpu = pair
    clean, _ = token_pair()
    _, want = cpu.run_with_cache(clean)
    _, cache = gpu.run_with_cache(clean.to(CUDA))
    for name in want:
        _close(cache[name], want[name], name)
    _close(cache.accumulated_resid(apply_ln=True), want.accumulated_resid(apply_ln=True), "accumulated_resid")
    _close(cache.decompose_resid(apply_ln=True), want.decompose_resid(apply_ln=True), "decompose_resid")
    _close(cache.stack_head_results(apply_ln=True), want.stack_head_results(apply_ln=True), "stack_head_results")
    full = dict(expand_neurons=False)  # MoE MLPs have no per-neuron results
    _close(cache.get_full_resid_decomposition(**full), want.get_full_resid_decomposition(**full), "decomposition")
    stack = want.decompose_resid(pos_slice=-1)
    got = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=3, incorrect_tokens=7, pos_slice=-1)
    _close(got, want.logit_attrs(stack, tokens=3, incorrect_tokens=7, pos_slice=-1), "logit_attrs")
    _close(cache.logit_lens(), want.logit_lens(), "logit_lens")


def test_backward_hooks(pair):
    cpu, gpu = pair
    clean, _ = token_pair()
    _, want = cpu.run_with_cache(clean, return_type="loss", incl_bwd=True)
    _, cache = gpu.run_with_cache(clean.to(CUDA), return_type="loss", incl_bwd=True)
    for name in want:
        if name.endswith("_grad"):
            _close(cache[name], want[name], name)


def test_generate_greedy_sampled_and_with_cache(pair):
    cpu, gpu = pair
    prompt, _ = token_pair(pos=4)
    kwargs = dict(max_new_tokens=5, verbose=False, stop_at_eos=False)
    greedy = gpu.generate(prompt.to(CUDA), do_sample=False, **kwargs)
    assert greedy.device == CUDA
    torch.testing.assert_close(greedy.cpu(), cpu.generate(prompt, do_sample=False, **kwargs), atol=0, rtol=0)
    torch.manual_seed(0)
    first = gpu.generate(prompt.to(CUDA), do_sample=True, temperature=1.0, **kwargs)
    torch.manual_seed(0)
    assert torch.equal(first, gpu.generate(prompt.to(CUDA), do_sample=True, temperature=1.0, **kwargs))
    out = gpu.generate(prompt.to(CUDA), do_sample=False, return_cache=True, names_filter="blocks.1.hook_resid_post",
                       **kwargs)  # fmt: skip
    resid = out.cache["blocks.1.hook_resid_post"]  # [batch, prompt + steps - 1, d_model]
    assert resid.device == CUDA and resid.shape[:2] == (prompt.shape[0], prompt.shape[1] + 4)
    _, want = cpu.run_with_cache(out.sequences[:, :-1].cpu(), names_filter="blocks.1.hook_resid_post")
    _close(resid, want["blocks.1.hook_resid_post"], "generation cache")


def test_patching_and_circuit_discovery(pair):
    cpu, gpu = pair
    clean, corrupted = token_pair()
    _, clean_cache = cpu.run_with_cache(clean)
    _, gpu_clean_cache = gpu.run_with_cache(clean.to(CUDA))
    want = get_act_patch_resid_pre(cpu, corrupted, clean_cache, logit_diff, verbose=False)
    _close(get_act_patch_resid_pre(gpu, corrupted.to(CUDA), gpu_clean_cache, logit_diff, verbose=False), want, "patch")
    names = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]
    want = attribution_patch(cpu, clean, corrupted, logit_diff, names)
    got = attribution_patch(gpu, clean.to(CUDA), corrupted.to(CUDA), logit_diff, names)
    for name in names:
        _close(got[name], want[name], name)
    want_graph = edge_attribution_patching(cpu, clean, corrupted, logit_diff)
    got_graph = edge_attribution_patching(gpu, clean.to(CUDA), corrupted.to(CUDA), logit_diff)
    torch.testing.assert_close(got_graph.scores.cpu(), want_graph.scores.cpu(), **CLOSE)


def test_weights_processing_and_factored_matrices(pair):
    cpu, gpu = pair
    _close(gpu.OV[1].AB, cpu.OV[1].AB, "OV")
    _close(gpu.QK[0].eigenvalues, cpu.QK[0].eigenvalues, "QK eigenvalues")
    cpu2, gpu2 = copy.deepcopy(cpu), copy.deepcopy(gpu)
    cpu2.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    gpu2.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    assert all(p.device == CUDA for p in gpu2.parameters())
    clean, _ = token_pair()
    _close(gpu2(clean.to(CUDA)).log_softmax(-1), cpu2(clean).log_softmax(-1), "processed")


def test_harvest_from_a_cuda_model(pair, tmp_path):
    _, gpu = pair
    corpus = torch.randint(0, gpu.cfg.d_vocab, (6, 8), generator=torch.Generator().manual_seed(1))
    torch.save(corpus, tmp_path / "tokens.pt")
    harvest(gpu, tmp_path / "tokens.pt", "blocks.0.hook_resid_post", tmp_path / "out", context_length=8,
            batch_size=4, progress=False)  # fmt: skip
    reader = ActivationReader(tmp_path / "out")
    rows, tokens = reader.read_all("blocks.0.hook_resid_post"), reader.read_all("tokens").reshape(-1, 8)
    want = [  # batch by batch as harvest ran (MoE routing sums experts per batch: bitwise only per batch)
        gpu.run_with_cache(chunk.to(CUDA), names_filter="blocks.0.hook_resid_post")[1]["blocks.0.hook_resid_post"]
        for chunk in tokens.split(4)
    ]
    torch.testing.assert_close(rows, torch.cat(want).reshape(rows.shape).cpu(), atol=0, rtol=0)


def test_views_from_a_cuda_cache(pair):
    _, gpu = pair
    clean, _ = token_pair()
    _, cache = gpu.run_with_cache(clean.to(CUDA))
    labels = [str(i) for i in range(clean.shape[1])]
    views = [
        attention_patterns(labels, cache, layer=1),
        logit_lens(gpu, cache, tokens=clean[0].to(CUDA)),
        direct_logit_attribution(gpu, cache, answer=3, wrong=7, per="layer"),
    ]
    kinds = [data["kind"] for view in views for data in embedded_data(view.html)]
    assert kinds == ["attention", "logit_lens", "bars"], kinds


def test_encoder_on_cuda():
    cpu = HookedEncoder(encoder_config(), tokenizer=make_wordpiece_tokenizer())
    gpu = copy.deepcopy(cpu).to(CUDA)
    ids = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(0))
    _close(gpu(ids.to(CUDA)), cpu(ids), "encoder logits")
