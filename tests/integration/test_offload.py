"""CPU + disk offload with a small `max_memory`: the same results as the model held in memory.

Tiny random checkpoints (Llama with GQA, GPT-2 with learned positions and tied embeddings)
are saved as safetensors and loaded twice: plainly, and with `max_memory` far below the
weights so that blocks and heads are paged in from `offload_folder` per forward.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hooked import HookedTransformer  # noqa: E402
from hooked.analysis.patching import get_act_patch_block_every  # noqa: E402
from hooked.placement.dispatch import read_weight  # noqa: E402
from tests.tiny_models import tiny_gpt2, tiny_hf, tokens

EXACT = dict(atol=0.0, rtol=0.0)  # offload moves the same tensors: nothing is recomputed differently
REPO = Path(__file__).resolve().parents[2]


def _save(hf, path: Path) -> Path:
    hf.save_pretrained(path)
    return path


def _tiny(name: str):
    if name == "llama":
        return tiny_hf("Llama", num_key_value_heads=2)
    if name == "mixtral":  # an MoE reads its router's and experts' weights directly: each part pages all in
        from tests.tiny_models import MOE_CONFIGS, tiny_moe

        prefix, overrides = MOE_CONFIGS["mixtral"]
        return tiny_moe(prefix, **overrides)
    return tiny_gpt2(n_positions=64, vocab_size=96)


@pytest.fixture(scope="module", params=["llama", "gpt2", "mixtral"])
def pair(request, tmp_path_factory):
    """(plain model, offloaded model) from one tiny checkpoint."""
    root = tmp_path_factory.mktemp(request.param)
    hf = _tiny(request.param)
    checkpoint = _save(hf, root / "ckpt")
    plain = HookedTransformer.from_pretrained(str(checkpoint))
    weights = sum(p.numel() * 4 for p in plain.parameters())
    offloaded = HookedTransformer.from_pretrained(
        str(checkpoint), max_memory={"cpu": weights // 4}, offload_folder=str(root / "offload")
    )
    return plain, offloaded, root


def test_small_max_memory_offloads_blocks_to_disk(pair):
    plain, offloaded, root = pair
    devices = offloaded.hf_device_map
    assert devices["embed"] == "cpu" and devices["blocks.0"] == "disk" and devices["unembed"] == "disk"
    assert offloaded.blocks[1].attn.W_Q.device.type == "meta"  # not in memory between forwards
    index = json.loads((root / "offload" / "index.json").read_text())
    assert "blocks.1.attn.W_Q" in index and "embed.W_E" not in index


def test_logits_and_loss_equal_the_plain_model(pair):
    plain, offloaded, _ = pair
    t = tokens()
    torch.testing.assert_close(offloaded(t), plain(t), **EXACT)
    torch.testing.assert_close(offloaded(t, return_type="loss"), plain(t, return_type="loss"), **EXACT)


def test_run_with_cache_and_stacking_methods_equal_the_plain_model(pair):
    plain, offloaded, _ = pair
    t = tokens()
    _, cache = plain.run_with_cache(t)
    _, off_cache = offloaded.run_with_cache(t, device="cpu")
    assert set(off_cache.keys()) == set(cache.keys())
    for name in cache:
        torch.testing.assert_close(off_cache[name], cache[name], **EXACT, msg=name)
    torch.testing.assert_close(off_cache.accumulated_resid(), cache.accumulated_resid(), **EXACT)
    torch.testing.assert_close(off_cache.decompose_resid(), cache.decompose_resid(), **EXACT)
    direction = plain.tokens_to_residual_directions(torch.tensor([3, 5]))
    torch.testing.assert_close(offloaded.tokens_to_residual_directions(torch.tensor([3, 5])), direction, **EXACT)
    stack = cache.decompose_resid(pos_slice=-1)
    torch.testing.assert_close(
        off_cache.logit_attrs(off_cache.decompose_resid(pos_slice=-1), tokens=torch.tensor([3, 5]), pos_slice=-1),
        cache.logit_attrs(stack, tokens=torch.tensor([3, 5]), pos_slice=-1),
        **EXACT,
    )


def test_hooks_that_edit_and_replace_act_on_offloaded_blocks(pair):
    plain, offloaded, _ = pair
    t = tokens()

    def scale_in_place(x, hook):
        x[:, 2:] *= 0.5

    def replace_with_zeros(x, hook):
        return torch.zeros_like(x)

    hooks = [("blocks.1.hook_resid_pre", scale_in_place), ("blocks.0.hook_attn_out", replace_with_zeros)]
    torch.testing.assert_close(
        offloaded.run_with_hooks(t, fwd_hooks=hooks), plain.run_with_hooks(t, fwd_hooks=hooks), **EXACT
    )
    assert not torch.equal(plain.run_with_hooks(t, fwd_hooks=hooks), plain(t))  # the hooks do change the output


def test_generate_greedy_with_kv_cache_equals_the_plain_model(pair):
    plain, offloaded, _ = pair
    prompt = tokens(batch=2, pos=5)
    kwargs = dict(max_new_tokens=6, do_sample=False, verbose=False, use_past_kv_cache=True, stop_at_eos=False)
    torch.testing.assert_close(offloaded.generate(prompt, **kwargs), plain.generate(prompt, **kwargs), **EXACT)


def test_activation_patching_helper_equals_the_plain_model(pair):
    plain, offloaded, _ = pair
    clean, corrupted = tokens(batch=1, pos=6, seed=1), tokens(batch=1, pos=6, seed=2)
    _, clean_cache = plain.run_with_cache(clean)

    def metric(logits):
        return logits[0, -1, 3] - logits[0, -1, 5]

    expected = get_act_patch_block_every(plain, corrupted, clean_cache, metric)
    torch.testing.assert_close(get_act_patch_block_every(offloaded, corrupted, clean_cache, metric), expected, **EXACT)


def test_weight_views_and_factored_matrices_read_offloaded_weights(pair):
    plain, offloaded, _ = pair
    mlp = ("W_in", "W_out") if not plain.cfg.num_experts else ()  # MoE weights are per expert (read below)
    for name in ("W_Q", "W_K", "W_V", "W_O", *mlp, "b_O", "W_E", "W_U"):
        torch.testing.assert_close(getattr(offloaded, name), getattr(plain, name), **EXACT, msg=name)
    if plain.cfg.num_experts:
        for name in ("blocks.1.mlp.W_gate.weight", "blocks.1.mlp.experts.2.W_in.weight"):
            torch.testing.assert_close(read_weight(offloaded, name), plain.get_parameter(name), **EXACT, msg=name)
    torch.testing.assert_close(offloaded.OV.AB, plain.OV.AB, **EXACT)
    torch.testing.assert_close(
        offloaded.accumulated_bias(1, mlp_input=True), plain.accumulated_bias(1, mlp_input=True), **EXACT
    )


def test_each_checkpoint_tensor_is_read_once_by_its_own_part(tmp_path):
    """Streaming reads every tensor exactly once (per part): the whole state dict is never loaded at once."""
    from hooked.loading.checkpoint import SafetensorsStateDict, safetensors_files
    from hooked.loading.registry import get_architecture
    from hooked.loading.streaming import PartView, iter_processed_parts, source_part

    checkpoint = _save(tiny_hf("Llama", num_key_value_heads=2, num_hidden_layers=3), tmp_path / "ckpt")
    state = SafetensorsStateDict(safetensors_files(checkpoint))
    model = HookedTransformer.from_pretrained(
        str(checkpoint), max_memory={"cpu": 1}, offload_folder=str(tmp_path / "o")
    )
    reads, per_part = [], {}
    convert = get_architecture("LlamaForCausalLM").weights
    cfg = HookedTransformer.from_pretrained_no_processing(str(checkpoint)).cfg
    for part, _tensors in iter_processed_parts(convert, state, cfg, [], str, reads):
        per_part[part] = [k for k in reads if k not in sum(per_part.values(), [])]
    assert sorted(reads) == sorted(state) and len(reads) == len(set(reads))
    assert all(source_part(k) == part for part, keys in per_part.items() for k in keys)
    assert isinstance(PartView(state, 0)["model.embed_tokens.weight"], torch.Tensor)
    assert PartView(state, 0)["model.embed_tokens.weight"].device.type == "meta"
    assert set(model.hf_device_map.values()) == {"disk"}


def test_missing_offload_folder_is_a_clear_error(tmp_path):
    checkpoint = _save(tiny_hf("Llama"), tmp_path / "ckpt")
    with pytest.raises(ValueError, match="pass offload_folder=DIR"):
        HookedTransformer.from_pretrained(str(checkpoint), max_memory={"cpu": 1000})


def test_n_devices_beyond_the_visible_gpus_is_a_clear_error(tmp_path):
    checkpoint = _save(tiny_hf("Llama"), tmp_path / "ckpt")
    visible = torch.cuda.device_count()
    n = max(2, visible + 1)
    with pytest.raises(ValueError, match=f"n_devices={n} needs {n} CUDA devices, but {visible} are visible"):
        HookedTransformer.from_pretrained(str(checkpoint), n_devices=n)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs >= 2 CUDA devices")
def test_two_gpus_split_equals_one_device(tmp_path):
    checkpoint = _save(tiny_hf("Llama", num_key_value_heads=2, num_hidden_layers=4), tmp_path / "ckpt")
    plain = HookedTransformer.from_pretrained(str(checkpoint), device="cuda:0")
    split = HookedTransformer.from_pretrained(str(checkpoint), n_devices=2)
    assert [split.hf_device_map[f"blocks.{i}"] for i in range(4)] == ["cuda:0"] * 2 + ["cuda:1"] * 2
    t = tokens().to("cuda:0")
    torch.testing.assert_close(split(t), plain(t), atol=1e-5, rtol=0)
    seen = {}
    split.run_with_hooks(
        t, fwd_hooks=[(lambda n: n.endswith("hook_resid_pre"), lambda x, hook: seen.update({hook.name: x.device}))]
    )
    assert seen["blocks.3.hook_resid_pre"] == torch.device("cuda:1") and seen[
        "blocks.0.hook_resid_pre"
    ] == torch.device("cuda:0")
    kwargs = dict(max_new_tokens=5, do_sample=False, verbose=False, stop_at_eos=False)
    torch.testing.assert_close(split.generate(t, **kwargs), plain.generate(t, **kwargs), atol=0, rtol=0)


@pytest.mark.slow
def test_peak_memory_with_disk_offload_is_at_most_half_of_the_in_memory_load(tmp_path):
    """Random 38M-parameter Llama, `max_memory` a quarter of its float32 weights, each run in a fresh process.

    The bound: offloaded, memory holds the parts that fit the quarter plus one part being converted,
    processed and written (the embeddings and unembedding: 2 x 16 MB, or one 15 MB block); in memory,
    all 152 MB of weights plus loading's transients. The issue's goal is at most 0.5x; we see about 0.2x.
    """
    sys.path.insert(0, str(REPO / "benchmarks"))
    import scale_offload as scale

    shape = dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=2, vocab_size=8000)
    checkpoint = scale.make_checkpoint(tmp_path / "ckpt", 8, shape)
    result = scale.bench_offload(checkpoint, 8, pos=16, shape=shape)  # raises if the logits differ
    assert result["offload_devices"] == ["cpu", "disk"]
    assert result["offload_peak_mib"] <= 0.5 * result["in_memory_peak_mib"], result


@pytest.mark.slow
def test_docs_offload_demo_runs_and_offloads_smollm2():
    """docs/scaling-out.md's offload example (```python offload_demo), on the bundled SmolLM2: its map
    and cache are as described."""
    import re

    page = (REPO / "docs" / "scaling-out.md").read_text()
    (block,) = re.findall(r"```python offload_demo\n(.*?)```", page, flags=re.S)
    namespace: dict = {}
    exec(compile(block, "docs/scaling-out.md offload_demo", "exec"), namespace)
    model, cache = namespace["model"], namespace["cache"]
    devices = [model.hf_device_map[f"blocks.{i}"] for i in range(model.cfg.n_layers)]
    assert model.hf_device_map["embed"] == "cpu" and devices[0] == "cpu" and devices[-1] == "disk"
    assert devices == sorted(devices)  # contiguous: cpu blocks first, then disk
    plain = HookedTransformer.from_pretrained("smollm2-135m")
    with torch.no_grad():
        expected, plain_cache = plain.run_with_cache("The Eiffel Tower is in")
    torch.testing.assert_close(namespace["logits"], expected, **EXACT)
    torch.testing.assert_close(cache["blocks.29.hook_resid_post"], plain_cache["blocks.29.hook_resid_post"], **EXACT)


def test_an_in_memory_hf_model_offloads_without_being_written(tmp_path):
    hf = tiny_hf("Llama", num_key_value_heads=2)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    plain = HookedTransformer.from_pretrained("llama", hf_model=hf)
    offloaded = HookedTransformer.from_pretrained(
        "llama", hf_model=hf, max_memory={"cpu": 1}, offload_folder=str(tmp_path)
    )
    assert set(offloaded.hf_device_map.values()) == {"disk"}
    torch.testing.assert_close(offloaded(tokens()), plain(tokens()), **EXACT)
    assert all(torch.equal(v, before[k]) for k, v in hf.state_dict().items())  # the user's model is untouched
