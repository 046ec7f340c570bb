"""The virtual-time run: gangs arrive, try, back off, start and end as the services would
handle them, on one engine ``Cluster`` (docs/whatif.md, "The model").

Overview. Events are (time, kind, order, gang) in time order (``agenda``); at each time the run ends the gangs
due to end (their reservations released; up to ``WAKE`` gangs backing off are woken, queues
below quota first — gang-coordinator's ``wake``), admits the gangs arriving, takes the gangs
whose retry is due, and runs one scheduling cycle over every gang due now:

1. gang-coordinator's fairness gate (``fairness.gate``) holds a gang back or names the nodes
   it must avoid; a held gang asks again after ``resync_s``;
2. placement's cycle order (``queueorder.cycle_key``: queue furthest below its fair share,
   priority, arrival), then per gang: its queue's limit (``queueorder.refusal``), the borrow
   gate (``queueorder.borrowing``/``owed``), the engine's decision (``decide``);
3. a gang that fits starts now (placing, binding and start-up take no time) and ends after its
   duration; one that does not backs off (``fairness.backoff_delay``), knowing, as placement
   tells it, whether it would fit the empty cluster and where.

A retry that nothing could have changed for is refused without deciding again: the same nodes
to avoid and no reservation released since its last refusal (the engine refuses a fuller
cluster what it refused an emptier one), or, for a gang of one — remembered by its request's
shape, so it holds for another pod asking the same — no node released since that passes the
member's filters (exact: a single member fits where some node passes them; a node without the
CPU, memory or pod slot is refused without running them, as the engine's own search does);
``SimConfig.exact`` decides every retry anyway.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cache

from phalanx_engine.candidates import checks_resources
from phalanx_engine.decide import DEFAULT_PROFILE, Cluster, decide
from phalanx_engine.framework import Profile
from phalanx_engine.kube_plugins import resources_fit
from phalanx_engine.packing import stranded_milli
from phalanx_engine.preempt import NoPlan, Plan
from phalanx_engine.snapshot import Decision, NodeView, Snapshot
from phalanx_engine.status import Status
from phalanx_engine.topology import domain_of
from phalanx_engine.whatif import Running, tier_of
from phalanx_proto.events import Assignment, PlacementFailed, PodRef, WaitsFor
from phalanx_proto.queues import GPU_UNITS, units_of_assignment
from phalanx_proto.state import GangState, attempt_members
from phalanx_proto.vocab import IDLE
from phalanx_rules import fairness, queueorder, reserve, saga
from phalanx_rules.queues import QueueTree
from phalanx_sim import preemption
from phalanx_sim.agenda import ARRIVE, END, RETRY, Agenda
from phalanx_sim.books import SimQueues
from phalanx_sim.derived import Derived
from phalanx_sim.model import Outcome, Sample, SimConfig, SimGang

DEFAULTS = SimConfig()
NO_FIT = "does not fit"
"""A refusal's reason during the run (the engine's own, with every node's status, is computed
for the gangs still pending at the end: ``report.pending``)."""
RELEASES_CHECKED = 64
"""A retry of a gang of one checks at most this many releases' nodes instead of deciding again."""


