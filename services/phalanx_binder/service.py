"""binder: binds placed pods to their nodes through the Kubernetes port.

For each ``BindRequested``: record the pod in the node's fence when the node's agent serves
the device plugin, then the Binding, which carries the assignment annotation (the API server
sets both in one write), then a ``Scheduled`` event, and reply ``Bound``. Idempotent: a pod already bound to the same node counts as success
(a redelivered command after a crash); bound elsewhere or recreated is a ``BindFailed`` with
the reason.

**The fence** (docs/delivery.md). The annotation is the exact text ``encoder.encode(a)`` of
the assignment, and the fence entry records its SHA-256, so the node's device plugin serves
only what binder wrote. The entry is written before the Binding (the kubelet can admit the
pod as soon as it is bound), through ``NodeFences``: one write per node for the binds under
way together (a gang's pods on a node share one). The entry is released as soon as the pod
has started, turned terminal, or is deleted (``PodWatch``). On the "already bound" path the
entry is written again unless the pod has started, so a crash between the fence and the
Binding, or an entry that lapsed, is repaired by the redelivery.

**The checks** (docs/saga.md, "Checks"). The command is not believed on its word: binder binds
only the assignment placement recorded in ``phx-ledger`` for this gang, attempt and pod uid
(the ledger entry is the authority: what is bound is the ledger's assignment), only a pod
whose ``schedulerName`` is Phalanx's, and only to a node that has a topology report in
``phx-topology`` and is enabled. Both buckets are mirrored in memory from KV watches
(``KvMirror``), so a bind reads no KV entry; when the mirror lacks the node or the allocation,
binder catches the mirror up to everything the bucket held when it asked (a reservation
committed a moment ago is then seen) and checks again. A command that fails a check is
refused: logged with the rule, counted in ``phalanx_refused_messages_total``, acknowledged,
and nothing is written — no reply either, so a forged command cannot make the coordinator give
up a good attempt. A bind of an attempt that was rolled back finds its reservation released and
is refused the same way.

**Concurrency.** Up to ``parallelism`` commands are handled at once (as kube-scheduler binds
asynchronously); each message is acknowledged on its own (``consume(concurrency=...)``). The
pod is read from the pod watch's cache when it knows that uid, else from the API server.

Metrics: ``phalanx_pod_pending_to_bound_seconds`` (from the pod's creation time),
``phalanx_binds_total{result}``, ``phalanx_fence_writes_total{result}``,
``phalanx_fence_batch_pods``; span ``binder.bind`` with ``k8s.pod.name``,
``k8s.namespace.name`` and ``k8s.node.name``.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import nullcontext
from dataclasses import dataclass

import anyio
import msgspec

from phalanx_binder.fences import NodeFences, Ticket
from phalanx_binder.pods import PodWatch
from phalanx_bus import Bus, Delivery, KvMirror, MirrorLagging, TemporaryError, consume
from phalanx_kube import fence as F
from phalanx_kube.port import BindConflict, ClusterPort, NotOurs, Pod, PodGone
from phalanx_proto import subjects as S
from phalanx_proto.events import Assignment, BindFailed, BindRequested, Bound, gang_decoder
from phalanx_proto.kubeapi import (
    ASSIGNMENT_ANNOTATION,
    SCHEDULER_NAMES,
    FenceEntry,
    assignment_digest,
    encode_assignment,
)
from phalanx_proto.state import alloc_key
from phalanx_proto.vocab import RefusalRule as R
from phalanx_service.config import namespace_name, option, whole_number
from phalanx_telemetry import log, metrics, refused, tracer, warn

DURABLE = "binder"


@dataclass(frozen=True)
class Config:
    """binder's configuration: each field is a flag of ``phalanx run binder`` (``phalanx_service.config``)."""

    parallelism: int = option(16, "bind commands handled at once, as kube-scheduler binds asynchronously; the "
                              "Kubernetes client's --kube-api-qps/--kube-api-burst still pace the requests",
                              env="PHALANX_BIND_PARALLELISM", parse=whole_number(1, 1024))
    fence_namespace: str = option("phalanx-system", "namespace of the per-node fence leases that the node agents' "
                                  "device plugins read (docs/delivery.md)", env="POD_NAMESPACE", parse=namespace_name)
    instance: str = option("", "this replica's name, written as the fence leases' holder (default: $POD_NAME, "
                           "else host name and process id)")


