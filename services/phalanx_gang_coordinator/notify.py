"""What gang-coordinator tells pods: Warning events and the ``PodScheduled=False`` condition,
kube-scheduler style, through the cluster port.

A notice never fails the caller: the pod may be gone by then, and the gang's record says it
all anyway (the failure is logged).
"""

from __future__ import annotations

from phalanx_kube.port import ClusterPort, Pod
from phalanx_proto.events import PodRef
from phalanx_telemetry import warn


class Notifier:
    def __init__(self, cluster: ClusterPort) -> None:
        self.cluster = cluster

    async def event(self, ref: PodRef, reason: str, message: str) -> None:
        """A Warning event on the pod (the same reason and message again bumps its count)."""
        try:
            await self.cluster.record_event(ref, reason=reason, message=message, type="Warning")
        except Exception as e:  # noqa: BLE001 - the pod may be gone; the gang state says it all
            warn("cannot record event", pod=str(ref), error=repr(e))

    async def condition(self, ref: PodRef, message: str) -> None:
        """``PodScheduled=False`` with reason ``Unschedulable`` and ``message``."""
        try:
            await self.cluster.set_scheduled_condition(ref, status=False, reason="Unschedulable", message=message)
        except Exception as e:  # noqa: BLE001 - as above
            warn("cannot set PodScheduled", pod=str(ref), error=repr(e))

    async def tell(self, pods: tuple[PodRef, ...], reason: str, message: str, *, condition: bool = True) -> None:
        for ref in pods:
            await self.event(ref, reason, message)
            if condition:
                await self.condition(ref, message)

    async def once(self, pod: Pod, reason: str, message: str) -> None:
        """Event + condition, unless the pod's ``PodScheduled`` already says ``message`` (the
        condition on the pod is the record, so a restart or a resync does not repeat it)."""
        for c in ((pod.raw.get("status") or {}).get("conditions") or []):
            if c.get("type") == "PodScheduled" and c.get("message") == message:
                return
        await self.event(pod.ref, reason, message)
        await self.condition(pod.ref, message)
