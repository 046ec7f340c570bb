# Phalanx: the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test test-unit test-integration lint schema bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

## Run the whole scheduler locally on a simulated 2 x 8-V100 cluster and print the decisions.
demo: install
	$(BIN)/phalanx demo

## Every test tier: unit, integration (real nats-server), architecture and lint checks.
test: install
	$(BIN)/pytest -q -p no:cacheprovider tests

test-unit: install
	$(BIN)/pytest -q tests/unit

test-integration: install
	$(BIN)/pytest -q tests/integration

lint: install
	$(BIN)/ruff check proto libs services tests bench
	$(BIN)/lint-imports

schema: install
	$(BIN)/phalanx schema

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
