"""Resync: the informer-resync safety net, and the queue the fairness gate decides on.

Every ``resync_s``: admit the pods the watch may have missed, forget members that are gone,
tell the pods of a gang that has waited ``settle_s`` for more members why they wait, start gangs whose backoff is over (in queue order, through the fairness gate), re-publish the
commands of a gang stalled in a running phase, continue an unfinished rollback, and announce
an attempt that has run ``announce_after_s`` (its deadline and ``GangAdmitted``).

The pods come from the pod watch's own view (``PodIntake.watched``), as an informer's resync
replays its cache: a pod whose event failed is admitted on the next tick without asking the
API server. Every ``full_resync_s`` (and on the first tick) the pods are listed from the API
server instead, and only a listing decides that a member is gone (a pod a listing admitted
may not have reached a lagging watch yet, so the watch's view never says "gone"). One pod's
or one gang's trouble (an odd pod, an unreadable record) is logged and counted and never
holds the others up.
"""

from __future__ import annotations

import time
from collections import Counter

import anyio

from phalanx_gang_coordinator.driver import SagaDriver
from phalanx_gang_coordinator.intake import PodIntake
from phalanx_gang_coordinator.store import GangStore
from phalanx_kube.port import ClusterPort, Pod
from phalanx_proto.state import GangState
from phalanx_proto.vocab import IDLE, OPEN
from phalanx_rules import fairness, saga
from phalanx_telemetry import log, metrics


class Resync:
    def __init__(self, cluster: ClusterPort, store: GangStore, intake: PodIntake, driver: SagaDriver, config) -> None:
        self.cluster = cluster
        self.store = store
        self.intake = intake
        self.driver = driver
        self.config = config
        self.contenders: dict[str, tuple[GangState, ...]] = {}
        """Per queue, the gangs that may head it as of the last resync (``fairness.contenders``):
        the view the fairness gate decides on."""
        self._failed_pods: set[tuple[str, str, str]] = set()
        self._listed_at = float("-inf")
        driver.gate = self.gate

    def gate(self, state: GangState, now: float) -> fairness.Gate:
        """The starvation gate among the gangs of the gang's own queue (across queues, a queue
        below its quota goes first in placement: docs/queues.md)."""
        others = [s for s in self.contenders.get(fairness.queue_of(state), ()) if s.gang_id != state.gang_id]
        return fairness.gate(state, others, now=now, starve_after_s=self.config.starve_after_s, mode=self.config.fairness)

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.config.resync_s)
            try:
                await self.once()
            except Exception:  # noqa: BLE001 - retried on the next tick
                log("resync failed", level=40, exc_info=True)

    async def once(self) -> None:
        # The gangs first, then the pods: a member the gangs name existed before the listing
        # began, so a listing without it means it is gone. A pod the watch admits while the
        # listing runs is in neither and is never taken for gone.
        states, _ = await self.store.all()
        full = not self.intake.listed or time.monotonic() - self._listed_at >= self.config.full_resync_s
        if full:
            self._listed_at = time.monotonic()
            pods = await self.cluster.list_pods()
        else:
            pods = list(self.intake.watched.values())
        live = {(p.namespace, p.name, p.uid) for p in pods}
        # Pods already members of a gang need no re-admission (that is two KV reads a pod a
        # tick); their gang is re-driven below. Only pods the watch may have missed go through.
        members = {(m.pod.namespace, m.pod.name, m.pod.uid) for st in states for m in st.members}
        listed = members if full else set()  # only a listing says a member is gone
        unknown = [p for p in pods if (p.namespace, p.name, p.uid) not in members and not p.node_name]
        for pod in unknown:
            await self._admit(pod)
        if unknown:
            states, _ = await self.store.all()
        self.contenders = fairness.contenders(s for s in states if s.members)
        running = {(s.gang_id, s.attempt) for s in states if s.phase in saga.RUNNING}
        self.driver.announced &= running  # forget the attempts that ended
        metrics.GANGS.replace(({"phase": p}, n) for p, n in Counter(s.phase for s in states).items())
        now = time.time()
        for state in sorted(states, key=fairness.queue_key):
            try:
                await self._gang(state, live, listed, now)
            except Exception:  # noqa: BLE001 - one gang's trouble must not stall the others
                log("resync of gang failed", level=40, exc_info=True, gang=state.gang_id)

    async def _admit(self, pod: Pod) -> None:
        """One pod the watch may have missed; its failure is logged once per pod and isolated."""
        key = (pod.namespace, pod.name, pod.uid)
        try:
            await self.intake.on_pod(pod)
            self._failed_pods.discard(key)
        except Exception:  # noqa: BLE001 - an odd pod must not stop the others
            metrics.RESYNC_POD_FAILURES.inc()
            if key not in self._failed_pods:
                self._failed_pods.add(key)
                log("resync of pod failed", level=40, exc_info=True, pod=f"{pod.namespace}/{pod.name}", uid=pod.uid)

    async def _gang(self, state: GangState, live: set, listed: set, now: float) -> None:
        """Re-drive one gang: drop gone members (those known before the listing, ``listed``, and
        absent from it), start it, re-publish its commands, resume its rollback."""
        gone = [m.pod for m in state.members
                if (key := (m.pod.namespace, m.pod.name, m.pod.uid)) in listed and key not in live]
        for ref in gone:
            await self.intake.on_pod_deleted(Pod(namespace=ref.namespace, name=ref.name, uid=ref.uid), state.gang_id)
        if gone:
            return
        if not state.members:
            if now - state.updated_at > self.config.tombstone_s and await self.store.delete_if(
                    state.gang_id, lambda s: bool(s.members)):
                log("tombstone removed", gang=state.gang_id, attempt=state.attempt)
            return
        if state.phase == "waiting" and len(state.members) < state.min_member and \
                now - state.created_at >= self.config.settle_s:
            await self.intake.tell_incomplete(state, now)
        stalled = now - state.updated_at > self.config.redrive_after_s
        if state.phase in IDLE or saga.late_members(state):
            await self.driver.start(state.gang_id)
        elif state.phase in OPEN and stalled:
            await self.driver.redrive(state)
        elif state.phase in saga.RUNNING and now - state.attempt_started_at >= self.config.announce_after_s:
            await self.driver.announce(state)
