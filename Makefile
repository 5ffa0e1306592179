# The two commands a newcomer needs: `make demo` and `make test`. Everything else is what they call.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# pytest workers: the suite is written for 2 cores; more just contend for them.
WORKERS ?= 2

# The dashboard's front-end packages (package.json + package-lock.json, from the npm registry) are
# copied into the Python package by `make assets`; the copies are not committed (see .gitignore).
VENDOR       := src/gpufleet/web/static/vendor
VENDOR_STAMP := $(VENDOR)/.stamp

.PHONY: demo test lint typecheck contracts pytest docs venv assets clean screenshots dist smoke

demo: $(STAMP) $(VENDOR_STAMP)
	$(BIN)/gpufleet demo

test: lint typecheck contracts pytest docs

venv: $(STAMP) $(VENDOR_STAMP)

assets: $(VENDOR_STAMP)

$(VENDOR_STAMP): package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)
	cp node_modules/htmx.org/dist/htmx.min.js $(VENDOR)/htmx.min.js
	cp node_modules/htmx.org/LICENSE $(VENDOR)/htmx.LICENSE
	cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css $(VENDOR)/
	cp node_modules/uplot/LICENSE $(VENDOR)/uPlot.LICENSE
	touch $(VENDOR_STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpufleet needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

# loadgroup: tests marked xdist_group("NAME") run on one worker together (their module's cluster starts
# once, not on each worker); the rest are spread as with the default `load`.
pytest: $(STAMP) $(VENDOR_STAMP)
	$(BIN)/pytest -n $(WORKERS) --dist loadgroup --durations=10

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d build/site

# The wheel, the sdist and the agent's zipapp in dist/ (scripts/dist.sh; docs/install.md).
dist: $(STAMP) $(VENDOR_STAMP)
	PYTHON=$(BIN)/python bash scripts/dist.sh dist

# The wheel, the agent zipapp and the head's image (Containerfile) installed and started from scratch, as CI does
# (scripts/smoke_packages.sh: needs podman and, for the image's base, debootstrap; about 4 minutes).
smoke: $(STAMP) $(VENDOR_STAMP)
	PYTHON=$(BIN)/python bash scripts/smoke_packages.sh

clean:
	rm -rf build dist site node_modules $(VENDOR) .pytest_cache .mypy_cache .ruff_cache

# Regenerates docs/images/*.png: a real head and 1,000 simulated nodes in Chromium (about 7 minutes).
screenshots: $(STAMP) $(VENDOR_STAMP)
	$(BIN)/python scripts/dashboard_screenshots.py
