"""The device IDs the plugin advertises for each resource, and what each ID stands for.

The kubelet only counts and hands out IDs; Phalanx decides which physical device a pod gets.
So every ID names its physical target, and the plugin steers the kubelet to IDs whose target
is in the pod's assignment (``prefer``) and refuses IDs whose target is not (``check``).

=============================  ==========================================  ================
resource                       IDs (per device)                            target
=============================  ==========================================  ================
``nvidia.com/gpu`` or          ``<GPU UUID>``, one per GPU not in MIG      the GPU
``aliyun.com/gpu``             mode
``aliyun.com/gpu-core``        ``<UUID>-core-<k>``, k < 100, per GPU not   the GPU
                               in MIG mode (1 ID = 1 % of its compute)
``aliyun.com/gpu-memory``      ``<UUID>-mem-<k>``, k < memory GiB, per GPU  the GPU
``aliyun.com/gpu-memory-mib``  ``<UUID>-mib-<k>``, k < memory MiB / 128     the GPU
``aliyun.com/gpu-slice``       ``<UUID>-slice-<k>``, k < 7, per GPU in MIG  the MIG parent
                               mode
``aliyun.com/rdma``            ``<RDMA device>-rdma-<k>``, k < GPUs on the  the NIC
                               node (at most one RDMA pod per GPU)
=============================  ==========================================  ================

Whole GPUs use one name per node, ``nvidia.com/gpu`` when every GPU is NVIDIA's, else
``aliyun.com/gpu`` (as topology-discovery advertised them before). A GPU without a UUID (a
topology file) is named ``gpu<index>``. Every ID stays within the kubelet's 63 characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from phalanx_proto.events import Assignment
from phalanx_proto.kubeapi import (
    ALIYUN_GPU,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_MIB,
    GPU_MEMORY_MIB_UNIT,
    GPU_SLICE,
    NVIDIA_GPU,
    RDMA,
)
from phalanx_proto.topology import NodeTopology

MIG_SLICES = 7
MAX_ID = 63


@dataclass(frozen=True, slots=True)
class Device:
    """One advertised ID: ``target`` is ``gpu:<name>`` or ``nic:<rdma device>``; ``numa`` is the
    NUMA node the kubelet's topology manager sees (-1: none)."""

    id: str
    target: str
    numa: int = -1


def _gpu_key(uuid: str, index: int) -> str:
    return uuid or f"gpu{index}"


