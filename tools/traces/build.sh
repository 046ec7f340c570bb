#!/usr/bin/env bash
# Build the trace receiver for tests/traces (Jaeger v2: OTLP receiver, in-memory store, query
# API) from the Go module in tools/traces/jaeger into a cache OUTSIDE the work tree:
#
#   ${PHALANX_TRACES_CACHE:-$HOME/.cache/phalanx-traces}/<version-key>/
#       jaeger .build-complete
#
# <version-key> is the jaeger module version required in tools/traces/jaeger/go.mod, e.g.
# v1.76.0 (Jaeger's Go module versions are v1.x; v1.76.0 is the release tagged v2.13.0).
#
# Usage:
#   tools/traces/build.sh                 build what is missing (skips when the cache is complete)
#   tools/traces/build.sh --force         rebuild even when the cache is complete
#   tools/traces/build.sh --print-bin-dir print the bin dir path and exit (builds nothing)
#
# Progress and timings go to stderr; the bin dir path is the only thing printed on
# stdout, as the last line, so `BIN=$(tools/traces/build.sh)` works.
# Exit status is non-zero, with a "build.sh: ERROR" message, whenever a step fails.
#
# The machine's go env (GOPROXY, GOSUMDB, GOFLAGS, GOCACHE, GOMODCACHE) is used as is.
# On shared machines run it niced:  nice -n 19 tools/traces/build.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../buildlib.sh
. "$HERE/../buildlib.sh"

JAEGER_VERSION=$(modver jaeger github.com/jaegertracing/jaeger)   # v1.76.0 (= Jaeger v2.13.0)
KEY="jaeger${JAEGER_VERSION}"
CACHE_ROOT=${PHALANX_TRACES_CACHE:-$HOME/.cache/phalanx-traces}
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(jaeger)

begin_build "$@"

# The -X flags of jaeger's scripts/makefiles/BuildInfo.mk (BUILD_INFO_V2); without them the
# binary reports an empty version. The v2 tag of module version v1.N.0 is v2.(N-63).0.
JMIN=${JAEGER_VERSION#v1.}; JMIN=${JMIN%%.*}
JAEGER_V2="v2.$((JMIN - 63)).0"
JP=github.com/jaegertracing/jaeger/internal/version
JLDF="-s -w -X '$JP.latestVersion=$JAEGER_V2' -X '$JP.commitSHA=gomod-$JAEGER_VERSION'"
JLDF+=" -X '$JP.date=1970-01-01T00:00:00Z'"

build jaeger jaeger github.com/jaegertracing/jaeger/cmd/jaeger "$JLDF"

# Smoke: the binary must at least print its version.
"$BIN_DIR/jaeger" version >&2 || die "jaeger version failed"

finish_build "jaeger=$JAEGER_V2"
