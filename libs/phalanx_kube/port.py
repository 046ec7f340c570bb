"""The Kubernetes port: the slice of the API Phalanx uses, as a protocol with two adapters.

* ``phalanx_kube.kvcluster.KvCluster`` — a simulated cluster whose objects live in NATS KV, so
  every service process of ``phalanx up`` sees the same cluster; used without a kubeconfig.
* the kubernetes-asyncio adapter (real API server) implements the same protocol.

Both pass the same contract tests (``tests/contract``). Only gang-coordinator and binder use
the pod half; only topology-discovery writes node status. Leases are the per-node fences of
docs/delivery.md: binder writes them, the node agent's device plugin reads them. The Dynamic
Resource Allocation objects (``resource.k8s.io/v1``, docs/kubernetes.md "DRA"): gang-coordinator
watches DeviceClasses, ResourceSlices and ResourceClaims (raw objects, read with
``phalanx_kubeobjects.dra``); binder writes a claim's finalizer, allocation and ``reservedFor``
before the pod's Binding (``reserve_claim``), undoes it (``unreserve_claim``), and makes the claim
for extended resources backed by DRA (``create_resource_claim``, ``set_extended_claim_status``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Literal, Protocol

import msgspec

from phalanx_proto.dra import ClaimAllocation
from phalanx_proto.events import PodRef


class Pod(msgspec.Struct, frozen=True, kw_only=True):
    """The part of a Pod that Phalanx reads. ``raw`` is the whole object as a dict."""

    namespace: str
    name: str
    uid: str = ""
    scheduler_name: str = ""
    node_name: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    phase: str = "Pending"
    deleting: bool = False
    created: float = 0.0
    raw: dict[str, Any] = {}

    @property
    def ref(self) -> PodRef:
        return PodRef(namespace=self.namespace, name=self.name, uid=self.uid)

    @property
    def started(self) -> bool:
        """The kubelet admitted the pod and reports its containers (``status.containerStatuses``)."""
        return bool((self.raw.get("status") or {}).get("containerStatuses"))

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class Node(msgspec.Struct, frozen=True, kw_only=True):
    """The part of a Node that Phalanx reads. ``raw`` is the whole object as a dict."""

    name: str
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    raw: dict[str, Any] = {}


class NodeObjects(msgspec.Struct, frozen=True, kw_only=True):
    """One node and the pods bound to it, of every scheduler, as the API holds them now (what
    a node agent reports from: ``phalanx_kubeobjects.nodekube``)."""

    node: Node | None
    pods: tuple[Pod, ...] = ()


class PodEvent(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    pod: Pod


class ObjectEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A change of one API object as its watch saw it (the DRA objects): ``obj`` is the whole
    object, camelCase, as the API server returns it (the simulator stores the same shape, with
    its KV revision as ``metadata.resourceVersion``)."""

    type: Literal["ADDED", "MODIFIED", "DELETED"]
    obj: dict[str, Any]

    @property
    def namespace(self) -> str:
        return (self.obj.get("metadata") or {}).get("namespace") or ""

    @property
    def name(self) -> str:
        return (self.obj.get("metadata") or {}).get("name") or ""


