"""binder: binds placed pods to their nodes through the Kubernetes port.

For each ``BindRequested``: write the assignment annotation (so the node's device plugin or
runtime hook can read it), then the Binding, then a ``Scheduled`` event, and reply ``Bound``.
Idempotent: a pod already bound to the same node counts as success (a redelivered command
after a crash), bound elsewhere or recreated is a ``BindFailed`` with the reason.

The command is not believed on its word (docs/saga.md, "Checks"): binder binds only the
assignment placement recorded in ``phx-ledger`` for this gang, attempt and pod uid (the ledger
entry is the authority: what is bound is the ledger's assignment), only a pod whose
``schedulerName`` is Phalanx's, and only to a node that has a topology report in
``phx-topology`` and is enabled. A command that fails a check is refused: logged with the rule,
counted in ``phalanx_refused_messages_total``, acknowledged, and nothing is written — no reply
either, so a forged command cannot make the coordinator give up a good attempt. A bind of an
attempt that was rolled back finds its reservation released and is refused the same way.

Metrics: ``phalanx_pod_pending_to_bound_seconds`` (from the pod's creation time) and
``phalanx_binds_total{result}``; span ``binder.bind`` with ``k8s.pod.name``,
``k8s.namespace.name`` and ``k8s.node.name``.
"""

from __future__ import annotations

import time

import anyio
import msgspec

from phalanx_bus import BadEntry, Bus, Delivery, consume, read_one
from phalanx_kube.port import (
    ASSIGNMENT_ANNOTATION,
    SCHEDULER_NAMES,
    BindConflict,
    ClusterPort,
    NotOurs,
    Pod,
    PodGone,
)
from phalanx_proto import subjects as S
from phalanx_proto.events import Assignment, BindFailed, BindRequested, Bound, encoder, gang_decoder
from phalanx_proto.state import alloc_key
from phalanx_telemetry import log, metrics, refused, tracer, warn

DURABLE = "binder"


class Binder:
    def __init__(self, bus: Bus, cluster: ClusterPort) -> None:
        self.bus = bus
        self.cluster = cluster

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case BindRequested():
                await self.bind(event)
            case _:
                warn("unexpected event on binder subject", kind=type(event).__name__)

    async def recorded(self, ev: BindRequested) -> tuple[str, str] | Assignment:
        """The assignment to bind: the ledger's allocation for exactly (gang, attempt, pod uid)
        on the command's node, when that node is known and enabled; else ``(rule, why)``.

        The ledger does not hold the MIG instance (mig-manager makes it after the reservation);
        the command's ``mig_instance_uuid`` is kept, everything else comes from the ledger."""
        a = ev.assignment
        topo = await read_one(await self.bus.kv(S.KV_TOPOLOGY), S.token(a.node))
        if topo is None or isinstance(topo, BadEntry) or topo.value.node != a.node:
            return "unknown_node", f"node {a.node!r} has no (readable) topology report in phx-topology"
        if not topo.value.enabled:
            return "node_disabled", f"node {a.node} is not enabled for Phalanx"
        entry = await read_one(await self.bus.kv(S.KV_LEDGER), S.token(a.node))
        if isinstance(entry, BadEntry):
            return "unreadable_record", str(entry)
        alloc = entry.value.allocations.get(alloc_key(a.pod)) if entry is not None else None
        if alloc is None or (alloc.gang_id, alloc.attempt) != (ev.gang_id, ev.attempt):
            held = f"gang {alloc.gang_id} attempt {alloc.attempt}" if alloc is not None else "nothing"
            return "not_in_ledger", (f"the ledger holds {held} for {a.pod} (uid {a.pod.uid or '-'}) on {a.node}, "
                                     f"not gang {ev.gang_id} attempt {ev.attempt}")
        recorded = msgspec.structs.replace(alloc.assignment, mig_instance_uuid=a.mig_instance_uuid)
        if recorded != a:
            return "not_in_ledger", f"the command's assignment for {a.pod} differs from the ledger's"
        return recorded

    async def bind(self, ev: BindRequested) -> None:
        a = ev.assignment
        checked = await self.recorded(ev)
        if not isinstance(checked, Assignment):
            refused(checked[0], checked[1], pod=str(a.pod), node=a.node, gang=ev.gang_id, attempt=ev.attempt)
            return
        with tracer().start_as_current_span("binder.bind", attributes={
                "k8s.pod.name": a.pod.name, "k8s.namespace.name": a.pod.namespace, "k8s.node.name": a.node,
                "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt,
                "phalanx.gpus": list(a.gpus)}) as span:
            await self._bind(ev, span)

    async def _bind(self, ev: BindRequested, span) -> None:
        a = ev.assignment
        ref = a.pod
        try:
            pod = await self.cluster.get_pod(ref)
            if pod is None or (ref.uid and pod.uid != ref.uid):
                raise PodGone(f"pod {ref} no longer exists")
            if not _ours(pod):
                refused("foreign_scheduler", f"pod {ref} has schedulerName {pod.scheduler_name!r}, not Phalanx's",
                        gang=ev.gang_id, attempt=ev.attempt)
                span.set_attribute("phalanx.outcome", "refused")
                return
            if pod.node_name == a.node:
                log("already bound", pod=str(ref), node=a.node, gang=ev.gang_id)
                metrics.BINDS.inc(result="already_bound")
                span.set_attribute("phalanx.outcome", "already_bound")
            else:
                await self.cluster.annotate_pod(ref, {ASSIGNMENT_ANNOTATION: encoder.encode(a).decode()})
                await self.cluster.bind(ref, a.node)
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


def _ours(pod: Pod) -> bool:
    return pod.scheduler_name in SCHEDULER_NAMES


async def run(bus: Bus, cluster: ClusterPort, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run binder until cancelled; ready once its durable consumer is live."""
    binder = Binder(bus, cluster)
    await consume(bus, stream=S.CONSUMER[DURABLE].stream, durable=DURABLE, filter_subject=S.CONSUMER[DURABLE].filter,
                  decoder=gang_decoder, handler=binder.on_command, task_status=task_status)
