"""A pod's GPU request, parsed and validated (R1-R5, R7, R8 label, R12).

Called by gang-coordinator (every pod it admits), by ``phalanx validate`` and by tests. The
input is a plain dict as it comes from YAML or the Kubernetes API; the output is a frozen
``GpuRequest``, or a ``RequestError`` that lists every ``Violation`` found, each naming the
field, the value and the rule. Node-side rules (MIG only on MIG-capable models, AMD whole
GPUs only, memory that the GPU has) are the engine's (``phalanx_engine.gpumodel``).

Resource names (``spec.containers[*].resources.limits``; ``requests`` may only repeat them).
Values are Kubernetes quantities that must be integers, read by ``phalanx_kubeobjects.quantity``
(ASCII digits; ``"1e0"`` is 1, ``"0.5"`` and ``"٤"`` are errors), each with an upper bound:

=============================  =========================================================
``nvidia.com/gpu``             whole NVIDIA GPUs (community name), integer 1..64
``aliyun.com/gpu``             whole GPUs of any vendor, integer 1..64
``aliyun.com/gpu-core``        TDM: percent of one GPU's compute, integer 1..100
``aliyun.com/gpu-memory``      TDM/MIG: GPU memory in **GiB**, integer 1..1024
``aliyun.com/gpu-memory-mib``  the same in **MiB**, a positive multiple of 128 (use one
                               of the two memory names, not both)
``aliyun.com/gpu-slice``       MIG: compute slices, one of 1, 2, 3, 4, 7
``aliyun.com/rdma``            ``"1"`` switches on joint GPU + RDMA NIC placement (a
                               switch, not a NIC count); whole GPUs 1..8, hostNetwork
=============================  =========================================================

Pod metadata: label ``replica: "N"`` - N GPUs (1..64), each with the share in ``limits``
(R4); label ``aliyun.com/min-member`` - gang size (R8), 1..10000; label values are strings of
ASCII digits (``quantity.decimal``). The pod's name, namespace, label keys and values and
annotation keys must follow the API server's rules (``names``). Annotation ``phalanx.io/gpu-vendor``
(``nvidia``, ``amd``, ``ppu``) - vendor hint. Shares are per GPU and per pod: every
container that names a share must name the same one (they share the pod's GPUs);
whole GPUs add up over containers, as in Kubernetes.

Everything else the pod asks of a node (CPU, memory and other requests, tolerations,
nodeSelector, required node affinity, nodeName, host ports) is read by ``podspec`` into
``GpuRequest.constraints`` and carried in ``MemberSpec``; the scheduling terms Phalanx refuses
(required pod affinity and anti-affinity, hard topology spread) or ignores (their preferred
forms, preferred node affinity) are warnings naming the field and the rule. Workload objects
(Job, JobSet, MPIJob, ...) are in ``workloads``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from phalanx_kubeobjects import names
from phalanx_kubeobjects.podspec import PodConstraints, parse_constraints
from phalanx_kubeobjects.quantity import Bound, Violation, count, decimal, shown
from phalanx_proto.events import MemberSpec, PodRef, RequestKind
from phalanx_proto.kubeapi import (
    ALIYUN_GPU,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_MIB,
    GPU_MEMORY_MIB_UNIT,
    GPU_SLICE,
    NVIDIA_GPU,
    RDMA,
    SCHEDULER_NAMES,
)
from phalanx_proto.state import MAX_GANG_MEMBERS

REPLICA_LABEL = "replica"
MIN_MEMBER_LABEL = "aliyun.com/min-member"
VENDOR_ANNOTATION = "phalanx.io/gpu-vendor"
VENDORS = ("nvidia", "amd", "ppu")
SLICE_VALUES = (1, 2, 3, 4, 7)
RDMA_MAX_GPUS = 8
WHOLE_RESOURCES = (NVIDIA_GPU, ALIYUN_GPU)
SHARE_RESOURCES = (GPU_CORE, GPU_MEMORY, GPU_MEMORY_MIB, GPU_SLICE)
RESOURCES = (*WHOLE_RESOURCES, *SHARE_RESOURCES, RDMA)
MAX_GPUS = Bound(64, "a pod's GPUs are on one node, and no node has more than 64 GPUs")
MAX_GPU_MEMORY_GIB = 1024
MAX_GANG = Bound(MAX_GANG_MEMBERS, f"a gang has at most {MAX_GANG_MEMBERS} pods (the wire contract's bound: one "
                                   "decision commits at most 1,000 nodes)")
MOST: Mapping[str, Bound] = {
    NVIDIA_GPU: MAX_GPUS,
    ALIYUN_GPU: MAX_GPUS,
    GPU_CORE: Bound(100, "gpu-core is a percent of one GPU's compute"),
    GPU_MEMORY: Bound(MAX_GPU_MEMORY_GIB, "gpu-memory is GiB of one GPU's memory, and no GPU has more than 1 TiB "
                                          "(4 GiB is written \"4\", not \"4Gi\")"),
    GPU_MEMORY_MIB: Bound(MAX_GPU_MEMORY_GIB * 1024, "gpu-memory-mib is MiB of one GPU's memory, and no GPU has more "
                                                     "than 1 TiB"),
    GPU_SLICE: Bound(max(SLICE_VALUES), "gpu-slice must be one of 1, 2, 3, 4, 7 (MIG compute slices)"),
    RDMA: Bound(1, "aliyun.com/rdma is a switch, not a NIC count: set it to \"1\" to place GPUs and RDMA NICs "
                   "together, or leave it out"),
}
"""The upper bound of every resource Phalanx reads, with its rule."""


class RequestError(ValueError):
    """The pod's request is invalid; ``violations`` lists every rule it breaks."""

    def __init__(self, violations: Sequence[Violation], pod: str = "") -> None:
        self.violations = tuple(violations)
        self.pod = pod
        head = f"invalid GPU request in pod {pod}" if pod else "invalid GPU request"
        super().__init__(head + ": " + "; ".join(str(v) for v in self.violations))


class GpuRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A valid request. ``gpus`` is the number of GPUs (whole, or each with the share);
    ``core_pct`` 0 means no compute limit; ``memory_mib`` is per GPU, 0 when not asked."""

    pod: str
    scheduler_name: str
    kind: RequestKind
    gpus: int = 0
    core_pct: int = 0
    memory_mib: int = 0
    mig_slices: int = 0
    rdma: bool = False
    vendor: str = ""
    resource_name: str = ""
    min_member: int = 0
    host_network: bool = False
    runtime_class: str = ""
    warnings: tuple[str, ...] = ()
    constraints: PodConstraints = PodConstraints()
    """What the pod asks of a node besides GPUs (``podspec``)."""

    def member_spec(self, pod: PodRef) -> MemberSpec:
        """The wire form of this request for ``PlacementRequested``, constraints included."""
        return MemberSpec(pod=pod, gpus=self.gpus, core_pct=self.core_pct, memory_mib=self.memory_mib,
                          mig_slices=self.mig_slices, rdma=self.rdma, vendor=self.vendor,
                          resource_name=self.resource_name or NVIDIA_GPU, **msgspec.structs.asdict(self.constraints))

    def describe(self) -> str:
        """One line for people: what the pod gets."""
        n = self.gpus
        match self.kind:
            case RequestKind.WHOLE:
                text = f"{n} whole GPU{'s' if n != 1 else ''} ({self.resource_name})"
            case RequestKind.TDM:
                parts = [f"{self.core_pct}% core" if self.core_pct else "no core limit"]
                if self.memory_mib:
                    parts.append(f"{self.memory_mib} MiB")
                text = f"TDM share {', '.join(parts)} " + (f"on each of {n} GPUs" if n > 1 else "on 1 GPU")
            case RequestKind.MIG:
                mem = f", {self.memory_mib} MiB" if self.memory_mib else ""
                text = f"MIG {self.mig_slices} slice{'s' if self.mig_slices != 1 else ''}{mem} " + (
                    f"on each of {n} GPUs" if n > 1 else "on 1 GPU")
            case _:
                text = "no GPU"
        if self.rdma:
            text += " + RDMA NICs"
        if self.min_member:
            text += f", gang of {self.min_member}"
        asks = _constraints_text(self.constraints)
        return f"{text}; {asks}" if asks else text


def parse_pod(pod: Mapping[str, Any], *, require_scheduler: bool = True) -> GpuRequest:
    """Parse and validate a pod (or pod template: ``metadata`` + ``spec``).

    Raises ``RequestError`` with every violation found. With ``require_scheduler`` (the
    default) a ``schedulerName`` other than Phalanx's two names is a violation too.
    Overview: per-container values and combinations first, then the pod-level rules (one
    kind of request, homogeneous shares, replica, vendor, RDMA), collecting every violation.
    """
    if not isinstance(pod, Mapping):
        raise RequestError([Violation("(pod)", type(pod).__name__, "a pod must be a mapping")])
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    labels = _mapping(meta.get("labels"))
    v: list[Violation] = list(names.check_metadata(meta))
    name = _text(meta.get("name") or meta.get("generateName"))
    pod_name = f"{_text(meta.get('namespace'))}/{name}" if meta.get("namespace") and name else name
    warnings: list[str] = []

    scheduler = str(spec.get("schedulerName") or "default-scheduler")
    if require_scheduler and scheduler not in SCHEDULER_NAMES:
        v.append(Violation("spec.schedulerName", scheduler,
                           "Phalanx schedules only pods whose schedulerName is 'phalanx' or "
                           "'lj-runtimekit-scheduler'; this pod would wait for another scheduler"))
    per = _containers(spec, v)
    whole, shares = _kinds(per, v)
    replica = _replica(labels, whole, shares, v)
    min_member = _label_int(labels, MIN_MEMBER_LABEL, MAX_GANG, v, "min-member is the number of pods in the gang")
    share = shares[0][1] if shares else None
    vendor = _vendor(_mapping(meta.get("annotations")), whole, share, v)
    rdma = _rdma(per, whole, spec, bool(min_member), v, warnings)
    constraints = parse_constraints(spec, RESOURCES, v, warnings)
    if v:
        raise RequestError(v, pod_name)

    common = dict(pod=pod_name, scheduler_name=scheduler, min_member=min_member or 0,
                  host_network=constraints.host_network, runtime_class=str(spec.get("runtimeClassName") or ""),
                  warnings=tuple(warnings), constraints=constraints)
    if whole:
        (resource, count), = whole.items()
        return GpuRequest(kind=RequestKind.WHOLE, gpus=count, resource_name=resource, rdma=rdma,
                          vendor=vendor or ("nvidia" if resource == NVIDIA_GPU else ""), **common)
    if share:
        core, memory_mib, slices = share
        return GpuRequest(kind=RequestKind.MIG if slices else RequestKind.TDM, gpus=replica or 1, core_pct=core,
                          memory_mib=memory_mib, mig_slices=slices, vendor=vendor, **common)
    return GpuRequest(kind=RequestKind.NONE, vendor=vendor, **common)


_Container = tuple[str, dict[str, int], Mapping[str, Any]]  # name, valid asks, the container


def _containers(spec: Mapping[str, Any], v: list[Violation]) -> list[_Container]:
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        v.append(Violation("spec.containers", _show(containers), "a pod needs at least one container"))
        containers = []
    inits = spec.get("initContainers") or []
    if not isinstance(inits, list):
        v.append(Violation("spec.initContainers", _show(inits), "must be a list of containers"))
        inits = []
    for section, items in (("containers", containers), ("initContainers", inits)):
        v.extend(Violation(f"spec.{section}[{i}]", _show(c), "must be a container (a mapping)")
                 for i, c in enumerate(items) if not isinstance(c, Mapping))
    for i, c in enumerate(inits):
        cname = _cname(c, i)
        for key in _asks(c, cname, "initContainers", v):
            v.append(Violation(f"spec.initContainers[{cname}].resources.limits[{key}]", _show(_limit(c, key)),
                               "init containers cannot ask for GPU resources; ask in the main containers"))
    per = []
    for i, c in enumerate(containers):
        cname = _cname(c, i)
        asks = _asks(c, cname, "containers", v)
        _check_container(cname, asks, v)
        per.append((cname, asks, _mapping(c)))
    return per


def _kinds(per: list[_Container], v: list[Violation]) -> tuple[dict[str, int], list[tuple[str, _Share]]]:
    """Whole GPUs per resource name (summed over containers) and each sharing container's
    share; violations when the pod mixes names, kinds or shares."""
    whole = {k: sum(a.get(k, 0) for _, a, _ in per) for k in WHOLE_RESOURCES if any(k in a for _, a, _ in per)}
    if len(whole) > 1:
        v.append(Violation("spec.containers", ", ".join(f"{k}={n}" for k, n in whole.items()),
                           "ask for whole GPUs under one name: nvidia.com/gpu (NVIDIA, community name) or "
                           "aliyun.com/gpu (any vendor), not both"))
    shares = [(cn, _share_of(a)) for cn, a, _ in per if _is_share(a)]
    whole_only = [cn for cn, a, _ in per if _is_whole(a) and not _is_share(a)]
    share_only = [cn for cn, a, _ in per if _is_share(a) and not _is_whole(a)]
    if whole_only and share_only:
        kinds = [f"{cn}={'whole' if cn in whole_only else 'share'}" for cn, _, _ in per
                 if cn in whole_only or cn in share_only]
        v.append(Violation("spec.containers", ", ".join(kinds),
                           "all containers of a pod must ask for the same kind of GPU: whole GPUs, or one "
                           "TDM/MIG share per GPU (seed 3.4: homogeneous requests only)"))
    if len({s for _, s in shares}) > 1:
        v.append(Violation("spec.containers", "; ".join(f"{cn}: {_share_text(s)}" for cn, s in shares),
                           "heterogeneous per-GPU requests are not supported: every container that asks "
                           "for a GPU share must ask the same gpu-core/gpu-memory/gpu-slice, and the pod "
                           "label replica sets how many GPUs get that share (seed 3.4)"))
    return whole, shares


def _replica(labels: Mapping[str, Any], whole: Mapping[str, int], shares: list[tuple[str, _Share]],
             v: list[Violation]) -> int | None:
    replica = _label_int(labels, REPLICA_LABEL, MAX_GPUS, v, "replica is the number of GPUs")
    field = f"metadata.labels[{REPLICA_LABEL}]"
    if replica is not None and whole:
        v.append(Violation(field, str(labels[REPLICA_LABEL]),
                           "replica applies to GPU shares (gpu-core/gpu-memory/gpu-slice); for whole GPUs "
                           f"ask {next(iter(whole))}: N instead"))
    elif replica is not None and not shares:
        v.append(Violation(field, str(labels[REPLICA_LABEL]),
                           f"replica asks for {replica} GPUs but no container says what each GPU gets: set "
                           "aliyun.com/gpu-core and/or aliyun.com/gpu-memory (or gpu-slice) in resources.limits"))
    return replica


def _vendor(annotations: Mapping[str, Any], whole: Mapping[str, int], share: _Share | None,
            v: list[Violation]) -> str:
    vendor = str(annotations.get(VENDOR_ANNOTATION) or "")
    field = f"metadata.annotations[{VENDOR_ANNOTATION}]"
    if vendor and vendor not in VENDORS:
        v.append(Violation(field, vendor, f"the GPU vendor hint must be one of {', '.join(VENDORS)}"))
    if vendor in ("amd", "ppu") and NVIDIA_GPU in whole:
        v.append(Violation(field, vendor, f"nvidia.com/gpu asks for NVIDIA GPUs; for {vendor} GPUs ask "
                                          "aliyun.com/gpu"))
    if vendor == "amd" and share:
        v.append(Violation(field, vendor, "AMD GPUs take whole-GPU requests only; gpu-core, gpu-memory and "
                                          "gpu-slice cannot be used with them (seed 3.5)"))
    elif vendor == "ppu" and share and share[2]:
        v.append(Violation(field, vendor, "MIG (gpu-slice) is an NVIDIA feature; on PPU use a TDM share "
                                          "(gpu-core/gpu-memory) instead (seed 3.3)"))
    return vendor


def _rdma(per: list[_Container], whole: Mapping[str, int], spec: Mapping[str, Any], gang: bool,
          v: list[Violation], warnings: list[str]) -> bool:
    """Whether the pod asks for RDMA; violations for RDMA without whole GPUs (1..8) or the
    host network, and for gang members without IPC_LOCK (a warning for single pods)."""
    rdma = [(cn, c) for cn, a, c in per if a.get(RDMA) == 1]
    if not rdma:
        return False
    if not whole:
        v.append(Violation(f"spec.containers[{rdma[0][0]}].resources.limits[{RDMA}]", "1",
                           "aliyun.com/rdma places whole GPUs together with RDMA NICs: ask for "
                           f"aliyun.com/gpu (1 to {RDMA_MAX_GPUS}) with it, not a GPU share or nothing"))
    elif sum(whole.values()) > RDMA_MAX_GPUS:
        v.append(Violation("spec.containers", str(sum(whole.values())),
                           f"with aliyun.com/rdma the pod asks for 1 to {RDMA_MAX_GPUS} whole GPUs"))
    if spec.get("hostNetwork") is not True:
        v.append(Violation("spec.hostNetwork", _show(spec.get("hostNetwork", False)),
                           "RDMA needs hostNetwork: true (seed 4.1)"))
    for cn, c in rdma:
        if "IPC_LOCK" in _capabilities(c):
            continue
        if gang:
            v.append(Violation(f"spec.containers[{cn}].securityContext.capabilities.add", _show(_capabilities(c)),
                               "RDMA gang members need the IPC_LOCK capability, or RDMA memory registration "
                               "fails (seed 4.2)"))
        else:
            warnings.append(f"container {cn} uses RDMA without the IPC_LOCK capability; RDMA memory "
                            "registration may fail")
    return True


# --- helpers --------------------------------------------------------------------------------


def _amount_text(resource: str, n: int) -> str:
    """An amount as a person writes it: cpu in cores or millicores, bytes with a binary suffix."""
    if resource == "cpu":
        return f"{n // 1000}" if n % 1000 == 0 else f"{n}m"
    if resource == "memory" or resource == "ephemeral-storage" or resource.startswith("hugepages-"):
        for suffix, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if n % size == 0:
                return f"{n // size}{suffix}"
    return str(n)


def _constraints_text(c: PodConstraints) -> str:
    """What the pod asks of a node besides GPUs, in one clause ('' when nothing)."""
    parts = [f"{r} {_amount_text(r, n)}" for r, n in c.requests.items()]
    parts += [f"host port {p.port}/{p.protocol}" for p in c.host_ports]
    parts += [f"nodeSelector {k}={x}" for k, x in c.node_selector.items()]
    if c.node_affinity is not None:
        parts.append(f"required node affinity ({len(c.node_affinity)} term{'s' if len(c.node_affinity) != 1 else ''})")
    if c.node_name:
        parts.append(f"nodeName {c.node_name}")
    if c.tolerations:
        parts.append(f"{len(c.tolerations)} toleration{'s' if len(c.tolerations) != 1 else ''}")
    return ", ".join(parts)


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _show(raw: Any) -> str:
    """A value for a violation: scalars as ``quantity.shown`` shows them, a list by its first
    items (never recursing into nested values)."""
    if raw is None:
        return "None"
    if isinstance(raw, list):
        return "[" + ", ".join(shown(x) for x in raw[:8]) + (", ..." if len(raw) > 8 else "") + "]"
    return shown(raw)


def _text(raw: Any) -> str:
    """A name as written ('' when it is not a string, cut when it is too long to be a name;
    a violation says so)."""
    if not isinstance(raw, str):
        return ""
    return raw if len(raw) <= names.SUBDOMAIN_MAX else shown(raw)


def _cname(c: Any, i: int) -> str:
    name = _mapping(c).get("name")
    return shown(name) if isinstance(name, str) and name else str(i)


def _limit(c: Any, key: str) -> Any:
    res = _mapping(_mapping(c).get("resources"))
    return _mapping(res.get("limits")).get(key, _mapping(res.get("requests")).get(key))


def _capabilities(c: Mapping[str, Any]) -> list[str]:
    caps = _mapping(_mapping(c.get("securityContext")).get("capabilities")).get("add") or []
    return [str(x) for x in caps] if isinstance(caps, list) else []


def _value_rule(key: str, n: int) -> str:
    """The rule ``n`` breaks for resource ``key``, or '' when it is fine."""
    if key in WHOLE_RESOURCES and n < 1:
        return f"{key} is a number of whole GPUs and must be at least 1 (leave it out to ask for none)"
    if key == GPU_CORE and n == 0:
        return ("gpu-core 0 is not allowed: it would make the GPU program in the container hang without output "
                "(seed FAQ Q1); give a percent from 1 to 100, or leave gpu-core out for no compute limit")
    if key == GPU_MEMORY and n < 1:
        return "gpu-memory is GiB of GPU memory and must be at least 1 (for less, use aliyun.com/gpu-memory-mib)"
    if key == GPU_MEMORY_MIB and (n < GPU_MEMORY_MIB_UNIT or n % GPU_MEMORY_MIB_UNIT):
        lower = max(GPU_MEMORY_MIB_UNIT, n // GPU_MEMORY_MIB_UNIT * GPU_MEMORY_MIB_UNIT)
        upper = max(GPU_MEMORY_MIB_UNIT, -(-n // GPU_MEMORY_MIB_UNIT) * GPU_MEMORY_MIB_UNIT)
        near = f"{lower}" if lower == upper else f"{lower} or {upper}"
        return (f"gpu-memory-mib must be a positive multiple of {GPU_MEMORY_MIB_UNIT} MiB (the MiB granularity, "
                f"seed 3.5); the nearest allowed: {near}")
    if key == GPU_SLICE and n not in SLICE_VALUES:
        return "gpu-slice must be one of 1, 2, 3, 4, 7 (MIG compute slices)"
    if key == RDMA and n != 1:
        return MOST[RDMA].rule
    return ""


def _asks(c: Any, cname: str, section: str, v: list[Violation]) -> dict[str, int]:
    """The valid Phalanx resources one container asks for; violations for the rest."""
    res = _mapping(_mapping(c).get("resources"))
    limits, requests = _mapping(res.get("limits")), _mapping(res.get("requests"))
    asks: dict[str, int] = {}
    for key in RESOURCES:
        lfield = f"spec.{section}[{cname}].resources.limits[{key}]"
        rfield = f"spec.{section}[{cname}].resources.requests[{key}]"
        if key not in limits:
            if key in requests:
                v.append(Violation(rfield, _show(requests[key]),
                                   "must be set in resources.limits; Kubernetes does not overcommit extended "
                                   "resources, so requests may only repeat the limit"))
            continue
        raw = limits[key]
        n = count(raw, lfield, most=MOST[key])
        if isinstance(n, Violation):
            v.append(n)
            continue
        if key in requests and count(requests[key], rfield, most=MOST[key]) != n:
            v.append(Violation(rfield, _show(requests[key]), f"must equal the limit ({_show(raw)}) or be left out"))
        rule = _value_rule(key, n)
        if rule:
            v.append(Violation(lfield, _show(raw), rule))
            continue
        asks[key] = n
    return asks


def _check_container(cname: str, asks: Mapping[str, int], v: list[Violation]) -> None:
    path = f"spec.containers[{cname}].resources.limits"
    whole = next((k for k in WHOLE_RESOURCES if k in asks), None)

    def both(*keys: str) -> str:
        return ", ".join(f"{k}={asks[k]}" for k in keys)

    if whole:
        for key, what in ((GPU_CORE, "a whole GPU has no compute limit; leave gpu-core out (seed 3.2)"),
                          (GPU_MEMORY, "a whole GPU comes with all its memory; leave gpu-memory out"),
                          (GPU_MEMORY_MIB, "a whole GPU comes with all its memory; leave gpu-memory-mib out"),
                          (GPU_SLICE, "a MIG slice is part of one GPU; ask for one or the other")):
            if key in asks:
                v.append(Violation(path, both(whole, key),
                                   f"{key} cannot be combined with a whole-GPU request ({whole}): {what}"))
    if GPU_CORE in asks and GPU_SLICE in asks:
        v.append(Violation(path, both(GPU_CORE, GPU_SLICE),
                           "TDM (gpu-core) and MIG (gpu-slice) cannot be combined: they never share a GPU "
                           "(seed 3.5); ask for one or the other"))
    if GPU_MEMORY in asks and GPU_MEMORY_MIB in asks:
        v.append(Violation(path, both(GPU_MEMORY, GPU_MEMORY_MIB),
                           "give GPU memory once: aliyun.com/gpu-memory in GiB or aliyun.com/gpu-memory-mib "
                           "in MiB"))


def _is_whole(asks: Mapping[str, int]) -> bool:
    return any(k in asks for k in WHOLE_RESOURCES)


def _is_share(asks: Mapping[str, int]) -> bool:
    return any(k in asks for k in SHARE_RESOURCES)


_Share = tuple[int, int, int]  # core percent, memory MiB, MIG slices (0 = not asked)


def _share_of(asks: Mapping[str, int]) -> _Share:
    memory = asks.get(GPU_MEMORY, 0) * 1024 or asks.get(GPU_MEMORY_MIB, 0)
    return (asks.get(GPU_CORE, 0), memory, asks.get(GPU_SLICE, 0))


def _share_text(share: _Share) -> str:
    core, memory, slices = share
    parts = ([f"gpu-core={core}"] if core else []) + ([f"gpu-slice={slices}"] if slices else [])
    parts += [f"memory={memory}MiB"] if memory else []
    return " ".join(parts) or "none"


def _label_int(labels: Mapping[str, Any], key: str, most: Bound, v: list[Violation], what: str) -> int | None:
    """The integer in label ``key`` (``quantity.decimal``: ASCII digits, 1..most), None when
    absent or invalid (then a violation says ``what`` it is and why)."""
    if not isinstance(labels.get(key), str):
        return None  # absent, or not a string (names.check_metadata says so)
    n = decimal(labels[key], f"metadata.labels[{key}]", most=most)
    if isinstance(n, Violation):
        v.append(Violation(n.field, n.value, f"{what}: {n.rule}"))
        return None
    return n

