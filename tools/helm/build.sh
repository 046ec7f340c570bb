#!/usr/bin/env bash
# Build the helm CLI for the chart tests (tests/kube/test_helm_chart.py) from the Go module in
# tools/helm/helm into a cache OUTSIDE the work tree:
#
#   ${PHALANX_HELM_CACHE:-$HOME/.cache/phalanx-helm}/<version-key>/
#       helm .build-complete
#
# <version-key> is the helm module version required in tools/helm/helm/go.mod, e.g. helm-v4.3.2.
#
# Usage:
#   tools/helm/build.sh                 build what is missing (skips when the cache is complete)
#   tools/helm/build.sh --force         rebuild even when the cache is complete
#   tools/helm/build.sh --print-bin-dir print the bin dir path and exit (builds nothing)
#
# Progress and timings go to stderr; the bin dir path is the only thing printed on
# stdout, as the last line, so `BIN=$(tools/helm/build.sh)` works.
# Exit status is non-zero, with a "build.sh: ERROR" message, whenever a step fails.
#
# The machine's go env (GOPROXY, GOSUMDB, GOFLAGS, GOCACHE, GOMODCACHE) is used as is.
# On shared machines run it niced:  nice -n 19 tools/helm/build.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../buildlib.sh
. "$HERE/../buildlib.sh"

HELM_VERSION=$(modver helm helm.sh/helm/v4)   # v4.3.2
KEY="helm-${HELM_VERSION}"
CACHE_ROOT=${PHALANX_HELM_CACHE:-$HOME/.cache/phalanx-helm}
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(helm)

begin_build "$@"

# The -X flags of helm's own Makefile for a tagged build: without them `helm version` reports
# "v4.3" with an empty commit.
HP=helm.sh/helm/v4/internal/version
HLDF="-s -w -X '$HP.version=$HELM_VERSION' -X '$HP.metadata=' -X '$HP.gitCommit=gomod-$HELM_VERSION'"
HLDF+=" -X '$HP.gitTreeState=clean'"

build helm helm helm.sh/helm/v4/cmd/helm "$HLDF"

# Smoke: the binary must at least print its version.
"$BIN_DIR/helm" version >&2 || die "helm version failed"

finish_build "helm=$HELM_VERSION"
