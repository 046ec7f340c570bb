"""Placement's watch-fed cluster cache: what a decision reads, kept in memory.

One ``KvMirror`` per bucket placement reads (``phx-topology``, ``phx-heartbeat``,
``phx-ledger``, ``phx-gangs``, and ``phx-node-state`` through ``nodestate.NodeStates``) feeds two long-lived engine ``Cluster``s: ``cluster`` (every
node with its reservations, as decisions see it) and ``empty`` (the same nodes with nothing
reserved: where a gang would go were the cluster empty). A mirror change only marks its node
dirty; ``refresh()`` rebuilds the dirty nodes (and those whose heartbeat went stale since,
from a heap of deadlines), so the cost of a cycle follows the changes, not the cluster.

Contract:

* **No bucket is read on the request path.** Everything comes from the mirrors; a gang
  record that looks behind a request is caught up from the watch (``catch_up``, one stream
  info request), never re-read.
* **Assume, then commit.** ``assume(writes)`` books a decision's new ledgers into the cache
  and rebuilds their nodes at once (the next decision sees them) and returns a ``Commit``. ``expected(commit)`` gives
  the atomic batch: each node's new ledger expecting the revision the decision read — the
  mirror's, or, when the node's ledger was itself only assumed by an earlier commit still in
  flight, that commit's outcome (it waits; if that one failed, so does this:
  ``KvConflict``). ``settle(commit, seq)`` records the committed revisions; the assumption
  is dropped when the watch echoes them. ``forget(commit)`` drops a failed assumption.
* **Unreadable values leave nodes out.** A node whose ledger entry does not decode is taken
  out of both clusters (its reservations are unknown: deciding on it could book a GPU twice).
  A node whose agent wrote a value that breaks its bucket's rule (a topology report with a
  GPU link missing, a heartbeat from the future, a Kubernetes state beyond a bound) stays in
  the cluster as *invalid*: it takes nothing, every pod's reason counts it as "node report
  invalid" (the rule in the status's detail), and it is back as soon as its agent writes a good
  value. Nothing one node writes reaches a plugin unchecked, so it cannot stop decisions for
  the others.
* **Nominations take GPUs.** A preemptor's nominations (``NodeLedger.nominations``) are in
  the node's view like reservations until they expire, for every decision but the
  preemptor's own (``excluding``), so the GPUs its victims free wait for it.
* **Bounded memory.** Staleness deadlines are kept one per node (a heap entry per key, moved
  forward when it comes due), so a node beating often, or with a time far ahead, costs one
  entry, not one per beat.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import time
from collections.abc import Callable, Iterator

import anyio

from phalanx_bus import Bus, KvMirror, MirrorEntry, Poisoned
from phalanx_engine.decide import Cluster
from phalanx_engine.snapshot import NodeView, reported
from phalanx_placement import assumed
from phalanx_placement.assumed import Assumed, Commit
from phalanx_placement.drapools import DraPools
from phalanx_placement.nodestate import GRACE_S, NodeStates
from phalanx_placement.recorder import JournaledCluster
from phalanx_proto import subjects as S
from phalanx_proto.queues import HISTORY_PREFIX, USAGE_PREFIX, QueueUsage, is_usage_key, usage_key
from phalanx_proto.state import GangState, NodeLedger, victim_of
from phalanx_proto.topology import NodeTopology
from phalanx_rules.queues import held_by_queue


class ClusterCache:
    def __init__(self, bus: Bus, *, stale_s: float, clock: Callable[[], float] = time.time,
                 node_state_policy: str | None = None, node_state_grace_s: float = GRACE_S) -> None:
        """``node_state_policy``: how nodes without a Kubernetes state report are taken
        (``nodestate``'s rule; None: no node has one, the non-GPU filters are off)."""
        self.stale_s = stale_s
        self.clock = clock
        self.node_states = (None if node_state_policy is None else
                            NodeStates(bus, policy=node_state_policy, grace_s=node_state_grace_s, on_change=self._mark))
        """Each node's Kubernetes state (``NodeView.kube``); None: no node has one."""
        self.topology = KvMirror.of_bucket(bus, S.KV_TOPOLOGY, on_put=self._changed, on_delete=self._gone)
        self.beats = KvMirror.of_bucket(bus, S.KV_HEARTBEAT, on_put=self._beat, on_delete=self._gone)
        self.ledger = KvMirror.of_bucket(bus, S.KV_LEDGER, keys="*", on_put=self._ledger_put, on_delete=self._gone)
        self.usage = KvMirror.of_bucket(bus, S.KV_LEDGER, keys=f"{USAGE_PREFIX}*", on_put=self._ledger_put,
                                        on_delete=self._gone)
        self.history = KvMirror.of_bucket(bus, S.KV_LEDGER, keys=f"{HISTORY_PREFIX}*")
        """Each queue's recent usage (``QueueHistory``, the fair share that remembers)."""
        self.queues = KvMirror.of_bucket(bus, S.KV_QUEUES)
        self.gangs = KvMirror.of_bucket(bus, S.KV_GANGS, on_put=self._gang_put, on_delete=self._gang_gone)
        self.preempting: set[str] = set()
        """The gangs whose record says their attempt waits for its victims (``preempting``):
        what placement's nomination pass looks after (``nominations``)."""
        self.pools = DraPools(bus, on_change=self._mark, every_node=lambda: self.views.keys())
        """The DRA pools each node reaches (``NodeView.dra``)."""
        self._dirty: set[str] = set()
        self.cluster = JournaledCluster(nodes={}, total=0)
        """Every node as decisions see it; it notes its changes for the decision log (``recorder``)."""
        self.empty = Cluster(nodes={}, total=0)
        self.views: dict[str, NodeView] = {}
        """Ledger key (the node's token) → the view ``cluster`` holds of it."""
        self._names: dict[str, str] = {}
        self._assumed: dict[str, Assumed] = {}
        self._by_gang: dict[str, set[str]] = {}
        self._gangs_at: dict[str, frozenset[str]] = {}
        self.queue_units: dict[str, int] = {}
        """Units each queue holds on the nodes as the cache believes them (assumed commits
        included): its reservations' ``Allocation.queues``."""
        self._queue_units_at: dict[str, dict[str, int]] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._deadline_of: dict[str, float] = {}
        """Each key's staleness deadline; the heap holds at most one entry per key."""
        self._poisoned_seen: dict[str, frozenset[str]] = {}
        self.generation = 0
        """Counts changes to ``cluster``: a node's view rebuilt unlike before, added or removed
        (a heartbeat that changes nothing does not count). The counterfactual probes' answers
        are kept while it stands still (``phalanx_placement.whatif``)."""
        self._nominated_until: dict[str, float] = {}
        """Node key → the earliest expiry of the nominations its ledger holds: the node is
        rebuilt once it passes (an expired nomination takes nothing)."""

    @property
    def mirrors(self) -> tuple[KvMirror, ...]:
        own = (self.topology, self.beats, self.ledger, self.usage, self.history, self.queues, self.gangs,
               self.pools.mirror)
        return own if self.node_states is None else (*own, self.node_states.mirror)

    def _mirror_of(self, key: str) -> KvMirror:
        """The mirror holding ``key`` of ``phx-ledger``: a queue's usage or a node's ledger."""
        return self.usage if is_usage_key(key) else self.ledger

    async def catch_up(self) -> None:
        """Both mirrors of ``phx-ledger`` reflect everything it held when this was called."""
        await self.ledger.catch_up()
        await self.usage.catch_up()

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow every bucket until cancelled; started once each is listed and the clusters built."""
        async with anyio.create_task_group() as tg:
            for mirror in (self.topology, self.beats, self.ledger, self.usage, self.history, self.queues, self.gangs):
                await tg.start(mirror.run)
            await tg.start(self.pools.run)
            if self.node_states is not None:
                await tg.start(self.node_states.run)
            self.refresh()
            task_status.started()

    # -- reading -----------------------------------------------------------------------------
    def gang(self, gang_id: str) -> GangState | Poisoned | None:
        key = S.gang_key(gang_id)
        entry = self.gangs.get(key)
        return entry.value if entry is not None else self.gangs.poisoned.get(key)

    def _gang_put(self, entry: MirrorEntry, previous: MirrorEntry | None) -> None:
        if entry.value.phase == "preempting":
            self.preempting.add(entry.value.gang_id)
        else:
            self.preempting.discard(entry.value.gang_id)

    def _gang_gone(self, previous: MirrorEntry) -> None:
        self.preempting.discard(previous.value.gang_id)

    def usable(self, key: str) -> bool:
        """The node is in the cluster decisions see, fresh and with a valid report."""
        view = self.views.get(key)
        return view is not None and view.fresh and not view.invalid

    def ledger_of(self, key: str) -> NodeLedger | None:
        """The node's ledger as the cache believes it (assumed commits included)."""
        assumed = self._assumed.get(key)
        if assumed is not None:
            return assumed.ledger  # type: ignore[return-value]
        entry = self.ledger.get(key)
        return entry.value if entry is not None else None

    def usage_of(self, queue: str) -> QueueUsage:
        """The queue's usage as the cache believes it (assumed commits included; empty when none)."""
        key = usage_key(queue)
        assumed = self._assumed.get(key)
        if assumed is not None:
            return assumed.ledger  # type: ignore[return-value]
        entry = self.usage.get(key)
        return entry.value if entry is not None else QueueUsage(queue=queue)

    @property
    def assuming(self) -> bool:
        """A commit is assumed and not yet echoed by the watch."""
        return bool(self._assumed)

    def gang_keys(self, gang_id: str) -> frozenset[str]:
        """Ledger keys holding any reservation of the gang (assumed ones included)."""
        return frozenset(self._by_gang.get(gang_id, ()))

    def victim_holds(self, victim: str) -> bool:
        """A preemption's victim (a gang, or one extra member of an elastic gang,
        ``state.victim_of``) still holds a reservation somewhere."""
        gang_id, pod = victim_of(victim)
        return any(a.gang_id == gang_id and (not pod or a.assignment.pod.name == pod)
                   for k in self.gang_keys(gang_id) for a in (self.ledger_of(k) or NodeLedger(node="")).allocations.values())

    def node_counts(self) -> dict[str, int]:
        """How many nodes the cache holds, fresh, stale and invalid (as of the last ``refresh``)."""
        invalid = sum(1 for v in self.views.values() if v.invalid)
        fresh = sum(1 for v in self.views.values() if v.fresh and not v.invalid)
        return {"fresh": fresh, "stale": len(self.views) - fresh - invalid, "invalid": invalid}

    def invalid_nodes(self) -> dict[str, str]:
        """Node → why its agent's record cannot be believed (as of the last ``refresh``)."""
        return {v.name: v.invalid for v in self.views.values() if v.invalid}

    def refresh(self) -> None:
        """Bring ``cluster``/``empty``/``views`` up to date with the mirrors and the clock."""
        now = self.clock()
        while self._deadlines and self._deadlines[0][0] < now:
            due, key = heapq.heappop(self._deadlines)
            later = self._deadline_of.get(key)
            if later is not None and later > due:  # beaten since: wait for the new deadline
                heapq.heappush(self._deadlines, (later, key))
                continue
            self._deadline_of.pop(key, None)
            self._dirty.add(key)
        for mirror in self._node_mirrors:
            poisoned, seen = frozenset(mirror.poisoned), self._poisoned_seen.get(mirror.bucket, frozenset())
            if poisoned != seen:
                self._dirty |= poisoned ^ seen
                self._poisoned_seen[mirror.bucket] = poisoned
        for key, until in list(self._nominated_until.items()):
            if until <= now:
                self._dirty.add(key)
                ledger = self.ledger_of(key)
                later = [n.expires_at for n in ledger.nominations.values() if n.expires_at > now] if ledger else []
                if later:
                    self._nominated_until[key] = min(later)
                else:
                    del self._nominated_until[key]
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            self._rebuild(key, now)

    @property
    def _node_mirrors(self) -> tuple[KvMirror, ...]:
        """The mirrors whose poisoned keys make a node invalid or leave it out."""
        own = (self.ledger, self.topology, self.beats)
        return own if self.node_states is None else (*own, self.node_states.mirror)

    @contextlib.contextmanager
    def excluding(self, gang_id: str, running: frozenset[str] = frozenset()) -> Iterator[None]:
        """``cluster`` without the gang's own reservations (a new attempt replaces them) and its
        own nominations (the GPUs kept for it while its victims go), but with those of its ``running`` members (allocation keys: bound by an earlier attempt,
        left where they are by an attempt for late members), for the duration of a
        synchronous decision."""
        saved = []
        for key in self.gang_keys(gang_id):
            view, ledger = self.views.get(key), self.ledger_of(key)
            if view is None or ledger is None:
                continue
            saved.append(view)
            others = tuple(a.assignment for k, a in ledger.allocations.items() if a.gang_id != gang_id or k in running)
            self.cluster.upsert(dataclasses.replace(view, allocations=others + nominated(ledger, self.clock(), gang_id)))
        try:
            yield
        finally:
            for view in saved:
                self.cluster.upsert(view)

    # -- assuming and committing --------------------------------------------------------------
    def assume(self, writes: dict[str, NodeLedger | QueueUsage]) -> Commit:
        commit = Commit(writes=dict(writes))
        for key, ledger in writes.items():
            base = self._assumed.get(key)
            if base is not None:
                base.commit.dependents.append(commit)
            entry = self._mirror_of(key).get(key)
            self._assumed[key] = Assumed(ledger, commit, base if base is not None else
                                         (entry.revision if entry is not None else 0))
            self._touch(key)
        now = self.clock()
        for key in writes:  # the next decision, in this same cycle, must see it
            if not is_usage_key(key):
                self._dirty.discard(key)
                self._rebuild(key, now)
        return commit

    async def expected(self, commit: Commit) -> list[tuple[str, bytes, int]]:
        """The commit's atomic batch, in key order: each write expecting the revision its
        decision read. Raises ``KvConflict`` when that revision came from a failed commit."""
        return await assumed.expected(commit, self._assumed)

    def settle(self, commit: Commit, last_seq: int) -> None:
        """The commit's batch is stored; ``last_seq`` is its last write's stream sequence (the
        writes of one batch are stored one after another, in key order)."""
        for key in assumed.settle(commit, last_seq):
            self._normalize(key)

    def forget(self, commit: Commit) -> None:
        """The commit failed: its assumptions go, and so do those of every commit whose
        decision read them (each fails when it tries to commit: ``expected``)."""
        for c in assumed.fail_commit(commit):
            for key in c.writes:
                self._normalize(key)

    # -- mirror callbacks (inline, in revision order) -------------------------------------------
    def _mark(self, key: str) -> None:
        self._dirty.add(key)

    def _changed(self, entry: MirrorEntry, previous: MirrorEntry | None = None) -> None:
        self._dirty.add(entry.key)

    def _gone(self, previous: MirrorEntry) -> None:
        self._normalize(previous.key)

    def _beat(self, entry: MirrorEntry, previous: MirrorEntry | None) -> None:
        """A beat of a node already fresh only moves its deadline forward: its view does not
        change, so it is not rebuilt (at 5,000 nodes beating every 10 s that is 500 rebuilds a
        second saved). A beat that may change the view — the first, one after the node went
        stale, one that moves the deadline back — marks it dirty."""
        deadline = entry.value.at + self.stale_s
        view = self.views.get(entry.key)
        if view is None or not view.fresh or deadline < self._deadline_of.get(entry.key, deadline):
            self._dirty.add(entry.key)
        if entry.key not in self._deadline_of:
            heapq.heappush(self._deadlines, (deadline, entry.key))
        self._deadline_of[entry.key] = deadline

    def _ledger_put(self, entry: MirrorEntry, previous: MirrorEntry | None) -> None:
        self._normalize(entry.key)

    def _normalize(self, key: str) -> None:
        """Drop assumptions that failed or that the watch has echoed; reindex the node."""
        assumed = self._assumed.get(key)
        while assumed is not None:
            if assumed.commit.failed:
                base = assumed.base
                assumed = base if isinstance(base, Assumed) else None
                continue
            revisions = assumed.commit.revisions
            entry = self._mirror_of(key).get(key)
            if revisions is not None and entry is not None and entry.revision >= revisions[key]:
                assumed = None
            break
        if assumed is None:
            self._assumed.pop(key, None)
        else:
            self._assumed[key] = assumed
        self._touch(key)

    def _touch(self, key: str) -> None:
        """The node's believed ledger may have changed: reindex its gangs, rebuild it later."""
        if is_usage_key(key):
            return
        self._dirty.add(key)
        ledger = self.ledger_of(key)
        now = frozenset(a.gang_id for a in ledger.allocations.values()) if ledger is not None else frozenset()
        if ledger is not None and ledger.nominations:
            now |= {n.gang_id for n in ledger.nominations.values()}
            self._nominated_until[key] = min(n.expires_at for n in ledger.nominations.values())
        else:
            self._nominated_until.pop(key, None)
        before = self._gangs_at.get(key, frozenset())
        for gang in before - now:
            keys = self._by_gang.get(gang)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_gang[gang]
        for gang in now - before:
            self._by_gang.setdefault(gang, set()).add(key)
        if now:
            self._gangs_at[key] = now
        else:
            self._gangs_at.pop(key, None)
        units = held_by_queue((ledger,)) if ledger is not None else {}
        for q, n in self._queue_units_at.pop(key, {}).items():
            self.queue_units[q] -= n
        for q, n in units.items():
            self.queue_units[q] = self.queue_units.get(q, 0) + n
        if units:
            self._queue_units_at[key] = units

    def _invalid(self, key: str) -> str:
        """Why a record of the node's agent under ``key`` cannot be believed ("" when none)."""
        mirrors = (self.topology, self.beats) + ((self.node_states.mirror,) if self.node_states is not None else ())
        for mirror in mirrors:
            bad = mirror.poisoned.get(key)
            if bad is not None:
                return f"{mirror.bucket} (revision {bad.revision}): {bad.error}"
        return ""

    def _rebuild(self, key: str, now: float) -> None:
        report = self.topology.get(key)
        old = self._names.get(key)
        invalid = self._invalid(key)
        if (report is None and not invalid) or key in self.ledger.poisoned:
            if old is not None:
                self.cluster.remove(old)
                self.empty.remove(old)
                del self._names[key]
                self.views.pop(key, None)
                self.generation += 1
            return
        name = report.value.node if report is not None else (old or key)
        if old is not None and old != name:
            self.cluster.remove(old)
            self.empty.remove(old)
        if invalid:  # takes nothing, but what its ledger holds is still held (the planner reads it)
            ledger = self.ledger_of(key)
            view = NodeView(name=name, topology=NodeTopology(node=name), enabled=False, fresh=False, invalid=invalid,
                            allocations=reserved(ledger) if ledger else ())
        else:
            view = self._view(key, report.value, now)
        self._names[key] = name
        if self.views.get(key) != view:
            self.generation += 1
        self.views[key] = view
        self.cluster.upsert(view)
        self.empty.upsert(dataclasses.replace(view, allocations=()))

    def _view(self, key: str, rep, now: float) -> NodeView:
        beat = self.beats.get(key)
        ledger = self.ledger_of(key)
        entry = self.ledger.get(key)
        return reported(rep, fresh=beat is not None and now - beat.value.at <= self.stale_s,
                        allocations=reserved(ledger) + nominated(ledger, now) if ledger else (),
                        revision=entry.revision if entry is not None else 0,
                        kube=self.node_states.of(rep.node) if self.node_states is not None else None,
                        dra=self.pools.of(rep.node))


def reserved(ledger: NodeLedger) -> tuple:
    """The assignments of the ledger's reservations."""
    return tuple(a.assignment for a in ledger.allocations.values())


def nominated(ledger: NodeLedger, now: float, but: str = "") -> tuple:
    """The assignments of the ledger's nominations still in force at ``now`` (those of gang
    ``but`` left out): a decision takes their GPUs like reservations, so nothing but the
    preemptor takes what its victims free (``phalanx_proto.state.Nomination``)."""
    return tuple(n.assignment for n in ledger.nominations.values() if n.gang_id != but and n.active(now))
