"""The pods a pod watch has reported, by namespace/name: turns what the reflector sees (a list,
a watch event) into the ``PodEvent``s ``ClusterPort.watch_pods`` promises. Used by
``KubeCluster.watch_pods``; pure, so its rules are unit-tested without an API server.

* After a (re-)list, what changed while the watch was away: ``DELETED`` for pods gone (or
  recreated under another uid), ``MODIFIED`` for pods whose resourceVersion moved, ``ADDED`` for
  new ones, in creation order.
* A watch event for a name whose uid changed (deleted and recreated between two events):
  ``DELETED`` of the old pod, then ``ADDED`` of the new one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from phalanx_kube.port import Pod, PodEvent


def _rv(pod: Pod) -> str | None:
    return (pod.raw.get("metadata") or {}).get("resourceVersion")


class PodTable:
    def __init__(self, read: Callable[[dict[str, Any]], Pod]) -> None:
        self._read = read
        self.known: dict[tuple[str, str], Pod] = {}

    def relisted(self, items: list[dict[str, Any]]) -> list[PodEvent]:
        """The events that take the table to exactly ``items`` (the list's objects)."""
        events: list[PodEvent] = []
        fresh = {(p.namespace, p.name): p for p in map(self._read, items)}
        known = self.known
        for key in [k for k in known if k not in fresh or known[k].uid != fresh[k].uid]:
            events.append(PodEvent(type="DELETED", pod=known.pop(key)))
        for key, pod in sorted(fresh.items(), key=lambda kv: (kv[1].created, kv[0])):
            old = known.get(key)
            if old is None:
                events.append(PodEvent(type="ADDED", pod=pod))
            elif _rv(old) != _rv(pod):
                events.append(PodEvent(type="MODIFIED", pod=pod))
            known[key] = pod
        return events

    def watched(self, etype: Literal["ADDED", "MODIFIED", "DELETED"], pod: Pod) -> list[PodEvent]:
        """The events one watch event stands for."""
        key = (pod.namespace, pod.name)
        if etype == "DELETED":
            self.known.pop(key, None)
            return [PodEvent(type="DELETED", pod=pod)]
        out = []
        old = self.known.get(key)
        if old is not None and old.uid != pod.uid:  # deleted and recreated between two events
            out.append(PodEvent(type="DELETED", pod=old))
            old = None
        self.known[key] = pod
        out.append(PodEvent(type="MODIFIED" if old is not None else "ADDED", pod=pod))
        return out
