"""binder's view of Phalanx's pods, from the Kubernetes port's pod watch.

Two jobs:

* **Releasing fence entries at once.** A pod that has started (the kubelet reports its
  containers: it was admitted, and the device plugin served it), turned terminal
  (``Succeeded``/``Failed``, which includes a pod the kubelet rejected), is being deleted or is
  gone no longer needs its fence entry: ``release`` drops it from its node's fence with the
  node's next write. Only for nodes that keep a fence (``fenced(node)``), and only uids the
  fence lists or may list (``NodeFences.release`` writes nothing for the others). A release
  binder misses (it was down, or another replica wrote the entry after this one last saw the
  fence) lapses on its own after ``phalanx_kube.fence.ENTRY_TTL_S``.
* **A cache for binds.** ``get(ref)`` answers from the watch when it knows the pod with that
  uid, so a bind does not read the pod from the API server. The cache may lag the server but
  never misleads a bind: a pod is never unbound, a recreated pod has another uid (the bind then
  reads the server), and every write a bind makes carries the pod's uid as a precondition.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from phalanx_kube.port import ClusterPort, Pod, PodEvent
from phalanx_proto.events import PodRef
from phalanx_telemetry import log, warn


def done_with_fence(pod: Pod) -> bool:
    """The pod needs no fence entry any more: started, terminal or being deleted."""
    return pod.started or pod.terminal or pod.deleting


class PodWatch:
    """Follows ``cluster.watch_pods()``; ``release(node, uids)`` is called for finished pods."""

    def __init__(self, cluster: ClusterPort, *, fenced: Callable[[str], bool],
                 release: Callable[[str, set[str]], None]) -> None:
        self.cluster = cluster
        self.fenced = fenced
        self.release = release
        self.listed = False
        self._pods: dict[tuple[str, str], Pod] = {}

    def get(self, ref: PodRef) -> Pod | None:
        """The watched pod ``ref`` names (its uid, when ``ref`` has one), or ``None`` when the
        watch does not know it (yet): the caller then reads the API server."""
        pod = self._pods.get((ref.namespace, ref.name))
        if pod is None or (ref.uid and pod.uid != ref.uid):
            return None
        return pod

    def apply(self, ev: PodEvent) -> None:
        pod, key = ev.pod, (ev.pod.namespace, ev.pod.name)
        if ev.type == "DELETED":
            if self._pods.get(key) is not None and self._pods[key].uid == pod.uid:
                del self._pods[key]
            finished = True
        else:
            self._pods[key] = pod
            finished = done_with_fence(pod)
        if finished and pod.node_name and pod.uid and self.fenced(pod.node_name):
            self.release(pod.node_name, {pod.uid})

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the watch until cancelled; started once the first listing is in (a watch that
        cannot start, for want of rights or a server, is retried and never blocks binds)."""
        started = False
        while True:
            try:
                async for ev in self.cluster.watch_pods():
                    if ev is None:
                        if not self.listed:
                            log("pod watch listed", pods=len(self._pods))
                        self.listed = True
                        if not started:
                            started = True
                            task_status.started()
                        continue
                    self.apply(ev)
            except Exception as e:  # noqa: BLE001 - the port re-lists on its own; this guards the rest
                warn("pod watch failed, starting again", error=repr(e)[:300])
                await anyio.sleep(2.0)
