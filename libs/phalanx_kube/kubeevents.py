"""Pod events on a real API server (the part of ``ClusterPort`` that tells a pod's owner what
happened): ``KubeCluster`` mixes it in.

Events are core/v1 Events named after (pod uid, reason, message), so a repeat, from any
process, bumps ``count`` of the same object (get + patch with the resourceVersion read).
"""

from __future__ import annotations

import hashlib
import time
from typing import Literal

from phalanx_kube.apitime import epoch, iso
from phalanx_kube.port import KubeEvent
from phalanx_proto.events import PodRef

EVENT_COMPONENT = "phalanx"
MESSAGE_LIMIT = 1024
"""The apiserver rejects Event messages above 1 KiB when ``eventTime`` is set."""


class KubeEvents:
    """Needs ``self._call``, ``self._core``, ``self._instance`` and ``self.get_pod`` (``KubeCluster``)."""

    async def record_event(self, ref: PodRef, *, reason: str, message: str,
                           type: Literal["Normal", "Warning"] = "Normal") -> None:
        message = message[:MESSAGE_LIMIT]
        digest = hashlib.sha256(f"{ref.uid}\0{reason}\0{message}".encode()).hexdigest()[:16]
        name = f"{ref.name[:200]}.{digest}"
        now = time.time()
        uid = ref.uid
        if not uid:
            pod = await self.get_pod(ref)
            uid = pod.uid if pod else ""
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ref.namespace, "name": ref.name,
                               **({"uid": uid} if uid else {})},
            "reason": reason, "message": message, "type": type, "count": 1,
            "firstTimestamp": iso(now), "lastTimestamp": iso(now), "eventTime": iso(now, micro=True),
            "source": {"component": EVENT_COMPONENT}, "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": self._instance, "action": "Scheduling",
        }
        status, _ = await self._call(f"create event for {ref}", self._core.create_namespaced_event, ref.namespace,
                                     event, ok=(409,))
        if status != 409:
            return
        for _ in range(10):  # the same event again: bump its count, resourceVersion as precondition
            _, current = await self._call(f"read event {name}", self._core.read_namespaced_event, name, ref.namespace)
            bump = {"metadata": {"resourceVersion": (current.get("metadata") or {}).get("resourceVersion")},
                    "count": int(current.get("count") or 1) + 1, "lastTimestamp": iso(time.time())}
            status, _ = await self._call(f"bump event {name}", self._core.patch_namespaced_event, name,
                                         ref.namespace, bump, _content_type="application/merge-patch+json",
                                         ok=(409,))
            if status != 409:
                return
        raise RuntimeError(f"event {ref.namespace}/{name}: too many concurrent updates")

    async def list_events(self, ref: PodRef) -> list[KubeEvent]:
        sel = f"involvedObject.kind=Pod,involvedObject.name={ref.name}"
        _, body = await self._call(f"list events of {ref}", self._core.list_namespaced_event, ref.namespace,
                                   field_selector=sel)
        items = sorted(body.get("items") or [], key=lambda e: (
            epoch(e.get("eventTime")) or epoch(e.get("firstTimestamp")),
            epoch((e.get("metadata") or {}).get("creationTimestamp")), (e.get("metadata") or {}).get("name", "")))
        return [KubeEvent(reason=e.get("reason") or "", message=e.get("message") or "",
                          type="Warning" if e.get("type") == "Warning" else "Normal", count=int(e.get("count") or 1),
                          at=epoch(e.get("lastTimestamp")) or epoch(e.get("eventTime")))
                for e in items]
