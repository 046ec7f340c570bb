"""ResourceSlices and DeviceClasses shaped like NVIDIA's DRA driver, for simulated nodes (the
DRA e2e tests, the agreement table against kube-scheduler, the DRA benchmarks). Pure: a node's
Phalanx topology in, Kubernetes API dicts (``resource.k8s.io/v1``) out; nothing is posted.

A kwok node has no kubelet plugin, so nobody publishes its devices: the test publishes what the
driver would. For Phalanx to join those devices to its own node model (docs/dra.md, "Which
devices"), the topology and the slices must name the same GPUs, so both come from here:

* ``with_identity(topo)``: the topology with a deterministic ``uuid`` (``GPU-`` + a UUID derived
  from node name and GPU index, ``gpu_uuid``) and ``pci_bus_id`` (``0000:xx:00.0``) on every GPU
  that lacks one, and a ``pci_bus_id`` on every NIC. Write it as the node's topology YAML.
* ``gpu_slices(node, topo)``: the ``gpu.nvidia.com`` pool the driver's kubelet plugin publishes.
* ``nic_slices(node, topo)``: an RDMA NIC driver's pool (``rdma.example.com``, our own).
* ``device_classes()``: the classes NVIDIA's Helm chart installs, plus one for the NIC driver.

What NVIDIA's driver publishes was read in its source, kubernetes-sigs/dra-driver-nvidia-gpu at
commit 95932046 (Aug 2026; successor of NVIDIA/k8s-dra-driver-gpu):

* ``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``GpuInfo.Attributes()``: ``type`` (``gpu``),
  ``uuid``, ``productName``, ``brand``, ``architecture`` (strings), ``cudaComputeCapability``,
  ``driverVersion``, ``cudaDriverVersion`` (versions, through Masterminds semver, so ``8.0``
  becomes ``8.0.0``), the standard ``resource.kubernetes.io/pciBusID`` and
  ``resource.kubernetes.io/pcieRoot`` when sysfs has them, and ``resource.kubernetes.io/numaNode``
  (an int; left out when NUMA is unknown, ``addNumaNodeAttribute``). Device name ``gpu-<minor>``
  (``CanonicalName``); unqualified names belong to the driver's domain ``gpu.nvidia.com``.
* ``cmd/gpu-kubelet-plugin/partitions.go``, ``fullGpuCapacity``: capacity ``memory`` in bytes
  (BinarySI).
* ``k8s.io/dynamic-resource-allocation/deviceattribute/attribute.go``: ``pcieRoot`` is
  ``pci<domain>:<bus>``, the host bridge's directory under ``/sys/devices``.
* MIG with the driver's ``DynamicMIG`` gate (``partitions.go``, ``mig.go``, ``driver.go``
  ``generateSplitResourceSlices``): on Kubernetes >= 1.35 one slice holds only the shared
  counters, one counter set per physical GPU named ``gpu-<minor>-counter-set`` (counters named
  after the capacities in DNS form, plus ``memory-slice-<i>`` = 1 per memory slice), then one
  slice per GPU with the full GPU (consuming the whole set) and every possible MIG device
  ``gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>`` (consuming its
  capacities and its memory slices). MIG devices carry ``type=mig``, ``parentUUID``,
  ``profile`` and the parent's product, version and PCI attributes; not-yet-created MIG devices
  have no ``uuid`` of their own.
* ``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-{gpu,mig}.yaml``: the classes.

What a topology cannot say is invented, deterministically: driver and CUDA versions
(``GpuFacts``), architecture and compute capability from the model name, brand ``Tesla`` for
models NVML names ``Tesla ...`` and ``Nvidia`` otherwise, MIG device capacities other than
memory (multiprocessors and copy engines per compute slice, consistent so that only memory
slices bind, as ``phalanx_engine.mig`` assumes).

**PCIe roots.** nvidia-smi's relations say which devices sit below one host bridge: ``PIX`` (one
PCIe switch), ``PXB`` (several switches) and ``PHB`` (through the host bridge itself) all mean
"same host bridge", hence the same ``pcieRoot``; ``NODE`` and ``SYS`` mean different host bridges.
An NVLink relation (``NV<k>``) hides the PCIe path, so two GPUs are put under one root only
through PCIe relations, directly or through a NIC both reach by PIX/PXB/PHB (same-root is an
equivalence, so it is transitive). A device with no such relation gets a root of its own. A
topology whose relations contradict that (A~B and B~C by PCIe, A–C ``NODE``) is refused. Roots
are numbered in the order of their first device (GPUs by index, then NICs); root ``k`` is
``pci0000:<bus>`` and its devices take the next bus numbers (``0000:<bus+1>:00.0``, ...). A
device that already has a ``pci_bus_id`` (NVML reported it) keeps it; only its root's name is
then made up.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from phalanx_engine import mig
from phalanx_proto.dra import MAX_COUNTER_SETS, NUMA_NODE, PCI_BUS_ID, PCIE_ROOT
from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology import load_file, yamlfmt

__all__ = [
    "GPU_CLASS", "GPU_DRIVER", "MIG_CLASS", "NIC_CLASS", "NIC_DRIVER", "NUMA_NODE", "PCIE_ROOT", "PCI_BUS_ID",
    "GpuFacts", "device_classes", "devices_of", "gpu_device", "gpu_slices", "gpu_uuid", "mig_device_name", "nic_device",
    "nic_slices", "pcie_roots", "topology", "with_identity",
]

API_VERSION = "resource.k8s.io/v1"
GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "rdma.example.com"
"""Our own RDMA NIC driver's name (no real driver is simulated)."""
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
NIC_CLASS = "rdma.example.com"
EXTENDED_RESOURCE = "nvidia.com/gpu"

