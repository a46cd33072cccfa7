import os
import sys
from pathlib import Path

import pytest
import torch

import tests

# Tests import what users import: `hooked.*` only. The checkout's top-level folders (`components/`,
# `loading/`) install as `hooked.components` and `hooked.loading`; with the checkout on `sys.path`
# (`python -m pytest` puts the working directory there) they would also import as `components` and
# `loading`: a second module object, a second run of module-level state. So the checkout leaves
# `sys.path` (pytest's importlib import mode adds nothing back) and `tests.*` resolves through the
# `tests` package, already imported.
_CHECKOUT = Path(tests.__file__).resolve().parents[1]
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _CHECKOUT]

# Runtime shape checks (tests/README.md): HOOKED_TYPECHECK=1 wraps every function of `hooked` in
# jaxtyping + beartype, so the unit tier checks the library's annotations on every call. The hook
# rewrites modules as they are imported, so it goes in before anything imports `hooked`.
TYPECHECK = os.environ.get("HOOKED_TYPECHECK", "")
if TYPECHECK not in ("", "0", "1"):
    raise RuntimeError(f"HOOKED_TYPECHECK={TYPECHECK!r}: use 1 (unit tier, checked), 0 (the rest) or leave it unset")
if TYPECHECK == "1":
    if "hooked" in sys.modules:
        raise RuntimeError(
            "HOOKED_TYPECHECK=1: `hooked` was imported before tests/conftest.py, so it cannot be checked"
        )
    # beartype reads `object.__dict__` when first imported: before nnsight patches `object` (tests/unit/compat)
    import beartype  # noqa: F401
    from jaxtyping import install_import_hook

    # the PEP 484 numeric tower: an int passes for a float, as type checkers read `float`
    _hook = install_import_hook(["hooked"], "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))")
    # hot-path plumbing with no tensor annotation: called tens of thousands of times per test file,
    # checking it would double the tier's time and check no shape
    _UNCHECKED_MODULES = {
        "hooked._moved_modules",
        "hooked.core.fast_attributes",
        "hooked.core.hook_points",
        "hooked.core.thread_guard",
    }
    _instrument = _hook.hook.should_instrument
    _hook.hook.should_instrument = lambda name: name not in _UNCHECKED_MODULES and _instrument(name)

# One intra-op thread per pytest-xdist worker (the workers already fill the cores), up to two otherwise.
# The subprocesses a test starts (notebook kernels, servers, torchrun ranks) inherit it through
# OMP_NUM_THREADS: more OpenMP threads than free cores make a process several times slower.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _XDIST_WORKERS)))
if _XDIST_WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())

# tests/gpu needs a CUDA device: collected where one is visible (`make test-gpu` runs them alone)
collect_ignore = [] if torch.cuda.is_available() else ["gpu"]

UNIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "unchecked: a unit test run without the runtime shape checks (why: tests/README.md)"
    )
    config.addinivalue_line("markers", "checked_only: needs the runtime shape checks (HOOKED_TYPECHECK=1)")


def pytest_report_header(config):
    return {
        "1": "runtime shape checks: on (tests/unit, less the `unchecked` tests)",
        "0": "runtime shape checks: off (everything HOOKED_TYPECHECK=1 leaves out)",
        "": "runtime shape checks: off (HOOKED_TYPECHECK=1 turns them on; `make test` runs both)",
    }[TYPECHECK]


def pytest_ignore_collect(collection_path, config):
    # the checked run takes the unit tier only: the other tiers are not even imported
    if TYPECHECK == "1":
        path = str(collection_path)
        if not (path == UNIT or path.startswith(UNIT + os.sep) or UNIT.startswith(path + os.sep)):
            return True
    return None


def _checked(item) -> bool:
    """Whether a HOOKED_TYPECHECK=1 run takes this test: the unit tier, less the `unchecked` tests."""
    return str(item.path).startswith(UNIT + os.sep) and item.get_closest_marker("unchecked") is None


