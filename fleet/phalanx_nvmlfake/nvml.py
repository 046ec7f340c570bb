"""A fake NVML driven by a ``NodeTopology``, so the real adapter's code runs in CI.

``FakeNvml`` has the pynvml functions the adapter calls, under the same names, returning the
same shapes (``nvmlPciInfo_t``, ``c_nvmlMemory_t``, ctypes CPU masks) and raising pynvml's own
``NVMLError`` with pynvml's constants, so nothing can drift from the real module.
``FakeMachine.from_topology`` turns a model (say, parsed from a real ``nvidia-smi topo -m``)
into fake hardware: PCI addresses and a PCIe tree (``fake_pci``), NVLinks to peer GPUs or to
NVSwitches, UUIDs; ``write_sysfs`` lays out the matching ``/sys`` for the NICs.

``FakeMachine.expected`` is the model the adapter must discover on that hardware: the input
model with the identities the hardware adds (PCI bus ids, UUIDs, NICs named by their RDMA
device, ``source="nvml"``). Tests and the simulator use this; nothing ships it to a node.
"""

from __future__ import annotations

import ctypes
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pynvml

from phalanx_nvml.pcie import natural_key, normalize_bus_id
from phalanx_nvmlfake import pci as fake_pci
from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology.links import nvlink_count
from phalanx_topology.model import parse_cpulist

_LEVEL = {"PIX": pynvml.NVML_TOPOLOGY_SINGLE, "PXB": pynvml.NVML_TOPOLOGY_MULTIPLE,
          "PHB": pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "NODE": pynvml.NVML_TOPOLOGY_NODE,
          "SYS": pynvml.NVML_TOPOLOGY_SYSTEM}
_SWITCHES = 4
"""NVSwitch chips a faked fabric spreads each GPU's links over (an HGX H100 board has 4)."""


@dataclass(frozen=True, slots=True)
class _Link:
    remote_bus_id: str
    remote_type: int


@dataclass(frozen=True, slots=True)
class FakeGpu:
    gpu: Gpu
    """As NVML reports it (uuid and bus id filled in)."""
    path: tuple[str, ...]
    links: tuple[_Link, ...]


@dataclass(frozen=True, slots=True)
class FakeNic:
    nic: Nic
    """As the adapter reports it: named by its RDMA device, bus id filled in."""
    path: tuple[str, ...]