SAME_ROOT = frozenset({"PIX", "PXB", "PHB"})
"""Relations between two devices below one PCIe host bridge."""
OTHER_ROOT = frozenset({"NODE", "SYS"})
_UUID_NAMESPACE = uuidlib.uuid5(uuidlib.NAMESPACE_URL, "https://phalanx.io/simulated-gpu")
_MAX_BUS = 0xFF


@dataclass(frozen=True)
class GpuFacts:
    """What NVML says that a topology does not: the node's driver and CUDA driver versions
    (the same for every GPU of a node, as the driver reads them once)."""

    driver_version: str = "580.95.5"
    cuda_driver_version: str = "13.0.0"


# --- topology with identities --------------------------------------------------------------------
def topology(topo: NodeTopology | Mapping[str, Any] | str | Path, node: str | None = None) -> NodeTopology:
    """A ``NodeTopology`` from a model, a parsed topology YAML document, YAML text or a file
    (YAML or ``nvidia-smi topo -m``); ``node`` overrides its node name."""
    if isinstance(topo, NodeTopology):
        t = topo
    elif isinstance(topo, Mapping):
        t = yamlfmt.loads(yaml.safe_dump(dict(topo), sort_keys=False))
    elif isinstance(topo, Path) or (isinstance(topo, str) and "\n" not in topo and Path(topo).is_file()):
        t = load_file(topo)
    else:
        t = yamlfmt.loads(str(topo))
    return msgspec.structs.replace(t, node=node) if node and node != t.node else t


def gpu_uuid(node: str, index: int) -> str:
    """The simulated GPU ``index`` of ``node``: ``GPU-`` and a name-based UUID (version 5),
    the same on every call, different for every (node, index)."""
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{node}/gpu/{index}')}"


def _devices(topo: NodeTopology) -> list[str]:
    return [g.name for g in sorted(topo.gpus, key=lambda g: g.index)] + [n.name for n in topo.nics]


def _root_groups(topo: NodeTopology) -> list[list[str]]:
    """Devices grouped by PCIe host bridge (see the module docstring), in device order."""
    names = _devices(topo)
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if topo.relations.get(a, {}).get(b) in SAME_ROOT:
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[max(ra, rb, key=names.index)] = min(ra, rb, key=names.index)
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(find(n), []).append(n)
    for members in groups.values():
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                rel = topo.relations.get(a, {}).get(b)
                if rel in OTHER_ROOT:
                    raise ValueError(f"node {topo.node}: {a} and {b} are {rel} (different PCIe host bridges), "
                                     "yet PCIe relations through other devices put them below one")
    return list(groups.values())


def _bus_layout(topo: NodeTopology) -> tuple[dict[str, str], dict[str, str]]:
    """(device -> PCIe root, device -> PCI bus id made up for it)."""
    groups = _root_groups(topo)
    roots: dict[str, str] = {}
    bus_ids: dict[str, str] = {}
    need = sum(len(g) + 1 for g in groups)
    if need > _MAX_BUS + 1:
        raise ValueError(f"node {topo.node}: {len(groups)} PCIe roots and {need - len(groups)} devices do not fit "
                         "one PCI domain's 256 buses")
    # Roots 0x10 apart when that fits (easier to read), else packed.
    stride = 0x10 if all(len(g) < 0x10 for g in groups) and len(groups) * 0x10 <= _MAX_BUS + 1 else 0
    bus = 0
    for k, members in enumerate(groups):
        root_bus = k * stride if stride else bus
        for j, name in enumerate(members, start=1):
            roots[name] = f"pci0000:{root_bus:02x}"
            bus_ids[name] = f"0000:{root_bus + j:02x}:00.0"
        bus = root_bus + len(members) + 1
    return roots, bus_ids


