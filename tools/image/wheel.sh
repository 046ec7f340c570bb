#!/usr/bin/env bash
# Build the Phalanx wheel that the container image installs: the packages under proto/, libs/
# and services/; not fleet/ (the node fleet, the fake NVML), bench/, the tests or the examples.
#
#   tools/image/wheel.sh OUTDIR [SOURCE]   # SOURCE: the repository root (default: this checkout)
#
# The Dockerfile's build stage runs it; tests/packaging/test_wheel.py runs it too, then installs
# the wheel into a clean virtualenv and runs `phalanx --help` from there.
set -euo pipefail
out=${1:?usage: wheel.sh OUTDIR [SOURCE]}
src=${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
python=${PYTHON:-python3}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$src/pyproject.toml" "$src/README.md" "$stage/"
for d in proto libs services; do
	mkdir -p "$stage/$d"
	(cd "$src/$d" && find . -name __pycache__ -prune -o -name '*.egg-info' -prune -o -type f -print0 |
		xargs -0 cp --parents -t "$stage/$d")
done
mkdir -p "$out"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$out" "$stage"
ls "$out"/phalanx-*.whl
