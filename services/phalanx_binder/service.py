"""binder: binds placed pods to their nodes through the Kubernetes port.

For each ``BindRequested``: write the assignment annotation (so the node's device plugin or
runtime hook can read it), then the Binding, then a ``Scheduled`` event, and reply ``Bound``.
Idempotent: a pod already bound to the same node counts as success (a redelivered command
after a crash), bound elsewhere or recreated is a ``BindFailed`` with the reason.
"""

from __future__ import annotations

import anyio

from phalanx_bus import Bus, Delivery, consume
from phalanx_kube.port import ASSIGNMENT_ANNOTATION, BindConflict, ClusterPort, PodGone
from phalanx_proto import subjects as S
from phalanx_proto.events import BindFailed, BindRequested, Bound, encoder, gang_decoder
from phalanx_telemetry import log, warn

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

    async def bind(self, ev: BindRequested) -> None:
        a = ev.assignment
        ref = a.pod
        try:
            pod = await self.cluster.get_pod(ref)
            if pod is None or (ref.uid and pod.uid != ref.uid):
                raise PodGone(f"pod {ref} no longer exists")
            if pod.node_name == a.node:
                log("already bound", pod=str(ref), node=a.node, gang=ev.gang_id)
            else:
                await self.cluster.annotate_pod(ref, {ASSIGNMENT_ANNOTATION: encoder.encode(a).decode()})
                await self.cluster.bind(ref, a.node)
                gpus = ",".join(map(str, a.gpus)) or "-"
                await self.cluster.record_event(
                    ref, reason="Scheduled",
                    message=f"Successfully assigned {ref} to {a.node} (GPUs {gpus}) by phalanx, gang {ev.gang_id} attempt {ev.attempt}")
                log("bound", pod=str(ref), node=a.node, gpus=gpus, gang=ev.gang_id, attempt=ev.attempt)
        except (BindConflict, PodGone) as e:
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
