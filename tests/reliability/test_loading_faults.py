"""Loading faults: bad arguments, corrupt or inconsistent checkpoints, and what is never executed."""

from __future__ import annotations

import builtins
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hooked import HookedTransformer
from hooked.core.errors import CheckpointError, InputError, UnsafeCheckpointError, WeightShapeError
from tests.tiny_models import make_tokenizer, tiny_gpt2


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A tiny GPT-2 checkpoint directory (config, model.safetensors, tokenizer)."""
    path = tmp_path_factory.mktemp("gpt2") / "ckpt"
    tiny_gpt2().save_pretrained(path, safe_serialization=True)
    make_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pristine_llama(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama") / "ckpt"
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=120, max_position_embeddings=64,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture
def ckpt(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "ckpt"))


def rewrite(directory: Path, **changes) -> Path:
    """Replace tensors of `directory/model.safetensors` (a value of None deletes the tensor)."""
    file = directory / "model.safetensors"
    state = load_file(file)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            del state[key]
        else:
            state[key] = value
    save_file(state, file, metadata={"format": "pt"})
    return file


# -- arguments -------------------------------------------------------------------------------------------
def test_unknown_keyword_names_close_matches(ckpt, model, tok, unchanged):
    with (
        unchanged(model, tok),
        pytest.raises(TypeError, match=r"unexpected keyword argument 'fold_LN'\. Did you mean fold_ln"),
    ):
        HookedTransformer.from_pretrained(str(ckpt), fold_LN=False, tokenizer=tok)


def test_unknown_keyword_without_close_match(ckpt):
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'banana'.*Accepted HuggingFace loading arguments"
    ):
        HookedTransformer.from_pretrained(str(ckpt), banana=1)


def test_torch_dtype_is_honoured(ckpt):
    model = HookedTransformer.from_pretrained_no_processing(str(ckpt), torch_dtype=torch.float64)
    assert model.cfg.dtype == torch.float64 and model.W_E.dtype == torch.float64


def test_dtype_and_torch_dtype_disagree(ckpt):
    with pytest.raises(InputError, match=r"dtype='float16' and torch_dtype=torch.float64 disagree"):
        HookedTransformer.from_pretrained(str(ckpt), dtype="float16", torch_dtype=torch.float64)


def test_trust_remote_code_is_refused(ckpt):
    with pytest.raises(UnsafeCheckpointError, match="trust_remote_code=True is refused"):
        HookedTransformer.from_pretrained(str(ckpt), trust_remote_code=True)


def test_trust_remote_code_false_is_accepted(ckpt):
    assert HookedTransformer.from_pretrained(str(ckpt), trust_remote_code=False).cfg.n_layers == 2


@pytest.mark.parametrize(
    "dtype, match",
    [
        ("flaot32", r"dtype='flaot32' is not a dtype hooked can load into\. Did you mean float32"),
        ("nn", r"dtype='nn'"),
        (torch.int64, r"dtype=torch.int64 is not a floating dtype"),
        (32, r"dtype=32"),
    ],
    ids=["typo", "torch-attribute", "int-dtype", "int"],
)
def test_invalid_dtype(ckpt, dtype, match):
    with pytest.raises(InputError, match=match):
        HookedTransformer.from_pretrained(str(ckpt), dtype=dtype)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a local checkpoint directory"):
        HookedTransformer.from_pretrained(str(tmp_path / "nothing-here"))


def test_config_without_architectures(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    del config["architectures"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="names no `architectures`"):
        HookedTransformer.from_pretrained(str(ckpt))


# -- corrupt safetensors ------------------------------------------------------------------------------------
def _header(file: Path) -> tuple[int, bytes, bytes]:
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return n, raw[8 : 8 + n], raw[8 + n :]


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (lambda n, h, d: b"", r"model.safetensors: not a safetensors file \(0 bytes"),
        (lambda n, h, d: b"\x01\x02", r"\(2 bytes"),
        (lambda n, h, d: (10**6).to_bytes(8, "little") + h + d, r"header length 1000000 is beyond the file size"),
        (lambda n, h, d: (2**62).to_bytes(8, "little") + h + d, r"header length 4611686018427387904 exceeds"),
        (lambda n, h, d: n.to_bytes(8, "little") + b"x" + h[1:] + d, r"header is not valid JSON"),
        (lambda n, h, d: (2).to_bytes(8, "little") + b"[]", r"header is not a JSON object"),
        (lambda n, h, d: n.to_bytes(8, "little") + h + d[: len(d) // 2], r"outside the \d+ data bytes; truncated"),
    ],
    ids=["zero-bytes", "two-bytes", "header-beyond-file", "header-too-large", "bad-json", "not-object", "truncated"],
)
def test_corrupt_safetensors(ckpt, corrupt, match, model, tok, unchanged):
    file = ckpt / "model.safetensors"
    file.write_bytes(corrupt(*_header(file)))
    with unchanged(model, tok), pytest.raises(CheckpointError, match=match):  # nor the caller's tokenizer
        HookedTransformer.from_pretrained(str(ckpt), tokenizer=tok)


def _edit_header(file: Path, edit) -> None:
    n, header, data = _header(file)
    entries = json.loads(header)
    edit(entries)
    new = json.dumps(entries).encode()
    file.write_bytes(len(new).to_bytes(8, "little") + new + data)


def test_header_entry_with_wrong_byte_count(ckpt):
    _edit_header(ckpt / "model.safetensors", lambda e: e["transformer.ln_f.weight"].update(shape=[63]))
    with pytest.raises(CheckpointError, match=r"'transformer.ln_f.weight' of shape \[63\] \(F32\) needs 252 bytes"):
        HookedTransformer.from_pretrained(str(ckpt))


def test_malformed_header_entry(ckpt):
    _edit_header(ckpt / "model.safetensors", lambda e: e["transformer.ln_f.weight"].update(shape="64"))
    with pytest.raises(CheckpointError, match=r"malformed header entry for tensor 'transformer.ln_f.weight'"):
        HookedTransformer.from_pretrained(str(ckpt))


# -- sharded checkpoints: shard names stay inside the directory ------------------------------------------------
def _index(ckpt: Path, shard: str) -> None:
    keys = json.loads(_header(ckpt / "model.safetensors")[1]).keys() - {"__metadata__"}
    index = {"metadata": {}, "weight_map": {k: shard for k in keys}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "shard, match",
    [
        ("../outside.safetensors", r"shard file name '../outside.safetensors' points outside the checkpoint directory"),
        ("/etc/passwd.safetensors", r"'/etc/passwd.safetensors' points outside"),
        ("sub/../../x.safetensors", r"points outside"),
        ("pytorch_model.bin", r"shard 'pytorch_model.bin' is not a .safetensors file"),
    ],
    ids=["dotdot", "absolute", "nested-dotdot", "pickle-shard"],
)
def test_index_shard_names_are_confined(ckpt, shard, match):
    _index(ckpt, shard)
    with pytest.raises(UnsafeCheckpointError, match=match):
        HookedTransformer.from_pretrained(str(ckpt))


def test_invalid_index_file(ckpt):
    (ckpt / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: not a valid safetensors index"):
        HookedTransformer.from_pretrained(str(ckpt))


def test_valid_index_loads(ckpt):
    _index(ckpt, "model.safetensors")
    assert HookedTransformer.from_pretrained(str(ckpt)).cfg.d_model == 64


# -- nothing from a checkpoint is executed or unpickled ---------------------------------------------------------
class _Payload:
    def __reduce__(self):  # unpickling this would create the marker file
        return (Path.write_text, (Path(_Payload.marker), "pwned"))


def test_pickle_only_checkpoint_is_refused_unopened(ckpt, tmp_path, monkeypatch):
    _Payload.marker = str(tmp_path / "marker")
    (ckpt / "model.safetensors").unlink()
    bin_file = ckpt / "pytorch_model.bin"
    bin_file.write_bytes(pickle.dumps(_Payload()))
    opened, real_open = [], builtins.open

    def watching_open(file, *args, **kwargs):
        opened.append(Path(file).name if isinstance(file, (str, Path)) else file)
        return real_open(file, *args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("deserialisation of a pickle was attempted")

    monkeypatch.setattr(builtins, "open", watching_open)
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    with pytest.raises(
        UnsafeCheckpointError, match=r"holds only pickle weights \(pytorch_model.bin\), which hooked never opens"
    ):
        HookedTransformer.from_pretrained(str(ckpt))
    assert "pytorch_model.bin" not in opened
    assert not Path(_Payload.marker).exists()


def test_checkpoint_needing_remote_code_is_refused(ckpt, tmp_path):
    marker = tmp_path / "remote_code_ran"
    config = json.loads((ckpt / "config.json").read_text())
    config.update(model_type="evil_gpt", architectures=["EvilForCausalLM"])
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig\n\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_gpt'\n"
    )
    with pytest.raises(UnsafeCheckpointError, match=r"needs custom Python code .* never runs checkpoint code"):
        HookedTransformer.from_pretrained(str(ckpt))
    assert not marker.exists()


# -- tensors that disagree with the config --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(transformer__ln_f__weight=torch.ones(1)),
         r"ln_final.w has shape \[1\], but the config implies \[64\].*'transformer.ln_f.weight' \(shape \[1\]\) "
         r"in .*model.safetensors"),
        (dict(transformer__wte__weight=torch.zeros(995, 64)),
         r"embed.W_E has shape \[995, 64\], but the config implies \[1000, 64\].*transformer.wte.weight"),
        (dict(transformer__h__0__attn__c_attn__weight=torch.zeros(64, 190)),
         r"converting the tensors last read, .*'transformer.h.0.attn.c_attn.weight' \(shape \[64, 190\]\) "
         r"in .*model.safetensors.* failed"),
        (dict(transformer__h__1__mlp__c_fc__weight=torch.zeros(64, 200)),
         r"blocks.1.mlp.W_in has shape \[64, 200\], but the config implies \[64, 256\].*c_fc.weight"),
        (dict(transformer__wpe__weight=torch.zeros(64, 64)),
         r"pos_embed.W_pos has shape \[64, 64\], but the config implies \[128, 64\]"),
        (dict(transformer__h__0__ln_1__bias=None), r"has no tensor 'h.0.ln_1.bias'"),
    ],
    ids=["norm-[1]", "short-embedding", "fused-c_attn", "mlp-c_fc", "short-W_pos", "missing-tensor"],
)  # fmt: skip
def test_gpt2_tensors_that_disagree_with_the_config(ckpt, changes, match, model, tok, unchanged):
    rewrite(ckpt, **changes)
    with unchanged(model, tok), pytest.raises(CheckpointError, match=match):  # the model is built before the check
        HookedTransformer.from_pretrained(str(ckpt), tokenizer=tok)


@pytest.mark.parametrize(
    "key, shape, match",
    [
        (
            "model.layers.0.self_attn.q_proj.weight",
            (30, 32),
            r"'model.layers.0.self_attn.q_proj.weight' \(shape \[30, 32\]\) in .*model.safetensors",
        ),
        ("model.layers.0.self_attn.k_proj.weight", (32, 32), r"k_proj.weight"),
        (
            "model.layers.0.mlp.up_proj.weight",
            (60, 32),
            r"blocks.0.mlp.W_in has shape \[32, 60\].*\[32, 64\].*up_proj.weight",
        ),
        ("model.norm.weight", (1,), r"ln_final.w has shape \[1\], but the config implies \[32\]"),
    ],
    ids=["q_proj", "k_proj-gqa", "up_proj", "final-norm"],
)
def test_llama_tensors_that_disagree_with_the_config(pristine_llama, tmp_path, key, shape, match):
    ckpt = Path(shutil.copytree(pristine_llama, tmp_path / "ckpt"))
    rewrite(ckpt, **{key.replace(".", "__"): torch.zeros(shape)})
    with pytest.raises(WeightShapeError, match=match):
        HookedTransformer.from_pretrained(str(ckpt))


# -- corrupt GGUF ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, match",
    [
        (b"", r"0 bytes is too short for a GGUF file"),
        (b"PK\x03\x04" + bytes(60), r"not a GGUF file \(starts with b'PK\\x03\\x04'"),
        (b"GGUF" + (3).to_bytes(4, "little") + (10**6).to_bytes(8, "little") + (5).to_bytes(8, "little") + bytes(16),
         r"cannot read this GGUF file .* truncated or corrupt"),
    ],
    ids=["zero-bytes", "bad-magic", "truncated"],
)  # fmt: skip
def test_corrupt_gguf(tmp_path, monkeypatch, content, match):
    monkeypatch.setenv("HOOKED_CACHE_DIR", str(tmp_path / "cache"))
    file = tmp_path / "model.gguf"
    file.write_bytes(content)
    with pytest.raises(CheckpointError, match=match):
        HookedTransformer.from_pretrained(str(file))


def test_invalid_dtype_string_in_a_config():
    from hooked import HookedTransformerConfig

    with pytest.raises(InputError, match=r"dtype='flaot16' .* Did you mean float16"):
        HookedTransformerConfig(d_model=8, d_head=4, n_layers=1, n_ctx=8, act_fn="relu", d_vocab=5, dtype="flaot16")
