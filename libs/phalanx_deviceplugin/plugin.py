"""The plugin's decisions: which pod the kubelet is admitting, which IDs to steer it to, what
the container gets, and the checks that fail closed. No gRPC here (``server.py`` serves it).

Pod identity, never a guess (docs/delivery.md): the kubelet admits one pod at a time and adds it
to its pod list before calling the device manager (``HandlePodAdditions``), so during
``GetPreferredAllocation``/``Allocate`` for resource R the pod being admitted is the one pod the
kubelet's PodResources ``List`` shows still short of its R devices. The plugin serves it only if
binder's fence vouches for it (uid listed, entry live, assignment annotation hashing to the
recorded digest), or, for a re-admission, the plugin's own record of serving it. Zero or several
such pods, a pod that is gone, recreated, deleting, terminal or bound elsewhere, or devices off
the assignment: an error, which the kubelet reports on the pod (``UnexpectedAdmissionError``).
``PreStartContainer`` checks again, after the fact, that the kubelet's device→pod mapping is
what was served.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from phalanx_deviceplugin import delivery as dv
from phalanx_deviceplugin.devices import DeviceTable
from phalanx_deviceplugin.served import ServedStore
from phalanx_kube import fence as F
from phalanx_kube.port import ClusterPort, Pod
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, RDMA, Fence, assignment_digest, decode_assignment


class Refused(Exception):
    """The request does not match what Phalanx decided; the message reaches the pod."""


@dataclass(frozen=True, slots=True)
class KubeletPod:
    """One pod as the kubelet's PodResources API lists it: devices per container and resource."""

    namespace: str
    name: str
    devices: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)

    def count(self, resource: str) -> int:
        return sum(len(per.get(resource, ())) for per in self.devices.values())


class PodResources(Protocol):
    async def list(self) -> list[KubeletPod]:
        """The kubelet's ``List``; raises on an unreachable kubelet."""
        ...


@dataclass(frozen=True, slots=True)
class Admitting:
    pod: Pod
    assignment: Assignment
    digest: str
    vouched_by: str
    """``fence`` or ``record`` (a re-admission of a pod this plugin served before)."""


def demand(pod: Pod, resource: str) -> int:
    """What the pod's app containers ask of ``resource`` in all (the kubelet's count)."""
    total = 0
    for c in (pod.raw.get("spec") or {}).get("containers") or []:
        value = ((c.get("resources") or {}).get("limits") or {}).get(resource)
        if value is not None and str(value).isdigit():
            total += int(value)
    return total


def pod_limits(pod: Pod) -> dict[str, str]:
    out: dict[str, str] = {}
    for c in (pod.raw.get("spec") or {}).get("containers") or []:
        out.update({k: str(v) for k, v in ((c.get("resources") or {}).get("limits") or {}).items()})
    return out