class DeviceTable:
    """Every resource's IDs on one node, built from its topology (a frozen value: a new
    topology generation builds a new table)."""

    def __init__(self, topo: NodeTopology) -> None:
        self.topology = topo
        self.whole_name = NVIDIA_GPU if all(g.vendor == "nvidia" for g in topo.gpus) else ALIYUN_GPU
        self._gpu_target = {g.index: f"gpu:{_gpu_key(g.uuid, g.index)}" for g in topo.gpus}
        self._by_uuid = {g.uuid: f"gpu:{_gpu_key(g.uuid, g.index)}" for g in topo.gpus if g.uuid}
        self._nic_device = {n.name: n.device or n.name for n in topo.nics if n.rdma}
        res: dict[str, list[Device]] = {}
        for g in topo.gpus:
            key, target = _gpu_key(g.uuid, g.index), self._gpu_target[g.index]

            def add(resource: str, ids: Iterable[str], numa: int = g.numa, target: str = target) -> None:
                res.setdefault(resource, []).extend(Device(i, target, numa) for i in ids)

            if g.mig_enabled:
                add(GPU_SLICE, (f"{key}-slice-{k}" for k in range(MIG_SLICES)))
            else:
                add(self.whole_name, [key])
                add(GPU_CORE, (f"{key}-core-{k}" for k in range(100)))
            add(GPU_MEMORY, (f"{key}-mem-{k}" for k in range(g.memory_mib // 1024)))
            add(GPU_MEMORY_MIB, (f"{key}-mib-{k}" for k in range(g.memory_mib // GPU_MEMORY_MIB_UNIT)))
        for n in topo.nics:
            if n.rdma and topo.gpus:
                dev = self._nic_device[n.name]
                res.setdefault(RDMA, []).extend(Device(f"{dev}-rdma-{k}", f"nic:{dev}", n.numa)
                                                for k in range(len(topo.gpus)))
        too_long = [d.id for ds in res.values() for d in ds if len(d.id) > MAX_ID]
        if too_long:
            raise ValueError(f"device IDs longer than the kubelet's {MAX_ID} characters: {too_long[:3]}")
        self.devices: dict[str, tuple[Device, ...]] = {r: tuple(ds) for r, ds in res.items()}
        self._target = {(r, d.id): d.target for r, ds in self.devices.items() for d in ds}
        self._rank = {(r, d.id): k for r, ds in self.devices.items() for k, d in enumerate(ds)}

    @property
    def resources(self) -> tuple[str, ...]:
        """The resource names this node advertises, in a stable order."""
        order = (NVIDIA_GPU, ALIYUN_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_MIB, GPU_SLICE, RDMA)
        return tuple(r for r in order if self.devices.get(r))

    def target(self, resource: str, device_id: str) -> str | None:
        return self._target.get((resource, device_id))

    def targets(self, resource: str, a: Assignment) -> tuple[str, ...]:
        """The physical targets the assignment allows for ``resource``, in steering order."""
        if resource == RDMA:
            return tuple(f"nic:{self._nic_device.get(n, n)}" for n in a.nics)
        gpus = [self._by_uuid[u] for u in a.gpu_uuids if u in self._by_uuid]
        if not gpus:
            gpus = [self._gpu_target[i] for i in a.gpus if i in self._gpu_target]
        return tuple(gpus)

    def prefer(self, resource: str, a: Assignment, available: Sequence[str], must_include: Sequence[str],
               size: int) -> list[str]:
        """IDs to answer ``GetPreferredAllocation`` with: ``must_include`` first, then available IDs
        on the assignment's targets in table order, spread round-robin over them (a share on 2 GPUs
        takes its units from both). Shorter than ``size`` when the targets lack free IDs: the kubelet then
        fills in others, and ``check`` refuses them at ``Allocate``."""
        wanted = self.targets(resource, a)
        free: dict[str, list[str]] = {t: [] for t in wanted}
        chosen = list(must_include)
        for dev_id in sorted(available, key=lambda i: self._rank.get((resource, i), -1)):
            t = self.target(resource, dev_id)
            if t in free and dev_id not in chosen:
                free[t].append(dev_id)
        while len(chosen) < size and any(free.values()):
            for t in wanted:
                if free[t] and len(chosen) < size:
                    chosen.append(free[t].pop(0))
        return chosen[:max(size, len(must_include))]

    def check(self, resource: str, a: Assignment, ids: Sequence[str]) -> str:
        """Empty when every ID is on one of the assignment's targets; else the reason."""
        allowed = set(self.targets(resource, a))
        if not allowed:
            return f"the assignment gives no device for {resource}"
        unknown = [i for i in ids if self.target(resource, i) is None]
        if unknown:
            return f"{resource}: device IDs {unknown[:4]} are not advertised on this node"
        foreign = sorted({self.target(resource, i) for i in ids} - allowed)
        if foreign:
            return (f"{resource}: the kubelet chose devices on {', '.join(t.split(':', 1)[1] for t in foreign)}, "
                    f"the assignment is {', '.join(t.split(':', 1)[1] for t in sorted(allowed))}")
        return ""

    def gpu_uuids(self, resource: str, ids: Sequence[str]) -> list[str]:
        """The GPUs (UUID or ``gpu<index>``) behind ``ids``, in first-seen order."""
        out: list[str] = []
        for i in ids:
            t = self.target(resource, i)
            if t and t.startswith("gpu:") and t[4:] not in out:
                out.append(t[4:])
        return out
