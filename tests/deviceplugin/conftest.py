"""The kubelet-harness tier: the device plugin against the kubelet's own device manager."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # dpkit: the shared builders
sys.path.insert(0, str(Path(__file__).parents[1] / "kube"))

from kubeharness import kube, kube_api  # noqa: E402,F401


@pytest.fixture
def anyio_backend():
    return "asyncio"
