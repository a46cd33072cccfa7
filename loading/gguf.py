"""Convert a GGUF file into an ordinary HuggingFace checkpoint directory.

A GGUF file (llama.cpp's format) bundles a config, a tokenizer and (usually quantised)
weights.  :func:`gguf_to_hf_checkpoint` dequantises it once with transformers' own
GGUF reader and writes a plain float32 checkpoint::

    out_dir/
        config.json             HF config (``architectures`` set, dtype float32)
        generation_config.json
        model.safetensors       float32 state dict (no duplicate of tied embeddings)
        tokenizer.json, tokenizer_config.json, ...
        hooked_conversion.json  completion marker, written last

so that everything downstream (``from_pretrained(out_dir)``, our own loaders) only ever
sees a normal checkpoint.  Transformers refuses ``save_pretrained`` on a model loaded
from GGUF, which is why the files are written here by hand.

The conversion is built in a temporary sibling directory and renamed into place at the
end, so an interrupted conversion never leaves a half-written ``out_dir``.

``transformers`` (and ``torch``) are imported lazily, inside the functions, so that
importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "CONVERSION_MARKER",
    "CONVERSION_FORMAT_VERSION",
    "find_gguf_file",
    "gguf_to_hf_checkpoint",
    "read_conversion_marker",
]

#: File written last into a finished checkpoint directory.
CONVERSION_MARKER = "hooked_conversion.json"
#: Bump when the layout/contents of converted checkpoints change; old caches are redone.
CONVERSION_FORMAT_VERSION = 1

# Strings whose tokenisation must survive the save/reload of the tokenizer.
_TOKENIZER_PROBES = (
    "The capital of France is",
    " Paris",
    "Hello, world!  Multiple   spaces\tand\ttabs\nnew lines\n\n",
    "naïve café – “quotes” — 日本語 🤗 1234567890",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
)


def find_gguf_file(path: str | os.PathLike[str]) -> Path:
    """Return the GGUF file named by ``path``.

    ``path`` is either a ``.gguf`` file or a directory that contains exactly one
    ``.gguf`` file (directly, not in subdirectories).
    """
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"Not a GGUF file (expected a '.gguf' suffix): {p}")
        return p
    if p.is_dir():
        found = sorted(c for c in p.iterdir() if c.suffix.lower() == ".gguf" and c.is_file())
        if not found:
            raise FileNotFoundError(f"No '.gguf' file in directory {p}")
        if len(found) > 1:
            names = ", ".join(c.name for c in found)
            raise ValueError(
                f"Directory {p} contains {len(found)} '.gguf' files ({names}); pass the path of the one you want."
            )
        return found[0]
    raise FileNotFoundError(f"No such GGUF file or directory: {p}")


def read_conversion_marker(checkpoint_dir: str | os.PathLike[str]) -> dict | None:
    """The completion marker of a converted checkpoint, or ``None`` if absent/unreadable."""
    try:
        with open(Path(checkpoint_dir) / CONVERSION_MARKER, encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def gguf_to_hf_checkpoint(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    progress: bool | None = None,
) -> Path:
    """Dequantise ``gguf_path`` into a float32 HuggingFace checkpoint at ``out_dir``.

    ``gguf_path`` may also be a directory holding exactly one ``.gguf`` file.  An existing
    ``out_dir`` is replaced, but only once the new checkpoint is complete.  Returns
    ``out_dir``. Progress bars (ours and transformers' per-tensor one) show with
    ``progress=True``, or by default when this module logs at DEBUG level; the steps are
    logged at DEBUG.
    """
    from tqdm.auto import tqdm

    progress = logger.isEnabledFor(logging.DEBUG) if progress is None else progress

    gguf_file = find_gguf_file(gguf_path).resolve()
    out_dir = Path(out_dir).expanduser().absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    logger.debug("Converting %s -> %s", gguf_file, out_dir)

    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    steps = tqdm(total=5, desc=f"GGUF -> HF ({gguf_file.name})", unit="step", disable=not progress)
    with _one_reader_per_file():
        try:
            steps.set_postfix_str("config")
            check_gguf_header(gguf_file)
            with _corrupt_file_errors(gguf_file):
                config, model_cls = _read_config(gguf_file)
            steps.update()

            steps.set_postfix_str("dequantise weights")
            with _corrupt_file_errors(gguf_file), _transformers_progress(progress):
                state_dict = _read_state_dict(gguf_file, config, model_cls)
            steps.update()

            steps.set_postfix_str("write model.safetensors")
            _write_model(tmp_dir, config, state_dict)
            del state_dict
            steps.update()

            steps.set_postfix_str("tokenizer")
            tokenizer_info = _write_tokenizer(
                gguf_file, tmp_dir, max_length=getattr(config, "max_position_embeddings", None)
            )
            steps.update()

            steps.set_postfix_str("finalise")
            marker = {
                "format_version": CONVERSION_FORMAT_VERSION,
                "source_gguf": gguf_file.name,
                "source_size_bytes": gguf_file.stat().st_size,
                "architectures": list(config.architectures or ()),  # (_read_config sets them)
                "dtype": "float32",
                "tokenizer": tokenizer_info,
                "transformers_version": _transformers_version(),
                "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "conversion_seconds": round(time.perf_counter() - start, 2),
            }
            # The marker is the last file written: a directory without it is not a checkpoint.
            _write_json(tmp_dir / CONVERSION_MARKER, marker)
            _replace_dir(tmp_dir, out_dir)
            steps.update()
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
        finally:
            steps.close()

    logger.debug("Wrote %s in %.1f s", out_dir, time.perf_counter() - start)
    return out_dir


_SHARED_READER_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_reader_per_file():
    """Parse each GGUF file once while converting it.

    transformers reads the file three times (the config, the tokenizer, the weights), each with a new
    `gguf.GGUFReader`, and parsing the metadata of a large vocabulary (Gemma 3's 262,144 tokens) takes seconds
    each time. The readers only read, so the three share one. The swap of `gguf.GGUFReader` is process-wide, so
    conversions in one process take turns (a second thread would otherwise restore the wrong function).
    """
    import gguf

    readers: dict[str, gguf.GGUFReader] = {}

    def shared(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> gguf.GGUFReader:
        if args or kwargs:  # another mode than reading: not shared
            return make_reader(path, *args, **kwargs)
        key = os.fspath(path)
        if key not in readers:
            readers[key] = make_reader(path)
        return readers[key]

    with _SHARED_READER_LOCK:  # read the original only once no other conversion has it swapped
        make_reader = gguf.GGUFReader
        gguf.GGUFReader = shared  # transformers imports the name from `gguf` at each call
        try:
            yield
        finally:
            gguf.GGUFReader = make_reader


@contextlib.contextmanager
def _transformers_progress(show: bool):
    """transformers' GGUF reader draws a per-tensor progress bar with no switch: hide it unless `show`."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as reader

    bar = getattr(reader, "tqdm", None)
    if show or bar is None:
        yield
        return
    # (setattr: the module re-exports tqdm without declaring it, so the type checker calls it private)
    setattr(reader, "tqdm", functools.partial(bar, disable=True))  # noqa: B010
    try:
        yield
    finally:
        setattr(reader, "tqdm", bar)  # noqa: B010


# --------------------------------------------------------------------------- validation

#: A GGUF file starts with this magic, a uint32 version, a uint64 tensor count and a uint64 metadata count.
GGUF_MAGIC = b"GGUF"
GGUF_MIN_BYTES = 24


def check_gguf_header(gguf_file: Path) -> None:
    """Raise `CheckpointError` unless the file starts like a GGUF file (magic and fixed header)."""
    from hooked.core.errors import CheckpointError

    size = gguf_file.stat().st_size
    if size < GGUF_MIN_BYTES:
        raise CheckpointError(f"{gguf_file}: {size} bytes is too short for a GGUF file; truncated?")
    with open(gguf_file, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{gguf_file}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")


@contextlib.contextmanager
def _corrupt_file_errors(gguf_file: Path):
    """Reader failures on a malformed file become one `CheckpointError` naming the file."""
    from hooked.core.errors import CheckpointError, HookedError

    try:
        yield
    except HookedError:
        raise
    except (ValueError, OSError, KeyError, IndexError, TypeError, EOFError, struct.error, MemoryError) as e:
        raise CheckpointError(
            f"{gguf_file}: cannot read this GGUF file ({type(e).__name__}: {e}); it may be truncated or corrupt, "
            "so download it again"
        ) from e


# --------------------------------------------------------------------------- steps


def _read_config(gguf_file: Path):
    """HF config parsed from the GGUF metadata, plus the causal-LM class it describes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    logger.debug("Reading config from GGUF metadata")
    config = AutoConfig.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, local_files_only=True, trust_remote_code=False
    )
    model_cls = AutoModelForCausalLM._model_mapping[type(config)]
    config.architectures = [model_cls.__name__]  # pyright: ignore[reportAttributeAccessIssue] - transformers types its lazy mapping's values loosely; they are classes
    config.dtype = torch.float32
    return config, model_cls


def _read_state_dict(gguf_file: Path, config, model_cls) -> dict:
    """Dequantised float32 tensors, keyed and checked against ``model_cls(config)``.

    Uses transformers' GGUF reader (``load_gguf_checkpoint``), which maps GGUF tensor
    names to HF names and undoes llama.cpp's layout changes (e.g. the Q/K row
    permutation).  A weightless skeleton of the model supplies the name mapping and the
    expected names/shapes; tied parameters are written once.

    (``AutoModelForCausalLM.from_pretrained(..., gguf_file=...)`` would give the same
    tensors -- checked bit-exact for SmolLM2 with transformers 5.23 -- but it requires
    ``accelerate``, which this project does not depend on.)
    """
    import inspect

    import torch
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = model_cls(config)
    # Unique parameters (tied ones appear once, under their first name) + saved buffers.
    expected = {name: p for name, p in skeleton.named_parameters()}
    non_persistent = {
        f"{mod_name}.{b}" if mod_name else b
        for mod_name, mod in skeleton.named_modules()
        for b in getattr(mod, "_non_persistent_buffers_set", ())
    }
    expected.update((name, b) for name, b in skeleton.named_buffers() if name not in non_persistent)
    tied_aliases = set(skeleton.state_dict()) - set(expected)

    logger.debug("Dequantising GGUF tensors")
    kwargs = {}
    if "torch_dtype" in inspect.signature(load_gguf_checkpoint).parameters:
        kwargs["torch_dtype"] = torch.float32
    parsed = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=skeleton, **kwargs)
    tensors: dict = parsed["tensors"]
    del skeleton

    for alias in tied_aliases & set(tensors):
        # A GGUF that stores e.g. output.weight although the config ties it: keep one copy.
        logger.debug("Dropping %s: tied to another parameter (tie_word_embeddings)", alias)
        del tensors[alias]

    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"GGUF tensors do not match {model_cls.__name__}: missing={missing[:10]} "
            f"({len(missing)}), unexpected={unexpected[:10]} ({len(unexpected)})"
        )
    state_dict = {}
    for name in expected:  # model order
        t = tensors.pop(name)
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ValueError(
                f"Shape mismatch for {name}: GGUF gives {tuple(t.shape)}, "
                f"{model_cls.__name__} expects {tuple(expected[name].shape)}"
            )
        state_dict[name] = t.to(torch.float32).contiguous()
    return state_dict


def _write_model(out: Path, config, state_dict: dict) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    logger.debug("Writing config.json and model.safetensors (%d tensors)", len(state_dict))
    config.save_pretrained(str(out))
    _polish_config_json(out / "config.json")
    try:
        GenerationConfig.from_model_config(config).save_pretrained(str(out))
    except Exception as exc:  # optional file; the checkpoint is complete without it
        logger.warning("Could not write generation_config.json: %s", exc)
    save_file(state_dict, str(out / "model.safetensors"), metadata={"format": "pt"})


def _write_tokenizer(gguf_file: Path, out: Path, max_length: int | None = None) -> dict:
    """Save the GGUF tokenizer as HF tokenizer files and check that they reload identically."""
    from transformers import AutoTokenizer

    logger.debug("Converting the tokenizer")
    tok = AutoTokenizer.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, local_files_only=True, trust_remote_code=False
    )
    if max_length:
        # GGUF carries no tokenizer length limit; use the model's context length, as HF repos do.
        tok.model_max_length = int(max_length)
    tok.save_pretrained(str(out))
    _drop_load_kwargs(out / "tokenizer_config.json")

    reloaded = AutoTokenizer.from_pretrained(str(out), local_files_only=True, trust_remote_code=False)
    problems = []
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        a, b = getattr(tok, attr), getattr(reloaded, attr)
        a_id, b_id = getattr(tok, attr + "_id"), getattr(reloaded, attr + "_id")
        if (str(a), a_id) != (str(b), b_id):
            problems.append(f"{attr}: {a!r}/{a_id} became {b!r}/{b_id}")
    if len(tok) != len(reloaded):
        problems.append(f"vocabulary size {len(tok)} became {len(reloaded)}")
    if getattr(tok, "chat_template", None) != getattr(reloaded, "chat_template", None):
        problems.append("chat_template changed")
    for text in _TOKENIZER_PROBES:
        a, b = tok(text)["input_ids"], reloaded(text)["input_ids"]
        if a != b:
            problems.append(f"{text!r} encodes as {b} instead of {a}")
        elif reloaded.decode(b) != tok.decode(a):
            problems.append(f"{text!r} decodes differently")
    if problems:
        raise RuntimeError("Saved tokenizer differs from the GGUF tokenizer: " + "; ".join(problems))

    return {
        name: {"token": str(getattr(reloaded, name)), "id": getattr(reloaded, name + "_id")}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        if getattr(reloaded, name) is not None
    }


# --------------------------------------------------------------------------- helpers


def _polish_config_json(path: Path) -> None:
    """Small, value-preserving tidy-ups of the saved config.

    * GGUF stores floats as float32, so e.g. ``rms_norm_eps`` reads back as
      ``9.999999747378752e-06``; write the shortest decimal with the same float32 value
      (``1e-05``) instead.  The float32 value, the one the model computes with, is unchanged.
    * Also write ``torch_dtype`` next to ``dtype`` for transformers 4.x readers.
    """
    import numpy as np

    def shorten(v):
        if isinstance(v, float):
            short = float(str(np.float32(v)))
            if np.float32(short) == np.float32(v):
                return short
        elif isinstance(v, dict):
            return {k: shorten(x) for k, x in v.items()}
        return v

    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg = {k: shorten(v) for k, v in cfg.items()}
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    cfg["dtype"] = cfg["torch_dtype"] = dtype
    _write_json(path, cfg)


def _drop_load_kwargs(path: Path) -> None:
    """Remove loading arguments that ``save_pretrained`` echoes into tokenizer_config.json."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return
    for key in ("is_local", "local_files_only", "gguf_file"):
        cfg.pop(key, None)
    _write_json(path, cfg)


def _write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished ``src`` to ``dst``, replacing any existing ``dst``."""
    # mkdtemp/safetensors create owner-only entries; a cache is ordinary readable files.
    os.chmod(src, 0o755)
    for child in src.iterdir():
        if child.is_file():
            os.chmod(child, 0o644)
    _fsync_dir(src)
    if dst.exists() or dst.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.replace(dst, old / dst.name)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)
    _fsync_dir(dst.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _transformers_version() -> str:
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return "unknown"
