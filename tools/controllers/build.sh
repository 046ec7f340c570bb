#!/usr/bin/env bash
# Build the workload controllers of the test control plane (the JobSet controller manager and
# the Kubeflow MPI Operator) from the Go modules in tools/controllers/{jobset,mpi-operator} into
# a cache OUTSIDE the work tree, with the CRDs and webhook manifests the fixtures install:
#
#   ${PHALANX_CONTROLLERS_CACHE:-$HOME/.cache/phalanx-controllers}/<version-key>/
#       jobset-controller mpi-operator .build-complete
#       manifests/jobset/...        exact files of sigs.k8s.io/jobset@<v>/config/components/...
#       manifests/mpi-operator/...  exact file of github.com/kubeflow/mpi-operator@<v>/manifests/base/...
#       manifests/SOURCES           module@version/path of every file above
#
# <version-key> comes from the wrapper go.mod files, e.g. jobset0.10.1-mpi0.6.0.
# kube-controller-manager (Job controller, garbage collector) is built by tools/kube/build.sh.
#
# Usage:
#   tools/controllers/build.sh                 build what is missing (skips when the cache is complete)
#   tools/controllers/build.sh --force         rebuild even when the cache is complete
#   tools/controllers/build.sh --print-bin-dir print the bin dir path and exit (builds nothing)
#
# Progress and timings go to stderr; the bin dir path is the only thing printed on
# stdout, as the last line, so `BIN=$(tools/controllers/build.sh)` works.
# Exit status is non-zero, with a "build.sh: ERROR" message, whenever a step fails.
#
# The machine's go env (GOPROXY, GOSUMDB, GOFLAGS, GOCACHE, GOMODCACHE) is used as is.
# On shared machines run it niced:  nice -n 19 tools/controllers/build.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../buildlib.sh
. "$HERE/../buildlib.sh"

JOBSET_VERSION=$(modver jobset sigs.k8s.io/jobset)                  # v0.10.1
MPI_VERSION=$(modver mpi-operator github.com/kubeflow/mpi-operator)  # v0.6.0
KEY="jobset${JOBSET_VERSION#v}-mpi${MPI_VERSION#v}"
CACHE_ROOT=${PHALANX_CONTROLLERS_CACHE:-$HOME/.cache/phalanx-controllers}
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(jobset-controller mpi-operator)
CACHE_FILES=(manifests/SOURCES)

begin_build "$@"

# The -X flags of each project's Makefile; without them the binaries report placeholders.
JLDF="-s -w -X 'sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION'"
JLDF+=" -X 'sigs.k8s.io/jobset/pkg/version.GitCommit=gomod-$JOBSET_VERSION'"
MP=github.com/kubeflow/mpi-operator/pkg/version
MLDF="-s -w -X '$MP.Version=$MPI_VERSION' -X '$MP.GitSHA=gomod-$MPI_VERSION' -X '$MP.Built=1970-01-01T00:00:00Z'"

build jobset-controller jobset       sigs.k8s.io/jobset "$JLDF"
build mpi-operator      mpi-operator .                  "$MLDF"

# The manifests come from the very module versions the binaries were built from.
copy_manifests() {
	local dest="$BIN_DIR/manifests" tmp="$BIN_DIR/manifests.tmp" jdir mdir f
	jdir=$(cd "$HERE/jobset" && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset) || die "jobset module not found"
	mdir=$(cd "$HERE/mpi-operator" && go list -m -f '{{.Dir}}' github.com/kubeflow/mpi-operator) \
		|| die "mpi-operator module not found"
	rm -rf "$tmp"
	mkdir -p "$tmp/jobset" "$tmp/mpi-operator"
	: > "$tmp/SOURCES"
	for f in config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml \
	         config/components/webhook/manifests.yaml \
	         config/components/webhook/patches/mutating-patch.yaml \
	         config/components/webhook/patches/validating-patch.yaml; do
		cp "$jdir/$f" "$tmp/jobset/$(basename "$f")" || die "missing $jdir/$f"
		echo "jobset/$(basename "$f") sigs.k8s.io/jobset@$JOBSET_VERSION/$f" >> "$tmp/SOURCES"
	done
	f=manifests/base/kubeflow.org_mpijobs.yaml
	cp "$mdir/$f" "$tmp/mpi-operator/$(basename "$f")" || die "missing $mdir/$f"
	echo "mpi-operator/$(basename "$f") github.com/kubeflow/mpi-operator@$MPI_VERSION/$f" >> "$tmp/SOURCES"
	chmod -R u+w,a+rX "$tmp"   # module cache files are read-only
	rm -rf "$dest"
	mv "$tmp" "$dest"
	log "[manifests] copied from the module cache (see $dest/SOURCES)"
}
copy_manifests

# Smoke: every binary must at least run (the JobSet manager has no --version; its --help
# lists its flags and exits 0).
help=$("$BIN_DIR/jobset-controller" --help 2>&1) || die "jobset-controller --help failed: $help"
[[ $help == *-leader-elect* ]] || die "jobset-controller --help lacks -leader-elect: $help"
"$BIN_DIR/mpi-operator" --version >&2 || die "mpi-operator --version failed"

finish_build "jobset=$JOBSET_VERSION" "mpi-operator=$MPI_VERSION"