def default_instance() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class Binder:
    def __init__(self, bus: Bus, cluster: ClusterPort, *, topology: KvMirror, ledger: KvMirror,
                 fences: NodeFences, pods: PodWatch | None = None) -> None:
        self.bus = bus
        self.cluster = cluster
        self.topology = topology
        self.ledger = ledger
        self.fences = fences
        self.pods = pods

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case BindRequested():
                await self.bind(event)
            case _:
                warn("unexpected event on binder subject", kind=type(event).__name__)

    # -- the checks -----------------------------------------------------------------------------
    def fenced(self, node: str) -> bool:
        """The node's agent serves the device plugin, so binds to it go through its fence."""
        entry = self.topology.get(S.token(node))
        return entry is not None and entry.value.node == node and entry.value.device_plugin

    def _check(self, ev: BindRequested) -> tuple[R, str] | Assignment:
        a = ev.assignment
        key = S.token(a.node)
        topo = self.topology.get(key)
        if topo is None or topo.value.node != a.node:
            bad = self.topology.poisoned.get(key)
            return R.UNKNOWN_NODE, (f"node {a.node!r} has no (readable) topology report in phx-topology"
                                    + (f": {bad.error}" if bad else ""))
        if not topo.value.enabled:
            return R.NODE_DISABLED, f"node {a.node} is not enabled for Phalanx"
        bad = self.ledger.poisoned.get(key)
        if bad is not None:
            return R.UNREADABLE_RECORD, f"{S.KV_LEDGER}/{key} (revision {bad.revision}): {bad.error}"
        entry = self.ledger.get(key)
        alloc = entry.value.allocations.get(alloc_key(a.pod)) if entry is not None else None
        if alloc is None or (alloc.gang_id, alloc.attempt) != (ev.gang_id, ev.attempt):
            held = f"gang {alloc.gang_id} attempt {alloc.attempt}" if alloc is not None else "nothing"
            return R.NOT_IN_LEDGER, (f"the ledger holds {held} for {a.pod} (uid {a.pod.uid or '-'}) on {a.node}, "
                                     f"not gang {ev.gang_id} attempt {ev.attempt}")
        if alloc.adopted:
            return R.ADOPTED_RESERVATION, (f"the ledger's reservation of {a.pod} on {a.node} was recorded for a pod "
                                           "found bound there (an adoption), not by a placement decision: binder binds "
                                           "only what placement decided")
        recorded = msgspec.structs.replace(alloc.assignment, mig_instance_uuid=a.mig_instance_uuid)
        if recorded != a:
            return R.NOT_IN_LEDGER, f"the command's assignment for {a.pod} differs from the ledger's"
        return recorded

    async def recorded(self, ev: BindRequested) -> tuple[R, str] | Assignment:
        """The assignment to bind: the ledger's allocation for exactly (gang, attempt, pod uid)
        on the command's node, when that node is known and enabled; else ``(rule, why)``.

        The ledger does not hold the MIG instance (mig-manager makes it after the reservation);
        the command's ``mig_instance_uuid`` is kept, everything else comes from the ledger.
        Read from the mirrors; a miss catches the mirror up to the bucket and checks again."""
        checked = self._check(ev)
        if isinstance(checked, Assignment) or checked[0] not in (R.UNKNOWN_NODE, R.NOT_IN_LEDGER):
            return checked
        try:
            await (self.topology if checked[0] == R.UNKNOWN_NODE else self.ledger).catch_up()
        except MirrorLagging as e:
            raise TemporaryError(f"cannot check the bind yet: {e}", delay=1.0) from e
        return self._check(ev)

    # -- the bind -------------------------------------------------------------------------------
    async def bind(self, ev: BindRequested) -> None:
        a = ev.assignment
        # Announced to the node's fence writer at once, so the binds of a gang share one write;
        # only nodes that keep a fence (a forged command naming other nodes creates nothing).
        with self.fences.coming(a.node) if self.fenced(a.node) else nullcontext() as ticket:
            checked = await self.recorded(ev)
            if not isinstance(checked, Assignment):
                refused(checked[0], checked[1], pod=str(a.pod), node=a.node, gang=ev.gang_id, attempt=ev.attempt)
                return
            with tracer().start_as_current_span("binder.bind", attributes={
                    "k8s.pod.name": a.pod.name, "k8s.namespace.name": a.pod.namespace, "k8s.node.name": a.node,
                    "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt,
                    "phalanx.gpus": list(a.gpus)}) as span:
                await self._bind(ev, checked, ticket, span)

    async def _pod(self, ev: BindRequested) -> Pod | None:
        ref = ev.assignment.pod
        cached = self.pods.get(ref) if self.pods is not None else None
        return cached if cached is not None else await self.cluster.get_pod(ref)

    async def _bind(self, ev: BindRequested, a: Assignment, ticket: Ticket | None, span) -> None:
        ref = a.pod
        try:
            pod = await self._pod(ev)
            if pod is None or (ref.uid and pod.uid != ref.uid):
                raise PodGone(f"pod {ref} no longer exists")
            if not _ours(pod):
                refused(R.FOREIGN_SCHEDULER, f"pod {ref} has schedulerName {pod.scheduler_name!r}, not Phalanx's",
                        gang=ev.gang_id, attempt=ev.attempt)
                span.set_attribute("phalanx.outcome", "refused")
                return
            if pod.node_name and pod.node_name != a.node:
                raise BindConflict(f"pod {ref} is already bound to {pod.node_name}")
            already = pod.node_name == a.node
            settled = already and (pod.started or pod.terminal)  # the container has its devices (or never will)
            text = encode_assignment(a)
            if already and not settled and pod.annotations.get(ASSIGNMENT_ANNOTATION) != text:
                await self.cluster.annotate_pod(ref, {ASSIGNMENT_ANNOTATION: text})
            if not settled and self.fenced(a.node):
                await self._fence(ev, a, text, ticket)
            if already:
                log("already bound", pod=str(ref), node=a.node, gang=ev.gang_id)
                metrics.BINDS.inc(result="already_bound")
                span.set_attribute("phalanx.outcome", "already_bound")
            else:
                await self.cluster.bind(ref, a.node, {ASSIGNMENT_ANNOTATION: text})  # the annotation in the same write
                gpus = ",".join(map(str, a.gpus)) or "-"
                await self.cluster.record_event(
                    ref, reason="Scheduled",
                    message=f"Successfully assigned {ref} to {a.node} (GPUs {gpus}) by phalanx, gang {ev.gang_id} attempt {ev.attempt}")
                log("bound", pod=str(ref), node=a.node, gpus=gpus, gang=ev.gang_id, attempt=ev.attempt)
                metrics.BINDS.inc(result="bound")
                span.set_attribute("phalanx.outcome", "bound")
                if pod.created:
                    metrics.POD_PENDING_TO_BOUND_SECONDS.observe(max(0.0, time.time() - pod.created))
        except (BindConflict, PodGone, NotOurs) as e:
            metrics.BINDS.inc(result="failed")
            span.set_attribute("phalanx.outcome", "failed")
            span.set_attribute("phalanx.failure_reason", str(e))
            await self.bus.publish(S.binder_reply_subject(ev.gang_id), BindFailed(
                gang_id=ev.gang_id, attempt=ev.attempt, pod=ref, reason=str(e)))
            return
        await self.bus.publish(S.binder_reply_subject(ev.gang_id), Bound(
            gang_id=ev.gang_id, attempt=ev.attempt, pod=ref, node=a.node))

    async def _fence(self, ev: BindRequested, a: Assignment, text: str, ticket: Ticket | None) -> None:
        now = self.fences.clock()
        entry = FenceEntry(uid=a.pod.uid, namespace=a.pod.namespace, name=a.pod.name, digest=assignment_digest(text),
                           expires=now + F.ENTRY_TTL_S, batch=f"{ev.gang_id}#{ev.attempt}")
        try:
            if ticket is None:  # the node's report began to say "device plugin" since the command came
                with self.fences.coming(a.node) as ticket:
                    await self.fences.fence(ticket, entry)
            else:
                await self.fences.fence(ticket, entry)
        except F.FenceError as e:  # the node's fence is full: pods bound earlier must be admitted first
            raise TemporaryError(str(e), delay=2.0) from e


