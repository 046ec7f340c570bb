#!/usr/bin/env bash
# Build the test control plane (kube-apiserver, kube-scheduler, etcd, kwok) from the
# Go modules in tools/kube/{k8s,etcd,kwok} into a cache OUTSIDE the work tree:
#
#   ${PHALANX_KUBE_CACHE:-$HOME/.cache/phalanx-kube}/<version-key>/
#       kube-apiserver kube-scheduler etcd kwok .build-complete
#
# <version-key> is derived from the wrapper go.mod files, e.g. v1.36.3-etcd3.6.16-kwok0.8.0.
#
# Usage:
#   tools/kube/build.sh                 build what is missing (skips when the cache is complete)
#   tools/kube/build.sh --force         rebuild even when the cache is complete
#   tools/kube/build.sh --print-bin-dir print the bin dir path and exit (builds nothing)
#
# Progress and timings go to stderr; the bin dir path is the only thing printed on
# stdout, as the last line, so `BIN=$(tools/kube/build.sh)` works.
# Exit status is non-zero, with a "build.sh: ERROR" message, whenever a step fails.
#
# The machine's go env (GOPROXY, GOSUMDB, GOFLAGS, GOCACHE, GOMODCACHE) is used as is.
# On shared machines run it niced:  nice -n 19 tools/kube/build.sh
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

KUBE_VERSION=$(modver k8s k8s.io/kubernetes)          # v1.36.3
ETCD_VERSION=$(modver etcd go.etcd.io/etcd/server/v3)  # v3.6.16
KWOK_VERSION=$(modver kwok sigs.k8s.io/kwok)           # v0.8.0
KEY="${KUBE_VERSION}-etcd${ETCD_VERSION#v}-kwok${KWOK_VERSION#v}"
CACHE_ROOT=${PHALANX_KUBE_CACHE:-$HOME/.cache/phalanx-kube}
BIN_DIR="$CACHE_ROOT/$KEY"
MARKER="$BIN_DIR/.build-complete"
BINARIES=(kube-apiserver kube-scheduler etcd kwok)

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

command -v go >/dev/null || die "go is not on PATH (need Go >= 1.26; the modules say 'go 1.26.0')"
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
	log "[$name] go build $pkg (in tools/kube/$dir) ..."
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

# kube-apiserver / kube-scheduler: the ldflags of upstream hack/lib/version.sh, else the
# binaries report v0.0.0-master+$Format:%H$.
KMAJ=${KUBE_VERSION#v}; KMAJ=${KMAJ%%.*}
KMIN=${KUBE_VERSION#v*.}; KMIN=${KMIN%%.*}
KLDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	KLDF+=" -X '$p.gitVersion=$KUBE_VERSION' -X '$p.gitMajor=$KMAJ' -X '$p.gitMinor=$KMIN'"
	KLDF+=" -X '$p.gitTreeState=clean' -X '$p.buildDate=1970-01-01T00:00:00Z'"
done
# etcd already carries its version (api/v3/version.Version); GitSHA is only cosmetic.
ELDF="-s -w -X 'go.etcd.io/etcd/api/v3/version.GitSHA=gomod-$ETCD_VERSION'"
# kwok: the -X its hack/releases.sh uses; the source default has the same form ("0.8.0").
WLDF="-s -w -X 'sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}'"

build kube-apiserver k8s  k8s.io/kubernetes/cmd/kube-apiserver "$KLDF"
build kube-scheduler k8s  k8s.io/kubernetes/cmd/kube-scheduler "$KLDF"
build etcd           etcd go.etcd.io/etcd/server/v3            "$ELDF"
build kwok           kwok sigs.k8s.io/kwok/cmd/kwok            "$WLDF"

# Smoke: every binary must at least print its version.
"$BIN_DIR/kube-apiserver" --version >&2 || die "kube-apiserver --version failed"
"$BIN_DIR/kube-scheduler" --version >&2 || die "kube-scheduler --version failed"
"$BIN_DIR/etcd" --version >&2           || die "etcd --version failed"
"$BIN_DIR/kwok" --version >&2           || die "kwok --version failed"

{
	echo "key=$KEY"
	echo "go=$(go version | awk '{print $3}')"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "seconds=$((SECONDS - TOTAL_START))"
} > "$MARKER.tmp"
mv -f "$MARKER.tmp" "$MARKER"

log "built in $((SECONDS - TOTAL_START))s total:"
for s in "${SUMMARY[@]}"; do log "  $s"; done
echo "$BIN_DIR"
