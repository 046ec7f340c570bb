#!/usr/bin/env bash
# Build the test control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd,
# kwok) from the Go modules in tools/kube/{k8s,etcd,kwok} into a cache OUTSIDE the work tree:
#
#   ${PHALANX_KUBE_CACHE:-$HOME/.cache/phalanx-kube}/<version-key>/
#       kube-apiserver kube-controller-manager kube-scheduler etcd kwok .build-complete
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
# shellcheck source=../buildlib.sh
. "$HERE/../buildlib.sh"

KUBE_VERSION=$(modver k8s k8s.io/kubernetes)          # v1.36.3
ETCD_VERSION=$(modver etcd go.etcd.io/etcd/server/v3)  # v3.6.16
KWOK_VERSION=$(modver kwok sigs.k8s.io/kwok)           # v0.8.0
KEY="${KUBE_VERSION}-etcd${ETCD_VERSION#v}-kwok${KWOK_VERSION#v}"
CACHE_ROOT=${PHALANX_KUBE_CACHE:-$HOME/.cache/phalanx-kube}
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)

begin_build "$@"

# kube-apiserver / kube-scheduler / kube-controller-manager: the ldflags of upstream hack/lib/version.sh, else the
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
build kube-controller-manager k8s k8s.io/kubernetes/cmd/kube-controller-manager "$KLDF"
build etcd           etcd go.etcd.io/etcd/server/v3            "$ELDF"
build kwok           kwok sigs.k8s.io/kwok/cmd/kwok            "$WLDF"

# Smoke: every binary must at least print its version.
"$BIN_DIR/kube-apiserver" --version >&2 || die "kube-apiserver --version failed"
"$BIN_DIR/kube-scheduler" --version >&2 || die "kube-scheduler --version failed"
"$BIN_DIR/kube-controller-manager" --version >&2 || die "kube-controller-manager --version failed"
"$BIN_DIR/etcd" --version >&2           || die "etcd --version failed"
"$BIN_DIR/kwok" --version >&2           || die "kwok --version failed"

finish_build
