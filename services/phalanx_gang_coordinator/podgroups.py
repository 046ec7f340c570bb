"""The upstream Workload API's PodGroups (docs/workloads.md, "The upstream Workload API"): the
gang a pod's ``spec.schedulingGroup.podGroupName`` names, and the status Phalanx reports back.

* **Which gang, what size.** A pod naming a PodGroup is in gang ``PodGroup:<name>``
  (``phalanx_kubeobjects.gangs.identify``); the PodGroup object says its size
  (``gangs.pod_group_policy``): ``gang.minCount`` pods placed together first, the group's
  other pods joining one by one as an elastic gang's members do; ``basic``, one by one from the
  first. ``phalanx.io/gang-min-member`` on the pods still wins, as for every shape.
* **Waiting for it.** A pod whose PodGroup does not exist (yet) is not refused: it waits, told
  why, and is taken in once the watch shows the PodGroup (``arrived``).
* **Status.** ``PodGroupScheduled`` is set True (reason ``Scheduled``) when the gang is
  placed, False (``Unschedulable``, with the pending reason) while it waits after an attempt;
  other conditions are kept. Only for PodGroups the watch shows: a gang named by a
  coscheduling label (the same ``PodGroup:<name>`` id, another API) has no object here.

The watch keeps every PodGroup's spec and conditions (``known``); a pod seen before the watch
shows its group reads the object on its own (``ClusterPort.get_pod_group``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from phalanx_kube.port import ClusterPort
from phalanx_kubeobjects.gangs import GangIdentity, PodGroupPolicy, pod_group_policy
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.kubeapi import POD_GROUP_SCHEDULED
from phalanx_telemetry import log, warn


class Waiting(str):
    """Why a pod waits for its PodGroup (it is not refused: the object may come)."""


Key = tuple[str, str]


class PodGroupBook:
    def __init__(self, cluster: ClusterPort) -> None:
        self.cluster = cluster
        self.known: dict[Key, dict[str, Any]] = {}
        """(namespace, name) → the PodGroup as the watch last showed it."""
        self.arrived: Callable[[str, str], Awaitable[None]] | None = None
        """Called with (namespace, name) when the watch shows a PodGroup it did not know: the
        pods that waited for it are taken in (set by the service: ``PodIntake.take_in_group``)."""

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the PodGroups; ready once they are listed."""
        started = False
        async for kind, body in self.cluster.watch_pod_groups():
            new: list[Key] = []
            if kind == "listed":
                before = self.known
                self.known = {_key(o): o for o in body}
                new = [k for k in self.known if k not in before]
            elif kind == "deleted":
                self.known.pop(_key(body), None)
            else:
                k = _key(body)
                if k not in self.known:
                    new.append(k)
                self.known[k] = body
            if not started:
                started = True
                task_status.started()
            elif self.arrived is not None:
                for ns, name in new:
                    try:
                        await self.arrived(ns, name)
                    except Exception as e:  # noqa: BLE001 - resync takes the pods in later
                        warn("pods of a new PodGroup not taken in", group=f"{ns}/{name}", error=repr(e)[:200])

    async def sized(self, namespace: str, ident: GangIdentity) -> GangIdentity | Waiting | Violation:
        """``ident`` (of a pod naming a PodGroup) with the size its PodGroup says: min-member
        (unless the pods say ``phalanx.io/gang-min-member``) and the elastic maximum; or why the
        pod waits (no such PodGroup yet), or the PodGroup's violation."""
        key = (namespace, ident.pod_group)
        obj = self.known.get(key)
        if obj is None:
            obj = await self.cluster.get_pod_group(*key)
            if obj is None:
                return Waiting(f"PodGroup {namespace}/{ident.pod_group} (spec.schedulingGroup.podGroupName) does not "
                               "exist (yet): the pod waits for it")
            self.known[key] = obj
        policy = pod_group_policy(obj)
        if isinstance(policy, Violation):
            return Violation(f"PodGroup {namespace}/{ident.pod_group} {policy.field}", policy.value, policy.rule)
        return _sized(ident, policy)

    async def report(self, gang_id: str, *, scheduled: bool, message: str) -> None:
        """Set ``PodGroupScheduled`` on the gang's PodGroup (one the watch shows; none: nothing)."""
        ns, _, rest = gang_id.partition("/")
        kind, _, name = rest.partition(":")
        obj = self.known.get((ns, name)) if kind == "PodGroup" else None
        if obj is None:
            return
        status, reason = ("True", "Scheduled") if scheduled else ("False", "Unschedulable")
        conditions = list((obj.get("status") or {}).get("conditions") or [])
        mine = next((c for c in conditions if c.get("type") == POD_GROUP_SCHEDULED), None)
        message = message[:32768]
        if mine is not None and (mine.get("status"), mine.get("reason"), mine.get("message")) == (status, reason, message):
            return
        at = (mine.get("lastTransitionTime") if mine is not None and mine.get("status") == status else None) or \
            datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": POD_GROUP_SCHEDULED, "status": status, "reason": reason, "message": message,
                     "lastTransitionTime": at}
        conditions = [c for c in conditions if c.get("type") != POD_GROUP_SCHEDULED] + [condition]
        try:
            await self.cluster.update_pod_group_status(ns, name, conditions)
        except Exception as e:  # noqa: BLE001 - a status is information; the next transition writes it again
            warn("PodGroup status not written", group=f"{ns}/{name}", error=repr(e)[:200])
            return
        self.known[(ns, name)] = {**obj, "status": {**(obj.get("status") or {}), "conditions": conditions}}
        log("PodGroup status", group=f"{ns}/{name}", condition=POD_GROUP_SCHEDULED, status=status)


def _sized(ident: GangIdentity, policy: PodGroupPolicy) -> GangIdentity:
    least = ident.min_member or policy.least
    return dataclasses.replace(ident, min_member=least, max_member=max(least, policy.most))


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")
