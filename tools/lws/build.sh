#!/usr/bin/env bash
# Build the LeaderWorkerSet controller manager of the test control plane from the Go module in
# tools/lws into a cache OUTSIDE the work tree, with the CRD and webhook manifests the fixture
# installs:
#
#   ${PHALANX_LWS_CACHE:-$HOME/.cache/phalanx-lws}/lws<version>/
#       lws-controller .build-complete
#       manifests/...        exact files of sigs.k8s.io/lws@<v>/config/{crd/bases,webhook}/...
#       manifests/SOURCES    module@version/path of every file above
#
# Its own cache (not tools/controllers'), so adding it rebuilds nothing else.
#
# Usage:
#   tools/lws/build.sh                 build what is missing (skips when the cache is complete)
#   tools/lws/build.sh --force         rebuild even when the cache is complete
#   tools/lws/build.sh --print-bin-dir print the bin dir path and exit (builds nothing)
#
# Progress and timings go to stderr; the bin dir path is the only thing printed on stdout, as
# the last line. Exit status is non-zero, with a "build.sh: ERROR" message, whenever a step fails.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../buildlib.sh
. "$HERE/../buildlib.sh"

LWS_VERSION=$(modver . sigs.k8s.io/lws)   # v0.8.0
KEY="lws${LWS_VERSION#v}"
CACHE_ROOT=${PHALANX_LWS_CACHE:-$HOME/.cache/phalanx-lws}
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(lws-controller)
CACHE_FILES=(manifests/SOURCES)

begin_build "$@"

# The -X flags of the project's Makefile; without them the binary reports placeholders.
LDF="-s -w -X 'sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION' -X 'sigs.k8s.io/lws/pkg/version.GitCommit=gomod-$LWS_VERSION'"
build lws-controller . sigs.k8s.io/lws/cmd "$LDF"

copy_manifests() {
	local dest="$BIN_DIR/manifests" tmp="$BIN_DIR/manifests.tmp" dir f
	dir=$(cd "$HERE" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws) || die "lws module not found"
	rm -rf "$tmp"
	mkdir -p "$tmp"
	: > "$tmp/SOURCES"
	for f in config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml \
	         config/webhook/manifests.yaml config/webhook/mutating-patch.yaml config/webhook/validating-patch.yaml; do
		cp "$dir/$f" "$tmp/$(basename "$f")" || die "missing $dir/$f"
		echo "$(basename "$f") sigs.k8s.io/lws@$LWS_VERSION/$f" >> "$tmp/SOURCES"
	done
	chmod -R u+w,a+rX "$tmp"   # module cache files are read-only
	rm -rf "$dest"
	mv "$tmp" "$dest"
	log "[manifests] copied from the module cache (see $dest/SOURCES)"
}
copy_manifests

"$BIN_DIR/lws-controller" --version >&2 || die "lws-controller --version failed"

finish_build "lws=$LWS_VERSION"
