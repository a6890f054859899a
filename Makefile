# Everything a newcomer needs: `make serve` and `make test` create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The project alone (what `make serve` needs), and the project with its test extras (browser driver...)
SERVING := $(VENV)/.installed-serve
TESTING := $(VENV)/.installed-test
CONFORMANCE := .conformance/node_modules/@modelcontextprotocol/conformance/package.json

.PHONY: serve test lint bench validate clean conformance

# Each install has its own stamp, so `make serve` after `make test` (or the other way round) installs
# what the other did not, and neither installs more than it needs; pyproject.toml changing redoes both.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(SERVING): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TESTING): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

serve: $(SERVING)
	$(BIN)/corral serve $${CORRAL_DEFINITIONS:-definitions}

test: $(TESTING) $(if $(shell command -v npm),$(CONFORMANCE))
	$(BIN)/ruff check server tests bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest

lint: $(TESTING)
	$(BIN)/ruff check server tests bench
	$(BIN)/lint-imports --no-cache

validate: $(SERVING)
	$(BIN)/corral validate definitions

bench: $(TESTING)
	$(BIN)/python -m bench

# The official MCP conformance suite (Node 20+), for tests/test_mcp_conformance.py, which skips
# without it. `make test` installs it only where npm exists; a failed install is not fatal.
$(CONFORMANCE):
	npm install --prefix .conformance --save-exact --no-audit --no-fund --loglevel=error \
		@modelcontextprotocol/conformance@0.1.13 || echo "conformance suite not installed: its test will skip"

conformance: $(CONFORMANCE)

clean:
	rm -rf $(VENV) .corral build *.egg-info
