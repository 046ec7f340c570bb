"""The node topology model as it travels on the wire and sits in KV ``phx-topology``.

A node's topology is a frozen value with a ``generation`` that increases whenever the
discovered hardware changes (style rule 4). The parser in ``phalanx_topology`` and the NVML
adapter both produce it; placement only ever reads it.

Relations between devices are kept exactly as ``nvidia-smi topo -m`` names them
(``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``); ``phalanx_topology.links`` turns
them into the ordered link classes placement compares.

A report is written by one node's agent and believed by placement and binder, so it is data
to check, never a precondition of their code: the field bounds below refuse a value at decode
(``Meta``), and ``topology_problem`` checks what a field alone cannot say (names unique,
relations complete, symmetric and known). Every reader of the wire form and every file reader
(``phalanx_topology``) applies the same rules.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

Vendor = Literal["nvidia", "amd", "ppu"]

MAX_GPUS = 64
"""The most GPUs one node has (GPU servers hold 16 at most today); GPU indices are below it."""
MAX_NICS = 64
"""The most network devices one node's topology lists."""
MAX_GPU_MEMORY_MIB = 1024 * 1024
"""No GPU has more than 1 TiB of memory (the largest hold 288 GB)."""
MAX_NUMA = 1024
"""Linux's largest MAX_NUMNODES: NUMA ids are below it (-1 means unknown)."""
MAX_SOCKETS = 1024
"""CPU package ids are below it (-1 means unknown)."""
MAX_DIRECT_NVLINKS = 18
"""The most NVLinks one GPU has (H100, B200), so the largest ``NV<k>`` a pair may show."""
MAX_GENERATION = 2**53
NODE_NAME_MAX = 253
"""A Node's name is a DNS-1123 subdomain."""
LABEL_VALUE_MAX = 320
"""A tier label's value (63 characters) or the ``node:<name>`` a node without one gets."""

DeviceName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Text = Annotated[str, msgspec.Meta(max_length=256)]
CpuList = Annotated[str, msgspec.Meta(max_length=4096, pattern=r"^[0-9,-]*$")]
Numa = Annotated[int, msgspec.Meta(ge=-1, lt=MAX_NUMA)]
Socket = Annotated[int, msgspec.Meta(ge=-1, lt=MAX_SOCKETS)]
NodeName = Annotated[str, msgspec.Meta(min_length=1, max_length=NODE_NAME_MAX)]
Relation = Annotated[str, msgspec.Meta(max_length=8)]


class Gpu(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU of a node. ``name`` is the device name used in the matrix (``GPU0``)."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)]
    name: DeviceName
    uuid: Text = ""
    vendor: Vendor = "nvidia"
    model: Text = ""
    memory_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_MEMORY_MIB)] = 0
    mig_capable: bool = False
    mig_enabled: bool = False
    numa: Numa = -1
    """NUMA domain id; -1 when unknown."""
    cpu_affinity: CpuList = ""
    """CPU list in ``nvidia-smi`` / sysfs ``cpulist`` form (``0-11,24-35``); empty when unknown."""
    pci_bus_id: Text = ""
    """Canonical sysfs form, lower case: ``0000:07:00.0``."""
    socket: Socket = -1
    """CPU package id (sysfs ``physical_package_id``); -1 when unknown (a matrix does not show it)."""


