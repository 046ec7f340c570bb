"""The kubelet-harness tier: the device plugin against the kubelet's own device manager."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # dpkit: the shared builders


@pytest.fixture
def anyio_backend():
    return "asyncio"
