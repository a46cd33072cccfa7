"""Run circuit-tracer's own test suite on TransformerLens and on `hooked`, offline, and compare.

    python benchmarks/circuit_tracer_suite.py /path/to/circuit-tracer --tl-python /tmp/tlvenv/bin/python
    python benchmarks/circuit_tracer_suite.py /path/to/circuit-tracer --tl-python ... tests/test_graph.py  # a subset

circuit-tracer (PyPI 0.5.0, built from the `Caerii/circuit-tracer` fork; its tests are not in
the sdist, so pass a checkout: commit 1cbc8b7 "Align tests with unified backends" matches the
0.5.0 API) builds its TransformerLens backend on `HookedTransformer`. Its `tests/` folder is
copied to a temporary directory and run by pytest twice, with the hub offline:

- on TransformerLens: `--tl-python`, a Python with `transformer-lens==2.18.*`,
  `transformers<=4.57.3` and `circuit-tracer==0.5.0` (installed `--no-deps`), torch as here;
- on `hooked`: this interpreter, with `circuit-tracer==0.5.0` installed `--no-deps`; a
  `conftest.py` calls `hooked.compat.alias_transformer_lens()` before any test imports it.

Both sides get the same `conftest.py` shims: `AutoTokenizer.from_pretrained` of a hub name
loads a local tokenizer instead (the bundled SmolLM2 `tokenizer.json`, 49152 tokens, as a plain
`PreTrainedTokenizerFast`), and huggingface_hub>=1.0's missing `HF_HUB_ENABLE_HF_TRANSFER`
constant is defined as False. The tests build their models from configs with random weights;
tests that need hub files (transcoders, pretrained models) or nnsight fail on both sides and
are not counted. The script prints the pass counts side by side and every test that passes on
TransformerLens but not on `hooked`. No circuit-tracer code is copied into this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLED_TOKENIZER = Path.home() / ".cache" / "hooked" / "smollm2-135m" / "tokenizer.json"

CONFTEST = """
import os
import transformers
import huggingface_hub.constants as _hub_constants

LOCAL_TOKENIZER = {tokenizer!r}
_from_pretrained = transformers.AutoTokenizer.from_pretrained.__func__


def _local(cls, name, *args, **kwargs):
    return _from_pretrained(cls, name if os.path.isdir(str(name)) else LOCAL_TOKENIZER, *args, **kwargs)


transformers.AutoTokenizer.from_pretrained = classmethod(_local)
if not hasattr(_hub_constants, "HF_HUB_ENABLE_HF_TRANSFER"):  # removed in huggingface_hub 1.0
    _hub_constants.HF_HUB_ENABLE_HF_TRANSFER = False
if {alias!r}:
    import sys
    sys.path.insert(0, {repo!r})
    import hooked.compat
    hooked.compat.alias_transformer_lens()
"""

TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<|endoftext|>",
    "eos_token": "<|endoftext|>",
    "unk_token": "<|endoftext|>",
    "model_max_length": 8192,
}


def make_tokenizer_dir(dest: Path) -> Path:
    """A tokenizer folder both transformers 4.x and 5.x load: the bundled tokenizer.json, a plain config."""
    if not BUNDLED_TOKENIZER.exists():
        sys.exit(f"{BUNDLED_TOKENIZER} is missing: convert the bundled SmolLM2 first (hooked inspect)")
    dest.mkdir(parents=True)
    shutil.copy(BUNDLED_TOKENIZER, dest / "tokenizer.json")
    (dest / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return dest


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from a JUnit XML report."""
    if not junit.exists():
        return {}
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        result[f"{case.get('classname')}::{case.get('name')}"] = next(
            (k for k in ("failure", "error", "skipped") if k in kinds), "passed"
        )
    return result


def run_side(checkout: Path, python: str, alias: bool, timeout: int, extra: list[str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="ct-suite-") as tmp:
        root = Path(tmp)
        shutil.copytree(checkout / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        tokenizer = make_tokenizer_dir(root / "tokenizer")
        (root / "conftest.py").write_text(CONFTEST.format(tokenizer=str(tokenizer), alias=alias, repo=str(REPO)))
        (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        junit = root / "report.xml"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        env.pop("PYTHONPATH", None)
        cmd = [python, "-m", "pytest", "-q", "--continue-on-collection-errors", f"--junitxml={junit}"]
        cmd += extra or ["tests"]
        try:
            subprocess.run(cmd, cwd=root, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"{'hooked' if alias else 'TransformerLens'}: timed out after {timeout} s", file=sys.stderr)
        return outcomes(junit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="a circuit-tracer checkout (its tests/ folder is used)")
    parser.add_argument("--tl-python", required=True, help="a Python with transformer-lens 2.18 and circuit-tracer")
    parser.add_argument("--report", type=Path, help="write every test's outcome on both sides as JSON")
    parser.add_argument("--timeout", type=int, default=3 * 3600, help="seconds per side")
    parser.add_argument("pytest_args", nargs="*", help="test paths / pytest arguments (after --)")
    args = parser.parse_intermixed_args()

    tl = run_side(args.checkout, args.tl_python, False, args.timeout, args.pytest_args)
    hk = run_side(args.checkout, sys.executable, True, args.timeout, args.pytest_args)
    tl_pass = {t for t, o in tl.items() if o == "passed"}
    hk_pass = {t for t, o in hk.items() if o == "passed"}
    print(f"{'':<28}{'TransformerLens 2.18':>22}{'hooked':>10}")
    print(f"{'collected':<28}{len(tl):>22}{len(hk):>10}")
    print(f"{'passed':<28}{len(tl_pass):>22}{len(hk_pass):>10}")
    print(f"{'passed on both':<28}{len(tl_pass & hk_pass):>22}")
    for test in sorted(tl_pass - hk_pass):
        print(f"  passes on TransformerLens only: {test} ({hk.get(test, 'not run')} on hooked)")
    for test in sorted(hk_pass - tl_pass):
        print(f"  passes on hooked only: {test} ({tl.get(test, 'not run')} on TransformerLens)")
    if args.report:
        args.report.write_text(json.dumps({"transformer_lens": tl, "hooked": hk}, indent=1))


if __name__ == "__main__":
    main()
