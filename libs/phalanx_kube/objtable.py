"""The objects a watch of raw API objects has reported (the DRA objects: DeviceClasses,
ResourceSlices, ResourceClaims), by namespace/name: turns a (re-)list or a watch event into the
``ObjectEvent``s the port's ``watch_*`` methods promise. ``PodTable`` does the same for pods,
which it reads into ``Pod`` values; this one keeps the objects as they are. Pure, shared by both
adapters (the real one's reflector, the simulator's KV watch).

* After a (re-)list, what changed while the watch was away: ``DELETED`` for objects gone (or
  recreated under another uid), ``MODIFIED`` for those whose resourceVersion moved, ``ADDED`` for
  new ones (by namespace and name).
* A watch event for a name whose uid changed: ``DELETED`` of the old object, then ``ADDED``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from phalanx_kube.port import ObjectEvent

Key = tuple[str, str]


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _uid(obj: Mapping[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("uid") or ""


def _rv(obj: Mapping[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("resourceVersion") or ""


class ObjectTable:
    def __init__(self) -> None:
        self.known: dict[Key, dict[str, Any]] = {}

    def relisted(self, items: list[dict[str, Any]]) -> list[ObjectEvent]:
        """The events that take the table to exactly ``items``."""
        fresh = {key_of(o): o for o in items}
        events = [ObjectEvent(type="DELETED", obj=self.known.pop(k)) for k in list(self.known)
                  if k not in fresh or _uid(self.known[k]) != _uid(fresh[k])]
        for k in sorted(fresh):
            old = self.known.get(k)
            if old is None:
                events.append(ObjectEvent(type="ADDED", obj=fresh[k]))
            elif _rv(old) != _rv(fresh[k]):
                events.append(ObjectEvent(type="MODIFIED", obj=fresh[k]))
            self.known[k] = fresh[k]
        return events

    def watched(self, etype: Literal["ADDED", "MODIFIED", "DELETED"], obj: dict[str, Any]) -> list[ObjectEvent]:
        """The events one watch event stands for."""
        k = key_of(obj)
        if etype == "DELETED":
            self.known.pop(k, None)
            return [ObjectEvent(type="DELETED", obj=obj)]
        out = []
        old = self.known.get(k)
        if old is not None and _uid(old) != _uid(obj):
            out.append(ObjectEvent(type="DELETED", obj=old))
            old = None
        self.known[k] = obj
        out.append(ObjectEvent(type="MODIFIED" if old is not None else "ADDED", obj=obj))
        return out
