"""The contract tier: one ``ClusterPort`` suite, run on the simulator and on the real API."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "kube"))

from kubeharness import kube, kube_api, kube_ns  # noqa: E402,F401


@pytest.fixture
def anyio_backend():
    return "asyncio"
