"""The port topology-discovery reads a node's hardware through (style rule 1: one small
Protocol). ``phalanx_nvml.adapter.NvmlDiscovery`` is the real adapter; tests run that same
adapter on ``phalanx_nvmlfake.nvml.FakeNvml`` instead of the NVIDIA driver."""

from __future__ import annotations

from typing import Protocol

from phalanx_proto.topology import NodeTopology


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver, no library, no permission)."""


class DiscoveryError(RuntimeError):
    """NVML answered, but with something the model cannot represent (a broken invariant)."""


class TopologySource(Protocol):
    def discover(self, node: str) -> NodeTopology:
        """The node's current topology. Deterministic for unchanged hardware, so a caller can
        compare two results to detect a change. Raises ``NvmlUnavailable`` or ``DiscoveryError``."""
        ...
