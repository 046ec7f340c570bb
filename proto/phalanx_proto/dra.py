"""Dynamic Resource Allocation (``resource.k8s.io/v1``) on the wire: the devices a pool of a DRA
driver publishes (``DraPool``, KV ``phx-dra``), what a pod's ResourceClaims ask
(``ClaimSpec``, carried in ``MemberSpec.claims``) and what Phalanx allocated for them
(``ClaimAllocated``, carried in ``Assignment.claims`` and so in the ledger), docs/dra.md.

The shapes follow the Kubernetes API objects field by field (snake_case here); values keep the
API's own strings: quantities as the API writes them (``"40Gi"``), attribute names as
qualified names (``gpu.nvidia.com/productName`` or the bare ``productName``, which belongs to the
driver's domain), CEL selectors as their text. gang-coordinator reads the API objects
(``phalanx_kubeobjects.dra``) and resolves each request's DeviceClass into it (its selectors and
config), so the engine needs no DeviceClass of its own; the engine's allocator
(``phalanx_engine.dra``) evaluates them.

Bounds are the API server's (``resource/v1`` validation), so a value the API server took always
fits, and a wire value beyond them does not decode.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

import msgspec

from phalanx_proto.codec import Decoder
from phalanx_proto.scheduling import NodeSelectorTerm

# --- the API server's bounds (resource/v1) -------------------------------------------------------
MAX_DEVICES_PER_SLICE = 128
MAX_SLICES_PER_POOL = 1024
"""Slices Phalanx keeps for one pool (the API server has no such bound; a pool this large is
refused by gang-coordinator with this rule rather than half kept)."""
MAX_ATTRIBUTES = 32
"""Attributes plus capacities of one device."""
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMES = 2
"""``consumesCounters`` entries of one device."""
MAX_DEVICE_TAINTS = 16
MAX_SELECTORS = 32
MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_RESULTS = 32
"""Devices one claim is allocated at most (``AllocationResultsMaxSize``)."""
MAX_RESERVED_FOR = 256
MAX_CLAIMS_PER_POD = 32
MAX_CEL_TEXT = 10 * 1024
MAX_OPAQUE_BYTES = 10 * 1024

Name = Annotated[str, msgspec.Meta(max_length=253)]
"""A DNS subdomain: a driver, a pool, a DeviceClass, a claim, a namespace."""
DeviceName = Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
QualifiedName = Annotated[str, msgspec.Meta(min_length=1, max_length=317)]
"""``<domain>/<id>`` or a bare ``<id>`` (the driver's own domain)."""
QuantityText = Annotated[str, msgspec.Meta(max_length=64)]
CelText = Annotated[str, msgspec.Meta(max_length=MAX_CEL_TEXT)]
AttrText = Annotated[str, msgspec.Meta(max_length=64)]
Effect = Literal["NoSchedule", "NoExecute", "None"]
AllocationMode = Literal["ExactCount", "All"]


# --- what a driver publishes ---------------------------------------------------------------------
class AttrValue(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One device attribute (``DeviceAttribute``): exactly one field is set."""

    int_: int | None = msgspec.field(default=None, name="int")
    bool_: bool | None = msgspec.field(default=None, name="bool")
    string: AttrText | None = None
    version: AttrText | None = None
    """A semantic version (semver 2.0, without a leading ``v``)."""

    def value(self) -> int | bool | str | None:
        """The one value set (a version as its text), or None when none is."""
        for v in (self.int_, self.bool_, self.string, self.version):
            if v is not None:
                return v
        return None


class CapacityRange(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``CapacityRequestPolicyRange``."""

    min: QuantityText
    max: QuantityText = ""
    step: QuantityText = ""


class CapacityPolicy(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``CapacityRequestPolicy``: how a shared device's capacity is handed out (consumable
    capacity): a default, and either listed valid values or a range."""

    default: QuantityText = ""
    valid_values: Annotated[tuple[QuantityText, ...], msgspec.Meta(max_length=10)] = ()
    valid_range: CapacityRange | None = None


class Capacity(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceCapacity``."""

    value: QuantityText
    request_policy: CapacityPolicy | None = None


class CounterUse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceCounterConsumption``: the counters of one of the pool's counter sets a device
    uses while allocated."""

    counter_set: DeviceName
    counters: Annotated[dict[DeviceName, QuantityText], msgspec.Meta(max_length=MAX_COUNTERS)] = {}


class CounterSet(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``CounterSet``: counters shared by the devices of a pool (a GPU's memory slices)."""

    name: DeviceName
    counters: Annotated[dict[DeviceName, QuantityText], msgspec.Meta(max_length=MAX_COUNTERS)] = {}


class DeviceTaint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceTaint``: ``NoSchedule`` and ``NoExecute`` keep a device from claims that do not
    tolerate it; ``None`` only informs."""

    key: QualifiedName
    value: Annotated[str, msgspec.Meta(max_length=63)] = ""
    effect: Effect


class NodeSelection(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Which nodes can reach a slice's devices (or one device's, with per-device node
    selection): exactly one of a node name, a node selector of one term, or all nodes."""

    node_name: Name = ""
    node_selector: NodeSelectorTerm | None = None
    all_nodes: bool = False


class Device(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One device of a ResourceSlice."""

    name: DeviceName
    attributes: Annotated[dict[QualifiedName, AttrValue], msgspec.Meta(max_length=MAX_ATTRIBUTES)] = {}
    capacity: Annotated[dict[QualifiedName, Capacity], msgspec.Meta(max_length=MAX_ATTRIBUTES)] = {}
    consumes_counters: Annotated[tuple[CounterUse, ...], msgspec.Meta(max_length=MAX_CONSUMES)] = ()
    taints: Annotated[tuple[DeviceTaint, ...], msgspec.Meta(max_length=MAX_DEVICE_TAINTS)] = ()
    allow_multiple_allocations: bool = False
    binds_to_node: bool = False
    binding_conditions: Annotated[tuple[QualifiedName, ...], msgspec.Meta(max_length=4)] = ()
    binding_failure_conditions: Annotated[tuple[QualifiedName, ...], msgspec.Meta(max_length=4)] = ()
    nodes: NodeSelection | None = None
    """The device's own node selection (a slice with ``perDeviceNodeSelection``); None: the
    slice's."""


class Slice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ResourceSlice of a pool."""

    name: Name
    generation: Annotated[int, msgspec.Meta(ge=0)] = 0
    """``spec.pool.generation``: only the pool's highest generation counts."""
    slice_count: Annotated[int, msgspec.Meta(ge=1)] = 1
    """``spec.pool.resourceSliceCount``: the pool is complete with this many slices of its generation."""
    nodes: NodeSelection = NodeSelection()
    per_device_nodes: bool = False
    """``perDeviceNodeSelection``: each device says its nodes (``Device.nodes``)."""
    devices: Annotated[tuple[Device, ...], msgspec.Meta(max_length=MAX_DEVICES_PER_SLICE)] = ()
    shared_counters: Annotated[tuple[CounterSet, ...], msgspec.Meta(max_length=MAX_COUNTER_SETS)] = ()


class InUse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A device of the pool allocated by a ResourceClaim (by any scheduler): not to be given
    again, unless the device allows multiple allocations, then only its remaining capacity."""

    device: DeviceName
    claim: Annotated[str, msgspec.Meta(max_length=600)]
    """``<namespace>/<name>/<uid>`` of the claim holding it."""
    share_id: Annotated[str, msgspec.Meta(max_length=64)] = ""
    consumed: Annotated[dict[QualifiedName, QuantityText], msgspec.Meta(max_length=MAX_ATTRIBUTES)] = {}
    """``consumedCapacity`` of a shared allocation."""


class DraPool(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every ResourceSlice of one pool (``(driver, pool)``) and its devices in use, as
    gang-coordinator last read them (KV ``phx-dra``, key ``pool_key``). Slices of every
    generation seen are kept: which count, and whether the pool is complete, is the engine's
    rule (``phalanx_engine.dra.pools``)."""

    driver: Name
    pool: Name
    slices: Annotated[tuple[Slice, ...], msgspec.Meta(max_length=MAX_SLICES_PER_POOL)] = ()
    in_use: tuple[InUse, ...] = ()
    problem: Annotated[str, msgspec.Meta(max_length=1000)] = ""
    """Why gang-coordinator could not read the pool's slices (the pool is then unusable)."""


def pool_key(driver: str, pool: str) -> str:
    """The KV key of a pool: a token of its driver and pool names (KV keys allow fewer
    characters than the names)."""
    digest = hashlib.sha256(f"{driver}\x00{pool}".encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{driver}.{pool}")[:200]
    return f"{safe}.{digest}"


# --- what a claim asks -----------------------------------------------------------------------------
class DeviceToleration(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceToleration``."""

    key: Annotated[str, msgspec.Meta(max_length=317)] = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: Annotated[str, msgspec.Meta(max_length=63)] = ""
    effect: Literal["", "NoSchedule", "NoExecute", "None"] = ""
    toleration_seconds: int | None = None


class OpaqueConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``OpaqueDeviceConfiguration``: parameters for one driver, passed through unread."""

    driver: Name
    parameters: Any = None
    """The raw JSON object (at most 10 KiB), as the API object holds it."""


class ClassConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ``DeviceClass.spec.config`` entry."""

    opaque: OpaqueConfig


class DeviceClassRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A DeviceClass as a request uses it, resolved by gang-coordinator: its name, its CEL
    selectors (every one must hold) and its config. ``missing``: no DeviceClass of that name
    exists (the request then fits no device, with that reason)."""

    name: Name
    selectors: Annotated[tuple[CelText, ...], msgspec.Meta(max_length=MAX_SELECTORS)] = ()
    config: Annotated[tuple[ClassConfig, ...], msgspec.Meta(max_length=MAX_CONFIGS)] = ()
    extended_resource_name: Annotated[str, msgspec.Meta(max_length=317)] = ""
    missing: bool = False


class ExactRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``ExactDeviceRequest`` (or one ``firstAvailable`` subrequest, with its ``name``)."""

    name: Annotated[str, msgspec.Meta(max_length=63)] = ""
    """The subrequest's name ("" for ``exactly``)."""
    device_class: DeviceClassRef
    selectors: Annotated[tuple[CelText, ...], msgspec.Meta(max_length=MAX_SELECTORS)] = ()
    allocation_mode: AllocationMode = "ExactCount"
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_RESULTS)] = 1
    admin_access: bool = False
    tolerations: Annotated[tuple[DeviceToleration, ...], msgspec.Meta(max_length=16)] = ()
    capacity: Annotated[dict[QualifiedName, QuantityText], msgspec.Meta(max_length=MAX_ATTRIBUTES)] = {}
    """``capacity.requests``: what a shared device must give this request."""


class DeviceRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceRequest``: exactly one of ``exactly`` or ``first_available`` (tried in order)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    exactly: ExactRequest | None = None
    first_available: Annotated[tuple[ExactRequest, ...], msgspec.Meta(max_length=MAX_SUBREQUESTS)] = ()


class DeviceConstraint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceConstraint``: exactly one of the two attributes (fully qualified). ``requests``
    names requests or ``<request>/<subrequest>``; empty: every request of the claim."""

    requests: Annotated[tuple[Annotated[str, msgspec.Meta(max_length=127)], ...],
                        msgspec.Meta(max_length=MAX_REQUESTS)] = ()
    match_attribute: Annotated[str, msgspec.Meta(max_length=317)] = ""
    distinct_attribute: Annotated[str, msgspec.Meta(max_length=317)] = ""


class ClaimConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceClaimConfiguration``."""

    requests: Annotated[tuple[Annotated[str, msgspec.Meta(max_length=127)], ...],
                        msgspec.Meta(max_length=MAX_REQUESTS)] = ()
    opaque: OpaqueConfig


class AllocatedDevice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceRequestAllocationResult``: one device given to one request."""

    request: Annotated[str, msgspec.Meta(max_length=127)]
    """The request's name, or ``<request>/<subrequest>``."""
    driver: Name
    pool: Name
    device: DeviceName
    admin_access: bool = False
    tolerations: Annotated[tuple[DeviceToleration, ...], msgspec.Meta(max_length=16)] = ()
    share_id: Annotated[str, msgspec.Meta(max_length=64)] = ""
    consumed_capacity: Annotated[dict[QualifiedName, QuantityText], msgspec.Meta(max_length=MAX_ATTRIBUTES)] = {}
    binding_conditions: Annotated[tuple[QualifiedName, ...], msgspec.Meta(max_length=4)] = ()
    binding_failure_conditions: Annotated[tuple[QualifiedName, ...], msgspec.Meta(max_length=4)] = ()


class AllocatedConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``DeviceAllocationConfiguration``."""

    source: Literal["FromClass", "FromClaim"]
    requests: Annotated[tuple[Annotated[str, msgspec.Meta(max_length=127)], ...],
                        msgspec.Meta(max_length=MAX_REQUESTS)] = ()
    opaque: OpaqueConfig


class ClaimAllocation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``AllocationResult``: the devices, their config, and the nodes that can use them
    (``None``: every node)."""

    devices: Annotated[tuple[AllocatedDevice, ...], msgspec.Meta(max_length=MAX_RESULTS)] = ()
    config: Annotated[tuple[AllocatedConfig, ...], msgspec.Meta(max_length=2 * MAX_CONFIGS)] = ()
    node_selector: Annotated[tuple[NodeSelectorTerm, ...], msgspec.Meta(max_length=1)] | None = None


class ExtendedRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One request of the claim for a pod's extended resources backed by DRA (KEP-5004):
    container ``container`` (index ``index`` in ``initContainers`` + ``containers``) asks ``count``
    of ``resource``, served by DeviceClass ``device_class``; ``request`` is the request's name in
    the claim (``container-<index>-request-<i>``)."""

    request: Annotated[str, msgspec.Meta(max_length=63)]
    container: Annotated[str, msgspec.Meta(max_length=253)]
    index: Annotated[int, msgspec.Meta(ge=0)]
    resource: Annotated[str, msgspec.Meta(max_length=317)]
    device_class: Name
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_RESULTS)]


class ClaimSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ResourceClaim a pod uses, as gang-coordinator read it: what it asks (classes
    resolved), and its allocation when it already has one (a claim shared with pods placed
    before: the pod must go where it can use it)."""

    namespace: Name
    name: Name
    uid: Annotated[str, msgspec.Meta(max_length=64)]
    requests: Annotated[tuple[DeviceRequest, ...], msgspec.Meta(max_length=MAX_REQUESTS)] = ()
    constraints: Annotated[tuple[DeviceConstraint, ...], msgspec.Meta(max_length=MAX_CONSTRAINTS)] = ()
    config: Annotated[tuple[ClaimConfig, ...], msgspec.Meta(max_length=MAX_CONFIGS)] = ()
    allocation: ClaimAllocation | None = None
    """Already allocated (by Phalanx for another pod, or by anyone): nothing to allocate."""
    extended: bool = False
    """A claim for a device-plugin style request (``nvidia.com/gpu: 2``) on a node without the
    device plugin, made by Phalanx from the DeviceClass naming that extended resource (KEP-5004);
    not in the API until binder creates it (its ``name`` is then "", its ``uid``
    ``extended:<pod uid>``)."""
    extended_requests: Annotated[tuple[ExtendedRequest, ...], msgspec.Meta(max_length=MAX_REQUESTS)] = ()
    """An extended claim's requests, by container (what binder creates and records in the pod's
    ``status.extendedResourceClaimStatus``)."""
    compute_domain: Annotated[str, msgspec.Meta(max_length=63)] = ""
    """The ComputeDomain (multi-node NVLink, the uid its claim template labels the claim with:
    ``COMPUTE_DOMAIN_LABEL``) whose channel the claim asks for; "" for none."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}/{self.uid}"


class PodClaim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ``spec.resourceClaims`` entry of a pod, resolved to its claim."""

    name: Annotated[str, msgspec.Meta(max_length=63)]
    """The pod's name for it (``spec.resourceClaims[].name``)."""
    claim: ClaimSpec


class ClaimAllocated(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a member's assignment holds for one of its claims: the claim, and the allocation
    binder writes to its status before the pod's binding (``allocated`` false: the claim was
    already allocated, binder only adds the pod to ``reservedFor``)."""

    claim: Annotated[str, msgspec.Meta(max_length=600)]
    """``<namespace>/<name>/<uid>``."""
    pod_claim: Annotated[str, msgspec.Meta(max_length=63)] = ""
    allocation: ClaimAllocation
    allocated: bool = True
    extended: bool = False
    """The claim Phalanx makes for an extended-resource request (binder creates it first)."""
    extended_requests: Annotated[tuple[ExtendedRequest, ...], msgspec.Meta(max_length=MAX_REQUESTS)] = ()
    """That claim's requests, by container (``ClaimSpec.extended_requests``)."""
    compute_domain: Annotated[str, msgspec.Meta(max_length=63)] = ""
    """The claim's ComputeDomain (``ClaimSpec.compute_domain``): the node's NVLink clique hosts it."""
    gpus: tuple[int, ...] = ()
    """Which of the node's GPUs (topology indices) the allocated devices are, where a device is
    joined to one (by ``uuid``, else ``resource.kubernetes.io/pciBusID``)."""


# --- attribute names Phalanx reads ---------------------------------------------------------------------
STANDARD_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
NVIDIA_UUID = "uuid"
"""The NVIDIA driver's unqualified ``uuid`` attribute (``GPU-…``, ``MIG-…``)."""
FINALIZER = "resource.kubernetes.io/delete-protection"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"
COMPUTE_DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
"""The label NVIDIA's ComputeDomain controller puts on the claim template it makes (the
ComputeDomain's uid), which the resourceclaim controller copies onto each claim."""

dra_pool_decoder = Decoder(DraPool)
