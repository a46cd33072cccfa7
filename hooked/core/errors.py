"""The exceptions `hooked` raises on purpose, in one place.

Every error is raised before any work is done (before the forward pass, before a
checkpoint's tensors are read) and its message names the argument, hook, tensor or
file at fault and what to do instead. Each class also derives from the built-in type
a caller would expect (`ValueError`, `TypeError`, `KeyError`, `RuntimeError`), and,
where TransformerLens 2.x used an `assert` for the same check, from `AssertionError`,
so `except AssertionError` code written against TransformerLens keeps working.

    HookedError
    ├── InputError (ValueError, AssertionError)       an argument has a bad value
    │   ├── TokenError                                token ids: dtype, rank, range, empty
    │   ├── AttentionMaskError                        mask: dtype, values, shape
    │   ├── TokenizerError                            the tokenizer cannot do what was asked
    │   ├── KVCacheMismatchError                      a KV cache built for another batch/model
    │   ├── PatchingError                             clean/corrupted mismatch, non-scalar metric
    │   ├── GraphMismatchError                        a saved circuit graph loaded against another model
    │   └── ShapeMismatchError                        e.g. FactoredMatrix inner dimensions
    ├── InputTypeError (TypeError, AssertionError)    an argument has a bad type
    ├── ConfigError (ValueError, AssertionError)      an impossible config
    ├── HookShapeError (ValueError)                   a hook returned a tensor of another shape
    ├── HookNotEnabledError (AssertionError)          an optional hook whose flag is off
    ├── MissingHooksError (KeyError)                  a cache lacks hooks an analysis needs
    ├── ConcurrentUseError (RuntimeError)             one model used by two threads at once
    ├── RemoteError (RuntimeError)                    a `hooked serve` server refused or failed a request
    ├── ReplacedModuleError (TypeError)               a replaced component lacks what a weight view needs
    └── CheckpointError (ValueError)                  a checkpoint file is corrupt or inconsistent
        ├── WeightShapeError                          a converted tensor disagrees with the config
        └── UnsafeCheckpointError                     would need remote code, unpickling or a path outside the checkpoint
"""

from __future__ import annotations


class HookedError(Exception):
    """Base class of every error `hooked` raises deliberately."""


class InputError(HookedError, ValueError, AssertionError):
    """An argument has a value `hooked` cannot use; the message names the argument."""


class InputTypeError(HookedError, TypeError, AssertionError):
    """An argument has a type `hooked` cannot use; the message names the argument."""


class TokenError(InputError):
    """Token ids that are not a usable `[batch, pos]` integer tensor within the vocabulary."""


class AttentionMaskError(InputError):
    """An `attention_mask` that is not a 0/1 (or bool) tensor of the inputs' `[batch, pos]` shape."""


class TokenizerError(InputError):
    """The tokenizer cannot do what the call asks (e.g. `prepend_bos=True` without a BOS token)."""


class KVCacheMismatchError(InputError):
    """A KV cache reused with another batch size, layer count, head count or head size."""


class PatchingError(InputError):
    """Clean and corrupted inputs that do not line up, or a metric that is not a scalar."""


class GraphMismatchError(InputError):
    """A saved circuit `Graph` loaded against a model of another shape (layers, heads, MLPs, block layout)."""


class ShapeMismatchError(InputError):
    """Operands whose shapes do not fit together (e.g. a `FactoredMatrix` product)."""


class ConfigError(HookedError, ValueError, AssertionError):
    """A `HookedTransformerConfig` whose fields contradict each other."""


class UnknownConfigFieldError(ConfigError, TypeError):
    """A `HookedTransformerConfig` keyword that is no field (a `TypeError`, as the plain dataclass raised)."""


class HookShapeError(HookedError, ValueError):
    """A hook returned a tensor whose shape differs from the activation it replaces."""


class HookNotEnabledError(HookedError, AssertionError):
    """A hook was asked for on an optional hook point whose config flag is off."""


class MissingHooksError(HookedError, KeyError):
    """An activation cache lacks hooks that an analysis needs; the message names them and the filter to use."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class GenerationHookError(HookedError, RuntimeError):
    """A hook failed at a decode step of `generate` (where activations cover only the new position)."""


class ConcurrentUseError(HookedError, RuntimeError):
    """A model was entered by a second thread while another thread was running it."""


class RemoteError(HookedError, RuntimeError):
    """A `hooked serve` server refused or failed a request; `status` is its HTTP status."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


class ReplacedModuleError(HookedError, TypeError):
    """A component replaced in place (a transcoder, an SAE wrapper) that a weight view or weight processing cannot read."""


class CheckpointError(HookedError, ValueError):
    """A checkpoint file is corrupt, truncated or inconsistent; the message names the file."""


class WeightShapeError(CheckpointError):
    """A converted tensor's shape differs from the shape the config implies."""


class UnsafeCheckpointError(CheckpointError):
    """Loading would run checkpoint code, unpickle data or read outside the checkpoint directory."""


__all__ = [
    "AttentionMaskError",
    "CheckpointError",
    "ConcurrentUseError",
    "ConfigError",
    "GraphMismatchError",
    "HookNotEnabledError",
    "HookShapeError",
    "HookedError",
    "InputError",
    "InputTypeError",
    "KVCacheMismatchError",
    "MissingHooksError",
    "PatchingError",
    "RemoteError",
    "ShapeMismatchError",
    "TokenError",
    "TokenizerError",
    "UnsafeCheckpointError",
    "WeightShapeError",
]


# -- loading registry (kept in its own block at the end: other error groups are edited elsewhere) --


class DuplicateArchitectureError(HookedError, ValueError):
    """An HF architecture class registered twice: the second converter would silently replace the first."""


__all__ += ["DuplicateArchitectureError"]
