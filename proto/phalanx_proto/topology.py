"""The node topology model as it travels on the wire and sits in KV ``phx-topology``.

A node's topology is a frozen value with a ``generation`` that increases whenever the
discovered hardware changes (style rule 4). The parser in ``phalanx_topology`` and the NVML
adapter both produce it; placement only ever reads it.

Relations between devices are kept exactly as ``nvidia-smi topo -m`` names them
(``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``); ``phalanx_topology.links`` turns
them into the ordered link classes placement compares.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Vendor = Literal["nvidia", "amd", "ppu"]


class Gpu(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU of a node. ``name`` is the device name used in the matrix (``GPU0``)."""

    index: Annotated[int, msgspec.Meta(ge=0)]
    name: str
    uuid: str = ""
    vendor: Vendor = "nvidia"
    model: str = ""
    memory_mib: Annotated[int, msgspec.Meta(ge=0)] = 0
    mig_capable: bool = False
    mig_enabled: bool = False
    numa: int = -1
    """NUMA domain id; -1 when unknown."""
    cpu_affinity: str = ""
    """CPU list in ``nvidia-smi`` / sysfs ``cpulist`` form (``0-11,24-35``); empty when unknown."""
    pci_bus_id: str = ""
    """Canonical sysfs form, lower case: ``0000:07:00.0``."""
    socket: int = -1
    """CPU package id (sysfs ``physical_package_id``); -1 when unknown (a matrix does not show it)."""


class Nic(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One network device (an RDMA HCA such as ``mlx5_0``)."""

    name: str
    """The name used as key in ``relations`` (``mlx5_0``, or ``NIC0`` as newer nvidia-smi prints)."""
    rdma: bool = True
    pci_bus_id: str = ""
    numa: int = -1
    cpu_affinity: str = ""
    device: str = ""
    """The RDMA device name (``/sys/class/infiniband/<device>``, what a pod is given), when known:
    from the matrix's ``NIC Legend`` (``NIC0: mlx5_0``) or the name itself; empty when unknown."""
    socket: int = -1


class NodeTopology(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything placement needs to know about one node's devices.

    ``relations[a][b]`` is the nvidia-smi relation string between devices ``a`` and ``b``
    (keyed by ``Gpu.name`` / ``Nic.name``); it is symmetric and has no self entries.
    ``nvswitch`` is true when the GPUs reach each other through an NVSwitch fabric, in which
    case every GPU pair is all-to-all at full fabric bandwidth.
    """

    node: str
    generation: Annotated[int, msgspec.Meta(ge=0)] = 0
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    relations: dict[str, dict[str, str]] = {}
    nvswitch: bool = False
    source: str = ""
    """Where the model came from: ``nvml``, ``topo-matrix:<file>``, ``yaml:<file>``."""

    def relation(self, a: str, b: str) -> str:
        """The relation string between two devices, ``X`` for a device and itself."""
        if a == b:
            return "X"
        return self.relations[a][b]


class NetworkTiers(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The network domains a node belongs to, smallest first: node < HyperNode < leaf switch <
    network-pod (R8). A node without tier labels is its own domain at every tier
    (``node:<name>``), filled in by ``phalanx_topology.tiers``."""

    hypernode: str = ""
    leaf: str = ""
    netpod: str = ""
