"""The simulated cluster: Kubernetes objects kept in NATS KV buckets.

``phalanx up`` runs without a kubeconfig: it loads nodes from a cluster file and pods from a
workload file into these buckets, and every service process reaches the same "API server"
through the bus. Writes are compare-and-set on the KV revision, like resourceVersion on a
real API server, so two writers never silently overwrite each other.

Buckets: ``phx-sim-pods`` (``<namespace>.<name>`` → pod JSON), ``phx-sim-nodes``
(``<name>`` → node JSON), ``phx-sim-events`` (``<namespace>.<name>`` → list of Events),
``phx-sim-leases`` (``<namespace>.<name>`` → ``Lease`` JSON; the KV revision is its
resourceVersion); the DRA objects (``phx-sim-deviceclasses``, ``-resourceslices``,
``-resourceclaims``) are ``phalanx_kube.kvdra``'s, mixed in.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Literal

import msgspec

from phalanx_bus import Bus, KvConflict
from phalanx_kube.kvdra import KvDra
from phalanx_kube.kvqueues import KvQueues
from phalanx_kube.port import (
    BindConflict,
    EvictionBlocked,
    KubeEvent,
    Lease,
    LeaseConflict,
    Node,
    NodeObjects,
    Pod,
    PodEvent,
    PodGone,
    node_from_dict,
    not_ours,
    pod_from_dict,
)
from phalanx_proto import subjects as S
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import DISRUPTION_BUDGET_ANNOTATION, SCHEDULER_NAMES
from phalanx_proto.subjects import token

KV_PODS = S.KV_SIM_PODS
KV_NODES = S.KV_SIM_NODES
KV_EVENTS = S.KV_SIM_EVENTS
KV_LEASES = S.KV_SIM_LEASES

NODE_POLL_S = 2.0
"""How often ``watch_node`` looks at a simulated node and its pods."""

_json = msgspec.json.Encoder()
_events_decoder = msgspec.json.Decoder(list[KubeEvent])
_lease_decoder = msgspec.json.Decoder(Lease)


def pod_key(namespace: str, name: str) -> str:
    return f"{token(namespace)}.{token(name)}"


class KvCluster(KvQueues, KvDra):
    """``ClusterPort`` over NATS KV. Create with ``await KvCluster.open(bus)``."""

    def __init__(self, bus: Bus, pods, nodes, events, leases=None, scheduler_names=SCHEDULER_NAMES) -> None:
        self._bus = bus
        self._pods = pods
        self._nodes = nodes
        self._events = events
        self._leases = leases
        self.scheduler_names = tuple(scheduler_names)

    @classmethod
    async def open(cls, bus: Bus, *, scheduler_names: tuple[str, ...] = SCHEDULER_NAMES) -> KvCluster:
        """The simulated cluster as a scheduler with ``scheduler_names`` sees it (a test plays
        kube-scheduler with ``("default-scheduler",)``)."""
        pods = await bus.kv(KV_PODS, history=4)
        nodes = await bus.kv(KV_NODES, history=4)
        events = await bus.kv(KV_EVENTS, history=2)
        leases = await bus.kv(KV_LEASES, history=2)
        return cls(bus, pods, nodes, events, leases, scheduler_names)

    # -- loading -------------------------------------------------------------------------
    async def apply_pod(self, obj: dict[str, Any]) -> Pod:
        """Create a pod (as ``kubectl create``): assigns uid and creation time; exists → error."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta["uid"] = meta.get("uid") or str(uuid.uuid4())
        meta["phalanxCreated"] = time.time()
        obj.setdefault("status", {})["phase"] = "Pending"
        key = pod_key(meta["namespace"], meta["name"])
        try:
            await self._pods.create(key, _json.encode(obj))
        except KvConflict as e:
            raise ValueError(f"pod {meta['namespace']}/{meta['name']} already exists") from e
        return pod_from_dict(obj)

    async def apply_node(self, obj: dict[str, Any]) -> Node:
        """Create or replace a node object."""
        await self._nodes.put(token(obj["metadata"]["name"]), _json.encode(obj))
        return node_from_dict(obj)

    # -- the Workload API: the simulated cluster has no PodGroups ------------------------
    async def get_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def watch_pod_groups(self) -> AsyncIterator[tuple[str, Any]]:
        yield "listed", []
        await asyncio.Event().wait()

    async def update_pod_group_status(self, namespace: str, name: str, conditions: list[dict[str, Any]]) -> None:
        return None

    # -- pods ----------------------------------------------------------------------------
    def _ours(self, pod: Pod) -> bool:
        return pod.scheduler_name in self.scheduler_names

    def _check_ours(self, ref: PodRef, obj: dict[str, Any]) -> None:
        """``NotOurs`` for a pod of another scheduler (read in the same compare-and-set cycle
        as the write, so the check and the write see the same pod)."""
        name = (obj.get("spec") or {}).get("schedulerName") or "default-scheduler"
        if name not in self.scheduler_names:
            raise not_ours(ref, name, self.scheduler_names)

    async def list_pods(self) -> list[Pod]:
        pods = [pod_from_dict(msgspec.json.decode(e.value)) for e in await self._pods.items()]
        return sorted((p for p in pods if self._ours(p)), key=lambda p: (p.created, p.namespace, p.name))

    async def watch_pods(self) -> AsyncIterator[PodEvent | None]:
        known: dict[str, Pod] = {}
        while True:
            try:
                async for entry in self._pods.watch():
                    if entry is None:
                        yield None
                        continue
                    if entry.deleted:
                        old = known.pop(entry.key, None)
                        if old is not None:
                            yield PodEvent(type="DELETED", pod=old)
                        continue
                    pod = pod_from_dict(msgspec.json.decode(entry.value))
                    if not self._ours(pod):
                        continue
                    kind = "MODIFIED" if entry.key in known else "ADDED"
                    known[entry.key] = pod
                    yield PodEvent(type=kind, pod=pod)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - watch broke (server restart): re-list
                await asyncio.sleep(0.5)

    async def _read(self, ref: PodRef):
        entry = await self._pods.get(pod_key(ref.namespace, ref.name))
        if entry is None:
            return None, None
        return entry, msgspec.json.decode(entry.value)

    async def get_pod(self, ref: PodRef) -> Pod | None:
        _, obj = await self._read(ref)
        return None if obj is None else pod_from_dict(obj)

    async def _modify(self, ref: PodRef, change) -> dict[str, Any]:
        """Read-modify-write a pod by compare-and-set, retrying on conflicts."""
        for _ in range(20):
            entry, obj = await self._read(ref)
            if obj is None or (ref.uid and obj["metadata"].get("uid") != ref.uid):
                raise PodGone(f"pod {ref} not found")
            self._check_ours(ref, obj)
            change(obj)
            try:
                await self._pods.update(entry.key, _json.encode(obj), last=entry.revision)
                return obj
            except KvConflict:
                continue
        raise RuntimeError(f"pod {ref}: too many concurrent updates")

    async def annotate_pod(self, ref: PodRef, annotations: dict[str, str]) -> None:
        def change(obj):
            obj["metadata"].setdefault("annotations", {}).update(annotations)
        await self._modify(ref, change)

    async def bind(self, ref: PodRef, node: str, annotations: Mapping[str, str] | None = None) -> None:
        def change(obj):
            current = obj.get("spec", {}).get("nodeName")
            if current and current != node:
                raise BindConflict(f"pod {ref} is already bound to {current}")
            if annotations:
                obj["metadata"].setdefault("annotations", {}).update(annotations)
            obj.setdefault("spec", {})["nodeName"] = node
            _set_condition(obj, True, "Scheduled", f"bound to {node}")
            obj["status"]["phase"] = "Running"
        _, obj = await self._read(ref)
        if obj is not None and ref.uid and obj["metadata"].get("uid") != ref.uid:
            raise BindConflict(f"pod {ref} was recreated (uid {obj['metadata'].get('uid')})")
        await self._modify(ref, change)

    async def delete_pod(self, ref: PodRef) -> None:
        entry, obj = await self._read(ref)
        if obj is None or (ref.uid and obj["metadata"].get("uid") != ref.uid):
            return
        self._check_ours(ref, obj)
        try:
            await self._pods.delete(entry.key, last=entry.revision)
        except KvConflict:
            await self._pods.delete(entry.key)

    async def evict_pod(self, ref: PodRef, *, dry_run: bool = False) -> bool:
        """The Eviction API, simulated: the simulated cluster has no PodDisruptionBudget
        objects; a pod annotated ``DISRUPTION_BUDGET_ANNOTATION: "0"`` stands for a pod whose
        budget allows no disruption (refused as the API server refuses: ``EvictionBlocked``)."""
        entry, obj = await self._read(ref)
        if obj is None or (ref.uid and obj["metadata"].get("uid") != ref.uid):
            return False
        self._check_ours(ref, obj)
        if ((obj["metadata"].get("annotations") or {}).get(DISRUPTION_BUDGET_ANNOTATION)) == "0":
            raise EvictionBlocked(f"evicting {ref}: Cannot evict pod as it would violate the pod's disruption budget.")
        if not dry_run:
            await self.delete_pod(ref)
        return True

    async def budgeted(self, refs: Iterable[PodRef]) -> set[PodRef]:
        """The pods annotated ``DISRUPTION_BUDGET_ANNOTATION`` (whatever its value): the
        simulator's stand-in for a PodDisruptionBudget selecting the pod."""
        out = set()
        for ref in refs:
            _, obj = await self._read(ref)
            if obj is not None and DISRUPTION_BUDGET_ANNOTATION in (obj["metadata"].get("annotations") or {}):
                out.add(ref)
        return out

    async def record_event(self, ref: PodRef, *, reason: str, message: str,
                           type: Literal["Normal", "Warning"] = "Normal") -> None:
        key = pod_key(ref.namespace, ref.name)
        for _ in range(20):
            entry = await self._events.get(key)
            events = _events_decoder.decode(entry.value) if entry else []
            if events and events[-1].reason == reason and events[-1].message == message:
                last = events[-1]
                events[-1] = KubeEvent(reason=reason, message=message, type=type, count=last.count + 1, at=time.time())
            else:
                events.append(KubeEvent(reason=reason, message=message, type=type, at=time.time()))
            events = events[-50:]
            try:
                if entry is None:
                    await self._events.create(key, _json.encode(events))
                else:
                    await self._events.update(key, _json.encode(events), last=entry.revision)
                return
            except KvConflict:
                continue

    async def list_events(self, ref: PodRef) -> list[KubeEvent]:
        entry = await self._events.get(pod_key(ref.namespace, ref.name))
        return _events_decoder.decode(entry.value) if entry else []

    async def set_scheduled_condition(self, ref: PodRef, *, status: bool, reason: str, message: str) -> None:
        await self._modify(ref, lambda obj: _set_condition(obj, status, reason, message))

    # -- nodes ---------------------------------------------------------------------------
    async def list_nodes(self) -> list[Node]:
        return sorted((node_from_dict(msgspec.json.decode(e.value)) for e in await self._nodes.items()),
                      key=lambda n: n.name)

    async def get_node(self, name: str) -> Node | None:
        entry = await self._nodes.get(token(name))
        return None if entry is None else node_from_dict(msgspec.json.decode(entry.value))

    async def list_bound_pods(self) -> list[Pod]:
        pods = [pod_from_dict(msgspec.json.decode(e.value)) for e in await self._pods.items()]
        return sorted((p for p in pods if p.node_name), key=lambda p: (p.namespace, p.name))

    async def list_node_pods(self, name: str) -> list[Pod]:
        return [p for p in await self.list_bound_pods() if p.node_name == name]

    async def revision(self) -> int:
        """A number that changes whenever a pod or node changes (the sum of both buckets' last
        stream sequences): the simulator's node agents list again only when it moved."""
        seqs = [int((await self._bus.js.stream_info(f"KV_{b}")).state.last_seq or 0) for b in (KV_PODS, KV_NODES)]
        return sum(seqs)

    async def watch_node(self, name: str) -> AsyncIterator[NodeObjects]:
        """Polls every ``NODE_POLL_S`` (the simulator's pods are one bucket of every node's):
        yields when the node or its pods changed. The pods are listed again only when the pods
        bucket has changed since the last listing (its stream's last sequence, read first)."""
        last: NodeObjects | None = None
        seq, pods = -1, ()
        while True:
            try:
                now_seq = int((await self._bus.js.stream_info(f"KV_{KV_PODS}")).state.last_seq or 0)
                if now_seq != seq:
                    pods, seq = tuple(await self.list_node_pods(name)), now_seq
                now = NodeObjects(node=await self.get_node(name), pods=pods)
                if now != last:
                    last = now
                    yield now
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - bus away: poll again
                pass
            await asyncio.sleep(NODE_POLL_S)

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None:
        for _ in range(20):
            entry = await self._nodes.get(token(name))
            if entry is None:
                raise KeyError(f"node {name} not found")
            obj = msgspec.json.decode(entry.value)
            status = obj.setdefault("status", {})
            status.setdefault("capacity", {}).update(resources)
            status.setdefault("allocatable", {}).update(resources)
            try:
                await self._nodes.update(entry.key, _json.encode(obj), last=entry.revision)
                return
            except KvConflict:
                continue

    # -- leases --------------------------------------------------------------------------
    async def get_lease(self, namespace: str, name: str) -> Lease | None:
        entry = await self._leases.get(pod_key(namespace, name))
        if entry is None:
            return None
        return msgspec.structs.replace(_lease_decoder.decode(entry.value), resource_version=str(entry.revision))

    @staticmethod
    def _stored(lease: Lease) -> bytes:
        return _json.encode(msgspec.structs.replace(lease, resource_version=""))

    async def create_lease(self, lease: Lease) -> Lease:
        try:
            rev = await self._leases.create(pod_key(lease.namespace, lease.name), self._stored(lease))
        except KvConflict as e:
            raise LeaseConflict(f"lease {lease.namespace}/{lease.name} exists") from e
        return msgspec.structs.replace(lease, resource_version=str(rev))

    async def update_lease(self, lease: Lease) -> Lease:
        what = f"lease {lease.namespace}/{lease.name}"
        if not lease.resource_version.isdigit():
            raise LeaseConflict(f"{what}: no resource_version to update from")
        if await self.get_lease(lease.namespace, lease.name) is None:
            raise LeaseConflict(f"{what} is gone")
        try:
            rev = await self._leases.update(pod_key(lease.namespace, lease.name), self._stored(lease),
                                            last=int(lease.resource_version))
        except KvConflict as e:
            raise LeaseConflict(f"{what} changed since {lease.resource_version}") from e
        return msgspec.structs.replace(lease, resource_version=str(rev))

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str = "") -> None:
        current = await self.get_lease(namespace, name)
        if current is None:
            return
        if resource_version and current.resource_version != resource_version:
            raise LeaseConflict(f"lease {namespace}/{name} changed since {resource_version}")
        try:
            await self._leases.delete(pod_key(namespace, name), last=int(current.resource_version))
        except KvConflict as e:
            raise LeaseConflict(f"lease {namespace}/{name} changed while deleting") from e


def _set_condition(obj: dict[str, Any], status: bool, reason: str, message: str) -> None:
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    conds[:] = [c for c in conds if c.get("type") != "PodScheduled"]
    conds.append({"type": "PodScheduled", "status": "True" if status else "False",
                  "reason": reason, "message": message})
