"""binder: binds placed pods to their nodes through the Kubernetes port.

For each ``BindRequested``: write the assignment annotation (so the node's device plugin or
runtime hook can read it), then the Binding, then a ``Scheduled`` event, and reply ``Bound``.
Idempotent: a pod already bound to the same node counts as success (a redelivered command
after a crash), bound elsewhere or recreated is a ``BindFailed`` with the reason.

Metrics: ``phalanx_pod_pending_to_bound_seconds`` (from the pod's creation time) and
``phalanx_binds_total{result}``; span ``binder.bind`` with ``k8s.pod.name``,
``k8s.namespace.name`` and ``k8s.node.name``.
"""

from __future__ import annotations

import time

import anyio

from phalanx_bus import Bus, Delivery, consume
from phalanx_kube.port import ASSIGNMENT_ANNOTATION, BindConflict, ClusterPort, PodGone
from phalanx_proto import subjects as S
from phalanx_proto.events import BindFailed, BindRequested, Bound, encoder, gang_decoder
from phalanx_proto.state import gang_state_decoder
from phalanx_telemetry import log, metrics, tracer, warn

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

    async def current(self, ev: BindRequested) -> bool:
        """Is the command's attempt still the gang's live binding attempt? A bind for an attempt
        that was rolled back (or superseded) must not happen: it would bind a pod with the old
        attempt's GPUs. Read from ``phx-gangs``; absent state means the gang is gone."""
        entry = await (await self.bus.kv(S.KV_GANGS)).get(S.gang_key(ev.gang_id))
        if entry is None:
            return False
        state = gang_state_decoder.decode(entry.value)
        return state.attempt == ev.attempt and state.phase in ("binding", "scheduled")

    async def bind(self, ev: BindRequested) -> None:
        a = ev.assignment
        if not await self.current(ev):
            log("stale bind skipped", pod=str(a.pod), gang=ev.gang_id, attempt=ev.attempt)
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
        except (BindConflict, PodGone) as e:
            metrics.BINDS.inc(result="failed")
            span.set_attribute("phalanx.outcome", "failed")
            span.set_attribute("phalanx.failure_reason", str(e))
            await self.bus.publish(S.coord_subject(ev.gang_id), BindFailed(
                gang_id=ev.gang_id, attempt=ev.attempt, pod=ref, reason=str(e)))
            return
        await self.bus.publish(S.coord_subject(ev.gang_id), Bound(
            gang_id=ev.gang_id, attempt=ev.attempt, pod=ref, node=a.node))


async def run(bus: Bus, cluster: ClusterPort, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run binder until cancelled; ready once its durable consumer is live."""
    binder = Binder(bus, cluster)
    await consume(bus, stream=S.STREAM_GANG, durable=DURABLE, filter_subject="phx.gang.binder.>",
                  decoder=gang_decoder, handler=binder.on_command, task_status=task_status)