def pytest_collection_modifyitems(config, items):
    # the split of `make test` into a checked and an unchecked process: each test runs in exactly one
    if TYPECHECK == "1":
        take = _checked
    elif TYPECHECK == "0":
        take = lambda item: not _checked(item)  # noqa: E731
    else:
        take = lambda item: item.get_closest_marker("checked_only") is None  # noqa: E731
    keep, dropped = [], []
    for item in items:
        (keep if take(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def tokenizer():
    from tests.tiny_models import make_tokenizer

    return make_tokenizer()


@pytest.fixture(scope="session")
def bos_tokenizer():
    from tests.tiny_models import make_tokenizer

    return make_tokenizer(prepends_bos=True)


# -- the bundled real model (SmolLM2-135M-Instruct): converted once per machine, loaded once per session --


@pytest.fixture(scope="session")
def smollm2_dir():
    from hooked.loading.bundled import bundled_checkpoint_dir

    return bundled_checkpoint_dir("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """Unprocessed hooked SmolLM2 (float32)."""
    from hooked import HookedTransformer

    return HookedTransformer.from_pretrained_no_processing("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_processed(smollm2_dir):
    """Hooked SmolLM2 with TransformerLens's default weight processing."""
    from hooked import HookedTransformer

    return HookedTransformer.from_pretrained("smollm2-135m")


TEXTS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally nicknamed "
    "the Iron Lady, it was constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial "
    "anniversary of the French Revolution. Although initially criticised by some of France's leading artists and "
    "intellectuals for its design, it has since become a global cultural icon of France and one of the most "
    "recognisable structures in the world.",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n'
    "        a, b = b, a + b\n    return a\n\n\ndef is_prime(n):\n    if n < 2:\n        return False\n"
    "    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n            return False\n    return True\n\n"
    "print([fibonacci(i) for i in range(10)])\nprint([p for p in range(50) if is_prime(p)])\n",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize "
    "foods from carbon dioxide and water. Photosynthesis in plants generally involves the green pigment "
    "chlorophyll and generates oxygen as a byproduct. The light-dependent reactions take place in the thylakoid "
    "membranes, while the Calvin cycle runs in the stroma of the chloroplast, fixing carbon into sugars that the "
    "plant uses for energy and growth throughout its life. Almost all life on Earth depends on it, directly or "
    "indirectly: it fills the atmosphere with oxygen, supplies the organic compounds at the base of nearly every "
    "food chain, and, over millions of years, laid down the coal, oil and gas that power much of the modern world.",
    "When Mary and John went to the store, John gave a drink to Mary. Later that evening, Mary and John walked to "
    "the park, where Mary gave a book to John. The next morning, John and Mary met their friends at the station "
    "and took the early train to the coast. They spent the whole day swimming, reading and talking about the "
    "summer, and in the evening they cooked dinner together before returning home on the last train of the day. "
    "On Sunday, John wrote a long letter to his sister, and Mary painted the view from their kitchen window, a row "
    "of red roofs under a grey sky, while the radio played old songs in the background.",
]


@pytest.fixture(scope="session")
def smollm2_batch(smollm2):
    """4 x 128 tokens of varied real text (prose, code, science, narrative), BOS first."""
    rows = [smollm2.to_tokens(t, prepend_bos=True, truncate=False)[0, :128] for t in TEXTS]
    assert all(len(r) == 128 for r in rows), [len(r) for r in rows]
    return torch.stack(rows)


# -- the second bundled real model (Gemma-3-270M base): converted once per machine, loaded once per session --
# Its vocabulary is 262,144: logits of one 64-token row are 67 MB in float32, so batches stay small.


@pytest.fixture(scope="session")
def gemma3_dir():
    from hooked.loading.bundled import bundled_checkpoint_dir

    return bundled_checkpoint_dir("gemma-3-270m")


@pytest.fixture(scope="session")
def gemma3_hf(gemma3_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gemma3_dir, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def gemma3(gemma3_dir):
    """Unprocessed hooked Gemma-3-270M (float32)."""
    from hooked import HookedTransformer

    return HookedTransformer.from_pretrained_no_processing("gemma-3-270m")


@pytest.fixture(scope="session")
def gemma3_processed(gemma3_dir):
    """Hooked Gemma-3-270M with TransformerLens's default weight processing."""
    from hooked import HookedTransformer

    return HookedTransformer.from_pretrained("gemma-3-270m")
