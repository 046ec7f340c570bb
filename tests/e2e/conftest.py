"""The e2e tier: Phalanx's service processes on a real kube-apiserver with kwok GPU nodes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "kube"))

from kubeharness import kube, kube_api, kube_ns  # noqa: E402,F401