class Plugin:
    """One node's plugin logic. ``table`` is replaced when the topology changes."""

    def __init__(self, *, node: str, table: DeviceTable, cluster: ClusterPort, pod_resources: PodResources,
                 served: ServedStore, delivery: dv.Delivery, fence_namespace: str = "phalanx-system",
                 on_served: Callable[[Admitting], Awaitable[None]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.table = table
        self.cluster = cluster
        self.pod_resources = pod_resources
        self.served = served
        self.delivery = delivery
        self.fence_namespace = fence_namespace
        self.on_served = on_served
        self.clock = clock

    # -- identification ----------------------------------------------------------------------
    async def _fence(self) -> tuple[Fence | None, str]:
        lease = await self.cluster.get_lease(self.fence_namespace, F.lease_name(self.node))
        try:
            return F.read(lease, self.node, self.clock()), ""
        except F.FenceError as e:
            return None, str(e)

    def _live(self, pod: Pod | None, uid: str) -> str:
        if pod is None or pod.uid != uid:
            return "is gone or was recreated"
        if pod.deleting:
            return "is being deleted"
        if pod.phase in ("Succeeded", "Failed"):
            return f"is {pod.phase}"
        if pod.node_name != self.node:
            return f"is bound to {pod.node_name or 'no node'}, not {self.node}"
        return ""

    async def admitting(self, resource: str) -> Admitting:
        """The pod the kubelet is admitting for ``resource``, vouched for; else ``Refused``."""
        fence, fence_problem = await self._fence()
        listed = {(p.namespace, p.name): p for p in await self.pod_resources.list()}
        vouchers = {e.uid: (e.namespace, e.name) for e in (fence.pods if fence else ())}
        vouchers.update({s.uid: (s.namespace, s.name) for s in self.served.all()})
        found: list[Admitting] = []
        problems: list[str] = []
        for uid, (ns, name) in vouchers.items():
            kp = listed.get((ns, name))
            if kp is None:
                continue  # not (yet) known to the kubelet: not the pod being admitted
            pod = await self.cluster.get_pod(PodRef(namespace=ns, name=name, uid=uid))
            dead = self._live(pod, uid)
            if dead:
                problems.append(f"{ns}/{name} {dead}")
                continue
            if kp.count(resource) >= demand(pod, resource):
                continue  # has its devices already
            adm = self._vouch(fence, pod, problems)
            if adm is not None:
                found.append(adm)
        if len(found) == 1:
            return found[0]
        if found:
            names = ", ".join(f"{a.pod.namespace}/{a.pod.name}" for a in found)
            raise Refused(f"{resource}: the kubelet lists several fenced pods still short of devices ({names}); "
                          "refusing rather than guessing")
        why = "; ".join(problems) or fence_problem or "no pod of the fence is waiting for its devices"
        raise Refused(f"{resource}: no pod that Phalanx bound to {self.node} is being admitted ({why})")

    def _vouch(self, fence: Fence | None, pod: Pod, problems: list[str]) -> Admitting | None:
        text = pod.annotations.get(ASSIGNMENT_ANNOTATION)
        problem, source = f"{pod.namespace}/{pod.name} is not in the fence", "fence"
        if fence is not None and fence.entry(pod.uid) is not None:
            problem = F.verify(fence, uid=pod.uid, namespace=pod.namespace, name=pod.name, annotation=text,
                               now=self.clock())
        if problem:
            rec = self.served.get(pod.uid)
            if rec is not None and text is not None and assignment_digest(text) == rec.digest:
                problem, source = "", "record"
        if problem or text is None:
            problems.append(problem or f"{pod.namespace}/{pod.name} has no assignment")
            return None
        try:
            a = decode_assignment(text)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            problems.append(f"{pod.namespace}/{pod.name}: {ASSIGNMENT_ANNOTATION} is invalid: {e}")
            return None
        if (a.pod.uid and a.pod.uid != pod.uid) or a.node != self.node:
            problems.append(f"{pod.namespace}/{pod.name}: the assignment is for uid {a.pod.uid} on {a.node}")
            return None
        return Admitting(pod=pod, assignment=a, digest=assignment_digest(text), vouched_by=source)

    # -- the RPCs -------------------------------------------------------------------------------
    async def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        adm = await self.admitting(resource)
        return self.table.prefer(resource, adm.assignment, available, must_include, size)

    async def allocate(self, resource: str, ids: list[str]) -> dv.Edits:
        """The container's edits for ``ids``; ``Refused`` when they are not the assignment's."""
        adm = await self.admitting(resource)
        a = adm.assignment
        problem = self.table.check(resource, a, ids)
        if problem:
            raise Refused(f"pod {adm.pod.namespace}/{adm.pod.name}: {problem}")
        edits = dv.Edits()
        if resource == RDMA:
            edits, problem = dv.rdma_edits(self.table, a, self.delivery)
            if problem:
                raise Refused(f"pod {adm.pod.namespace}/{adm.pod.name}: {problem}")
        elif resource == dv.carrier(a, pod_limits(adm.pod), self.table.whole_name):
            assigned = [t.split(":", 1)[1] for t in self.table.targets(resource, a)]
            if dv.kind(a) == "whole":  # the kubelet's IDs, named in the assignment's order
                served = set(self.table.gpu_uuids(resource, ids))
                assigned = [g for g in assigned if g in served]
            gpus = assigned
            edits = dv.gpu_edits(a, gpus, self.delivery)
        self.served.add(uid=adm.pod.uid, namespace=adm.pod.namespace, name=adm.pod.name, digest=adm.digest,
                        resource=resource, ids=ids, at=self.clock())
        if self.on_served is not None:
            await self.on_served(adm)
        return edits

    async def prestart(self, resource: str, ids: list[str]) -> None:
        """``Refused`` unless the kubelet holds ``ids`` for the pod they were served to."""
        holders = [kp for kp in await self.pod_resources.list()
                   for per in kp.devices.values() if set(per.get(resource, ())) == set(ids)]
        if len(holders) != 1:
            raise Refused(f"{resource}: the kubelet reports {len(holders)} containers holding {sorted(ids)[:4]}")
        kp = holders[0]
        rec = self.served.owner(resource, ids)
        if rec is None:
            raise Refused(f"{resource}: {kp.namespace}/{kp.name} holds devices this plugin never served to it")
        if (rec.namespace, rec.name) != (kp.namespace, kp.name):
            raise Refused(f"{resource}: devices served to {rec.namespace}/{rec.name} are held by {kp.namespace}/{kp.name}")
        pod = await self.cluster.get_pod(PodRef(namespace=kp.namespace, name=kp.name, uid=rec.uid))
        if pod is None or pod.uid != rec.uid:
            raise Refused(f"{resource}: {kp.namespace}/{kp.name} is not the pod (uid {rec.uid}) the devices were served to")