def _ours(pod: Pod) -> bool:
    return pod.scheduler_name in SCHEDULER_NAMES


async def run(bus: Bus, cluster: ClusterPort, config: Config = Config(), *,
              task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run binder until cancelled; ready once both mirrors are listed and its durable consumer
    is live (the pod watch starts alongside and never holds binds up)."""
    own = S.CONSUMER[DURABLE]
    async with anyio.create_task_group() as tg:
        topology = KvMirror.of_bucket(bus, S.KV_TOPOLOGY)
        ledger = KvMirror.of_bucket(bus, S.KV_LEDGER, keys="*")
        await tg.start(topology.run)
        await tg.start(ledger.run)
        fences = NodeFences(tg, cluster, namespace=config.fence_namespace,
                            holder=config.instance or default_instance())
        binder = Binder(bus, cluster, topology=topology, ledger=ledger, fences=fences)
        binder.pods = PodWatch(cluster, fenced=binder.fenced, release=fences.release)
        tg.start_soon(binder.pods.run)
        log("binder settings", parallelism=config.parallelism, fence_namespace=config.fence_namespace,
            holder=fences.holder)
        await tg.start(lambda task_status: consume(
            bus, stream=own.stream, durable=own.durable, filter_subject=own.filter, decoder=gang_decoder,
            handler=binder.on_command, concurrency=config.parallelism, task_status=task_status))
        task_status.started()
