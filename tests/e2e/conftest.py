"""The e2e tier: Phalanx's service processes on a real kube-apiserver with kwok GPU nodes (and,
for the tests that ask, the real Job, JobSet, LeaderWorkerSet and MPI controllers: see
tests/kube/kubecontrollers.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "kube"))

from kubecontrollers import jobset_controller, kube_controller_manager, lws_controller, mpi_operator  # noqa: E402,F401
from kubeharness import kube, kube_api, kube_ns  # noqa: E402,F401
from sharedstack import stack4, stack4_shared, users_first  # noqa: E402,F401


def pytest_collection_modifyitems(items):
    """The modules that share ``stack4`` run one after another (tests/e2e/sharedstack.py)."""
    users_first(items, Path(__file__).parent)