class Simulation:
    """One run. ``run()`` once; then ``outcomes``, ``samples`` and ``cluster`` (as it ended)."""

    def __init__(self, nodes: Sequence[NodeView], gangs: Sequence[SimGang], tree: QueueTree,
                 config: SimConfig = DEFAULTS, profile: Profile = DEFAULT_PROFILE,
                 progress: Callable[[Simulation, float], None] | None = None, *,
                 held: Mapping[str, int] | None = None, live: Mapping[PodRef, Running] | None = None) -> None:
        """``nodes`` may carry reservations (``phalanx sim --from-live``): gangs outside the run
        that hold them to its end; ``held``: the units they charge each queue; ``live``: who
        they are (named in what-if answers)."""
        self.views = {v.name: v for v in nodes}
        self.cluster = Cluster.from_snapshot(Snapshot(nodes=tuple(nodes)))
        self.empty = Cluster.from_snapshot(Snapshot(nodes=tuple(replace(v, allocations=()) for v in nodes)))
        self.live = dict(live or {})
        self.capacity = sum(len(v.topology.gpus) for v in nodes if v.enabled) * GPU_UNITS
        self.tree, self.config, self.profile, self.progress = tree, config, profile, progress
        self.outcomes = {g.gang_id: Outcome(g) for g in gangs}
        self.records: dict[str, GangState] = {}
        self._failed: dict[str, GangState] = {}
        """The gangs backing off after a failed placement (those a release may wake), as recorded."""
        self.pending: dict[str, dict[str, GangState]] = {}
        """Per queue, the gangs admitted and not started (gang-coordinator's view of its queue)."""
        self.held: dict[str, int] = dict(held or {})
        self.waiting_units: dict[str, int] = {}
        self.queues = SimQueues(tree, self.held, self.waiting_units, self.capacity, config.usage_half_life_s)
        """The books above as the rulebook's arguments (``books``), and each queue's recent usage."""
        self.queues.held_changed(sorted(q for q, n in self.held.items() if n), 0.0)
        self._later: dict[str, tuple[float, str]] = {}
        """A gang whose preemption waits for its victims' minimum runtime: when, and why."""
        self.running: dict[str, tuple[Assignment, ...]] = {}
        self.owner: dict[PodRef, str] = {}
        self.samples: list[Sample] = []
        self.now = 0.0
        self.epoch = 0
        self.decisions = 0
        self.preemptions = 0
        self.running_priorities: dict[str, Counter[int]] = {}
        """Per queue, the priorities of its running gangs (how many of each)."""
        """Plans carried out (each evicts one or more gangs)."""
        self._ends: dict[str, int] = {}
        """A running gang's end event (its sequence number): an end left from a run cut short by
        preemption is ignored."""
        self._agenda = Agenda()
        self._arrival: dict[str, int] = {}
        self._refused_at: dict[str | bytes, tuple[int, tuple[str, ...]]] = {}
        """Per gang (a gang of one: per request shape), the release count and the nodes it
        avoided at its last refusal."""
        self._released: list[frozenset[str]] = []
        """The nodes each release freed, in order (``epoch`` counts them)."""
        self._empty_memo: dict[tuple[bytes, ...], tuple[bool, tuple[str, ...], str]] = {}
        self._allocations: dict[str, dict[PodRef, Assignment]] = {}
        """Per node booked since the start, its view's allocations by pod, in order."""
        self.derived = Derived()
        for g in sorted(gangs, key=lambda g: g.arrival_s):  # stable: at one instant, in the order submitted
            self._arrival[g.gang_id] = len(self._arrival)
            if not g.refused:
                self._agenda.arrive(g.arrival_s, g.gang_id)
            else:
                self.outcomes[g.gang_id].reason = g.refused

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> Simulation:
        next_sample = 0.0
        last_report = time.monotonic()
        horizon = self.config.horizon_s
        while (t := self._agenda.first()) is not None:
            if horizon is not None and t > horizon:
                break
            if horizon is None and not self._agenda.changes:
                break  # only retries are left: nothing arrives or ends, so nothing can change
            while next_sample <= t:
                self._sample(next_sample)
                next_sample += self.config.sample_s
            self.now = t
            self._instant(t)
            if self.progress is not None and time.monotonic() - last_report >= 2.0:
                last_report = time.monotonic()
                self.progress(self, t)
        end = horizon if horizon is not None else self.now
        while next_sample <= end:
            self._sample(next_sample)
            next_sample += self.config.sample_s
        self.now = end
        return self

    def _instant(self, t: float) -> None:
        """Everything due at ``t``: ends, arrivals, retries, then one cycle."""
        due: dict[str, None] = {}
        while (event := self._agenda.take(t)) is not None:
            _, kind, seq, gang_id = event
            if kind == END and self._ends.get(gang_id) != seq:
                continue  # the run it ended was cut short by preemption
            if kind == END:
                freed = self.tree.chain(self.outcomes[gang_id].gang.queue)
                self._end(gang_id)
                # each queue asked once: nothing changes while the order is drawn
                ranks = self.queues.shares_and_ranks(t)[1] if self._failed and len(self.tree.specs) > 1 else {}
                for s in fairness.wake_order(self._failed.values(), now=t, below_quota=cache(self._below_quota),
                                             freed=freed, chain=self.tree.chain,
                                             rank=_ranker(ranks)):
                    self._set(saga.woken(s, t))
                    due[s.gang_id] = None
            elif kind == ARRIVE:
                g = self.outcomes[gang_id].gang
                self._set(GangState(gang_id=gang_id, members=g.members, min_member=len(g.members),
                                    priority=g.priority, created_at=t))
                self.waiting_units[g.queue] = self.waiting_units.get(g.queue, 0) + g.units
                due[gang_id] = None
            else:
                s = self.records.get(gang_id)
                if s is not None and s.phase in IDLE and s.backoff_until <= t:
                    due[gang_id] = None
        if due:
            self._cycle(t, [self.records[g] for g in due if self.records[g].phase in IDLE])

    def _cycle(self, t: float, due: list[GangState]) -> None:
        c = self.config
        starting = []
        heads: dict[str, GangState | None] = {}
        for s in due:
            queue = fairness.queue_of(s)
            if queue not in heads:
                heads[queue] = fairness.head_of(self.pending.get(queue, {}).values())
            # The head among the others is the queue's head unless it is this gang (then the gate
            # lets it go whoever is next): one scan of the queue per instant, not one per gang.
            head = heads[queue]
            others = [head] if head is not None and head.gang_id != s.gang_id else []
            gate = fairness.gate(s, others, now=t, starve_after_s=c.starve_after_s, mode=c.fairness)
            if gate.hold:
                held = saga.held_back(s, gate.hold)
                if held is not None:
                    self._set(held)
                self._agenda.push(t + c.resync_s, RETRY, s.gang_id)
                continue
            placing = saga.start_attempt(s, now=t, settle_s=0.0, avoid=gate.avoid, avoid_for=gate.head)
            if placing is not None:
                starting.append(placing)
        if not starting:
            return
        queues = {fairness.queue_of(s) for s in starting}
        # One queue among them: its rank is the same for all, so the order is priority, arrival.
        ranks = self.queues.shares_and_ranks(t)[1] if len(queues) > 1 else {}
        # As placement sees the records: the gangs starting now are placing (their attempt counted).
        records = {o.gang_id: o for q in self.pending.values() for o in q.values()}
        records.update((o.gang_id, o) for o in starting)
        owed = self.queues.owed_candidates(records.values())
        memo: dict[int, bool] = {}
        starting.sort(key=lambda s: queueorder.cycle_key(ranks.get(fairness.queue_of(s), float("inf")), s.priority,
                                                         self._arrival[s.gang_id]))
        for s in starting:
            self.outcomes[s.gang_id].attempts += 1
            self._place(t, s, owed, memo)

    def _place(self, t: float, s: GangState, owed: list, memo: dict[int, bool]) -> None:
        """placement's handling of one request: queue, borrow gate, decision. Other queues'
        spare capacity for repairs is left alone, as placement leaves it (``_kept_back``)."""
        queue = fairness.queue_of(s)
        kept = self._kept_back(queue)
        avoid = tuple(sorted(set(s.avoid_nodes) | kept)) if kept - set(s.avoid_nodes) else s.avoid_nodes
        refusal = self.queues.refusal(s.members)
        if refusal:  # over a limit it may preempt its own queue's lower priorities, as placement does
            if self.tree.problem(queue) or not preemption.worth_planning(self, s) or not self._preempt(t, s, avoid):
                later, why = self._later.pop(s.gang_id, (0.0, ""))
                self._refused(t, s, f"{refusal}; {why}" if why else refusal, fits_empty=False, waits_for="queue",
                              retry_at=later)
            return None
        if self.queues.borrowing(s.members):
            kept = self.queues.owed_now(queue, owed, self._fits_now, memo)
            if kept:
                return self._refused(t, s, queueorder.borrow_reason(queue, kept), fits_empty=False, waits_for="gpus")
        may_preempt = preemption.worth_planning(self, s)
        if not self.config.exact and not may_preempt and self._still_refused(s, avoid):
            return self._refused(t, s, NO_FIT, *self._on_empty(s))
        self.decisions += 1
        got = decide(self.cluster, s.members, self.profile, explain=False, avoid=avoid)
        if not isinstance(got, Decision):
            if may_preempt and self._preempt(t, s, avoid):
                return None
            self._refused_at[self.derived.key(s)] = (self.epoch, avoid)
            later, why = self._later.pop(s.gang_id, (0.0, ""))
            return self._refused(t, s, f"{NO_FIT}; {why}" if why else NO_FIT, *self._on_empty(s), retry_at=later)
        self._start(t, s, got.assignments)

    def _kept_back(self, queue: str) -> set[str]:
        """The nodes other queues' ``repairReserve`` keeps from a new gang of ``queue``
        (``phalanx_rules.reserve``, the rule placement's ``spare.kept_from`` calls): the queues'
        running gangs' nodes from the run's books, free whole GPUs from the engine's state."""
        rs = reserve.reserves(self.tree, self.held)
        if not rs or all(r.queue == queue for r in rs):
            return set()
        running: dict[str, set[str]] = {}
        for gang_id, assignments in self.running.items():
            running.setdefault(queueorder.queue_of(self.outcomes[gang_id].gang.members), set()).update(
                a.node for a in assignments)
        nodes = self.cluster.nodes
        free = {name: len(st.free_whole()) for name, st in nodes.items()}
        return set(reserve.held_back(rs, queue, running, free, lambda n, tier: domain_of(nodes[n], tier)))

    def _preempt(self, t: float, s: GangState, avoid: tuple[str, ...]) -> bool:
        """Plan a preemption for ``s`` (on the nodes it may use: not ``avoid``); if there is
        one, evict its victims and start ``s`` on the plan's placement now."""
        plan, trials = preemption.answer(self, s, t, avoid)
        self.decisions += trials
        if isinstance(plan, NoPlan) and plan.code == "min-runtime" and plan.retry_at:
            self._later[s.gang_id] = (plan.retry_at, plan.reason)
        if not isinstance(plan, Plan) or not plan.victims:
            return False
        self.preemptions += 1
        for v in plan.victims:
            self._evict(t, v.gang_id)
        self._start(t, s, plan.placement.assignments)
        return True

    def _evict(self, t: float, gang_id: str) -> None:
        """A victim's reservations go now and it waits again, as a rolled-back gang whose
        controller recreates it: it will run its whole duration once placed again."""
        o = self.outcomes[gang_id]
        o.preempted += 1
        o.lost_gpu_s += (t - (o.start if o.start is not None else t)) * o.gang.units / GPU_UNITS
        self._end(gang_id)
        o.start = o.end = None
        o.tier, o.domain, o.nodes, o.split = "", "", 0, False
        self.waiting_units[o.gang.queue] = self.waiting_units.get(o.gang.queue, 0) + o.gang.units
        g = o.gang
        self._set(GangState(gang_id=gang_id, members=g.members, min_member=len(g.members), priority=g.priority,
                            created_at=t, phase="backoff", backoff_until=t + self.config.backoff_base_s,
                            reason="preempted"))
        self._agenda.push(t + self.config.backoff_base_s, RETRY, gang_id)

    def _still_refused(self, s: GangState, avoid: tuple[str, ...]) -> bool:
        """Would the engine refuse ``s`` again for sure? Yes when it avoids the same nodes as at
        its last refusal and nothing was released since (the cluster only got fuller); for a
        gang of one also when no node released since can take it now (a single member fits
        exactly when some node passes every filter, and the other nodes only got fuller)."""
        key = self.derived.key(s)
        last = self._refused_at.get(key)
        if last is None or last[1] != avoid:
            return False
        if self.cluster.has_pod_anti_affinity() or any(m.pod_affinity or m.pod_anti_affinity or m.spread
                                                       for m in s.members):
            return False  # pod (anti-)affinity, spread: a release elsewhere in a domain may change any node's answer
        if last[0] == self.epoch:
            return True
        if len(s.members) != 1 or self.epoch - last[0] > RELEASES_CHECKED:
            return False
        member = self.derived.members(s)[0]
        gate = checks_resources(self.profile, member)  # as the engine's search: no room, refused
        for name in set().union(*self._released[last[0]:self.epoch]):
            st = self.cluster.nodes.get(name)
            if name in avoid or st is None or (gate and not resources_fit(member, st)):
                continue
            if not isinstance(self.profile.evaluate(member, st), Status):
                return False
        self._refused_at[key] = (self.epoch, avoid)
        return True

    def _fits_now(self, members) -> bool:
        self.decisions += 1
        return isinstance(decide(self.cluster, members, self.profile, explain=False), Decision)

    def _on_empty(self, s: GangState) -> tuple[bool, tuple[str, ...]]:
        """Would the gang fit the empty cluster, and where (placement's reserve nodes)."""
        fits, nodes, _ = self._empty_tier(s)
        return fits, nodes

    def _empty_tier(self, s: GangState) -> tuple[bool, tuple[str, ...], str]:
        key = tuple(m.shape for m in self.derived.members(s))
        got = self._empty_memo.get(key)
        if got is None:
            d = decide(self.empty, s.members, self.profile, explain=False)
            got = ((True, tuple(sorted({a.node for a in d.assignments})), tier_of(self.empty, d.assignments)[0])
                   if isinstance(d, Decision) else (False, (), ""))
            self._empty_memo[key] = got
        return got

    def _refused(self, t: float, s: GangState, reason: str, fits_empty: bool, reserve: tuple[str, ...] = (),
                 waits_for: WaitsFor = "", retry_at: float = 0.0) -> None:
        """placement's ``PlacementFailed`` for the placing gang ``s``, taken as gang-coordinator
        takes it (``saga.placement_failed``: ``retry_at`` is when its preemption becomes possible)."""
        c = self.config
        failed = PlacementFailed(gang_id=s.gang_id, attempt=s.attempt, summary=reason, fits_empty_cluster=fits_empty,
                                 reserve_nodes=reserve, waits_for=waits_for, retry_at=retry_at)
        after = saga.placement_failed(s, failed, now=t, base_s=c.backoff_base_s, max_s=c.backoff_max_s,
                                      unschedulable_s=c.unschedulable_retry_s)
        self._set(after)
        self.outcomes[s.gang_id].reason = after.reason
        self._agenda.push(after.backoff_until, RETRY, s.gang_id)

    def _start(self, t: float, s: GangState, assignments: tuple[Assignment, ...]) -> None:
        o = self.outcomes[s.gang_id]
        self._book(assignments, +1, s.gang_id)
        self._set(saga.bound(s, s.attempt, tuple(m.pod for m in attempt_members(s))))
        self.waiting_units[o.gang.queue] -= o.gang.units
        self.running[s.gang_id] = assignments
        self.running_priorities.setdefault(o.gang.queue, Counter())[o.gang.priority] += 1
        tier, domain = tier_of(self.cluster, assignments)
        o.start, o.tier, o.domain, o.nodes, o.reason = t, tier, domain, len({a.node for a in assignments}), ""
        if len(s.members) > 1:
            o.split = _TIER_ORDER.index(tier) > _TIER_ORDER.index(self._empty_tier(s)[2] or tier)
        self.derived.forget(s.gang_id)
        if o.gang.duration_s is not None:
            self._ends[s.gang_id] = self._agenda.push(t + o.gang.duration_s, END, s.gang_id)

    def _end(self, gang_id: str) -> None:
        self._ends.pop(gang_id, None)
        assignments = self.running.pop(gang_id)
        gang = self.outcomes[gang_id].gang
        counts = self.running_priorities[gang.queue]
        counts[gang.priority] -= 1
        if not counts[gang.priority]:
            del counts[gang.priority]
        self._book(assignments, -1, gang_id)
        self.outcomes[gang_id].end = self.now
        self.records.pop(gang_id, None)
        self._released.append(frozenset(a.node for a in assignments))
        self.epoch += 1

    def _book(self, assignments: tuple[Assignment, ...], sign: int, gang_id: str) -> None:
        """Reserve (+1) or release (-1) a gang's assignments: the node views (what placement's
        cache holds, and what the probes read), the engine's state, each queue's units."""
        by_node: dict[str, list[Assignment]] = {}
        for a in assignments:
            by_node.setdefault(a.node, []).append(a)
            self.owner[a.pod] = gang_id
            if sign < 0:
                del self.owner[a.pod]
        for name, mine in by_node.items():
            booked = self._allocations.get(name)
            if booked is None:
                booked = self._allocations[name] = {a.pod: a for a in self.views[name].allocations}
            before = len(booked)
            for a in mine:  # a pod booked again moves to the end, as it did when the tuple was rebuilt
                booked.pop(a.pod, None)
            replaced = len(booked) != before
            if sign > 0:
                booked.update((a.pod, a) for a in mine)
            view = replace(self.views[name], allocations=tuple(booked.values()))
            self.views[name] = view
            st = self.cluster.nodes.get(name)
            if sign > 0 and st is not None and not replaced:
                # Only added: booked into the node's state in place (what rebuilding it from the
                # new view gives, taking the same allocations in the same order), its view swapped.
                self.cluster.assume(mine)
                st.view = view
            else:
                self.cluster.upsert(view)
        units = sum(units_of_assignment(a) for a in assignments)
        chain = self.tree.chain(queueorder.queue_of(self.outcomes[gang_id].gang.members))
        for q in chain:
            self.held[q] = self.held.get(q, 0) + sign * units
        self.queues.held_changed(chain, self.now)

    # -- records ----------------------------------------------------------------------------------
    def _set(self, s: GangState) -> None:
        self.records[s.gang_id] = s
        queue = self.pending.setdefault(fairness.queue_of(s), {})
        if s.phase in IDLE:
            queue[s.gang_id] = s
        else:
            queue.pop(s.gang_id, None)
        if s.phase == "backoff" and s.failure == "placement_failed":
            self._failed[s.gang_id] = s
        else:
            self._failed.pop(s.gang_id, None)

    def _below_quota(self, queue: str) -> bool:
        return self.queues.below_quota(queue)

    def _sample(self, t: float) -> None:
        shares, _ = self.queues.shares_and_ranks(t)
        allocated = sum(self.held.get(q, 0) for q in self.tree.roots())
        stranded = sum(stranded_milli(st) for st in self.cluster.nodes.values()) / 1000
        self.samples.append(Sample(
            t=t, allocated=allocated / GPU_UNITS, stranded=round(stranded, 3),
            pending=sum(len(q) for q in self.pending.values()),
            pending_gpus=sum(self.waiting_units.values()) / GPU_UNITS, running=len(self.running),
            queues={q: (self.held.get(q, 0) / GPU_UNITS, shares.get(q, 0) / GPU_UNITS) for q in sorted(self.tree.specs)}))


def _ranker(ranks: Mapping[str, float]) -> Callable[[str], float]:
    """A queue's rank in ``ranks`` (a queue not in it last)."""
    return lambda q: ranks.get(q, float("inf"))


_TIER_ORDER = ("node", "hypernode", "leaf", "netpod", "cluster")

