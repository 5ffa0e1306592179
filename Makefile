# The two commands a newcomer needs: `make demo` and `make test`. Everything else is what they call.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# pytest workers: the suite is written for 2 cores; more just contend for them.
WORKERS ?= 2

.PHONY: demo test lint typecheck contracts pytest docs venv clean

demo: $(STAMP)
	$(BIN)/gpufleet demo

test: lint typecheck contracts pytest docs

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpufleet needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

pytest: $(STAMP)
	$(BIN)/pytest -n $(WORKERS) --durations=10

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d build/site

clean:
	rm -rf build site .pytest_cache .mypy_cache .ruff_cache