def pcie_roots(topo: NodeTopology) -> dict[str, str]:
    """Each device's (``Gpu.name``/``Nic.name``) ``resource.kubernetes.io/pcieRoot``."""
    return _bus_layout(topo)[0]


def with_identity(topo: NodeTopology | Mapping[str, Any] | str | Path, node: str | None = None) -> NodeTopology:
    """The topology with ``uuid`` and ``pci_bus_id`` filled in where empty (GPUs), and
    ``pci_bus_id`` (NICs), so the node model joins the published devices. Idempotent."""
    t = topology(topo, node)
    _, bus_ids = _bus_layout(t)
    gpus = tuple(msgspec.structs.replace(g, uuid=g.uuid or gpu_uuid(t.node, g.index),
                                         pci_bus_id=g.pci_bus_id or bus_ids[g.name]) for g in t.gpus)
    nics = tuple(msgspec.structs.replace(n, pci_bus_id=n.pci_bus_id or bus_ids[n.name]) for n in t.nics)
    return msgspec.structs.replace(t, gpus=gpus, nics=nics)


# --- what the model name implies -------------------------------------------------------------------
_ARCH = (  # (pattern on the NVML name, architecture, CUDA compute capability)
    (re.compile(r"\bV100\b"), "Volta", "7.0"),
    (re.compile(r"\bT4\b"), "Turing", "7.5"),
    (re.compile(r"\b(A100|A800|A30)\b"), "Ampere", "8.0"),
    (re.compile(r"\b(A10|A40|A16|A2|RTX A\d+)\b"), "Ampere", "8.6"),
    (re.compile(r"\b(L40S|L40|L4|L20|RTX 4090|RTX 6000 ADA)\b"), "Ada Lovelace", "8.9"),
    (re.compile(r"\b(H100|H800|H200|H20|GH200)\b"), "Hopper", "9.0"),
    (re.compile(r"\bB300\b"), "Blackwell", "10.3"),
    (re.compile(r"\b(B200|GB200)\b"), "Blackwell", "10.0"),
)
_MIG_PROFILE_ID = {(1, 1): 19, (1, 2): 15, (2, 2): 14, (3, 4): 9, (4, 4): 5, (7, 8): 0}
"""NVML GPU-instance profile ids by (compute slices, memory slices) (``nvidia-smi mig -lgip``
on A100/H100: 1g=19, 1g double memory=15, 2g=14, 3g=9, 4g=5, 7g=0)."""
_SM_PER_SLICE = {"A100": 14, "A800": 14, "A30": 14, "H100": 16, "H800": 16, "H200": 16, "H20": 16,
                 "GH200": 16, "B200": 18, "GB200": 18, "B300": 18}


def _arch(model: str) -> tuple[str, str]:
    for pattern, arch, cc in _ARCH:
        if pattern.search(model.upper()):
            return arch, cc
    return "Unknown", "0.0"


def _brand(model: str) -> str:
    return "Tesla" if model.startswith("Tesla") else "Nvidia"


