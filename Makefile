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
## Two lanes at once (docs/tests.md, "How long"): the first runs the unit tier (pure CPU), the
## Kubernetes-adapter, packaging, contract, device-plugin and trace tiers on a control plane of their
## own, the hostile and chaos tiers, then the integration modules named in INTEGRATION_BESIDE; the
## second runs the e2e tier and the rest of the integration tier, which mostly wait on real servers.
## The first lane's report follows the second's, and both must pass.
INTEGRATION_BESIDE := tests/integration/test_saga_gangs.py tests/integration/test_queue_fair_share.py \
	tests/integration/test_records_and_reconciler.py tests/integration/test_placement_race.py \
	tests/integration/test_cli_demo.py tests/integration/test_metrics_endpoint.py \
	tests/integration/test_saga_processes.py
LANE_BESIDE := tests/unit tests/kube tests/packaging tests/contract tests/deviceplugin tests/traces tests/hostile \
	tests/chaos
LANE_WAITING := tests/e2e tests/integration
test: install kube
	@$(BIN)/pytest -q -p no:cacheprovider $(LANE_BESIDE) $(INTEGRATION_BESIDE) > $(VENV)/lane-beside.log 2>&1 & lane=$$!; \
	$(BIN)/pytest -q -p no:cacheprovider $(LANE_WAITING) $(addprefix --ignore=,$(INTEGRATION_BESIDE)); rest=$$?; \
	wait $$lane; lane_rc=$$?; echo "== $(LANE_BESIDE) $(INTEGRATION_BESIDE), run beside the others (exit $$lane_rc):"; \
	cat $(VENV)/lane-beside.log; test $$rest -eq 0 && test $$lane_rc -eq 0

## Build (or reuse) the Go-built test tools: the Kubernetes control plane (with
## kube-controller-manager), the JobSet controller and MPI Operator, the Jaeger trace receiver,
## the kubelet device-manager harness and helm (cached outside the work tree; seconds when
## cached; cold times in tools/*/README.md).
kube:
	bash tools/kube/build.sh >/dev/null
	bash tools/controllers/build.sh >/dev/null
	bash tools/lws/build.sh >/dev/null
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
