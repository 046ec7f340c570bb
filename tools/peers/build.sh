#!/usr/bin/env bash
# Build the upstream peers bench/peers.py runs beside Phalanx, from the Go modules in
# tools/peers/{k8s,kueue}, into a cache OUTSIDE the work tree:
#
#   ${PHALANX_PEERS_CACHE:-$HOME/.cache/phalanx-peers}/<version-key>/
#       kube-apiserver kube-scheduler kube-controller-manager   k8s.io/kubernetes (Workload API, gangs)
#       kueue                                                   sigs.k8s.io/kueue/cmd/kueue
#       manifests/kueue/*.yaml   the CRDs and webhook manifests of that Kueue version
#       manifests/SOURCES        module@version/path of every file above
#       .build-complete
#
# <version-key> comes from the wrapper go.mod files, e.g. v1.37.2-kueue0.17.0. etcd and kwok
# come from tools/kube/build.sh. Not part of `make test`: `make peers` runs this, and
# bench/peers.py runs it on demand.
#
# Usage:
#   tools/peers/build.sh                 build what is missing (skips when the cache is complete)
#   tools/peers/build.sh --force         rebuild even when the cache is complete
#   tools/peers/build.sh --print-bin-dir print the bin dir path and exit (builds nothing)
#
# Progress and timings go to stderr; the bin dir path is the only thing printed on
# stdout, as the last line, so `BIN=$(tools/peers/build.sh)` works.
# Exit status is non-zero, with a "build.sh: ERROR" message, whenever a step fails.
#
# The machine's go env (GOPROXY, GOSUMDB, GOFLAGS, GOCACHE, GOMODCACHE) is used as is.
# On shared machines run it niced:  nice -n 19 tools/peers/build.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../buildlib.sh
. "$HERE/../buildlib.sh"

KUBE_VERSION=$(modver k8s k8s.io/kubernetes)   # v1.37.2
KUEUE_VERSION=$(modver kueue sigs.k8s.io/kueue) # v0.17.0
KEY="${KUBE_VERSION}-kueue${KUEUE_VERSION#v}"
CACHE_ROOT=${PHALANX_PEERS_CACHE:-$HOME/.cache/phalanx-peers}
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kueue)
CACHE_FILES=(manifests/SOURCES)

begin_build "$@"

# The ldflags of upstream hack/lib/version.sh (Kubernetes) and Kueue's Makefile, else the
# binaries report placeholders.
KMAJ=${KUBE_VERSION#v}; KMAJ=${KMAJ%%.*}
KMIN=${KUBE_VERSION#v*.}; KMIN=${KMIN%%.*}
KLDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	KLDF+=" -X '$p.gitVersion=$KUBE_VERSION' -X '$p.gitMajor=$KMAJ' -X '$p.gitMinor=$KMIN'"
	KLDF+=" -X '$p.gitTreeState=clean' -X '$p.buildDate=1970-01-01T00:00:00Z'"
done
QLDF="-s -w -X 'sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION'"
QLDF+=" -X 'sigs.k8s.io/kueue/pkg/version.GitCommit=gomod-$KUEUE_VERSION'"

build kube-apiserver          k8s   k8s.io/kubernetes/cmd/kube-apiserver          "$KLDF"
build kube-scheduler          k8s   k8s.io/kubernetes/cmd/kube-scheduler          "$KLDF"
build kube-controller-manager k8s   k8s.io/kubernetes/cmd/kube-controller-manager "$KLDF"
build kueue                   kueue sigs.k8s.io/kueue/cmd/kueue                   "$QLDF"

# The manifests come from the very module version the binary was built from.
copy_manifests() {
	local dest="$BIN_DIR/manifests" tmp="$BIN_DIR/manifests.tmp" qdir f
	qdir=$(cd "$HERE/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue) || die "kueue module not found"
	rm -rf "$tmp"
	mkdir -p "$tmp/kueue"
	: > "$tmp/SOURCES"
	for f in "$qdir"/config/components/crd/bases/*.yaml config/components/webhook/manifests.yaml; do
		f=${f#"$qdir/"}
		cp "$qdir/$f" "$tmp/kueue/$(basename "$f")" || die "missing $qdir/$f"
		echo "kueue/$(basename "$f") sigs.k8s.io/kueue@$KUEUE_VERSION/$f" >> "$tmp/SOURCES"
	done
	chmod -R u+w,a+rX "$tmp"   # module cache files are read-only
	rm -rf "$dest"
	mv "$tmp" "$dest"
	log "[manifests] copied from the module cache (see $dest/SOURCES)"
}
copy_manifests

# Smoke: every binary must at least run.
"$BIN_DIR/kube-apiserver" --version >&2 || die "kube-apiserver --version failed"
"$BIN_DIR/kube-scheduler" --version >&2 || die "kube-scheduler --version failed"
"$BIN_DIR/kube-controller-manager" --version >&2 || die "kube-controller-manager --version failed"
help=$("$BIN_DIR/kueue" --help 2>&1) || die "kueue --help failed: $help"
[[ $help == *-config* ]] || die "kueue --help lacks -config: $help"

finish_build "kubernetes=$KUBE_VERSION" "kueue=$KUEUE_VERSION"
