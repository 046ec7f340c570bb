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

die() { echo "build.sh: ERROR: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

# Version of MODULE as required in DIR/go.mod (require lines only, not replace lines).
modver() {
	local dir=$1 mod=$2 v
	v=$(awk -v m="$mod" '
		$1 == "require" && $2 == m && $3 ~ /^v/ { print $3; exit }
		$1 == m && $2 ~ /^v/ && $0 !~ /=>/      { print $2; exit }
	' "$HERE/$dir/go.mod")
	[[ -n "$v" ]] || die "cannot find the version of $mod in $HERE/$dir/go.mod"
	echo "$v"
}

JAEGER_VERSION=$(modver jaeger github.com/jaegertracing/jaeger)   # v1.76.0 (= Jaeger v2.13.0)
KEY="jaeger${JAEGER_VERSION}"
CACHE_ROOT=${PHALANX_TRACES_CACHE:-$HOME/.cache/phalanx-traces}
BIN_DIR="$CACHE_ROOT/$KEY"
MARKER="$BIN_DIR/.build-complete"
BINARIES=(jaeger)

FORCE=0
case "${1:-}" in
	--print-bin-dir) echo "$BIN_DIR"; exit 0 ;;
	--force) FORCE=1 ;;
	"") ;;
	-h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (use --print-bin-dir, --force or --help)" ;;
esac

complete() {
	[[ -f "$MARKER" ]] || return 1
	local b
	for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

if [[ $FORCE == 0 ]] && complete; then
	log "cached: $BIN_DIR ($(tr '\n' ' ' < "$MARKER"))"
	echo "$BIN_DIR"
	exit 0
fi

command -v go >/dev/null || die "go is not on PATH (need Go >= 1.26; the module says 'go 1.26.0')"
mkdir -p "$BIN_DIR" || die "cannot create $BIN_DIR"

# One builder at a time per cache dir; a second caller waits, then finds the cache complete.
exec 9>"$BIN_DIR/.lock"
if command -v flock >/dev/null; then
	flock 9 || die "cannot lock $BIN_DIR/.lock"
	if [[ $FORCE == 0 ]] && complete; then
		log "cached (built by a concurrent run): $BIN_DIR"
		echo "$BIN_DIR"
		exit 0
	fi
fi
rm -f "$MARKER"

log "building $KEY into $BIN_DIR with $(go version | awk '{print $3}')"
TOTAL_START=$SECONDS
SUMMARY=()

# build NAME MODULE_DIR PACKAGE LDFLAGS: go build into NAME.tmp, then rename (atomic).
build() {
	local name=$1 dir=$2 pkg=$3 ldflags=$4 start=$SECONDS secs
	log "[$name] go build $pkg (in tools/traces/$dir) ..."
	if ! (cd "$HERE/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
			-o "$BIN_DIR/$name.tmp" "$pkg") >&2; then
		rm -f "$BIN_DIR/$name.tmp"
		die "[$name] go build $pkg FAILED after $((SECONDS - start))s (see the go output above)"
	fi
	mv -f "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
	secs=$((SECONDS - start))
	SUMMARY+=("$(printf '%-15s %5ss  %s' "$name" "$secs" "$(du -h "$BIN_DIR/$name" | cut -f1)")")
	log "[$name] done in ${secs}s"
}

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

{
	echo "key=$KEY"
	echo "jaeger=$JAEGER_V2"
	echo "go=$(go version | awk '{print $3}')"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "seconds=$((SECONDS - TOTAL_START))"
} > "$MARKER.tmp"
mv -f "$MARKER.tmp" "$MARKER"

log "built in $((SECONDS - TOTAL_START))s total:"
for s in "${SUMMARY[@]}"; do log "  $s"; done
echo "$BIN_DIR"
