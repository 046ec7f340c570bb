"""Fixtures of the Kubernetes tier: the shared control plane (see kubeharness.py) and the real
workload controllers on it (see kubecontrollers.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kubecontrollers import jobset_controller, kube_controller_manager, mpi_operator  # noqa: E402,F401
from kubeharness import kube, kube_api, kube_ns, kube_scheduler  # noqa: E402,F401


@pytest.fixture
def anyio_backend():
    return "asyncio"
