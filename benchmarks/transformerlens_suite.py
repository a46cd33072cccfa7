"""Run TransformerLens's own test suite against `hooked` (through `alias_transformer_lens()`), offline.

    python benchmarks/transformerlens_suite.py /path/to/TransformerLens-v2.18.0
    python benchmarks/transformerlens_suite.py /path/to/TL --tl-python /venv-tl/bin/python   # also run TL itself

The checkout's `tests/` folder is copied to a temporary directory (so its own
`transformer_lens` package is not importable) and run by pytest with the hub offline.
Against `hooked`, a `conftest.py` activates the alias before any test module imports
`transformer_lens`. With `--tl-python` (a Python where transformer-lens 2.18 is installed)
the same copy is run on TransformerLens first; the tests that pass there are the runnable
set, and the script prints how many of them pass on `hooked`. Without it, the runnable set
is read from `--baseline` (a JSON list of test ids written by an earlier `--tl-python` run).

Of those 413, `hooked` passes all but 4 (`ARGUED`: Apertus converter expectations that
would make `hooked` wrong or that it deliberately does not share; docs/tools-on-hooked.md).

Test files of modules `hooked` does not cover would be left out and counted (`EXCLUDED`, empty
now): `HookedEncoder` (BERT), `BertNextSentencePrediction`, `transformer_lens.lit`,
`HookedEncoderDecoder` (T5) and `HookedAudioEncoder` (HuBERT) are covered: their tests run,
and those that pass on TransformerLens offline are in the baseline.
No TransformerLens code is copied into this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# test files about modules outside hooked's scope (encoders, LIT)
EXCLUDED = {}

# tests that pass on TransformerLens and whose expectation hooked deliberately does not meet
# (docs/tools-on-hooked.md argues each one)
APERTUS = "tests.unit.pretrained_weight_conversions.test_apertus.TestApertusWeightConversion::"
ARGUED = {
    APERTUS + "test_xielu_params_fallback_defaults": "TL writes xIELU's effective defaults into raw (softplus) slots",
    APERTUS + "test_attention_weight_shapes": "n_key_value_heads == n_heads is multi-head attention (W_K, not _W_K)",
    APERTUS + "test_gqa_underscore_keys": "n_key_value_heads == n_heads is multi-head attention (W_K, not _W_K)",
    APERTUS + "test_zero_biases_have_correct_device": "a config built without a device keeps device=None",
}

ALIAS_CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
import hooked.compat
hooked.compat.alias_transformer_lens()
"""


def copy_tests(checkout: Path, dest: Path) -> None:
    shutil.copytree(checkout / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in EXCLUDED:
        (dest / rel).unlink(missing_ok=True)
    (dest / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")


def run_pytest(python: str, root: Path, junit: Path, timeout: int, extra: list[str]) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    cmd = [python, "-m", "pytest", "-q", "--continue-on-collection-errors", f"--junitxml={junit}", "tests", *extra]
    subprocess.run(cmd, cwd=root, env=env, timeout=timeout, check=False)


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from a JUnit XML report."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        result[test_id] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
    return result


def normalized(test_id: str) -> str:
    """The id with numbers in its parameters blanked: some TL tests parametrize on random values."""
    name, bracket, params = test_id.partition("[")
    return name + bracket + re.sub(r"-+", "-", re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", params))


def count_passing(baseline: list[str], outcomes_: dict[str, str]) -> int:
    """How many baseline tests pass, matching ids up to their random parameter values."""
    wanted = Counter(normalized(t) for t in baseline)
    passing = Counter(normalized(t) for t, o in outcomes_.items() if o == "passed")
    return sum(min(n, passing[key]) for key, n in wanted.items())


def run_suite(checkout: Path, python: str, alias: bool, timeout: int, extra: list[str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="tl-suite-") as tmp:
        root = Path(tmp)
        copy_tests(checkout, root)
        if alias:
            (root / "conftest.py").write_text(ALIAS_CONFTEST)
        junit = root / "report.xml"
        run_pytest(python, root, junit, timeout, extra)
        return outcomes(junit)


def excluded_counts(checkout: Path) -> dict[str, int]:
    """How many test functions each excluded file defines (a lower bound: parametrized tests count once)."""
    counts: Counter = Counter()
    for rel, why in EXCLUDED.items():
        path = checkout / rel
        if path.exists():
            counts[why] += sum(1 for line in path.read_text().splitlines() if line.lstrip().startswith("def test_"))
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="a TransformerLens checkout (tag v2.18.0)")
    parser.add_argument("--tl-python", help="a Python with transformer-lens 2.18 installed: run the suite on TL too")
    parser.add_argument("--baseline", type=Path, default=REPO / "benchmarks" / "transformerlens_suite_baseline.json")
    parser.add_argument("--write-baseline", action="store_true", help="store TL's passing tests in --baseline")
    parser.add_argument("--report", type=Path, help="write every test's outcome on both sides as JSON")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()

    print("left out (test functions):", excluded_counts(args.checkout))
    if args.tl_python:
        tl = run_suite(args.checkout, args.tl_python, alias=False, timeout=args.timeout, extra=args.pytest_args)
        baseline = sorted(t for t, o in tl.items() if o == "passed")
        print(f"TransformerLens 2.18 offline: {len(baseline)} passed of {len(tl)} collected")
        if args.write_baseline:
            args.baseline.write_text(json.dumps(baseline, indent=0) + "\n")
    else:
        tl = None
        baseline = json.loads(args.baseline.read_text())
    hk = run_suite(args.checkout, sys.executable, alias=True, timeout=args.timeout, extra=args.pytest_args)
    passed = count_passing(baseline, hk)
    print(f"hooked: {sum(o == 'passed' for o in hk.values())} passed of {len(hk)} collected")
    print(f"runnable (pass on TransformerLens 2.18 offline): {len(baseline)}")
    print(f"passed on hooked: {passed} / {len(baseline)} = {100 * passed / max(len(baseline), 1):.1f}%")
    failing = [t for t in baseline if count_passing([t], hk) == 0]
    argued = [t for t in failing if t in ARGUED]
    print(f"argued exceptions (docs/tools-on-hooked.md): {len(argued)}; other failures: {len(failing) - len(argued)}")
    for test in failing:
        print(f"  {test}: {ARGUED.get(test, 'FAILS on hooked')}")
    if args.report:
        args.report.write_text(json.dumps({"tl": tl, "hooked": hk, "baseline": baseline}, indent=1))


if __name__ == "__main__":
    main()
