# Everything a newcomer needs: `make serve` and `make test` create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFORMANCE := .conformance/node_modules/@modelcontextprotocol/conformance/package.json

.PHONY: serve test lint bench validate clean conformance

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/corral serve $${CORRAL_DEFINITIONS:-definitions}

test: $(STAMP) $(if $(shell command -v npm),$(CONFORMANCE))
	$(BIN)/ruff check server tests bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check server tests bench
	$(BIN)/lint-imports --no-cache

validate: $(STAMP)
	$(BIN)/corral validate definitions

bench: $(STAMP)
	$(BIN)/python -m bench

# The official MCP conformance suite (Node 20+), for tests/test_mcp_conformance.py, which skips
# without it. `make test` installs it only where npm exists; a failed install is not fatal.
$(CONFORMANCE):
	npm install --prefix .conformance --save-exact --no-audit --no-fund --loglevel=error \
		@modelcontextprotocol/conformance@0.1.13 || echo "conformance suite not installed: its test will skip"

conformance: $(CONFORMANCE)

clean:
	rm -rf $(VENV) .corral build *.egg-info
