"""Fixtures of the Kubernetes tier: the shared control plane (see kubeharness.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kubeharness import kube, kube_api, kube_ns, kube_scheduler  # noqa: E402,F401


@pytest.fixture
def anyio_backend():
    return "asyncio"
