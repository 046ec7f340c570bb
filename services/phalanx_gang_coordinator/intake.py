"""Pod intake: pending pods with a Phalanx schedulerName become gang members; deleted pods
stop being members and give back what they held.

Called for every pod event of the watch and, for pods the watch may have missed, by resync.
A pod Phalanx cannot take (an invalid request, a bad annotation value, a gang record that
cannot be read) is told why once — Warning event and ``PodScheduled=False`` naming field,
value and rule — and never admitted; one pod's trouble never stops another's.
"""

from __future__ import annotations

import time
from functools import partial

import anyio
import msgspec

from phalanx_bus import KeyedWork
from phalanx_gang_coordinator import effects
from phalanx_gang_coordinator.drabook import DraBook, Waiting
from phalanx_gang_coordinator.driver import SagaDriver
from phalanx_gang_coordinator.gangs import InvalidMember, identity, member_spec
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.podgroups import PodGroupBook
from phalanx_gang_coordinator.podgroups import Waiting as GroupWaiting
from phalanx_gang_coordinator.queuebook import QueueBook
from phalanx_gang_coordinator.store import GangStore, UnreadableRecord
from phalanx_kube.port import ClusterPort, Pod
from phalanx_kubeobjects import nodeterms
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.events import PodRef
from phalanx_proto.state import FailedMember, GangState
from phalanx_rules import saga
from phalanx_telemetry import log, metrics, warn


