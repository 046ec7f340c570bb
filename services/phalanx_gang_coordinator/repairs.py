"""The repair watch: a running gang's members on failed nodes or GPUs are seen failed, the
repair starts, and the failed members are evicted so their controllers recreate them
(docs/repair.md). The rules are ``phalanx_rules.repair``; this module carries them out.

Called by the service when the nodes change (``ClusterChanges.signal``) and on every resync
(``scan``), by pod intake when a bound member is deleted or fails (``failed``), and by resync for
a repair that waited past its deadline (``overdue``). What it reads: the nodes' Kubernetes state
and topology reports (``ClusterChanges``' mirrors), the ledger (where each member is bound), the
pods as the watch shows them (their repair policy). What it writes: the gang record (compare-and-
set, before anything else), then pod events and deletions (uid precondition, Phalanx pods only).

The repair attempt itself is an attempt for late members (``saga.start_attempt``), which
placement confines to the repair's domain (``phalanx_placement.confine``); its end is a
transition the driver sees (``GangRepaired``, metrics).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import anyio

from phalanx_gang_coordinator.changes import ClusterChanges
from phalanx_gang_coordinator.driver import SagaDriver
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.store import GangStore
from phalanx_kube.port import ClusterPort, NotOurs, Pod
from phalanx_proto import subjects as S
from phalanx_proto.events import NodeTopologyReported, PodRef
from phalanx_proto.kubeapi import REPAIR_POLICY_KEY
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.state import FailedMember, GangState
from phalanx_proto.topology import NetworkTiers
from phalanx_rules import repair as rules
from phalanx_telemetry import log, metrics, warn


class RepairWatch:
    def __init__(self, store: GangStore, driver: SagaDriver, cluster: ClusterPort, notifier: Notifier,
                 changes: ClusterChanges, *, pods: dict[tuple[str, str], Pod] | None = None,
                 not_ready_grace_s: float = rules.NOT_READY_GRACE_S, no_schedule: bool = False,
                 queue_default=lambda gang: "") -> None:
        """``pods``: the pod watch's view by (namespace, name) (the policy label); ``no_schedule``:
        an untolerated ``NoSchedule`` taint or a cordon fails a member too; ``queue_default``:
        gang state → its queue's default repair policy ("" when none)."""
        self.store = store
        self.driver = driver
        self.cluster = cluster
        self.notifier = notifier
        self.changes = changes
        self.pods = pods if pods is not None else {}
        self.grace_s = not_ready_grace_s
        self.no_schedule = no_schedule
        self.queue_default = queue_default
        self.not_ready_since: dict[str, float] = {}
        """Node → when this process first saw it not Ready (a restart starts the grace again)."""
        self.seen: set[str] = set()
        """Nodes whose Kubernetes state this process has seen: one that disappears was deleted."""

    # -- what the nodes say ----------------------------------------------------------------------
    def _state(self, node: str) -> NodeKubeState | None:
        entry = self.changes.node_states.get(S.token(node))
        return entry.value if entry is not None else None

    def _tiers(self, nodes: Iterable[str]) -> dict[str, NetworkTiers]:
        out = {}
        for n in nodes:
            entry = self.changes.topology.get(S.token(n))
            report = entry.value if entry is not None else None
            if isinstance(report, NodeTopologyReported):
                out[n] = report.tiers
        return out

    def _unhealthy(self, node: str) -> tuple[int, ...]:
        entry = self.changes.topology.get(S.token(node))
        report = entry.value if entry is not None else None
        return report.unhealthy if isinstance(report, NodeTopologyReported) else ()

    def _note_nodes(self, now: float) -> None:
        for entry in self.changes.node_states:
            state = entry.value
            if not isinstance(state, NodeKubeState):
                continue
            name = entry.key  # the node's token, as ``_state`` looks it up
            self.seen.add(name)
            if state.ready == "True":
                self.not_ready_since.pop(name, None)
            else:
                self.not_ready_since.setdefault(name, now)

    async def run(self, interval_s: float) -> None:
        """Scan every ``interval_s`` until cancelled, and carry on overdue repairs and restarts;
        one pass's trouble is logged and the next tries again."""
        while True:
            await anyio.sleep(interval_s)
            try:
                states, _ = await self.store.all()
                await self.scan(states)
                now = time.time()
                for s in states:
                    if s.repair is None:
                        continue
                    if s.repair.restart:
                        await self.restart(s)
                    elif now >= s.repair.deadline_at:
                        await self.overdue(s, now)
            except Exception:  # noqa: BLE001 - the next pass tries again
                log("repair scan failed", level=40, exc_info=True)

    # -- the scan ----------------------------------------------------------------------------------
    async def scan(self, states: list[GangState] | None = None) -> int:
        """Look at every bound member of every running gang; each on a failed node or GPU starts
        (or joins) its gang's repair and is evicted. Returns how many failures were recorded."""
        now = time.time()
        self._note_nodes(now)
        if states is None:
            states, _ = await self.store.all()
        found = 0
        for s in states:
            if s.phase != "scheduled" and s.repair is None:
                continue
            for pod in sorted(rules.held_members(s), key=str):
                alloc = self.driver.ledger.allocation(pod)
                if alloc is None or alloc.gang_id != s.gang_id:
                    continue
                node = alloc.assignment.node
                state = self._state(node)
                deleted = state is None and S.token(node) in self.seen
                since = self.not_ready_since.get(S.token(node))
                spec = next((m for m in s.members if m.pod == pod), None)
                why = rules.failure_of(state, deleted=deleted, not_ready_for=now - since if since else 0.0,
                                       tolerations=spec.tolerations if spec else (), gpus=alloc.assignment.gpus,
                                       unhealthy=self._unhealthy(node), grace_s=self.grace_s,
                                       no_schedule=self.no_schedule)
                if why is None:
                    continue
                signal, detail = why
                if await self.failed(s.gang_id, FailedMember(pod=pod, node=node, signal=signal,  # type: ignore[arg-type]
                                                             detail=detail, at=now), evict=True):
                    found += 1
        return found

    # -- a failure ----------------------------------------------------------------------------------
    async def failed(self, gang_id: str, failed: FailedMember, *, evict: bool) -> bool:
        """Record ``failed`` in its gang's repair (the first starts it: its domains are those
        holding every node the gang runs on now, its policy the pods' or their queue's), tell the
        members, then — ``evict`` — delete the failed pod so its controller recreates it. True
        when the failure was new."""
        now = time.time()
        current = await self.store.get(gang_id)
        if current is None:
            return False
        nodes = {failed.node}
        for pod in rules.held_members(current):
            alloc = self.driver.ledger.allocation(pod)
            if alloc is not None and alloc.gang_id == gang_id:
                nodes.add(alloc.assignment.node)
        domains = rules.gang_domains(nodes, self._tiers(nodes))
        policy, problem = rules.policy_of(self._policy_values(current), self.queue_default(current))
        timeout_s = self.driver.timeout_of(current)
        t = await self.store.transition(gang_id, lambda s: rules.member_failed(
            s, failed, domains=domains, policy=policy, now=now, timeout_s=timeout_s))
        if t is None:
            if evict:
                await self._evict(failed.pod, "")  # recorded before (a crash before the delete)
            return False
        metrics.GANG_MEMBER_FAILURES.inc(signal=failed.signal)
        r = t.after.repair
        assert r is not None
        log("member failed", gang=gang_id, pod=str(failed.pod), node=failed.node, signal=failed.signal,
            repair_domain=str(r.domain()), policy=r.policy)
        message = f"gang {gang_id}: {rules.describe(r, now)}" + (f" ({problem})" if problem else "")
        self.notifier.tell(tuple(m.pod for m in t.after.members), "GangRepairing", message, condition=False)
        if evict:
            await self._evict(failed.pod, f"gang {gang_id}: member failed on {failed.node} ({failed.detail}); "
                                          "deleting it so its controller recreates it, to be placed near the others")
        return True

    def _policy_values(self, s: GangState) -> list[str]:
        out = []
        for m in s.members:
            pod = self.pods.get((m.pod.namespace, m.pod.name))
            if pod is not None:
                out.append(pod.labels.get(REPAIR_POLICY_KEY) or pod.annotations.get(REPAIR_POLICY_KEY) or "")
        return out

    async def _evict(self, ref: PodRef, why: str) -> None:
        if why:
            self.notifier.event(ref, "GangRepairing", why)
        try:
            await self.cluster.delete_pod(ref)
        except NotOurs as e:
            warn("refused to delete a pod of another scheduler", pod=str(ref), error=str(e))

    # -- the deadline and a whole restart ------------------------------------------------------------
    async def overdue(self, s: GangState, now: float) -> None:
        """A repair that waited past its deadline: its policy restarts the gang (or it waits on)."""
        t = await self.store.transition(s.gang_id, lambda cur: rules.overdue(cur, now))
        if t is not None:
            self.driver.note_repair(t.before, t.after, now)
            await self.restart(t.after)

    async def restart(self, s: GangState) -> None:
        """Delete every member of a gang whose repair gave its domain up (``GangRestarted``), so
        the whole gang is recreated and placed again. Idempotent: resync calls it again for a
        restart still under way."""
        pods = rules.restart_pods(s)
        if not pods:
            return
        r = s.repair
        assert r is not None
        lost = ", ".join(f"{f.node} ({f.detail or f.signal})" for f in r.failed[:5])
        d = r.domain()
        where = f"{d.tier} {d.domain}" if d is not None else "its domain"
        message = (f"gang {s.gang_id} restarted whole: no room in {where} for the replacement(s) of the "
                   f"member(s) lost on {lost} (policy {r.policy}); every member is deleted so the gang is placed "
                   "again as one, back on its nodes first")
        for pod in pods:
            self.notifier.event(pod, "GangRestarted", message)
            await self._evict(pod, "")
