"""GPU health for the device plugin's ``ListAndWatch``: which GPUs NVML can no longer use.

A GPU is unhealthy when NVML cannot find it by UUID or a basic query on it fails (fallen off
the bus, ``GPU_IS_LOST``, an XID that took it down); when NVML itself cannot start, every GPU
is. Tests run the same code on ``phalanx_nvmlfake.nvml.FakeNvml`` (``lost`` marks GPUs as gone).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pynvml


class NvmlHealth:
    """``unhealthy(uuids)`` over NVML (``nvml`` is pynvml, or a fake with its functions)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = pynvml if nvml is None else nvml

    def unhealthy(self, uuids: Iterable[str]) -> frozenset[str]:
        """The UUIDs among ``uuids`` that NVML cannot use right now."""
        nvml, wanted = self._nvml, tuple(uuids)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return frozenset(wanted)
        bad = set()
        try:
            for uuid in wanted:
                try:
                    nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByUUID(uuid))
                except nvml.NVMLError:
                    bad.add(uuid)
        finally:
            nvml.nvmlShutdown()
        return frozenset(bad)
