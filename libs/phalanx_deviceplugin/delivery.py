"""What a container gets for an allocation: device names, device nodes, environment, and the
isolation level that is honestly enforced on this node.

* GPUs by CDI name, ``nvidia.com/gpu=<GPU UUID>`` (a MIG instance by its ``MIG-…`` UUID), the
  names ``nvidia-ctk cdi generate`` writes by default; ``NVIDIA_VISIBLE_DEVICES=void`` beside
  them so an image's ``NVIDIA_VISIBLE_DEVICES=all`` selects nothing more. Only where the node
  has no CDI (``Delivery.cdi=False``) the UUIDs go in ``NVIDIA_VISIBLE_DEVICES`` instead.
* RDMA: the ``/dev/infiniband`` nodes of the chosen NICs (``uverbs*``, ``umad*``) plus
  ``rdma_cm``, read from sysfs; the NIC names in ``PHALANX_RDMA_DEVICES``.
* TDM: ``PHALANX_GPU_CORE_PERCENT`` / ``PHALANX_GPU_MEMORY_MIB`` for a limiter to read, and
  on an ``mps`` node the MPS pipe directory (mounted) and the client-side MPS limits.
* Isolation (``isolation``): ``hard`` for whole GPUs and MIG; ``mps`` only when the node runs
  an MPS control daemon whose *defaults* are at least as tight as the pod's limits (per-client
  MPS variables only tighten voluntarily); ``advisory`` otherwise. It is set in
  ``PHALANX_ISOLATION`` and recorded on the pod by the agent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from phalanx_deviceplugin import devices as D
from phalanx_proto.events import Assignment
from phalanx_proto.kubeapi import GPU_CORE, GPU_MEMORY, GPU_MEMORY_MIB, GPU_SLICE, RDMA

Isolation = Literal["hard", "mps", "advisory"]
CDI_KIND = "nvidia.com/gpu"
"""The CDI device kind (``vendor/class``) of the GPUs and MIG instances in the spec ``nvidia-ctk
cdi generate`` writes: a name in the node's CDI registry, not the Kubernetes resource
``phalanx_proto.kubeapi.NVIDIA_GPU`` (it names the devices whatever resource, ``aliyun.com/gpu``
or a TDM/MIG share, the pod asked for)."""


@dataclass(frozen=True, slots=True)
class Mps:
    """The node's MPS control daemon, as the admin configured it: its pipe directory and the
    defaults it applies to every client (``set_default_active_thread_percentage``,
    ``set_default_device_pinned_mem_limit``; 0 = not set)."""

    pipe_dir: str
    active_thread_pct: int = 0
    pinned_mem_mib: int = 0

    def running(self) -> bool:
        """The daemon's control pipe exists."""
        return os.path.exists(os.path.join(self.pipe_dir, "control"))


@dataclass(frozen=True, slots=True)
class Delivery:
    """How this node delivers devices (node agent flags)."""

    cdi: bool = True
    mps: Mps | None = None
    sysfs_root: str = "/"


@dataclass(slots=True)
class Edits:
    """One ``ContainerAllocateResponse``, as plain data (``server.py`` turns it into protobuf)."""

    envs: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    devices: list[tuple[str, str, str]] = field(default_factory=list)
    """(container path, host path, permissions)."""
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    """(container path, host path, read only)."""


def kind(a: Assignment) -> str:
    if a.mig_profile or a.mig_instance_uuid:
        return "mig"
    if a.core_pct or a.memory_mib:
        return "tdm"
    return "whole"


def isolation(a: Assignment, delivery: Delivery) -> tuple[Isolation, str]:
    """The level that is really enforced for this assignment on this node, and why."""
    k = kind(a)
    if k == "whole":
        return "hard", "whole GPUs, delivered by device name"
    if k == "mig":
        return "hard", "a MIG instance: compute and memory partitioned by the GPU"
    mps = delivery.mps
    if mps is None:
        return "advisory", "no MPS control daemon is configured on this node; nothing enforces the limits"
    if not mps.running():
        return "advisory", f"the MPS control daemon is configured but not running ({mps.pipe_dir}/control is missing)"
    if a.core_pct and not 0 < mps.active_thread_pct <= a.core_pct:
        return "advisory", (f"the MPS daemon's default active thread percentage ({mps.active_thread_pct or 'unset'}) "
                            f"does not enforce gpu-core {a.core_pct}")
    if a.memory_mib and not 0 < mps.pinned_mem_mib <= a.memory_mib:
        return "advisory", (f"the MPS daemon's default pinned memory limit ({mps.pinned_mem_mib or 'unset'} MiB) "
                            f"does not enforce {a.memory_mib} MiB")
    return "mps", "the node's MPS control daemon defaults cap every client at or below these limits"