class PodIntake:
    def __init__(self, cluster: ClusterPort, store: GangStore, driver: SagaDriver, notifier: Notifier,
                 settle_s: float, *, parallelism: int = 1, queues: QueueBook | None = None,
                 bound_seen: dict[str, str] | None = None, dra: DraBook | None = None,
                 groups: PodGroupBook | None = None) -> None:
        """``bound_seen``: pod uid → the node the watch last showed it bound to, kept here and read
        by the driver (the same map is passed to both); ``dra``: where a pod's ResourceClaims are
        resolved (None: pods with claims are admitted without them); ``groups``: where a pod
        naming a Workload API PodGroup learns its gang's size (None: such pods wait)."""
        self.cluster = cluster
        self.parallelism = parallelism
        self.bound_seen: dict[str, str] = bound_seen if bound_seen is not None else {}
        self.watched: dict[tuple[str, str], Pod] = {}
        """The pods as the watch last showed them, by (namespace, name)."""
        self.listed = False
        """The watch has listed the cluster's pods once (``watched`` is complete since)."""
        self.store = store
        self.driver = driver
        self.notifier = notifier
        self.settle_s = settle_s
        self.queues = queues
        self.dra = dra
        self.groups = groups
        self.repairs = None
        """The repair watch (``repairs.RepairWatch``), set by the service: a bound member of a
        running gang that is deleted or fails is a failure its gang is repaired for."""
        self._queued: dict[str, list] = {}
        """Gang key → pod events not yet handled (``watch``, ``_drain``)."""

    async def on_pod(self, pod: Pod) -> None:
        """Admit an unbound pod into its gang and start the gang if it is complete."""
        await self.on_pods([pod])

    async def on_pods(self, pods: list[Pod]) -> None:
        """Admit unbound pods of one gang together: one compare-and-set records them all (and
        starts the gang when they complete it). A pod Phalanx cannot take is told why alone."""
        admitted: list[tuple[Pod, object, object]] = []
        for pod in pods:
            if pod.node_name or pod.deleting:
                continue
            try:
                ident = identity(pod)
                spec = member_spec(pod)
            except InvalidMember as e:
                warn("pod rejected", pod=f"{pod.namespace}/{pod.name}", reason=str(e))
                self.notifier.once(pod, "FailedScheduling", f"invalid request: {e}")
                continue
            if ident.pod_group:  # the Workload API: the PodGroup object says the size
                sized = await self.groups.sized(pod.namespace, ident) if self.groups is not None else \
                    GroupWaiting("PodGroups are not read by this gang-coordinator")
                if self._stopped(pod, sized, GroupWaiting, "its PodGroup"):
                    continue
                ident = sized
            if self.queues is not None:
                queue, problem = await self.queues.resolve(pod)
                if problem:
                    warn("pod not admitted for its queue", pod=f"{pod.namespace}/{pod.name}", queue=queue,
                         reason=problem)
                    metrics.QUEUE_ADMISSIONS_REFUSED.inc(reason=_refusal_kind(problem))
                    self.notifier.once(pod, "FailedScheduling", problem)
                    continue
                spec = msgspec.structs.replace(spec, queue=queue)
                if nodeterms.selects_namespaces(spec):  # namespaceSelector by labels: the namespaces it selects now
                    resolved = nodeterms.resolve_namespaces(spec, self.queues.namespaces)
                    if isinstance(resolved, Violation):
                        warn("pod rejected", pod=f"{pod.namespace}/{pod.name}", reason=str(resolved))
                        self.notifier.once(pod, "FailedScheduling", f"invalid request: {resolved}")
                        continue
                    spec = resolved
            if self.dra is not None and self.dra.concerns(pod):
                claims = await self.dra.resolve(pod)
                if self._stopped(pod, claims, Waiting, "its claims"):
                    continue
                spec = msgspec.structs.replace(spec, claims=claims)
            admitted.append((pod, ident, spec))
        for gang_id in dict.fromkeys(ident.gang_id for _, ident, _ in admitted):
            await self._admit(gang_id, [(p, i, sp) for p, i, sp in admitted if i.gang_id == gang_id])

    def _stopped(self, pod: Pod, outcome: object, waiting: type, what: str) -> bool:
        """Does ``outcome`` (of resolving the pod's PodGroup or claims) keep the pod out for now?
        A ``waiting`` reason: it waits, told why; a ``Violation``: it is refused, told why."""
        if isinstance(outcome, waiting):
            log(f"pod waits for {what}", pod=f"{pod.namespace}/{pod.name}", reason=str(outcome))
            self.notifier.once(pod, "FailedScheduling", str(outcome))
            return True
        if isinstance(outcome, Violation):
            warn("pod rejected", pod=f"{pod.namespace}/{pod.name}", reason=str(outcome))
            self.notifier.once(pod, "FailedScheduling", f"invalid request: {outcome}")
            return True
        return False

    async def take_in_group(self, namespace: str, name: str) -> None:
        """A PodGroup appeared: take in the unbound pods that waited for it."""
        pods = [p for p in self.watched.values() if p.namespace == namespace and not p.node_name
                and not p.deleting and _names_group(p, name)]
        if pods:
            await self.on_pods(pods)

    async def _admit(self, gang_id: str, arrivals: list[tuple[Pod, object, object]]) -> None:
        now = time.time()

        def add(s: GangState | None) -> GangState | None:
            changed = None
            for _, ident, spec in arrivals:
                new = saga.add_member(s, spec, gang_id=gang_id, min_member=ident.min_member, timeout_s=ident.timeout_s,
                                      priority=ident.priority, now=now, part=ident.part, jobs=ident.jobs,
                                      max_member=ident.max_member)
                if new is not None:
                    s = changed = new
            return changed

        try:
            t = await self.driver.admit(gang_id, add)
        except UnreadableRecord as e:
            for pod, _, _ in arrivals:
                self.notifier.once(pod, "FailedScheduling", f"gang {gang_id}: its record cannot be read "
                                                            f"({e.bad}); see `phalanx doctor`")
            return
        if t is not None:
            for pod, ident, _ in arrivals:
                await self._tell_membership(pod, ident.min_member, t.after)

    async def _tell_membership(self, pod: Pod, declared: int | None, s: GangState) -> None:
        """Tell the pod what its gang is when that is not plain (no silent guesses)."""
        msg = ""
        if s.max_member and len(s.members) > s.max_member:
            msg = (f"gang {s.gang_id}: {len(s.members)} pods present but the elastic gang's maximum is "
                   f"{s.max_member}; the pods past it wait until a member goes")
        elif s.max_member and s.phase == "scheduled" and saga.late_members(s):
            msg = (f"elastic gang {s.gang_id} runs with its minimum: this pod joins it by an attempt of its own when "
                   "GPUs near its members are free; the running members stay where they are")
        elif s.phase == "scheduled" and saga.late_members(s):
            msg = (f"gang {s.gang_id} is already scheduled: this pod joins it by an attempt of its own; the running "
                   "members stay where they are")
        elif not s.min_member_declared and s.gang_id != f"{pod.namespace}/{pod.name}":
            msg = (f"gang {s.gang_id}: no pod says min-member (aliyun.com/min-member); the gang is taken as the "
                   f"pods present once none arrived for {self.settle_s:g}s ({len(s.members)} so far)")
        elif declared is not None and declared != s.min_member:
            msg = f"gang {s.gang_id}: this pod says min-member {declared}, others say {s.min_member}; using {s.min_member}"
        elif len(s.members) > s.min_member and not s.max_member:
            msg = (f"gang {s.gang_id}: {len(s.members)} pods present but min-member is {s.min_member}; every "
                   "present pod is placed, all or nothing")
        # Fewer members than min-member: the pods are told once the gang has waited --settle-s
        # (resync, ``tell_incomplete``); a gang whose pods arrive together writes nothing to them.
        if msg:
            self.notifier.event(pod.ref, "GangMembership", msg)

    async def tell_incomplete(self, s: GangState, now: float) -> None:
        """``PodScheduled=False`` on each member of a gang that waits for more members, unless
        the pod (as the watch shows it) says so already."""
        message = saga.pending_reason(s, now)
        for m in s.members:
            pod = self.watched.get((m.pod.namespace, m.pod.name))
            if pod is None or pod.uid != m.pod.uid or pod.node_name or _condition_message(pod) == message:
                continue
            self.notifier.condition(m.pod, message)

    async def on_pod_deleted(self, pod: Pod, gang_id: str | None = None, *, failed: bool = False) -> None:
        """Forget a deleted member, then give back what it held (its MIG instance, its
        reservation), then roll back a running attempt it was part of. Placement refuses to
        release a live member's reservation, so the member is forgotten first; a crash in
        between leaves a reservation without a pod, which the reconciler releases."""
        if gang_id is None:
            try:
                gang_id = identity(pod).gang_id
            except InvalidMember:
                return
        ref = PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid)
        alloc = self.driver.ledger.allocation(ref)
        held = alloc.assignment if alloc is not None and alloc.gang_id == gang_id else None
        if self.repairs is not None and held is not None:
            # A bound member of a running gang gone: a failure its gang is repaired for (recorded
            # first: the record must still hold it). The repair watch's own evictions are known.
            await self.repairs.failed(gang_id, FailedMember(
                pod=ref, node=held.node, signal="pod_failed" if failed else "pod_deleted",
                detail="the pod failed" if failed else "the pod was deleted", at=time.time()), evict=False)
        t = await self.store.transition(gang_id, lambda s: saga.drop_member(s, ref, held.node if held else ""))
        if t is None or t.before is None:
            return
        log("member gone", gang=gang_id, pod=str(ref))
        await self.driver.execute(effects.member_gone(t.before, ref, held))
        new = t.after
        if not new.members:
            # A tombstone, not a deletion: the attempt counter survives, so a gang recreated
            # under this id (a JobSet restart) never reuses an attempt number. Resync deletes
            # it once it has been empty for --tombstone-s.
            await self.store.transition(gang_id, lambda s: saga.tombstone(s))
            log("gang gone", gang=gang_id, attempt=new.attempt)
            return
        if new.phase in saga.RUNNING and ref not in new.unbound and ref not in {r.pod for r in t.before.running}:
            await self.driver.apply(await self.store.transition(
                gang_id, lambda s: saga.member_deleted(s, new.attempt, ref)))

    async def watch(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the cluster's pods; ready once the current ones are listed and taken in.
        Events of different gangs are handled up to ``parallelism`` at once, one gang's events
        one at a time in watch order (``KeyedWork``). A failed event is logged and left to resync."""
        started = False

        def failed(e: BaseException, pod: Pod) -> None:  # resync covers whatever this missed
            log("pod event failed", level=40, exc_info=True, pod=f"{pod.namespace}/{pod.name}")

        async with anyio.create_task_group() as tg:
            work = KeyedWork(tg, self.parallelism, on_error=failed)
            async for ev in self.cluster.watch_pods():
                if ev is None:
                    self.listed = True
                    if not started:
                        await work.idle()
                        started = True
                        task_status.started()
                    continue
                self._note_binding(ev.type, ev.pod)
                key = _gang_of(ev.pod)
                queued = self._queued.setdefault(key, [])
                queued.append(ev)
                if len(queued) == 1:  # a job for this gang is not waiting yet: its drain takes what came since
                    await work.submit(key, partial(self._drain, key), ev.pod)

    async def _drain(self, key: str) -> None:
        """The gang's pod events that arrived since its last job, in order: consecutive arrivals
        admitted together (one write for a gang whose pods come at once), deletions one by one."""
        events = self._queued.pop(key, [])
        i = 0
        while i < len(events):
            if events[i].type == "DELETED":
                await self.on_pod_deleted(events[i].pod)
                i += 1
                continue
            if _failed_member(events[i].pod):
                # A bound pod that failed (its controller makes a new one): the member is gone.
                await self.on_pod_deleted(events[i].pod, failed=True)
                i += 1
                continue
            j = i
            while j < len(events) and events[j].type != "DELETED" and not _failed_member(events[j].pod):
                j += 1
            await self.on_pods([ev.pod for ev in events[i:j]])
            i = j


    def _note_binding(self, etype: str, pod: Pod) -> None:
        """Keep ``watched`` and the pod uid → bound node map (``bound_seen``, which the driver
        reads) as the watch shows them."""
        if etype == "DELETED":
            self.watched.pop((pod.namespace, pod.name), None)
        else:
            self.watched[(pod.namespace, pod.name)] = pod
        if etype == "DELETED" or pod.deleting:
            self.bound_seen.pop(pod.uid, None)
        elif pod.node_name and pod.uid:
            self.bound_seen[pod.uid] = pod.node_name


def _failed_member(pod: Pod) -> bool:
    """A pod bound to a node whose containers failed for good (phase ``Failed``)."""
    return bool(pod.node_name) and pod.phase == "Failed"


def _condition_message(pod: Pod) -> str | None:
    """The message of the pod's ``PodScheduled`` condition (None without one)."""
    for c in ((pod.raw.get("status") or {}).get("conditions") or []):
        if c.get("type") == "PodScheduled":
            return c.get("message")
    return None


def _refusal_kind(problem: str) -> str:
    if "does not exist" in problem:
        return "missing"
    return "namespace" if "does not admit" in problem else "invalid"


def _gang_of(pod: Pod) -> str:
    """The key that keeps one gang's pod events in order (the pod's own for an invalid one)."""
    try:
        return identity(pod).gang_id
    except InvalidMember:
        return f"{pod.namespace}/{pod.name}"


def _names_group(pod: Pod, name: str) -> bool:
    group = (pod.raw.get("spec") or {}).get("schedulingGroup")
    return isinstance(group, dict) and group.get("podGroupName") == name
