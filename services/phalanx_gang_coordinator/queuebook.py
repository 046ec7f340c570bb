"""The queue book: the cluster's Queue objects and namespaces as gang-coordinator knows them,
brought onto the bus, and the queue each pod is in (docs/queues.md).

* **Sync.** Every ``sync_s`` it lists the Queues, reads each Queue
  (``phalanx_kubeobjects.queuespec``: the CRD's rules), checks the tree (a parent that exists, no
  cycle, children's quotas within the parent's) and writes each queue's ``QueueSpec`` — its
  problem included — to KV ``phx-queues``, where placement reads it. A Queue that is gone
  leaves the bucket.
* **Which queue.** A pod names its queue with the label ``scheduling.phalanx.io/queue``; else
  its namespace's label of that name does; else it is in ``default`` (quota 0, no limit: it
  only borrows). The queue must exist, be usable, and select the pod's namespace
  (``spec.namespaceSelector``); otherwise the pod is told why and not admitted. The namespaces'
  labels come from a watch; a namespace the watch has not shown yet is read from the API
  server before its pod is given a queue, and a pod whose namespace cannot be read waits with
  that reason — a pod is never put in a queue by a label set Phalanx has not read. The queue
  is decided once, when the pod is admitted: a namespace whose labels change sends its new
  pods to the new queue, and the gangs already admitted keep theirs (docs/queues.md).
* **Status.** ``write_status`` (the reconciler's lease holder calls it every pass) sets each
  Queue's ``status``: allocated and borrowed GPUs (the reservations that name the queue in
  ``phx-ledger``, mirrored here), pending gangs and GPUs (from the gang records), its fair
  share (``phalanx_rules.queues.fair_shares`` over the nodes' GPUs, weighted by the queues'
  recent usage placement keeps in ``phx-ledger``), that recent usage in GPU-hours, and a
  ``Valid`` condition naming the problem.
"""

from __future__ import annotations

import time

import anyio

from phalanx_bus import Bus, KvMirror
from phalanx_gang_coordinator.changes import Signal
from phalanx_kube.port import ClusterPort, Pod
from phalanx_kubeobjects.queuespec import QueueObjectError, queue_from_object
from phalanx_proto import subjects as S
from phalanx_proto.events import encoder
from phalanx_proto.queues import (
    DEFAULT_QUEUE,
    GPU_UNITS,
    HISTORY_PREFIX,
    QueueSpec,
    queue_key,
)
from phalanx_proto.state import GangState
from phalanx_rules import queueorder, usage
from phalanx_rules.queues import QueueTree, held_by_queue, queue_report, tree_problems
from phalanx_telemetry import log, metrics, warn


