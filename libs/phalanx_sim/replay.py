"""``phalanx sim --replay``: decide placement's recorded decisions again and say which differ
(docs/whatif.md, "Replay").

Each placement replica logs its cluster's changes and its engine decisions in order
(``DecisionsRecorded`` on ``phx.decisions.<replica>``, written by
``services/phalanx_placement/recorder.py``). ``Replay`` rebuilds each replica's cluster from a
base record, applies the changes as they come, and asks the same questions again: the queue
rules (``phalanx_rules.queueorder``: the limit's refusal, whether the gang would borrow, and the
cycle's fair shares with the queues' recent usage, ``phalanx_rules.usage``) on the queues,
units and usage records the decision read, the engine with the same profile (the same members, the
same nodes to avoid), and the preemption planner on the running gangs, priorities, queues and
units it read (its victims' start times against the queues' minimum runtimes included). Each
answer must be the recorded one: the refusal to the word, the fair shares to the unit, the placement to
the GPU (``Decision.assignments``) or the engine's reason to the word (``NoFit.summary``), the
plan to its victims and placement.

A replica's log read from the middle, or after a gap (records lost, ``seq`` not one more than
the last), cannot be rebuilt until its next base: its decisions until then are counted as not
replayable, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx_engine.decide import Cluster, decide_within, default_profile
from phalanx_engine.preempt import Plan, plan_preemption
from phalanx_engine.recorded import Memory
from phalanx_engine.snapshot import Decision
from phalanx_proto.events import Assignment, DecisionsRecorded, RecordedDecision, RecordedNode
from phalanx_proto.kubeapi import PREEMPT_LOWER_PRIORITY
from phalanx_proto.queues import shown
from phalanx_rules import queueorder, usage
from phalanx_rules.preemption import Preemptor, RunningGang
from phalanx_rules.queues import QueueTree


@dataclass(frozen=True)
class Difference:
    """A decision the engine now makes otherwise than the log says it made."""

    replica: str
    seq: int
    at: float
    gang_id: str
    attempt: int
    recorded: str
    replayed: str


@dataclass
class ReplicaReplay:
    """One replica's log as far as it was read, and what its replay found."""

    replica: str
    records: int = 0
    first_seq: int = 0
    last_seq: int = 0
    bases: int = 0
    gaps: int = 0
    decisions: int = 0
    agree: int = 0
    not_replayable: int = 0
    queue_checks: int = 0
    """Decisions whose queue rules were asked again."""
    plans: int = 0
    """Decisions whose preemption plan was made again."""
    first_at: float = 0.0
    last_at: float = 0.0
    differences: list[Difference] = field(default_factory=list)
    _cluster: Cluster | None = None
    _memory: Memory = field(default_factory=Memory)
    _held: dict[str, tuple[Assignment, ...]] = field(default_factory=dict)
    """Each recorded node's reservations, usable or not: the planner's running gangs hold GPUs
    on nodes the engine leaves out (a report invalid or stale) too."""

    def feed(self, record: DecisionsRecorded, *, since: float = 0.0) -> None:
        """Apply one record; decisions of cycles before unix time ``since`` are applied but not compared."""
        if self.records and record.seq != self.last_seq + 1:
            self.gaps += 1
            self._cluster = None
        self.records += 1
        self.first_seq = self.first_seq or record.seq
        self.last_seq = record.seq
        if record.base:
            self.bases += 1
            self._cluster = Cluster(nodes={}, total=0)
            self._memory.clear()
            self._held.clear()
        for item in record.items:
            if isinstance(item, RecordedNode):
                self._apply(item)
            elif record.at >= since:
                self.first_at = self.first_at or record.at
                self.last_at = record.at
                self._decide(record, item)

    def _apply(self, item: RecordedNode) -> None:
        if self._cluster is None:
            return
        if item.removed:
            self._cluster.remove(item.name)
            self._memory.forget(item.name)
            self._held.pop(item.name, None)
            return
        try:
            view = self._memory.view(item)
        except KeyError:  # "same as before" of a node this replay never saw: not from a base
            self._cluster = None
            return
        self._cluster.upsert(view)
        self._held[item.name] = view.allocations

    def _decide(self, record: DecisionsRecorded, item: RecordedDecision) -> None:
        self.decisions += 1
        if self._cluster is None:
            self.not_replayable += 1
            return
        found = []
        if item.queue is not None:
            self.queue_checks += 1
            found += _queue_differs(item)
        if item.engine:
            # confined to a repair's domain, or trying the nodes a restarted gang ran on first
            result = decide_within(self._cluster, item.members, _profile(item.node_state_required), avoid=item.avoid,
                                   inside=item.within or None, required=item.within_required)
            now = (result.assignments, "") if isinstance(result, Decision) else ((), result.summary)
            if now != (item.placed, item.no_fit):
                found.append((_words(item.placed, item.no_fit), _words(*now)))
        if item.preemption is not None and not item.preemption.omitted:
            self.plans += 1
            found += self._plan_differs(item)
        if not found:
            self.agree += 1
        for recorded, replayed in found:
            self.differences.append(Difference(self.replica, record.seq, record.at, item.gang_id, item.attempt,
                                               recorded=recorded, replayed=replayed))

    def _plan_differs(self, item: RecordedDecision) -> list[tuple[str, str]]:
        """The preemption planner asked again on what it read: the running gangs' assignments are
        the replayed nodes' reservations, on every node recorded (placement reads them from the
        ledgers, whether the engine can use the node or not)."""
        p = item.preemption
        held = {a.pod: a for allocations in self._held.values() for a in allocations}
        running = tuple(RunningGang(gang_id=g.gang_id, assignments=tuple(held[pod] for pod in g.pods if pod in held),
                                    priority=g.priority, queues=g.queues, started_at=g.started_at)
                        for g in p.running)
        who = Preemptor(gang_id=item.gang_id, members=item.members, priority=p.priority, queue=p.queue,
                        preemption_policy=p.policy or PREEMPT_LOWER_PRIORITY)
        got = plan_preemption(self._cluster, who, running, QueueTree.of(p.specs), held_by=p.held_by,
                              profile=_profile(item.node_state_required), avoid=item.avoid, now=p.now,
                              within=frozenset(item.within) if item.within_required else None)
        recorded = _plan_words(p.victims, p.placed, p.no_plan)
        replayed = (_plan_words(tuple(v.gang_id for v in got.victims), got.placement.assignments, "")
                    if isinstance(got, Plan) else _plan_words((), (), got.reason))
        return [] if recorded == replayed else [(recorded, replayed)]


