"""Reading a node's hardware: the ``TopologySource`` port, its NVML adapter, and a fake NVML
for tests and the simulator. ``pynvml`` is imported only inside this package (an
import-linter contract holds the rest of the tree to that)."""

from phalanx_nvml.adapter import NvmlDiscovery
from phalanx_nvml.mig import MigDevices, MigError, MigInstanceInfo, NvmlMig
from phalanx_nvml.port import DiscoveryError, NvmlUnavailable, TopologySource

__all__ = ["DiscoveryError", "MigDevices", "MigError", "MigInstanceInfo", "NvmlDiscovery", "NvmlMig", "NvmlUnavailable",
           "TopologySource"]
