"""The real ``TopologySource``: NVML (through ``pynvml``) for GPUs, sysfs for RDMA NICs.

topology-discovery runs it on every GPU node; ``phalanx topology discover`` runs it by hand.
What it reads, per GPU: UUID, name, memory, PCI bus id, MIG mode, NUMA node (NVML, else
sysfs), CPU affinity; per GPU pair: ``nvmlDeviceGetTopologyCommonAncestor`` (PCIe level);
per NVLink: state, remote PCI address and remote device type (a peer GPU, or an NVSwitch).
NICs come from ``/sys/class/infiniband`` and relate to GPUs by PCI path (``pcie``).

The relation of a GPU pair is ``NV<k>`` when they share k active links; two GPUs that both
have links to NVSwitches are ``NV<k>`` with k the smaller switch-link count (``nvswitch`` is
set when every GPU does); otherwise it is the PCIe level. Only ``phalanx_nvml`` imports
``pynvml``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pynvml

from phalanx_nvml.pcie import (
    PciDevice,
    normalize_bus_id,
    numa_relation,
    pci_device,
    rdma_devices,
    same_bridge_relation,
    socket_of_numa,
)
from phalanx_nvml.port import DiscoveryError, NvmlUnavailable
from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology.model import finish, format_cpulist

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class _GpuReading:
    gpu: Gpu
    handle: Any
    pci: PciDevice | None
    switch_links: int
    peer_links: Counter


class NvmlDiscovery:
    """``TopologySource`` over NVML and sysfs.

    ``nvml`` is the pynvml module (default) or anything with its functions, such as
    ``phalanx_nvmlfake.nvml.FakeNvml``; ``sysfs_root`` is where ``sys/`` is found (``/``);
    ``cpu_words`` is the size of the CPU mask asked for, in 64-CPU words."""

    def __init__(self, nvml: Any = None, *, sysfs_root: str | Path = "/", cpu_words: int = 16) -> None:
        self._nvml = pynvml if nvml is None else nvml
        self._root = Path(sysfs_root)
        self._cpu_words = cpu_words

    def discover(self, node: str) -> NodeTopology:
        """Read the node now. Raises ``NvmlUnavailable`` when NVML cannot start (no driver)
        and ``DiscoveryError`` when an NVML call fails or answers something unmodellable."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise NvmlUnavailable(str(e)) from e
        try:
            return self._read(node)
        except nvml.NVMLError as e:
            raise DiscoveryError(f"NVML call failed: {e}") from e
        finally:
            nvml.nvmlShutdown()

    # --- GPUs -----------------------------------------------------------------------------

    def _try(self, fn: str, *args: Any, default: Any = None) -> Any:
        """``nvml.<fn>(*args)``, or ``default`` when the call is missing or not supported."""
        call = getattr(self._nvml, fn, None)
        if call is None:
            return default
        try:
            return call(*args)
        except self._nvml.NVMLError:
            return default

    def _cpus(self, handle: Any) -> str:
        mask = self._try("nvmlDeviceGetCpuAffinity", handle, self._cpu_words, default=())
        return format_cpulist(w * 64 + bit for w, word in enumerate(mask) for bit in range(64) if int(word) >> bit & 1)

    def _gpu(self, index: int) -> tuple[Gpu, Any, PciDevice | None]:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        bus_id = normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        pci = pci_device(self._root, bus_id)
        mig = self._try("nvmlDeviceGetMigMode", handle)
        numa = self._try("nvmlDeviceGetNumaNodeId", handle, default=-1)
        if numa < 0 and pci is not None:
            numa = pci.numa
        name = nvml.nvmlDeviceGetName(handle)
        gpu = Gpu(index=index, name=f"GPU{index}", uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                  model=_text(name), memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB,
                  mig_capable=mig is not None, mig_enabled=mig is not None and mig[0] == nvml.NVML_DEVICE_MIG_ENABLE,
                  numa=numa, cpu_affinity=self._cpus(handle), pci_bus_id=bus_id)
        return gpu, handle, pci

    def _nvlinks(self, handle: Any, gpu_buses: set[str]) -> tuple[int, Counter]:
        """Active links to NVSwitches, and active links per peer GPU bus id."""
        nvml = self._nvml
        switch, peers = 0, Counter()
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            if self._try("nvmlDeviceGetNvLinkState", handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            info = self._try("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            if info is None:
                continue
            remote = normalize_bus_id(info.busId)
            kind = self._try("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH or (kind is None and remote not in gpu_buses):
                switch += 1
            elif remote in gpu_buses:
                peers[remote] += 1
        return switch, peers

    def _level(self, a: Any, b: Any) -> str:
        nvml = self._nvml
        level = nvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
        names = {nvml.NVML_TOPOLOGY_INTERNAL: "PIX", nvml.NVML_TOPOLOGY_SINGLE: "PIX",
                 nvml.NVML_TOPOLOGY_MULTIPLE: "PXB", nvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
                 nvml.NVML_TOPOLOGY_NODE: "NODE", nvml.NVML_TOPOLOGY_SYSTEM: "SYS"}
        if level not in names:
            raise DiscoveryError(f"nvmlDeviceGetTopologyCommonAncestor returned unknown level {level}")
        return names[level]

    # --- the whole node -------------------------------------------------------------------

    def _read(self, node: str) -> NodeTopology:
        nvml = self._nvml
        raw = [self._gpu(i) for i in range(nvml.nvmlDeviceGetCount())]
        buses = {g.pci_bus_id for g, _, _ in raw}
        readings = [_GpuReading(g, h, pci, *self._nvlinks(h, buses)) for g, h, pci in raw]
        levels = {(a.gpu.name, b.gpu.name): self._level(a.handle, b.handle)
                  for i, a in enumerate(readings) for b in readings[i + 1:]}
        levels.update({(b, a): v for (a, b), v in list(levels.items())})
        nvswitch = len(readings) >= 2 and all(r.switch_links for r in readings)
        relations: dict[str, dict[str, str]] = {r.gpu.name: {} for r in readings}
        for a in readings:
            for b in readings:
                if a is not b:
                    relations[a.gpu.name][b.gpu.name] = _gpu_relation(a, b, levels)
        nics = self._nics(readings, levels, relations)
        topo = finish(node, [r.gpu for r in readings], nics, relations, source="nvml", nvswitch=nvswitch)
        return self._with_sockets(topo)

    def _nics(self, readings: list[_GpuReading], levels: dict[tuple[str, str], str],
              relations: dict[str, dict[str, str]]) -> list[Nic]:
        """RDMA NICs from sysfs, with their relations to every GPU and NIC filled in."""
        found = rdma_devices(self._root)
        points = {r.gpu.name: r.pci for r in readings} | {d.name: d.pci for d in found}
        numa = {r.gpu.name: r.gpu.numa for r in readings} | {d.name: d.pci.numa for d in found}
        on_bridge: dict[str, str] = {}
        for r in readings:
            if r.pci is not None:
                on_bridge.setdefault(r.pci.root, r.gpu.name)
        gpu_names = {r.gpu.name for r in readings}

        def rep(name: str) -> str | None:
            if name in gpu_names:
                return name
            return on_bridge.get(points[name].root)

        def relate(a: str, b: str) -> str:
            pa, pb = points[a], points[b]
            if pa is None or pb is None:
                return "SYS"
            if pa.root == pb.root:
                return same_bridge_relation(pa.path, pb.path)
            ra, rb = rep(a), rep(b)
            if ra is not None and rb is not None:
                return levels[(ra, rb)]
            return numa_relation(numa[a], numa[b])

        for d in found:
            relations[d.name] = {}
        for d in found:
            for other in [*gpu_names, *(x.name for x in found)]:
                if other != d.name:
                    relations[d.name][other] = relations.setdefault(other, {})[d.name] = relate(d.name, other)
        return [Nic(name=d.name, device=d.name, pci_bus_id=d.pci.bus_id, numa=d.pci.numa,
                    cpu_affinity=d.pci.cpu_affinity) for d in found]

    def _with_sockets(self, topo: NodeTopology) -> NodeTopology:
        def socket(d):
            return msgspec.structs.replace(d, socket=socket_of_numa(self._root, d.numa))
        return msgspec.structs.replace(topo, gpus=tuple(map(socket, topo.gpus)), nics=tuple(map(socket, topo.nics)))


def _gpu_relation(a: _GpuReading, b: _GpuReading, levels: dict[tuple[str, str], str]) -> str:
    """Direct links first; two GPUs on NVSwitches reach each other over the smaller bundle."""
    direct = a.peer_links.get(b.gpu.pci_bus_id, 0)
    if direct:
        return f"NV{direct}"
    if a.switch_links and b.switch_links:
        return f"NV{min(a.switch_links, b.switch_links)}"
    return levels[(a.gpu.name, b.gpu.name)]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