class ClaimRef(msgspec.Struct, frozen=True, kw_only=True):
    """A ResourceClaim: a non-empty ``uid`` is a precondition of every write (a claim deleted and
    recreated under the same name is another claim)."""

    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, key: str) -> ClaimRef:
        """From a claim key ``<namespace>/<name>/<uid>`` (``ClaimSpec.key``, ``ClaimAllocated.claim``)."""
        namespace, _, rest = key.partition("/")
        name, _, uid = rest.partition("/")
        return cls(namespace=namespace, name=name, uid=uid)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}/{self.uid}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class KubeEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A Kubernetes Event recorded on a pod."""

    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"
    count: int = 1
    at: float = 0.0


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """A ``coordination.k8s.io/v1`` Lease: an expiring owner record. Times are epoch seconds
    (``acquireTime``/``renewTime``); ``resource_version`` is the version read, the precondition
    of ``update_lease``/``delete_lease`` (empty on a lease not yet created)."""

    namespace: str
    name: str
    holder: str = ""
    duration_s: int = 0
    acquired: float = 0.0
    renewed: float = 0.0
    annotations: dict[str, str] = {}
    resource_version: str = ""

    def expired(self, now: float) -> bool:
        """True when the holder has not renewed within ``duration_s``."""
        return self.renewed + self.duration_s <= now


class LeaseConflict(Exception):
    """The lease exists (create), or changed or vanished since ``resource_version`` was read."""


class BindConflict(Exception):
    """The pod is already bound to another node (or was recreated with another uid)."""


class PodGone(Exception):
    """The pod no longer exists."""


class EvictionBlocked(Exception):
    """The Eviction API refused to evict the pod now (HTTP 429): a PodDisruptionBudget allows
    no disruption of it. The message is the API server's."""


class ClaimGone(Exception):
    """The ResourceClaim no longer exists (or exists under another uid)."""


class ClaimConflict(Exception):
    """The claim cannot be reserved for the pod as asked: it got allocated elsewhere in the
    meantime, is not allocated any more, is being deleted, or is reserved for as many consumers as
    it may be; or (create) a claim of that name exists and is another one. The message says which."""


class ClaimRefused(Exception):
    """The API server refused the claim write itself (HTTP 400, 403 or 422: its validation, an
    admission policy or webhook, authorization): written again the same way, it is refused
    again. The message is the server's."""


class NotOurs(Exception):
    """The pod's ``schedulerName`` is not one of Phalanx's: Phalanx never binds, patches or
    deletes it, whatever a command on the bus says (both adapters check before acting)."""


def not_ours(ref: object, scheduler_name: str, ours: tuple[str, ...]) -> NotOurs:
    return NotOurs(f"pod {ref} has schedulerName {scheduler_name!r}, not one of Phalanx's "
                   f"({', '.join(ours)}): Phalanx does not bind, patch or delete it")


