# Phalanx: the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test test-unit test-integration test-e2e kube peers lint schema bench fuzz clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,plot]'
	@touch $(STAMP)

install: $(STAMP)

## Run the whole scheduler locally on a simulated 2 x 8-V100 cluster and print the decisions.
demo: install
	$(BIN)/phalanx demo

## Every test tier: unit, integration (real nats-server), e2e (real kube-apiserver + etcd + kwok,
## built from Go modules into ~/.cache/phalanx-kube on first use), architecture and lint checks.
## The unit tier (pure CPU, about two minutes) runs beside the others, which mostly wait on real
## servers; its report follows theirs and both must pass (docs/tests.md, "How long").
## Their order is the directories' but chaos last, away from the unit tier's CPU: the e2e modules
## share one API server with the tests of tests/kube, which leave pods there, so e2e goes first.
TIERS_BESIDE_UNIT := tests/contract tests/deviceplugin tests/e2e tests/hostile tests/integration tests/kube \
                     tests/packaging tests/traces tests/chaos
test: install kube
	@$(BIN)/pytest -q -p no:cacheprovider tests/unit > $(VENV)/unit-tier.log 2>&1 & unit=$$!; \
	$(BIN)/pytest -q -p no:cacheprovider $(TIERS_BESIDE_UNIT); rest=$$?; \
	wait $$unit; unit_rc=$$?; echo "== the unit tier, run beside the others (exit $$unit_rc):"; \
	cat $(VENV)/unit-tier.log; test $$rest -eq 0 && test $$unit_rc -eq 0

## Build (or reuse) the Go-built test tools: the Kubernetes control plane (with
## kube-controller-manager), the JobSet controller and MPI Operator, the Jaeger trace receiver,
## the kubelet device-manager harness and helm (cached outside the work tree; seconds when
## cached; cold times in tools/*/README.md).
kube:
	bash tools/kube/build.sh >/dev/null
	bash tools/controllers/build.sh >/dev/null
	bash tools/traces/build.sh >/dev/null
	bash tools/devicemanager/build.sh >/dev/null
	bash tools/helm/build.sh >/dev/null

## Build (or reuse) what bench/peers.py runs beside Phalanx: kube-apiserver, kube-scheduler and
## kube-controller-manager v1.37.2 and Kueue v0.17.0 (tools/peers), with etcd and kwok from
## tools/kube. Cached outside the work tree; not part of `make test`; cold times in tools/peers/README.md.
peers: install
	bash tools/kube/build.sh >/dev/null
	bash tools/peers/build.sh >/dev/null

test-e2e: install kube
	$(BIN)/pytest -q tests/e2e tests/contract tests/kube tests/deviceplugin

test-unit: install
	$(BIN)/pytest -q tests/unit

test-integration: install
	$(BIN)/pytest -q tests/integration

## The long fuzz run: the Hypothesis profile "fuzz" (200000 inputs per target, a fresh seed, the
## failure database in .hypothesis/ replayed first; tests/unit/conftest.py).
fuzz: install
	PHALANX_FUZZ_PROFILE=fuzz $(BIN)/pytest -q -p no:cacheprovider -m fuzz tests/unit

## ruff, the import contracts, then the type checker: mypy ([tool.mypy] in pyproject.toml), strict
## on proto/ and the rulebook, the engine checked with each plugin held to its Protocol where the
## profile registers it; its cache lives in the venv. `make test` runs the same three
## (tests/unit/test_architecture.py).
lint: install
	$(BIN)/ruff check proto libs services fleet tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy --cache-dir $(VENV)/.mypy_cache

schema: install
	$(BIN)/phalanx schema

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
