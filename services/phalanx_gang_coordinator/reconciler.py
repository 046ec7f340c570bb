"""The reconciler: continuously proves the ledger matches the cluster, and repairs where not.

One replica at a time (the holder of the ``phx-leases`` lease ``gang-coordinator.reconciler``)
reads the ledger, the gang records, MIG ownership and the cluster's pods every
``reconcile_s``, finds every disagreement (``audit.audit``, the rules are there) and repairs
it through the owners' own channels — only placement writes the ledger, so a reservation is
released with a ``ReleaseRequested`` and recorded with an ``AdoptRequested``; a member whose
pod is gone is forgotten by pod intake; a pod on GPUs booked by another is reported on the
pod (Warning event) and never booked twice. A destructive repair (release, forget, evict) is made
only for a finding seen in two passes running, so a reading taken in the middle of an
ordinary step does not undo it.

Findings are metrics with zero as the healthy value (``phalanx_reconciler_findings{finding}``),
and the pass's report is stored in ``phx-leases`` (``gang-coordinator.reconciler-report``),
where ``phalanx doctor`` reads it.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import Counter

import anyio

from phalanx_bus import Bus, Record, read_all, read_one
from phalanx_gang_coordinator import audit
from phalanx_gang_coordinator.gangs import InvalidMember, identity
from phalanx_gang_coordinator.intake import PodIntake
from phalanx_gang_coordinator.lease import LeaseHolder
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.queuebook import QueueBook
from phalanx_gang_coordinator.store import GangStore
from phalanx_kube.port import ClusterPort, Pod
from phalanx_proto import subjects as S
from phalanx_proto.events import AdoptRequested, ReleaseRequested, encoder
from phalanx_proto.state import RECONCILER_LEASE_KEY, RECONCILER_REPORT_KEY, ReconcilerReport, alloc_key
from phalanx_telemetry import log, metrics, warn

DETAILS_KEPT = 20


def owner_id() -> str:
    """This replica's name in the lease: host, process and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Reconciler:
    def __init__(self, bus: Bus, cluster: ClusterPort, store: GangStore, intake: PodIntake, notifier: Notifier, *,
                 reconcile_s: float, owner: str | None = None, queues: QueueBook | None = None) -> None:
        self.bus = bus
        self.cluster = cluster
        self.store = store
        self.intake = intake
        self.notifier = notifier
        self.reconcile_s = reconcile_s
        self.queues = queues
        self.owner = owner or owner_id()
        self.lease: LeaseHolder | None = None
        self._suspects: set[tuple] = set()
        """Destructive repairs found in the previous pass: made only if found again."""

    async def run(self) -> None:
        """Every ``reconcile_s``: hold the lease, then run one pass; give the lease up on exit."""
        self.lease = LeaseHolder(await self.bus.kv(S.KV_LEASES), RECONCILER_LEASE_KEY, self.owner,
                                 ttl_s=max(10.0, 3 * self.reconcile_s))
        try:
            while True:
                try:
                    leader = await self.lease.hold()
                    metrics.RECONCILER_LEADER.set(1 if leader else 0)
                    if leader:
                        await self.once()
                except Exception:  # noqa: BLE001 - retried next pass
                    log("reconcile pass failed", level=40, exc_info=True)
                await anyio.sleep(self.reconcile_s)
        finally:
            metrics.RECONCILER_LEADER.set(0)
            with anyio.move_on_after(2, shield=True):
                try:
                    await self.lease.release()
                except Exception:  # noqa: BLE001 - the lease expires anyway
                    pass

    async def read(self) -> audit.Reading:
        """Ledger first, then gang records and MIG records, then pods (see ``audit``); then, again,
        the ledger of each node where a pod is bound that the first read did not hold — it may
        have been bound while the reading was taken."""
        ledger_kv = await self.bus.kv(S.KV_LEDGER)
        ledgers, bad_ledgers = await read_all(ledger_kv, pattern="*")
        usage, _ = await read_all(ledger_kv, pattern="queue.*")
        gangs, bad_gangs = await self.store.all(current=True)
        mig, bad_mig = await read_all(await self.bus.kv(S.KV_MIG))
        pods = await self.cluster.list_pods()
        by_node = {r.value.node: r.value for r in ledgers}
        recent = {}
        for node in sorted({p.node_name for p in pods if p.node_name and not p.terminal and (
                p.node_name not in by_node or alloc_key(p.ref) not in by_node[p.node_name].allocations)}):
            again = await read_one(ledger_kv, S.token(node))
            if isinstance(again, Record):
                recent[node] = again.value
        return audit.Reading(
            ledgers=by_node, recent=recent, gangs={g.gang_id: g for g in gangs}, pods=pods,
            gang_of={p.uid: _gang_of(p) for p in pods if p.node_name},
            mig=[rec for r in mig for rec in r.value.instances.values()],
            unreadable=tuple(str(b) for b in (*bad_ledgers, *bad_gangs, *bad_mig)),
            unreadable_nodes=frozenset(b.key for b in bad_ledgers), unreadable_gangs=frozenset(b.key for b in bad_gangs),
            usage={r.value.queue: r.value for r in usage}, queues=self.queues.tree if self.queues else None)

    async def once(self) -> list[audit.Finding]:
        """One pass: read, audit, repair, report (and each Queue's status)."""
        reading = await self.read()
        findings = audit.audit(reading)
        suspects, repairs = set(), Counter()
        for f in findings:
            action = await self._repair(f, suspects)
            if action:
                repairs[action] += 1
                metrics.RECONCILER_REPAIRS.inc(action=action)
        self._suspects = suspects
        counts = Counter(f.kind for f in findings)
        metrics.RECONCILER_FINDINGS.replace(({"finding": k}, counts.get(k, 0)) for k in metrics.RECONCILER_FINDING_KINDS)
        metrics.RECONCILER_PASSES.inc()
        report = ReconcilerReport(owner=self.owner, at=time.time(), findings={k: counts.get(k, 0) for k in
                                                                              metrics.RECONCILER_FINDING_KINDS},
                                  details=tuple(f"{f.kind}: {f.detail}" for f in findings[:DETAILS_KEPT]),
                                  repairs=dict(repairs))
        await (await self.bus.kv(S.KV_LEASES)).put(RECONCILER_REPORT_KEY, encoder.encode(report))
        if self.queues is not None:
            await self.queues.write_status(list(reading.gangs.values()))
        if findings:
            log("reconciler findings", findings=",".join(f"{k}={n}" for k, n in sorted(counts.items())),
                repairs=",".join(f"{k}={n}" for k, n in sorted(repairs.items())))
        return findings

    async def _repair(self, f: audit.Finding, suspects: set) -> str:
        """Carry out a finding's repair; the action taken, or "" (none, or not yet)."""
        match f.repair:
            case audit.Release(gang_id=gang, attempt=attempt, pod=pod, node=node):
                key = ("release", gang, attempt, pod, node)
                suspects.add(key)
                if key not in self._suspects:
                    return ""
                warn("reconciler releases a reservation", gang=gang, attempt=attempt, pod=str(pod), node=node,
                     why=f.detail)
                ev = ReleaseRequested(gang_id=gang, attempt=attempt, reason=f"reconciler: {f.kind}", pods=(pod,))
                await self.bus.publish(S.placement_subject(gang), ev, msg_id=f"{ev.key()}:reconcile:{time.time():.0f}")
                return "release"
            case audit.Forget(gang_id=gang, pod=pod):
                key = ("forget", gang, pod)
                suspects.add(key)
                if key not in self._suspects:
                    return ""
                await self.intake.on_pod_deleted(Pod(namespace=pod.namespace, name=pod.name, uid=pod.uid), gang)
                return "forget"
            case audit.Adopt(gang_id=gang, attempt=attempt, assignment=a):
                warn("reconciler asks to record a reservation for a bound pod", gang=gang, pod=str(a.pod), node=a.node,
                     gpus=",".join(map(str, a.gpus)))
                ev = AdoptRequested(gang_id=gang, attempt=attempt, assignment=a, reason=f.detail)
                await self.bus.publish(S.placement_subject(gang), ev, msg_id=f"{ev.key()}:reconcile:{time.time():.0f}")
                return "adopt"
            case audit.Evict(pod=pod, message=message):
                key = ("evict", pod)
                suspects.add(key)
                if key not in self._suspects:
                    return ""
                warn("reconciler rolls back a pod that shares a GPU", pod=str(pod), why=message)
                self.notifier.event(pod, "PhalanxDoubleBooked", message)
                await self.cluster.delete_pod(pod)
                return "evict"
            case audit.Report(pod=pod, message=message):
                warn("reconciler found a pod it cannot repair", pod=str(pod), why=message)
                self.notifier.event(pod, "PhalanxUnreserved", message)
                return "report"
        return ""


def _gang_of(pod: Pod) -> str:
    try:
        return identity(pod).gang_id
    except InvalidMember:
        return f"{pod.namespace}/{pod.name}"