class ClusterPort(Protocol):
    """What Phalanx needs from Kubernetes. Every method is safe to call more than once."""

    async def list_pods(self) -> list[Pod]:
        """All pods with one of our scheduler names (bound or not)."""
        ...

    def watch_pods(self) -> AsyncIterator[PodEvent | None]:
        """The current pods with our scheduler names as ADDED, then ``None`` once listed, then
        every change. Implementations re-list after errors, so consumers must be idempotent."""
        ...

    async def get_pod(self, ref: PodRef) -> Pod | None: ...

    async def annotate_pod(self, ref: PodRef, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into the pod's. Raises ``PodGone``; ``NotOurs`` for a pod of
        another scheduler (as do ``bind``, ``set_scheduled_condition`` and ``delete_pod``)."""
        ...

    async def bind(self, ref: PodRef, node: str, annotations: Mapping[str, str] | None = None) -> None:
        """Bind the pod to ``node``, setting ``annotations`` on it in the same write. Already
        bound to ``node`` is success (its annotations then set as given); bound elsewhere, or a
        pod whose uid differs from ``ref.uid``, raises ``BindConflict``; ``PodGone``."""
        ...

    async def delete_pod(self, ref: PodRef) -> None:
        """Delete the pod (so its controller recreates it). Absent is success."""
        ...

    async def evict_pod(self, ref: PodRef, *, dry_run: bool = False) -> bool:
        """Evict the pod through the Eviction API (``policy/v1`` Eviction subresource, the uid
        as precondition), so PodDisruptionBudgets are kept: True when evicted (with
        ``dry_run``: would be), False when it is gone (or recreated: another uid). Raises
        ``EvictionBlocked`` when a disruption budget refuses it, ``NotOurs`` for a pod of
        another scheduler."""
        ...

    async def budgeted(self, refs: Iterable[PodRef]) -> set[PodRef]:
        """Of ``refs``, the pods a PodDisruptionBudget selects: an eviction of one of them may be
        refused, so binder tries it as a dry run first; the others are evicted at once. May
        answer more pods than are selected (never fewer)."""
        ...

    async def record_event(self, ref: PodRef, *, reason: str, message: str,
                           type: Literal["Normal", "Warning"] = "Normal") -> None:
        """Record a pod Event; the same reason+message again bumps its count."""
        ...

    async def set_scheduled_condition(self, ref: PodRef, *, status: bool, reason: str, message: str) -> None:
        """Set the pod's ``PodScheduled`` condition (``status=False`` with the pending reason)."""
        ...

    async def list_events(self, ref: PodRef) -> list[KubeEvent]: ...

    async def list_nodes(self) -> list[Node]: ...

    async def get_node(self, name: str) -> Node | None: ...

    async def list_node_pods(self, name: str) -> list[Pod]:
        """The pods bound to node ``name``, of every scheduler (as the kubelet sees them)."""
        ...

    async def list_bound_pods(self) -> list[Pod]:
        """Every pod bound to a node, of every scheduler (one listing for many nodes)."""
        ...

    def watch_node(self, name: str) -> AsyncIterator[NodeObjects]:
        """Node ``name`` and its pods (``list_node_pods``): the current state first, then again
        after changes (several changes may come as one). Implementations re-list after errors."""
        ...

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None:
        """Set extended resources in the node's status capacity and allocatable."""
        ...

    async def list_queues(self) -> list[dict[str, Any]]:
        """Every ``Queue`` object (``scheduling.phalanx.io/v1alpha1``) as it is stored; none when
        the CRD is not installed."""
        ...

    async def list_namespaces(self) -> dict[str, dict[str, str]]:
        """Every namespace's labels, by name."""
        ...

    async def get_namespace(self, name: str) -> dict[str, str] | None:
        """The namespace's labels read now, None when there is no such namespace (the
        simulator's namespaces exist implicitly: one never applied has no labels)."""
        ...

    def watch_namespaces(self) -> AsyncIterator[dict[str, dict[str, str]]]:
        """Every namespace's labels, by name: the current ones first, then the whole map again
        after each change (several changes may come as one). Implementations re-list after
        errors."""
        ...

    async def update_queue_status(self, name: str, status: dict[str, Any]) -> None:
        """Set the Queue's ``status`` (a Queue that is gone is no error)."""
        ...

    # -- the upstream Workload API (scheduling.k8s.io PodGroups) -----------------------------
    async def get_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PodGroup object as stored, read now; None when there is none (or the server
        serves no PodGroup version: the simulated cluster has none)."""
        ...

    def watch_pod_groups(self) -> AsyncIterator[tuple[str, Any]]:
        """Every PodGroup: ``("listed", [objects])`` first (and again after a re-list), then
        ``("put", object)`` and ``("deleted", object)`` for each change."""
        ...

    async def update_pod_group_status(self, namespace: str, name: str, conditions: list[dict[str, Any]]) -> None:
        """Set the PodGroup's ``status.conditions`` (a PodGroup that is gone is no error)."""
        ...

    # -- Dynamic Resource Allocation (resource.k8s.io/v1) ------------------------------------
    async def list_device_classes(self) -> list[dict[str, Any]]:
        """Every DeviceClass, as stored (by name)."""
        ...

    def watch_device_classes(self) -> AsyncIterator[ObjectEvent | None]:
        """The DeviceClasses as ADDED, then ``None`` once listed, then every change; after a
        break, a re-list and what changed meanwhile (ADDED/MODIFIED/DELETED), then ``None``
        again (as ``watch_pods``)."""
        ...

    async def list_resource_slices(self) -> list[dict[str, Any]]:
        """Every ResourceSlice, as stored (by name)."""
        ...

    def watch_resource_slices(self) -> AsyncIterator[ObjectEvent | None]:
        """The ResourceSlices, as ``watch_device_classes``."""
        ...

    async def list_resource_claims(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every ResourceClaim (of ``namespace`` only, when given), as stored."""
        ...

    def watch_resource_claims(self) -> AsyncIterator[ObjectEvent | None]:
        """The ResourceClaims of every namespace, as ``watch_device_classes``."""
        ...

    async def get_resource_claim(self, claim: ClaimRef) -> dict[str, Any] | None:
        """The claim read now; None when there is none of that name (its uid is not checked)."""
        ...

    async def reserve_claim(self, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None) -> dict[str, Any]:
        """Reserve the claim for the pod before its Binding, as kube-scheduler's PreBind does:
        with ``allocation`` (Phalanx allocated it) the finalizer
        ``resource.kubernetes.io/delete-protection`` is ensured first (an update), then
        ``status.allocation`` is set and the pod appended to ``status.reservedFor`` in one status
        update carrying the resourceVersion read; without (the claim was allocated already),
        only the pod is appended. A conflict re-reads and tries again. Returns the claim as
        written. May be called more than once: a pod already reserved (with that allocation)
        is success. Raises ``ClaimGone``, and ``ClaimConflict`` when the claim got allocated
        elsewhere in the meantime (another allocation), is not allocated when ``allocation`` is
        None, is being deleted, or its ``reservedFor`` is full. A refusal by the API server
        itself (400, 403 or 422: validation, an admission policy, an account without
        ``resourceclaims/binding``) raises ``ClaimRefused`` with the server's message (the
        simulator: ``ClaimInvalid``, a ``ClaimRefused``)."""
        ...

    async def unreserve_claim(self, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None = None) -> None:
        """Undo ``reserve_claim``: remove the pod from ``status.reservedFor``; with the
        ``allocation`` Phalanx wrote, also clear it (and then the finalizer) when nobody else holds
        the claim and its allocation is still that one. May be called more than once, and when
        the take never happened (absent claim, pod not reserved): then it changes nothing."""
        ...

    async def create_resource_claim(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create the claim (the extended-resource claim of ``phalanx_kubeobjects.dra.extended_claim``)
        and return it as created. May be called more than once: a claim of the same controller
        owner with the same annotations and requests (for ``generateName``: in the namespace; for
        a name: of that name) is returned instead of a second one; a named claim that exists and
        is another one raises ``ClaimConflict``."""
        ...

    async def delete_resource_claim(self, claim: ClaimRef) -> None:
        """Delete the claim (the uid as precondition; a claim with finalizers stays until they are
        removed, marked deleting). Absent, or another uid, is success."""
        ...

    async def set_extended_claim_status(self, pod: PodRef, status: dict[str, Any] | None) -> None:
        """Set ``pod.status.extendedResourceClaimStatus`` (``phalanx_kubeobjects.dra.extended_claim_status``;
        None removes it). Raises ``PodGone``, ``NotOurs`` (as ``annotate_pod``)."""
        ...

    async def get_lease(self, namespace: str, name: str) -> Lease | None: ...

    async def create_lease(self, lease: Lease) -> Lease:
        """Create the lease; the result carries its ``resource_version``. Raises ``LeaseConflict``
        when it exists."""
        ...

    async def update_lease(self, lease: Lease) -> Lease:
        """Replace holder, times and annotations only if the lease is still at
        ``lease.resource_version`` (renew, hand over, change what it records); raises
        ``LeaseConflict`` when it changed or is gone."""
        ...

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str = "") -> None:
        """Release: delete the lease, only at ``resource_version`` when one is given (then
        ``LeaseConflict`` if it changed). Absent is success."""
        ...


def pod_from_dict(obj: dict[str, Any]) -> Pod:
    """Build a ``Pod`` from a Kubernetes-shaped dict (camelCase keys as in YAML/JSON)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return Pod(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        node_name=spec.get("nodeName") or "",
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        created=float(meta.get("phalanxCreated") or 0.0),
        raw=obj,
    )


def node_from_dict(obj: dict[str, Any]) -> Node:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return Node(
        name=meta.get("name") or "",
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        capacity={k: str(v) for k, v in (status.get("capacity") or {}).items()},
        allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
        raw=obj,
    )