class Nic(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One network device (an RDMA HCA such as ``mlx5_0``)."""

    name: DeviceName
    """The name used as key in ``relations`` (``mlx5_0``, or ``NIC0`` as newer nvidia-smi prints)."""
    rdma: bool = True
    pci_bus_id: Text = ""
    numa: Numa = -1
    cpu_affinity: CpuList = ""
    device: Text = ""
    """The RDMA device name (``/sys/class/infiniband/<device>``, what a pod is given), when known:
    from the matrix's ``NIC Legend`` (``NIC0: mlx5_0``) or the name itself; empty when unknown."""
    socket: Socket = -1


class NodeTopology(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything placement needs to know about one node's devices.

    ``relations[a][b]`` is the nvidia-smi relation string between devices ``a`` and ``b``
    (keyed by ``Gpu.name`` / ``Nic.name``); it is symmetric and has no self entries.
    ``nvswitch`` is true when the GPUs reach each other through an NVSwitch fabric, in which
    case every GPU pair is all-to-all at full fabric bandwidth.
    """

    node: NodeName
    generation: Annotated[int, msgspec.Meta(ge=0, le=MAX_GENERATION)] = 0
    gpus: Annotated[tuple[Gpu, ...], msgspec.Meta(max_length=MAX_GPUS)] = ()
    nics: Annotated[tuple[Nic, ...], msgspec.Meta(max_length=MAX_NICS)] = ()
    relations: Annotated[dict[DeviceName, Annotated[dict[DeviceName, Relation],
                                                    msgspec.Meta(max_length=MAX_GPUS + MAX_NICS)]],
                         msgspec.Meta(max_length=MAX_GPUS + MAX_NICS)] = {}
    nvswitch: bool = False
    source: Annotated[str, msgspec.Meta(max_length=4096)] = ""
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

    hypernode: Annotated[str, msgspec.Meta(max_length=LABEL_VALUE_MAX)] = ""
    leaf: Annotated[str, msgspec.Meta(max_length=LABEL_VALUE_MAX)] = ""
    netpod: Annotated[str, msgspec.Meta(max_length=LABEL_VALUE_MAX)] = ""


_NV = re.compile(r"NV([1-9][0-9]?)")
PCIE_RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""PCIe relations, nearest first (nvidia-smi's legend)."""


def relation_problem(relation: str) -> str:
    """Why ``relation`` is not a relation between two devices, or "": ``NV<k>`` with ``k`` from
    1 to ``MAX_DIRECT_NVLINKS``, or one of ``PCIE_RELATIONS``."""
    if relation in PCIE_RELATIONS:
        return ""
    m = _NV.fullmatch(relation)
    if m and int(m.group(1)) <= MAX_DIRECT_NVLINKS:
        return ""
    return (f"unknown relation {relation[:16]!r} (NV1..NV{MAX_DIRECT_NVLINKS}, "
            f"{', '.join(PCIE_RELATIONS)})")


def topology_problem(t: NodeTopology) -> str:
    """Why ``t`` cannot be one node's topology, or "" when it keeps every rule a field alone
    cannot state: device names unique across GPUs and NICs, GPU indices unique, and
    ``relations`` naming exactly the devices, one known relation for every pair of distinct
    devices, the same both ways, and none from a device to itself."""
    names = [g.name for g in t.gpus] + [n.name for n in t.nics]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        return f"device name(s) {', '.join(map(repr, twice[:3]))} listed twice: each device has its own name"
    indices = [g.index for g in t.gpus]
    if len(set(indices)) != len(indices):
        return f"GPU indices {sorted(indices)}: each is listed once"
    known = set(names)
    stray = sorted(set(t.relations) - known) or sorted({b for row in t.relations.values() for b in row} - known)
    if stray:
        return f"relations name {stray[0][:64]!r}, which is no GPU or NIC of the node"
    for i, a in enumerate(names):
        row = t.relations.get(a, {})
        if a in row:
            return f"relations[{a!r}] relates the device to itself"
        for b in names[i + 1:]:
            ab, ba = row.get(b), t.relations.get(b, {}).get(a)
            if ab is None or ba is None:
                return f"relations lack {a}–{b}: every pair of devices has a relation"
            why = relation_problem(ab)
            if why:
                return f"relations[{a!r}][{b!r}]: {why}"
            if ab != ba:
                return f"relations: {a}–{b} is {ab} but {b}–{a} is {ba[:16]}: the matrix is symmetric"
    return ""
