#!/usr/bin/env bash
# Build dm-harness (harness/main.go): the kubelet's device manager and PodResources server from
# k8s.io/kubernetes v1.36.3, driven over stdin by tests/deviceplugin. The binary is cached OUTSIDE
# the work tree:
#
#   ${PHALANX_KUBE_CACHE:-$HOME/.cache/phalanx-kube}/dm-harness-<kube version>-<source digest>/
#       dm-harness .build-complete
#
# <source digest> covers go.mod, go.sum and harness/, so an edit rebuilds. The module pins the
# versions of tools/kube/k8s, so the Go build cache is shared with the kube-apiserver build.
# The harness reaches the manager's unexported constructor (socket path of our choosing, as the
# package's own tests build it) through go:linkname, so no root and no mount namespace are needed.
#
# Usage:
#   tools/devicemanager/build.sh                 build what is missing (skips when cached)
#   tools/devicemanager/build.sh --force         rebuild even when cached
#   tools/devicemanager/build.sh --print-bin-dir print the bin dir path and exit (builds nothing)
#
# Progress and timings go to stderr; stdout's last line is the bin dir.
# On shared machines run it niced:  nice -n 19 tools/devicemanager/build.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../buildlib.sh
. "$HERE/../buildlib.sh"

KUBE_VERSION=$(modver . k8s.io/kubernetes)   # v1.36.3
DIGEST=$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE"/harness/* | sha256sum | cut -c1-12)
KEY="dm-harness-${KUBE_VERSION}-${DIGEST}"
CACHE_ROOT=${PHALANX_KUBE_CACHE:-$HOME/.cache/phalanx-kube}
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(dm-harness)

begin_build "$@"

build dm-harness . ./harness "-s -w"

# Smoke: start a device manager through the linked constructor on a temp dir and ask for its
# capacity (none: no plugin registered); EOF on stdin stops it.
SMOKE=$(mktemp -d)
out=$(printf '{"op":"capacity"}\n' | "$BIN_DIR/dm-harness" --socket-dir "$SMOKE/dp" \
	--pod-resources-socket "$SMOKE/pr.sock" 2>"$SMOKE/stderr") || { cat "$SMOKE/stderr" >&2; rm -rf "$SMOKE"; die "dm-harness smoke run failed"; }
rm -rf "$SMOKE"
[[ "$out" == *'"ready":true'*'"ok":true'* ]] || die "dm-harness smoke run answered: $out"

finish_build "kubernetes=$KUBE_VERSION"