def _semver(text: str) -> str:
    """``major.minor[.patch]`` as the driver publishes it (Masterminds: padded, no leading zeros)."""
    parts = [str(int(p)) for p in text.split(".")[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


# --- devices ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Version:
    text: str


def _attrs(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, v in values.items():
        if isinstance(v, bool):
            out[name] = {"bool": v}
        elif isinstance(v, int):
            out[name] = {"int": v}
        elif isinstance(v, _Version):
            out[name] = {"version": v.text}
        else:
            out[name] = {"string": str(v)}
    return out


def _common(g: Gpu, roots: Mapping[str, str], bus_ids: Mapping[str, str],
            facts: GpuFacts) -> dict[str, Any]:
    model = g.model or "NVIDIA GPU"
    arch, cc = _arch(model)
    values: dict[str, Any] = {
        "productName": model, "brand": _brand(model), "architecture": arch,
        "cudaComputeCapability": _Version(_semver(cc)), "driverVersion": _Version(_semver(facts.driver_version)),
        "cudaDriverVersion": _Version(_semver(facts.cuda_driver_version)),
        PCI_BUS_ID: g.pci_bus_id or bus_ids[g.name], PCIE_ROOT: roots[g.name],
    }
    if g.numa >= 0:
        values[NUMA_NODE] = g.numa
    return values


def _gpu_device(t: NodeTopology, g: Gpu, roots: Mapping[str, str], bus_ids: Mapping[str, str],
                facts: GpuFacts) -> dict[str, Any]:
    dev: dict[str, Any] = {"name": f"gpu-{g.index}",
                           "attributes": _attrs({"type": "gpu", "uuid": g.uuid, **_common(g, roots, bus_ids, facts)})}
    if g.memory_mib:
        dev["capacity"] = {"memory": {"value": f"{g.memory_mib}Mi"}}
    return dev


def gpu_device(topo: NodeTopology, index: int, *, facts: GpuFacts = GpuFacts()) -> dict[str, Any]:
    """GPU ``index`` as the driver publishes it without DynamicMIG (``GpuInfo.GetDevice``)."""
    t = with_identity(topo)
    roots, bus_ids = _bus_layout(t)
    return _gpu_device(t, next(g for g in t.gpus if g.index == index), roots, bus_ids, facts)


def mig_device_name(index: int, profile: mig.MigProfile, start: int) -> str:
    """``gpu-<minor>-mig-<profile without dots>-<GI profile id>-<start>`` (``MigSpecTuple.ToCanonicalName``)."""
    return f"gpu-{index}-mig-{profile.name.replace('.', '')}-{_MIG_PROFILE_ID[(profile.slices, profile.size)]}-{start}"


def _counter_set(index: int) -> str:
    return f"gpu-{index}-counter-set"


def _mig_capacity(profile: mig.MigProfile, family: str) -> dict[str, str]:
    sm = _SM_PER_SLICE.get(family, 16) * profile.slices
    return {"multiprocessors": str(sm), "copyEngines": str(profile.slices), "memory": f"{profile.memory_gib}Gi"}


def _counters(capacity: Mapping[str, str], start: int, size: int) -> dict[str, dict[str, str]]:
    """Capacities as counters (``capacitiesToCounters``: names in DNS form) plus the memory slices."""
    out = {re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", name).lower(): {"value": v} for name, v in capacity.items()}
    out.update({f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)})
    return out


def _mig_devices(t: NodeTopology, g: Gpu, table: mig.MigTable, roots: Mapping[str, str],
                 bus_ids: Mapping[str, str], facts: GpuFacts) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the GPU's counter set, its devices: the full GPU then each possible MIG device)."""
    family = mig.mig_family(g.model)
    full = max(table.profiles, key=lambda p: p.size)
    full_cap = _mig_capacity(full, family)
    counter_set = {"name": _counter_set(g.index), "counters": _counters(full_cap, 0, table.memory_slices)}
    common = _common(g, roots, bus_ids, facts)
    whole = {"name": f"gpu-{g.index}",
             "attributes": _attrs({"type": "gpu", "uuid": g.uuid, **common}),
             "capacity": {k: {"value": v} for k, v in full_cap.items()},
             "consumesCounters": [{"counterSet": _counter_set(g.index), "counters": counter_set["counters"]}]}
    devices = [whole]
    for p in table.profiles:
        cap = _mig_capacity(p, family)
        for start in p.starts:
            devices.append({
                "name": mig_device_name(g.index, p, start),
                "attributes": _attrs({"type": "mig", "parentUUID": g.uuid, "profile": p.name, **common}),
                "capacity": {k: {"value": v} for k, v in cap.items()},
                "consumesCounters": [{"counterSet": _counter_set(g.index), "counters": _counters(cap, start, p.size)}]})
    devices[1:] = sorted(devices[1:], key=lambda d: d["name"])
    return counter_set, devices


def _taint(devices: list[dict[str, Any]], taints: Mapping[str, Sequence[Mapping[str, str]]]) -> list[dict[str, Any]]:
    for d in devices:
        if d["name"] in taints:
            d["taints"] = [dict(t) for t in taints[d["name"]]]
    return devices


def _slice(name: str, driver: str, node: str, generation: int, count: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                     "nodeName": node, **spec}}


def gpu_slices(node: str, topo: NodeTopology | Mapping[str, Any] | str | Path, *, mig_devices: bool = False,
               taints: Mapping[str, Sequence[Mapping[str, str]]] | None = None, generation: int = 1,
               facts: GpuFacts = GpuFacts()) -> list[dict[str, Any]]:
    """The ``gpu.nvidia.com`` pool of ``node`` (pool name = node name, every slice ``nodeName``
    = node): one slice of ``gpu-<i>`` devices; or, with ``mig_devices`` (the driver's DynamicMIG
    gate, Kubernetes >= 1.35 layout), the counters slice (a counter set per GPU that has a MIG
    table in ``phalanx_engine.mig``; one slice per 8 sets, the API's bound) and then one slice per GPU with the full GPU and its
    possible MIG devices (GPUs without MIG: the plain device). ``taints`` maps device names to
    ``DeviceTaint`` dicts (``key``, ``value``, ``effect``); ``generation`` is the pool's
    (bump it when publishing a changed pool). Slice names: ``<node>-gpu.nvidia.com-<k>``."""
    t = with_identity(topo, node)
    roots, bus_ids = _bus_layout(t)
    gpus = sorted(t.gpus, key=lambda g: g.index)
    taints = taints or {}
    if not mig_devices:
        devices = _taint([_gpu_device(t, g, roots, bus_ids, facts) for g in gpus], taints)
        return [_slice(f"{node}-{GPU_DRIVER}-0", GPU_DRIVER, node, generation, 1, devices=devices)]
    counter_sets: list[dict[str, Any]] = []
    per_gpu: list[list[dict[str, Any]]] = []
    for g in gpus:
        table = mig.mig_table(g.model, g.memory_mib)
        if table is None:
            per_gpu.append([_gpu_device(t, g, roots, bus_ids, facts)])
            continue
        cs, devices = _mig_devices(t, g, table, roots, bus_ids, facts)
        counter_sets.append(cs)
        per_gpu.append(devices)
    chunks = [counter_sets[i:i + MAX_COUNTER_SETS] for i in range(0, len(counter_sets), MAX_COUNTER_SETS)]
    count = len(chunks) + len(per_gpu)
    slices = [_slice(f"{node}-{GPU_DRIVER}-{k}", GPU_DRIVER, node, generation, count, sharedCounters=sets)
              for k, sets in enumerate(chunks)]
    slices += [_slice(f"{node}-{GPU_DRIVER}-{k}", GPU_DRIVER, node, generation, count, devices=_taint(devs, taints))
               for k, devs in enumerate(per_gpu, start=len(chunks))]
    return slices


def _nic_device(k: int, n: Nic, roots: Mapping[str, str], bus_ids: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {"type": "rdma", "rdmaDevice": n.device or n.name,
                              PCI_BUS_ID: n.pci_bus_id or bus_ids[n.name], PCIE_ROOT: roots[n.name]}
    if n.numa >= 0:
        values[NUMA_NODE] = n.numa
    return {"name": f"nic-{k}", "attributes": _attrs(values)}


def nic_device(topo: NodeTopology, name: str) -> dict[str, Any]:
    """RDMA NIC ``name`` (``Nic.name``): device ``nic-<k>`` (its position among the node's RDMA
    NICs), attributes ``type=rdma``, ``rdmaDevice`` (``mlx5_0``) and the standard PCI ones."""
    t = with_identity(topo)
    roots, bus_ids = _bus_layout(t)
    rdma = [n for n in t.nics if n.rdma]
    k = next(i for i, n in enumerate(rdma) if n.name == name)
    return _nic_device(k, rdma[k], roots, bus_ids)


def nic_slices(node: str, topo: NodeTopology | Mapping[str, Any] | str | Path, *,
               taints: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
               generation: int = 1) -> list[dict[str, Any]]:
    """The ``rdma.example.com`` pool of ``node``: one slice with a device per RDMA NIC (none
    when the node has no RDMA NIC: then no slice)."""
    t = with_identity(topo, node)
    roots, bus_ids = _bus_layout(t)
    devices = [_nic_device(k, n, roots, bus_ids) for k, n in enumerate(n for n in t.nics if n.rdma)]
    if not devices:
        return []
    return [_slice(f"{node}-{NIC_DRIVER}-0", NIC_DRIVER, node, generation, 1, devices=_taint(devices, taints or {}))]


def device_classes(*, extended_resource: bool = True) -> list[dict[str, Any]]:
    """``gpu.nvidia.com`` (with ``extendedResourceName: nvidia.com/gpu``, as the chart installs it
    on ``resource.k8s.io/v1``; ``extended_resource=False`` leaves it out), ``mig.nvidia.com``
    and ``rdma.example.com``."""
    def cls(name: str, expression: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}], **spec}}

    gpu = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{}'"
    extra = {"extendedResourceName": EXTENDED_RESOURCE} if extended_resource else {}
    return [cls(GPU_CLASS, gpu.format("gpu"), **extra), cls(MIG_CLASS, gpu.format("mig")),
            cls(NIC_CLASS, f"device.driver == '{NIC_DRIVER}'")]


def devices_of(slices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Device name -> device, over every slice."""
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}