def gpu_edits(a: Assignment, gpus: list[str], delivery: Delivery) -> Edits:
    """Edits for the resource that carries the pod's GPUs: ``gpus`` (UUIDs) for whole GPUs and
    TDM, the MIG instance for MIG."""
    names = [a.mig_instance_uuid] if kind(a) == "mig" and a.mig_instance_uuid else list(gpus)
    e = Edits()
    if delivery.cdi:
        e.cdi_devices = [f"{CDI_KIND}={n}" for n in names]
        e.envs["NVIDIA_VISIBLE_DEVICES"] = "void"
    else:
        e.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(names)
    level, _ = isolation(a, delivery)
    e.envs["PHALANX_ISOLATION"] = level
    e.envs["PHALANX_GPU_UUIDS"] = ",".join(names)
    if kind(a) == "tdm":
        if a.core_pct:
            e.envs["PHALANX_GPU_CORE_PERCENT"] = str(a.core_pct)
        if a.memory_mib:
            e.envs["PHALANX_GPU_MEMORY_MIB"] = str(a.memory_mib)
        if level == "mps" and delivery.mps is not None:
            e.envs["CUDA_MPS_PIPE_DIRECTORY"] = delivery.mps.pipe_dir
            e.mounts.append((delivery.mps.pipe_dir, delivery.mps.pipe_dir, False))
            if a.core_pct:
                e.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(a.core_pct)
            if a.memory_mib:
                e.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{u}={a.memory_mib}M" for u in names)
    return e


def rdma_nodes(sysfs_root: str | Path, device: str) -> list[str]:
    """``/dev/infiniband`` nodes of one RDMA device (``uverbs*``, ``umad*``) from
    ``/sys/class/infiniband/<device>/device/infiniband_{verbs,mad}``, sorted."""
    base = Path(sysfs_root) / "sys" / "class" / "infiniband" / device / "device"
    names = []
    for sub in ("infiniband_verbs", "infiniband_mad"):
        d = base / sub
        if d.is_dir():
            names += sorted(p.name for p in d.iterdir())
    return [f"/dev/infiniband/{n}" for n in names]


def rdma_edits(table: D.DeviceTable, a: Assignment, delivery: Delivery) -> tuple[Edits, str]:
    """Edits for ``aliyun.com/rdma``: the chosen NICs' device nodes; a reason when one of them
    has no device node on this node."""
    e = Edits()
    nics = [t.split(":", 1)[1] for t in table.targets(RDMA, a)]
    for nic in nics:
        nodes = rdma_nodes(delivery.sysfs_root, nic)
        if not nodes:
            return e, f"RDMA device {nic} has no uverbs device node under /sys/class/infiniband/{nic}"
        e.devices += [(n, n, "rwm") for n in nodes]
    if (Path(delivery.sysfs_root) / "sys" / "class" / "misc" / "rdma_cm").exists():
        e.devices.append(("/dev/infiniband/rdma_cm", "/dev/infiniband/rdma_cm", "rwm"))
    e.envs["PHALANX_RDMA_DEVICES"] = ",".join(nics)
    return e, ""


def carrier(a: Assignment, limits: dict[str, str], whole_name: str) -> str:
    """The one resource whose ``Allocate`` delivers the pod's GPUs (the others of a share are
    verified the same way but add nothing, so no GPU is named twice)."""
    k = kind(a)
    if k == "whole":
        return whole_name
    if k == "mig":
        return GPU_SLICE
    for r in (GPU_CORE, GPU_MEMORY, GPU_MEMORY_MIB):
        if r in limits:
            return r
    return GPU_CORE
