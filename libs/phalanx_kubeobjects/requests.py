"""A pod's GPU request, parsed and validated (R1-R5, R7, R8 label, R12).

Called by gang-coordinator (every pod it admits), by ``phalanx validate`` and by tests. The
input is a plain dict as it comes from YAML or the Kubernetes API; the output is a frozen
``GpuRequest``, or a ``RequestError`` that lists every ``Violation`` found, each naming the
field, the value and the rule. Node-side rules (MIG only on MIG-capable models, AMD whole
GPUs only, memory that the GPU has) are the engine's (``phalanx_engine.gpumodel``).

Resource names (``spec.containers[*].resources.limits``; ``requests`` may only repeat them;
each container's values and combinations are checked by ``containers``, the pod-level rules
here).
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
(``nvidia``, ``amd``, ``ppu``) - vendor hint; annotation ``phalanx.io/gang-timeout-seconds`` - the
gang's attempt deadline, a whole number of seconds up to a week (``gang_timeout``). Shares are per GPU and per pod: every
container that names a share must name the same one (they share the pod's GPUs);
whole GPUs add up over containers, as in Kubernetes.

Everything else the pod asks of a node (CPU, memory and other requests, tolerations,
nodeSelector, required node affinity, nodeName, host ports, required pod (anti-)affinity with the
pod's labels) is read by ``podspec`` into
``GpuRequest.constraints`` and carried in ``MemberSpec``, required and preferred terms alike
(the placement engine filters by the first and ranks by the second: docs/placement.md).
Workload objects (Job, JobSet, MPIJob, ...) are in ``workloads``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from phalanx_kubeobjects import names
from phalanx_kubeobjects.containers import (
    MAX_GPUS,
    RESOURCES,
    WHOLE_RESOURCES,
    Container,
    Share,
    containers,
    is_share,
    is_whole,
    share_of,
    share_text,
)
from phalanx_kubeobjects.names import name_text
from phalanx_kubeobjects.podspec import PodConstraints, parse_constraints
from phalanx_kubeobjects.quantity import Bound, decimal
from phalanx_kubeobjects.violations import Violation, as_map, shown_value
from phalanx_proto.events import MemberSpec, PodRef, RequestKind
from phalanx_proto.kubeapi import (
    ALIYUN_GPU,
    GANG_MIN_MEMBER,
    MIN_MEMBER_KEYS,
    NVIDIA_GPU,
    RDMA,
    REPLICA_LABEL,
    SCHEDULER_NAMES,
    TIMEOUT_ANNOTATION,
    VENDOR_ANNOTATION,
)
from phalanx_proto.state import MAX_GANG_MEMBERS, MAX_GANG_TIMEOUT_S

MAX_TIMEOUT = Bound(int(MAX_GANG_TIMEOUT_S), "a gang waits at most a week for its members")
VENDORS = ("nvidia", "amd", "ppu")
RDMA_MAX_GPUS = 8
MAX_GANG = Bound(MAX_GANG_MEMBERS, f"a gang has at most {MAX_GANG_MEMBERS} pods (the wire contract's bound: one "
                                   "decision commits at most 1,000 nodes)")


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
        """The wire form of this request for ``PlaceRequested``, constraints included."""
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
    meta = as_map(pod.get("metadata"))
    spec = as_map(pod.get("spec"))
    labels = as_map(meta.get("labels"))
    v: list[Violation] = list(names.check_metadata(meta))
    name = name_text(meta.get("name") or meta.get("generateName"))
    pod_name = f"{name_text(meta.get('namespace'))}/{name}" if meta.get("namespace") and name else name
    warnings: list[str] = []

    scheduler = str(spec.get("schedulerName") or "default-scheduler")
    if require_scheduler and scheduler not in SCHEDULER_NAMES:
        v.append(Violation("spec.schedulerName", scheduler,
                           "Phalanx schedules only pods whose schedulerName is 'phalanx' or "
                           "'lj-runtimekit-scheduler'; this pod would wait for another scheduler"))
    per = containers(spec, v)
    whole, shares = _kinds(per, v)
    replica = _replica(labels, whole, shares, v)
    said = min_member_said(labels, as_map(meta.get("annotations")), v)
    min_member = said.explicit or said.declared
    share = shares[0][1] if shares else None
    vendor = _vendor(as_map(meta.get("annotations")), whole, share, v)
    gang_timeout(as_map(meta.get("annotations")), v)
    rdma = _rdma(per, whole, spec, bool(min_member), v, warnings)
    constraints = parse_constraints(spec, RESOURCES, v, meta.get("labels"))
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


def _kinds(per: list[Container], v: list[Violation]) -> tuple[dict[str, int], list[tuple[str, Share]]]:
    """Whole GPUs per resource name (summed over containers) and each sharing container's
    share; violations when the pod mixes names, kinds or shares."""
    whole = {k: sum(a.get(k, 0) for _, a, _ in per) for k in WHOLE_RESOURCES if any(k in a for _, a, _ in per)}
    if len(whole) > 1:
        v.append(Violation("spec.containers", ", ".join(f"{k}={n}" for k, n in whole.items()),
                           "ask for whole GPUs under one name: nvidia.com/gpu (NVIDIA, community name) or "
                           "aliyun.com/gpu (any vendor), not both"))
    shares = [(cn, share_of(a)) for cn, a, _ in per if is_share(a)]
    whole_only = [cn for cn, a, _ in per if is_whole(a) and not is_share(a)]
    share_only = [cn for cn, a, _ in per if is_share(a) and not is_whole(a)]
    if whole_only and share_only:
        kinds = [f"{cn}={'whole' if cn in whole_only else 'share'}" for cn, _, _ in per
                 if cn in whole_only or cn in share_only]
        v.append(Violation("spec.containers", ", ".join(kinds),
                           "all containers of a pod must ask for the same kind of GPU: whole GPUs, or one "
                           "TDM/MIG share per GPU (seed 3.4: homogeneous requests only)"))
    if len({s for _, s in shares}) > 1:
        v.append(Violation("spec.containers", "; ".join(f"{cn}: {share_text(s)}" for cn, s in shares),
                           "heterogeneous per-GPU requests are not supported: every container that asks "
                           "for a GPU share must ask the same gpu-core/gpu-memory/gpu-slice, and the pod "
                           "label replica sets how many GPUs get that share (seed 3.4)"))
    return whole, shares


def _replica(labels: Mapping[str, Any], whole: Mapping[str, int], shares: list[tuple[str, Share]],
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


def _vendor(annotations: Mapping[str, Any], whole: Mapping[str, int], share: Share | None,
            v: list[Violation]) -> str:
    vendor = str(annotations.get(VENDOR_ANNOTATION) or "")
    field = f"metadata.annotations[{VENDOR_ANNOTATION}]"
    if vendor and vendor not in VENDORS:
        v.append(Violation(field, vendor, f"the GPU vendor hint must be one of {', '.join(VENDORS)}"))
    if vendor in ("amd", "ppu") and NVIDIA_GPU in whole:
        v.append(Violation(field, vendor, f"{NVIDIA_GPU} asks for NVIDIA GPUs; for {vendor} GPUs ask "
                                          f"{ALIYUN_GPU}"))
    if vendor == "amd" and share:
        v.append(Violation(field, vendor, "AMD GPUs take whole-GPU requests only; gpu-core, gpu-memory and "
                                          "gpu-slice cannot be used with them (seed 3.5)"))
    elif vendor == "ppu" and share and share[2]:
        v.append(Violation(field, vendor, "MIG (gpu-slice) is an NVIDIA feature; on PPU use a TDM share "
                                          "(gpu-core/gpu-memory) instead (seed 3.3)"))
    return vendor


def _rdma(per: list[Container], whole: Mapping[str, int], spec: Mapping[str, Any], gang: bool,
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
        v.append(Violation("spec.hostNetwork", shown_value(spec.get("hostNetwork", False)),
                           "RDMA needs hostNetwork: true (seed 4.1)"))
    for cn, c in rdma:
        if "IPC_LOCK" in _capabilities(c):
            continue
        if gang:
            v.append(Violation(f"spec.containers[{cn}].securityContext.capabilities.add", shown_value(_capabilities(c)),
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
    for what, terms in (("pod affinity", c.pod_affinity), ("pod anti-affinity", c.pod_anti_affinity)):
        if terms:
            parts.append(f"required {what} on {', '.join(sorted({t.topology_key for t in terms}))}")
    parts += [f"spread over {s.topology_key} (maxSkew {s.max_skew})" for s in c.spread]
    prefers = [f"node affinity ({len(c.preferred_node_affinity)} term{'s' if len(c.preferred_node_affinity) != 1 else ''})"
               ] if c.preferred_node_affinity else []
    for what, weighted in (("pod affinity", c.preferred_affinity), ("pod anti-affinity", c.preferred_anti_affinity)):
        if weighted:
            prefers.append(f"{what} on {', '.join(sorted({w.term.topology_key for w in weighted}))}")
    prefers += [f"spread over {s.topology_key}" for s in c.soft_spread]
    if prefers:
        parts.append(f"prefers {', '.join(prefers)}")
    return ", ".join(parts)


def _capabilities(c: Mapping[str, Any]) -> list[str]:
    caps = as_map(as_map(c.get("securityContext")).get("capabilities")).get("add") or []
    return [str(x) for x in caps] if isinstance(caps, list) else []


class MinMember(NamedTuple):
    """What a pod says of its gang's size: ``explicit`` (``phalanx.io/gang-min-member``), and
    ``declared``, the first of ``MIN_MEMBER_KEYS`` present; ``key``: where the one that counts
    (explicit first) was read."""

    explicit: int | None
    declared: int | None
    key: str


def min_member_said(labels: Mapping[str, Any], annotations: Mapping[str, Any], v: list[Violation]) -> MinMember:
    """The gang size a pod says, read in one place for the request (``parse_pod``) and the gang
    (``gangs.identity``): each key as a label, else an annotation; a value that is not a whole
    number of pods in bounds is a violation naming the key."""
    def count(key: str) -> int | None:
        for where in (labels, annotations):
            raw = where.get(key)
            if isinstance(raw, str) and raw:
                n = decimal(raw, f"metadata.labels[{key}]", most=MAX_GANG)
                if isinstance(n, Violation):
                    v.append(Violation(n.field, n.value, f"min-member is the number of pods in the gang: {n.rule}"))
                    return None
                return n
        return None

    def present(key: str) -> bool:
        return any(isinstance(w.get(key), str) and w[key] for w in (labels, annotations))

    explicit = count(GANG_MIN_MEMBER)
    key = next((k for k in MIN_MEMBER_KEYS if present(k)), "")
    declared = count(key) if key else None
    return MinMember(explicit, declared, GANG_MIN_MEMBER if explicit is not None else key)


def gang_timeout(annotations: Mapping[str, Any], v: list[Violation]) -> float:
    """The ``phalanx.io/gang-timeout-seconds`` annotation in seconds (whole, 1 s to a week);
    0.0 when absent or invalid (then a violation says why)."""
    raw = annotations.get(TIMEOUT_ANNOTATION)
    if raw is None:
        return 0.0
    value = decimal(raw, f"metadata.annotations[{TIMEOUT_ANNOTATION}]", most=MAX_TIMEOUT)
    if isinstance(value, Violation):
        v.append(Violation(value.field, value.value, f"the gang timeout is a whole number of seconds: {value.rule}"))
        return 0.0
    return float(value)


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