def _queue_differs(item: RecordedDecision) -> list[tuple[str, str]]:
    """The queue rules asked again on the queues and units the decision read."""
    q = item.queue
    tree = QueueTree.of(q.specs)
    refusal = queueorder.refusal(tree, item.members, q.limited_held, q.releasing)
    out = []
    if refusal != q.refusal:
        out.append((f"queue refusal: {q.refusal or 'none'}", f"queue refusal: {refusal or 'none'}"))
    if not refusal:
        queue = queueorder.queue_of(item.members)
        borrowing = queueorder.borrowing(tree, item.members, q.held, q.releasing.get(queue, 0))
        if borrowing != q.borrowing:
            out.append((f"borrowing: {q.borrowing}", f"borrowing: {borrowing}"))
    if q.order is not None:  # the cycle's order: fair shares, weighted by the recent usage recorded
        o = q.order
        shares, _ = queueorder.shares_and_ranks(QueueTree.of(o.specs), o.held, o.waiting, o.capacity,
                                                usage.recent_gpus(o.history, o.now))
        if shares != o.shares:
            out.append((f"fair shares: {_shares(o.shares)}", f"fair shares: {_shares(shares)}"))
    return out


def _shares(shares: dict[str, int]) -> str:
    return ", ".join(f"{q} {shown(n)}" for q, n in sorted(shares.items()))


def _plan_words(victims: tuple[str, ...], placed: tuple[Assignment, ...], no_plan: str) -> str:
    if not victims and not placed:
        return f"no plan: {no_plan}"
    return f"evict {', '.join(victims) or 'nobody'}; " + _words(placed, "")


class Replay:
    """Every replica's replay, fed records in each replica's order."""

    def __init__(self, *, since: float = 0.0) -> None:
        self.since = since
        self.replicas: dict[str, ReplicaReplay] = {}

    def feed(self, record: DecisionsRecorded) -> None:
        self.replicas.setdefault(record.replica, ReplicaReplay(record.replica)).feed(record, since=self.since)

    @property
    def decisions(self) -> int:
        return sum(r.decisions - r.not_replayable for r in self.replicas.values())

    @property
    def differences(self) -> list[Difference]:
        return [d for r in self.replicas.values() for d in r.differences]


_PROFILES = {}


def _profile(node_state_required: bool):
    if node_state_required not in _PROFILES:
        _PROFILES[node_state_required] = default_profile(require_node_state=node_state_required)
    return _PROFILES[node_state_required]


def _words(placed: tuple[Assignment, ...], no_fit: str) -> str:
    """A decision in words: every member's node and GPUs (all of an assignment that has more),
    or why nothing fits."""
    if not placed:
        return f"no fit: {no_fit}"
    return "placed " + "; ".join(f"{a.pod.namespace}/{a.pod.name} -> {a.node} {list(a.gpus)}"
                                 + ("" if a == Assignment(pod=a.pod, node=a.node, gpus=a.gpus) else f" ({a})")
                                 for a in placed)
