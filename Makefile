# Everything a newcomer needs: `make serve` and `make test` create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench validate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/corral serve $${CORRAL_DEFINITIONS:-definitions}

test: $(STAMP)
	$(BIN)/ruff check server tests bench
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check server tests bench

validate: $(STAMP)
	$(BIN)/corral validate definitions

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .corral build *.egg-info
