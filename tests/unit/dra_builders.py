"""Builders for DRA tests: NVIDIA-shaped ResourceSlices (``gpu-0``..``gpu-7`` with ``uuid``,
``productName``, ``memory``, ``resource.kubernetes.io/pciBusID`` and ``pcieRoot``; MIG devices
using the counters of ``gpu-<i>-counter-set``), a NIC driver, DeviceClasses as the NVIDIA chart
ships them, and claims."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from phalanx_proto.dra import (
    AttrValue,
    Capacity,
    CapacityPolicy,
    CapacityRange,
    ClaimConfig,
    ClaimSpec,
    ClassConfig,
    CounterSet,
    CounterUse,
    Device,
    DeviceClassRef,
    DeviceConstraint,
    DeviceRequest,
    DeviceTaint,
    DeviceToleration,
    DraPool,
    ExactRequest,
    InUse,
    NodeSelection,
    OpaqueConfig,
    Slice,
)
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm

NVIDIA = "gpu.nvidia.com"
NIC = "nic.example.com"
ROOTS = ("pci0000:00", "pci0000:00", "pci0000:40", "pci0000:40", "pci0000:80", "pci0000:80", "pci0000:c0",
         "pci0000:c0")
"""pcieRoot of GPU i: two GPUs per root complex, as on a DGX-1."""

GPU_CLASS = DeviceClassRef(name="gpu.nvidia.com", selectors=(
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",))
MIG_CLASS = DeviceClassRef(name="mig.nvidia.com", selectors=(
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",))
NIC_CLASS = DeviceClassRef(name="nic.example.com", selectors=("device.driver == 'nic.example.com'",))
MIG_SLICES = 8
MIG_PROFILES = (("1g.10gb", 1, 14, "10Gi", (0, 1, 2, 3, 4, 5, 6)), ("1g.20gb", 2, 14, "20Gi", (0, 2, 4, 6)),
                ("2g.20gb", 2, 28, "20Gi", (0, 2, 4)), ("3g.40gb", 4, 42, "40Gi", (0, 4)),
                ("4g.40gb", 4, 56, "40Gi", (0,)), ("7g.80gb", 8, 98, "80Gi", (0,)))
"""(profile, memory slices, multiprocessors, memory, placements) of the A100-80GB MIG profiles."""


def pci(i: int) -> str:
    return f"0000:{0x10 + 0x10 * i:02x}:00.0"


def gpu(i: int, *, root: str | None = None, counters: bool = False, taints: Sequence[DeviceTaint] = (),
        product: str = "NVIDIA A100-SXM4-80GB", memory: str = "80Gi", uuid: str | None = None,
        **extra: AttrValue) -> Device:
    """Full GPU ``gpu-<i>``; ``counters``: it uses its whole counter set (partitionable)."""
    attrs = {"type": AttrValue(string="gpu"), "uuid": AttrValue(string=uuid or f"GPU-{i:08d}"),
             "productName": AttrValue(string=product), "driverVersion": AttrValue(version="580.126.20"),
             "resource.kubernetes.io/pciBusID": AttrValue(string=pci(i)),
             "resource.kubernetes.io/pcieRoot": AttrValue(string=root or ROOTS[i % len(ROOTS)]),
             "resource.kubernetes.io/numaNode": AttrValue(int_=0 if i % 8 < 4 else 1), **extra}
    uses = (CounterUse(counter_set=f"gpu-{i}-counter-set", counters=_all_counters()),) if counters else ()
    return Device(name=f"gpu-{i}", attributes=attrs, capacity={"memory": Capacity(value=memory)},
                  consumes_counters=uses, taints=tuple(taints))


def _all_counters() -> dict[str, str]:
    return {"memory": "80Gi", "multiprocessors": "98", **{f"memory-slice-{s}": "1" for s in range(MIG_SLICES)}}


def counter_set(i: int) -> CounterSet:
    return CounterSet(name=f"gpu-{i}-counter-set", counters=_all_counters())


def mig(i: int, profile: str, start: int) -> Device:
    """A MIG device of GPU ``i`` at memory slice ``start``, using its counters."""
    _, size, sms, memory, _ = next(p for p in MIG_PROFILES if p[0] == profile)
    name = f"gpu-{i}-mig-{profile.replace('.', '')}-{start}"
    counters = {"memory": memory, "multiprocessors": str(sms),
                **{f"memory-slice-{s}": "1" for s in range(start, start + size)}}
    return Device(name=name, attributes={
        "type": AttrValue(string="mig"), "uuid": AttrValue(string=f"MIG-{i}-{profile}-{start}"),
        "profile": AttrValue(string=profile), "productName": AttrValue(string="NVIDIA A100-SXM4-80GB"),
        "resource.kubernetes.io/pciBusID": AttrValue(string=pci(i)),
        "resource.kubernetes.io/pcieRoot": AttrValue(string=ROOTS[i % len(ROOTS)]),
    }, capacity={"memory": Capacity(value=memory), "multiprocessors": Capacity(value=str(sms))},
        consumes_counters=(CounterUse(counter_set=f"gpu-{i}-counter-set", counters=counters),))


def migs(i: int) -> list[Device]:
    """Every placement of every profile on GPU ``i`` (18 devices)."""
    return [mig(i, profile, s) for profile, _, _, _, starts in MIG_PROFILES for s in starts]


def nic(i: int, *, root: str | None = None, shared: bool = False, bandwidth: str = "") -> Device:
    attrs = {"resource.kubernetes.io/pcieRoot": AttrValue(string=root or ROOTS[i % len(ROOTS)]),
             "rdmaDevice": AttrValue(string=f"mlx5_{i}")}
    capacity = {"bandwidth": Capacity(value=bandwidth, request_policy=CapacityPolicy(
        default="10G", valid_range=CapacityRange(min="1G", step="1G")))} if bandwidth else {}
    return Device(name=f"nic-{i}", attributes=attrs, capacity=capacity, allow_multiple_allocations=shared)


def on(node: str) -> NodeSelection:
    return NodeSelection(node_name=node)


def slice_(name: str, *devices: Device, nodes: NodeSelection | None = None, generation: int = 0, count: int = 1,
           counters: Sequence[CounterSet] = (), per_device: bool = False) -> Slice:
    return Slice(name=name, generation=generation, slice_count=count, nodes=nodes or NodeSelection(),
                 per_device_nodes=per_device, devices=tuple(devices), shared_counters=tuple(counters))


def pool(driver: str, name: str, *slices: Slice, in_use: Iterable[InUse] = (), problem: str = "") -> DraPool:
    return DraPool(driver=driver, pool=name, slices=tuple(slices), in_use=tuple(in_use), problem=problem)


def gpu_pool(node: str, n: int = 8, *, in_use: Iterable[str] = (), mig: bool = False) -> DraPool:
    """NVIDIA's pool of ``node``: ``n`` GPUs in one slice; ``mig``: partitionable, with a
    counters slice and every MIG placement. ``in_use``: device names held by claim ``x/held``."""
    devices = [gpu(i, counters=mig) for i in range(n)]
    if not mig:
        return pool(NVIDIA, node, slice_(f"{node}-gpu", *devices, nodes=on(node)),
                    in_use=[InUse(device=d, claim="x/held/u0") for d in in_use])
    for i in range(n):
        devices += migs(i)
    return pool(NVIDIA, node,
                slice_(f"{node}-counters", counters=[counter_set(i) for i in range(n)], nodes=on(node), count=2),
                slice_(f"{node}-devices", *devices, nodes=on(node), count=2),
                in_use=[InUse(device=d, claim="x/held/u0") for d in in_use])


def nic_pool(node: str, n: int = 8, *, roots: Sequence[str] | None = None, in_use: Iterable[str] = ()) -> DraPool:
    devices = [nic(i, root=roots[i] if roots else None) for i in range(n)]
    return pool(NIC, node, slice_(f"{node}-nic", *devices, nodes=on(node)),
                in_use=[InUse(device=d, claim="x/held/u0") for d in in_use])


def term(**labels: str) -> NodeSelectorTerm:
    return NodeSelectorTerm(match_expressions=tuple(
        NodeSelectorRequirement(key=k, operator="In", values=(v,)) for k, v in labels.items()))


def exact(cls: DeviceClassRef = GPU_CLASS, count: int = 1, *, name: str = "", mode: str = "ExactCount",
          selectors: Sequence[str] = (), tolerations: Sequence[DeviceToleration] = (), admin: bool = False,
          capacity: dict[str, str] | None = None) -> ExactRequest:
    return ExactRequest(name=name, device_class=cls, count=count, allocation_mode=mode,  # type: ignore[arg-type]
                        selectors=tuple(selectors), tolerations=tuple(tolerations), admin_access=admin,
                        capacity=capacity or {})


def request(name: str, cls: DeviceClassRef = GPU_CLASS, count: int = 1, **kw) -> DeviceRequest:
    return DeviceRequest(name=name, exactly=exact(cls, count, **kw))


def first_available(name: str, *subs: ExactRequest) -> DeviceRequest:
    return DeviceRequest(name=name, first_available=subs)


def claim(name: str, *requests: DeviceRequest, constraints: Sequence[DeviceConstraint] = (),
          config: Sequence[ClaimConfig] = (), ns: str = "ns", uid: str | None = None, **kw) -> ClaimSpec:
    return ClaimSpec(namespace=ns, name=name, uid=uid or f"uid-{name}", requests=tuple(requests),
                     constraints=tuple(constraints), config=tuple(config), **kw)


def match(attribute: str, *requests: str) -> DeviceConstraint:
    return DeviceConstraint(requests=requests, match_attribute=attribute)


def distinct(attribute: str, *requests: str) -> DeviceConstraint:
    return DeviceConstraint(requests=requests, distinct_attribute=attribute)


def opaque(driver: str, **parameters: object) -> OpaqueConfig:
    return OpaqueConfig(driver=driver, parameters=parameters)


def with_config(cls: DeviceClassRef, *configs: OpaqueConfig) -> DeviceClassRef:
    return DeviceClassRef(name=cls.name, selectors=cls.selectors, config=tuple(ClassConfig(opaque=c) for c in configs))