class QueueBook:
    def __init__(self, bus: Bus, cluster: ClusterPort, topology: KvMirror, *, sync_s: float = 2.0,
                 changed: Signal | None = None) -> None:
        self.bus = bus
        self.cluster = cluster
        self.sync_s = sync_s
        self.changed = changed or Signal()
        """Fired when a sync wrote a queue that changed (not by the first): the gangs waiting at
        their queue are tried again."""
        self._synced = False
        self.tree = QueueTree.of(())
        self.namespaces: dict[str, dict[str, str]] = {}
        self.units: dict[str, int] = {}
        """Units each queue holds (its subtree's included), from the ledger mirror."""
        self._held_at: dict[str, dict[str, int]] = {}
        self.ledger: KvMirror = KvMirror.of_bucket(bus, S.KV_LEDGER, keys="*", on_put=self._ledger_put,
                                                   on_delete=self._ledger_gone)
        self.history: KvMirror = KvMirror.of_bucket(bus, S.KV_LEDGER, keys=f"{HISTORY_PREFIX}*")
        """Each queue's recent usage (placement writes it: docs/queues.md, "Fair share that remembers")."""
        self.topology = topology
        """Each node's topology report (``changes.ClusterChanges``' mirror; run by it)."""
        self._written: dict[str, bytes] = {}
        self.declared: set[str] = set()
        self._told: set[str] = set()

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the queues until cancelled; started once they were read once."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.ledger.run)
            await tg.start(self.history.run)
            await tg.start(self._follow_namespaces)
            await self._sync_logged()
            task_status.started()
            while True:
                await anyio.sleep(self.sync_s)
                await self._sync_logged()

    async def _follow_namespaces(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Keep ``namespaces`` as the watch shows them; started once they were listed."""
        started = False
        async for labels in self.cluster.watch_namespaces():
            self.namespaces = labels
            if not started:
                started = True
                task_status.started()

    async def _sync_logged(self) -> None:
        try:
            await self.sync()
        except Exception as e:  # noqa: BLE001 - the next sync retries; the last tree stays
            warn("queue sync failed", error=repr(e)[:300])

    async def sync(self) -> None:
        """Read the Queues; write what changed to ``phx-queues``."""
        specs: list[QueueSpec] = []
        for obj in await self.cluster.list_queues():
            try:
                specs.append(queue_from_object(obj))
            except QueueObjectError as e:
                name = str((obj.get("metadata") or {}).get("name"))[:64]
                if name not in self._told:
                    self._told.add(name)
                    warn("queue object ignored", queue=name, error=str(e))
        problems = tree_problems(specs)
        specs = [s if s.problem or s.name not in problems else _with_problem(s, problems[s.name]) for s in specs]
        self.tree = QueueTree.of(specs)
        self.declared = {s.name for s in specs}
        kv = await self.bus.kv(S.KV_QUEUES)
        wanted = {queue_key(s.name): encoder.encode(s) for s in specs}
        changed = False
        for key, raw in wanted.items():
            if self._written.get(key) != raw:
                await kv.put(key, raw)
                self._written[key] = raw
                changed = True
                log("queue written", queue=key, spec=raw.decode()[:300])
        for key in set(await kv.keys()) - set(wanted):
            await kv.delete(key)
            self._written.pop(key, None)
            changed = True
        if changed and self._synced:
            self.changed.fire()
        self._synced = True

    def repair_policy(self, s: GangState) -> str:
        """The repair policy ``s``'s queue (or the nearest ancestor that names one) gives its
        gangs ("" when none does)."""
        name = next((m.queue for m in s.members if m.queue), "") or DEFAULT_QUEUE
        for queue in self.tree.chain(name):
            spec = self.tree.get(queue)
            if spec is not None and spec.repair_policy:
                return spec.repair_policy
        return ""

    async def resolve(self, pod: Pod) -> tuple[str, str]:
        """(the pod's queue, why it may not be in it — "" when it may). A namespace the watch has
        not shown yet is read first; one that cannot be read leaves the pod waiting."""
        ns_labels = self.namespaces.get(pod.namespace)
        if ns_labels is None:
            try:
                ns_labels = await self.cluster.get_namespace(pod.namespace)
            except Exception as e:  # noqa: BLE001 - the pod waits; resync tries it again
                return "", f"namespace {pod.namespace} could not be read to find the pod's queue ({e!r:.200}); waiting"
            if ns_labels is None:
                return "", f"namespace {pod.namespace} is not known to the API server yet; waiting to read its labels"
            self.namespaces = {**self.namespaces, pod.namespace: ns_labels}
        return queueorder.resolve(self.tree, pod.namespace, pod.labels, ns_labels)

    # -- what each queue holds ---------------------------------------------------------------------
    def _ledger_put(self, entry, previous) -> None:
        self._ledger_gone(entry)
        units = held_by_queue((entry.value,))
        for q, n in units.items():
            self.units[q] = self.units.get(q, 0) + n
        if units:
            self._held_at[entry.key] = units

    def _ledger_gone(self, previous) -> None:
        for q, n in self._held_at.pop(previous.key, {}).items():
            self.units[q] -= n

    def below_quota(self, queue: str) -> bool:
        return queueorder.below_quota(self.tree, self.units, queue)

    def capacity(self) -> int:
        """The enabled nodes' GPUs, in queue units."""
        return sum(len(e.value.topology.gpus) for e in self.topology if e.value.enabled) * GPU_UNITS

    def ranks(self, states: list[GangState], now: float) -> dict[str, float]:
        """Each queue's distance from its fair share, as placement orders a cycle
        (``queueorder.shares_and_ranks`` with the queues' recent usage): the order a release
        wakes the gangs of different queues in."""
        waiting = queueorder.waiting_units(states, lambda s: False)
        recent = usage.recent_gpus((e.value for e in self.history), now)
        return queueorder.shares_and_ranks(self.tree, self.units, waiting, self.capacity(), recent)[1]

    def report(self, states: list[GangState]) -> dict[str, dict]:
        """Each queue's status (``phalanx_rules.queues.queue_report``), and its metrics."""
        out = queue_report(self.tree, self.units, states, self.capacity(), (e.value for e in self.history), time.time())
        for q, r in out.items():
            metrics.QUEUE_ALLOCATED.set(r["allocated"], queue=q)
            metrics.QUEUE_QUOTA.set(r["quota"], queue=q)
            metrics.QUEUE_BORROWED.set(r["borrowed"], queue=q)
            metrics.QUEUE_PENDING_GPUS.set(r["pendingGPUs"], queue=q)
            metrics.QUEUE_FAIR_SHARE.set(r["fairShare"], queue=q)
        return out

    async def write_status(self, states: list[GangState]) -> None:
        """Set each declared Queue's status (the implicit ``default`` has no object)."""
        declared = self.declared
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for q, r in self.report(states).items():
            if q not in declared:
                continue
            valid = {"type": "Valid", "status": "False" if r["problem"] else "True",
                     "reason": "Invalid" if r["problem"] else "Valid", "message": r["problem"] or "the queue is usable",
                     "lastTransitionTime": now}
            status = {k: r[k] for k in ("allocated", "borrowed", "pendingGangs", "pendingGPUs", "fairShare",
                                        "recentGPUHours")}
            try:
                await self.cluster.update_queue_status(q, {**status, "conditions": [valid]})
            except Exception as e:  # noqa: BLE001 - status is advisory; the next pass writes it again
                warn("queue status not written", queue=q, error=repr(e)[:200])


def _with_problem(spec: QueueSpec, problem: str) -> QueueSpec:
    import msgspec

    return msgspec.structs.replace(spec, problem=problem)