def gpu_uuid(node: str, gpu: str) -> str:
    """A stable UUID in NVML's ``GPU-…`` form for GPU ``gpu`` (``GPU<index>``) of ``node``, for a
    model that has none; the fake MIG NVML of the same node reports the same one."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.{gpu}.phalanx.invalid')}"


def _pcie_relation(topo: NodeTopology):
    def rel(a: str, b: str) -> str | None:
        r = topo.relations[a][b]
        return None if nvlink_count(r) else r
    return rel


def _links(topo: NodeTopology, bus: dict[str, str]) -> dict[str, tuple[_Link, ...]]:
    """Each GPU's NVLinks: k links to the switches for a fabric, else a bundle per peer."""
    names = [g.name for g in topo.gpus]
    links: dict[str, list[_Link]] = {n: [] for n in names}
    if topo.nvswitch and len(names) >= 2:
        counts = {nvlink_count(topo.relations[a][b]) for a in names for b in names if a != b}
        if len(counts) != 1 or not min(counts):
            raise ValueError("an NVSwitch fabric needs every GPU pair at the same NV<k>")
        k = counts.pop()
        for n in names:
            links[n] = [_Link(f"0001:{i % _SWITCHES:02x}:00.0", pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                        for i in range(k)]
    else:
        for a in names:
            for b in names:
                if a != b:
                    links[a] += [_Link(bus[b], pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)] * nvlink_count(topo.relations[a][b])
    for n, ls in links.items():
        if len(ls) > pynvml.NVML_NVLINK_MAX_LINKS:
            raise ValueError(f"{n} would need {len(ls)} NVLinks, NVML has at most {pynvml.NVML_NVLINK_MAX_LINKS}")
    return {n: tuple(ls) for n, ls in links.items()}


@dataclass(frozen=True, slots=True)
class FakeMachine:
    """Fake hardware for one node; build it with ``from_topology``."""

    node: str
    gpus: tuple[FakeGpu, ...]
    nics: tuple[FakeNic, ...]
    pci: fake_pci.PciLayout
    nvswitch: bool
    expected: NodeTopology
    renamed: dict[str, str]
    """Model name → name the adapter reports (NICs take their RDMA device name)."""

    @classmethod
    def from_topology(cls, topo: NodeTopology) -> FakeMachine:
        """Fake hardware whose discovery gives back ``topo`` (see ``expected``); raises
        ValueError when the model cannot be hardware (GPUs not GPU0..GPUn-1, relations that
        no PCIe tree produces, more NVLinks than NVML has)."""
        if [g.name for g in topo.gpus] != [f"GPU{i}" for i in range(len(topo.gpus))]:
            raise ValueError("the fake NVML enumerates GPUs as GPU0..GPUn-1 in order")
        names = [g.name for g in topo.gpus] + [n.name for n in topo.nics]
        given = {d.name: normalize_bus_id(d.pci_bus_id) for d in (*topo.gpus, *topo.nics) if d.pci_bus_id}
        layout = fake_pci.layout(names, _pcie_relation(topo), gpus={g.name for g in topo.gpus},
                                 numa={d.name: d.numa for d in (*topo.gpus, *topo.nics)}, bus_ids=given)
        bus = {n: layout.paths[n][-1] for n in names}
        links = _links(topo, bus)
        gpus = tuple(FakeGpu(gpu=msgspec.structs.replace(g, pci_bus_id=bus[g.name],
                                                         uuid=g.uuid or gpu_uuid(topo.node, g.name)),
                             path=layout.paths[g.name], links=links[g.name]) for g in topo.gpus)
        renamed = {n.name: n.device or n.name for n in topo.nics}
        nics = tuple(sorted((FakeNic(nic=msgspec.structs.replace(n, name=renamed[n.name], device=renamed[n.name],
                                                                  pci_bus_id=bus[n.name]),
                                     path=layout.paths[n.name]) for n in topo.nics),
                            key=lambda f: natural_key(f.nic.name)))
        expected = NodeTopology(
            node=topo.node, gpus=tuple(f.gpu for f in gpus), nics=tuple(f.nic for f in nics),
            relations={renamed.get(a, a): {renamed.get(b, b): r for b, r in row.items()} for a, row in topo.relations.items()},
            nvswitch=topo.nvswitch and len(gpus) >= 2, source="nvml")
        return cls(node=topo.node, gpus=gpus, nics=nics, pci=layout, nvswitch=expected.nvswitch,
                   expected=expected, renamed={**{g.name: g.name for g in topo.gpus}, **renamed})

    def write_sysfs(self, root: str | Path) -> Path:
        """Lay out ``<root>/sys`` as Linux shows these devices: ``devices/pci…`` directories
        with ``numa_node`` (and ``local_cpulist``), ``bus/pci/devices/<id>`` links, and
        ``class/infiniband/<nic>/device`` links. Returns ``root``."""
        root = Path(root)
        devices = root / "sys" / "devices"
        bus_dir = root / "sys" / "bus" / "pci" / "devices"
        ib = root / "sys" / "class" / "infiniband"
        bus_dir.mkdir(parents=True, exist_ok=True)
        entries = [(f.gpu.pci_bus_id, f.path, f.gpu.numa, "") for f in self.gpus]
        entries += [(f.nic.pci_bus_id, f.path, f.nic.numa, f.nic.cpu_affinity) for f in self.nics]
        for bus_id, path, numa, cpus in entries:
            d = devices.joinpath(*path)
            d.mkdir(parents=True, exist_ok=True)
            (d / "numa_node").write_text(f"{numa}\n", encoding="ascii")
            if cpus:
                (d / "local_cpulist").write_text(f"{cpus}\n", encoding="ascii")
            (bus_dir / bus_id).symlink_to(os.path.relpath(d, bus_dir))
        for f in self.nics:
            entry = ib / f.nic.name
            entry.mkdir(parents=True, exist_ok=True)
            (entry / "device").symlink_to(os.path.relpath(devices.joinpath(*f.path), entry))
        return root


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


def _pci_info(bus_id: str) -> pynvml.nvmlPciInfo_t:
    domain, bus, rest = bus_id.split(":")
    dev = rest.split(".")[0]
    d, b, v = int(domain, 16), int(bus, 16), int(dev, 16)
    return pynvml.nvmlPciInfo_t(busIdLegacy=(pynvml.NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT % (d, b, v)).encode(),
                                busId=(pynvml.NVML_DEVICE_PCI_BUS_ID_FMT % (d, b, v)).encode(),
                                domain=d, bus=b, device=v)


class FakeNvml:
    """Stands in for the ``pynvml`` module: pass it as ``NvmlDiscovery(nvml=FakeNvml(machine))``.

    ``machine=None`` fakes a host without the driver: ``nvmlInit`` raises NVML's
    "library not found", as pynvml does there."""

    NVMLError = pynvml.NVMLError
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    NVML_TOPOLOGY_INTERNAL = pynvml.NVML_TOPOLOGY_INTERNAL
    NVML_TOPOLOGY_SINGLE = pynvml.NVML_TOPOLOGY_SINGLE
    NVML_TOPOLOGY_MULTIPLE = pynvml.NVML_TOPOLOGY_MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE = pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    NVML_TOPOLOGY_NODE = pynvml.NVML_TOPOLOGY_NODE
    NVML_TOPOLOGY_SYSTEM = pynvml.NVML_TOPOLOGY_SYSTEM

    def __init__(self, machine: FakeMachine | None) -> None:
        self.machine = machine
        self.initialized = 0
        self.calls: list[str] = []
        """Names of the NVML functions called, in order (tests assert on the code path)."""
        self.lost: set[str] = set()
        """UUIDs of GPUs that fell off the bus: every call on them raises ``GPU_IS_LOST``."""

    def _enter(self, name: str) -> FakeMachine:
        self.calls.append(name)
        if not self.initialized or self.machine is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.machine

    def _gpu(self, name: str, handle: _Handle) -> FakeGpu:
        gpu = self._enter(name).gpus[handle.index]
        if gpu.gpu.uuid in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.machine is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self._enter("nvmlDeviceGetCount").gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self._enter("nvmlDeviceGetHandleByIndex").gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, g in enumerate(self._enter("nvmlDeviceGetHandleByUUID").gpus):
            if g.gpu.uuid == uuid:
                if uuid in self.lost:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                return _Handle(i)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).gpu.model

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> pynvml.c_nvmlMemory_t:
        total = self._gpu("nvmlDeviceGetMemoryInfo", handle).gpu.memory_mib * 1024 * 1024
        if version:
            return pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=0, free=total, used=0)
        return pynvml.c_nvmlMemory_t(total=total, free=total, used=0)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> pynvml.nvmlPciInfo_t:
        return _pci_info(self._gpu("nvmlDeviceGetPciInfo", handle).gpu.pci_bus_id)

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", device).gpu
        if not gpu.mig_capable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        numa = self._gpu("nvmlDeviceGetNumaNodeId", handle).gpu.numa
        if numa < 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return numa

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpuSetSize: int):  # noqa: N803 - pynvml's name
        cpus = self._gpu("nvmlDeviceGetCpuAffinity", handle).gpu.cpu_affinity
        mask = (ctypes.c_ulonglong * cpuSetSize)()
        for cpu in (parse_cpulist(cpus) if cpus else ()):
            if cpu // 64 < cpuSetSize:
                mask[cpu // 64] |= 1 << (cpu % 64)
        return mask

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: _Handle, device2: _Handle) -> int:
        machine = self._enter("nvmlDeviceGetTopologyCommonAncestor")
        if device1 == device2:
            return pynvml.NVML_TOPOLOGY_INTERNAL
        a, b = machine.gpus[device1.index].gpu.name, machine.gpus[device2.index].gpu.name
        return _LEVEL[machine.pci.relation(a, b)]

    def _link(self, name: str, handle: _Handle, link: int) -> _Link:
        gpu = self._gpu(name, handle)
        if not gpu.links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, device: _Handle, link: int) -> int:
        self._link("nvmlDeviceGetNvLinkState", device, link)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: _Handle, link: int) -> pynvml.nvmlPciInfo_t:
        return _pci_info(self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link).remote_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link).remote_type
