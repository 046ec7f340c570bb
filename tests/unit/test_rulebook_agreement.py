"""One rulebook, two clocks: on generated workloads, the services' adapters and ``phalanx sim``
give the same answers to the same questions.

A run of the simulator is stopped in the middle (gangs running, gangs waiting after a refusal);
from the state it reached, placement's view is built as the buckets would hold it — the node
ledgers (each reservation charged to its queue's line, as placement charges it) and the gang
records — and placement's queue adapter (``services/phalanx_placement/queues.py``) is asked what
the simulator's (``phalanx_sim.books``) is asked, for every waiting gang: the queue's limit,
borrowing, the queues below their quota, the gangs that make a queue owed free GPUs, the cycle's
ranks and shares — weighted by the queues' recent usage when the run keeps it (the records
placement's cache mirrors are the run's) — which gangs a release wakes and in which order
(gang-coordinator's ``wake`` and the run's, queues furthest below their fair share first), and
for a waiting gang of higher priority the preemption planner's answer on the running gangs each
builds (with their start times: a queue's minimum runtime keeps the young ones). Both call
``phalanx_rules``; what this pins is that each builds the rules' arguments from its own books
alike.
"""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest
from engine_builders import node, pod
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx_engine.preempt import plan_preemption
from phalanx_gang_coordinator.queuebook import QueueBook
from phalanx_placement import preempting
from phalanx_placement.queues import PlacementQueues
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_proto.state import Allocation, NodeLedger, alloc_key, attempt_members
from phalanx_rules import fairness, queueorder, usage
from phalanx_rules.queues import QueueTree
from phalanx_sim import preemption as sim_preemption
from phalanx_sim.loop import Simulation
from phalanx_sim.model import SimConfig, SimGang

QUEUES = ("a", "b", "c")


@st.composite
def trees(draw) -> QueueTree:
    """Up to three queues, perhaps under one parent, each with a quota and perhaps a limit."""
    nested = draw(st.booleans())
    specs = [QueueSpec(name="org", quota=draw(st.integers(0, 16)) * GPU_UNITS)] if nested else []
    for q in QUEUES:
        quota = draw(st.integers(0, 8))
        limit = draw(st.one_of(st.none(), st.integers(quota, 16)))
        minimum = draw(st.sampled_from((None, 0.0, 0.4, 5.0)))
        specs.append(QueueSpec(name=q, parent="org" if nested and q != "c" else "", quota=quota * GPU_UNITS,
                               limit=None if limit is None else limit * GPU_UNITS, over_quota_weight=draw(
                                   st.sampled_from((1.0, 3.0))), preempt_min_runtime_s=minimum,
                               reclaim_min_runtime_s=minimum))
    return QueueTree.of(specs)


@st.composite
def workloads(draw) -> list[SimGang]:
    """Gangs that start at once and run past the stop, some that end before it, then gangs that
    arrive after them. Nothing starts at virtual time 0: a gang record's start 0 means "unknown"
    to placement (no unix time is 0), while the run's clock starts there."""
    gangs = []
    for i in range(draw(st.integers(0, 6))):
        gangs.append(_gang(f"run{i}", draw(st.sampled_from(QUEUES)), draw(st.integers(1, 4)),
                           draw(st.integers(1, 2)), at=draw(st.sampled_from((0.25, 1.0))), runs=1000.0))
    for i in range(draw(st.integers(0, 3))):  # gangs that end before the stop: usage that decays
        gangs.append(_gang(f"done{i}", draw(st.sampled_from(QUEUES)), draw(st.integers(1, 8)), 1, at=0.25,
                           runs=draw(st.sampled_from((0.5, 1.0)))))
    for i in range(draw(st.integers(1, 6))):
        gangs.append(_gang(f"wait{i}", draw(st.sampled_from(QUEUES)), draw(st.integers(1, 8)),
                           draw(st.integers(1, 3)), at=1.0, runs=1000.0, priority=draw(st.integers(0, 2))))
    return gangs


def _gang(name: str, queue: str, gpus: int, members: int, *, at: float, runs: float, priority: int = 0) -> SimGang:
    specs = tuple(msgspec.structs.replace(pod(f"{name}-{i}").gpus(gpus).spec(), queue=queue, priority=priority)
                  for i in range(members))
    return SimGang(gang_id=f"ns/{name}", members=specs, arrival_s=at, duration_s=runs, priority=priority)


def entry(value):
    return SimpleNamespace(value=value)


class Mirror(list):
    revision = 1

    def get(self, key):
        return None


class PlacementView:
    """What placement's queue adapter reads of its cache, as the buckets hold the run's state."""

    def __init__(self, sim: Simulation) -> None:
        self.queues = Mirror(entry(spec) for spec in sim.tree.specs.values())
        self.gangs = [entry(s) for s in sim.records.values()]
        self.usage = Mirror()
        self.history = Mirror(entry(r) for r in sim.queues.history.values())
        self.clock = lambda: sim.now
        self._ledgers: dict[str, NodeLedger] = {}
        allocations: dict[str, dict] = {}
        for gang_id, assignments in sim.running.items():
            queues = sim.tree.chain(sim.outcomes[gang_id].gang.queue)
            for a in assignments:  # charged as placement charges a reservation: its queue's line
                allocations.setdefault(a.node, {})[alloc_key(a.pod)] = Allocation(
                    gang_id=gang_id, attempt=1, assignment=a, queues=queues)
        self._ledgers = {n: NodeLedger(node=n, allocations=a) for n, a in allocations.items()}
        from phalanx_rules.queues import held_by_queue

        self.queue_units = held_by_queue(self._ledgers.values())
        self.views = {v.name: SimpleNamespace(topology=v.topology, enabled=v.enabled, invalid="")
                      for v in sim.views.values()}

    def gang_keys(self, gang_id: str) -> frozenset[str]:
        return frozenset(n for n, led in self._ledgers.items() if any(a.gang_id == gang_id
                                                                        for a in led.allocations.values()))

    def ledger_of(self, key: str) -> NodeLedger | None:
        return self._ledgers.get(key)

    def usage_of(self, queue: str):
        from phalanx_proto.queues import QueueUsage

        return QueueUsage(queue=queue)


@settings(max_examples=120, deadline=None)
@given(tree=trees(), gangs=workloads(), nodes=st.integers(1, 2), half_life=st.sampled_from((0.0, 0.5, 2.0)))
def test_placement_and_the_simulator_answer_the_queue_rules_alike(tree, gangs, nodes, half_life):
    views = [node(f"n{i}").gpus(8).view() for i in range(nodes)]
    sim = Simulation(views, gangs, tree, SimConfig(starve_after_s=0, horizon_s=1.5, preemption=False,
                                                   usage_half_life_s=half_life)).run()
    assert half_life > 0 or not sim.queues.history
    placement = PlacementQueues(PlacementView(sim), clock=lambda: 0.0)
    waiting = [s for q in sim.pending.values() for s in q.values()]
    for s in waiting:
        members = attempt_members(s)
        assert placement.refusal(s.gang_id, members, frozenset()) == sim.queues.refusal(members), s.gang_id
        assert placement.borrowing(members, s.gang_id, frozenset()) == sim.queues.borrowing(members), s.gang_id
    for q in tree.specs:
        assert queueorder.below_quota(tree, placement.cache.queue_units, q) == sim.queues.below_quota(q), q
    placement.ranks()
    shares, ranks = sim.queues.shares_and_ranks(sim.now)
    assert (placement.shares, placement._ranks) == (shares, ranks)
    coordinator = SimpleNamespace(tree=tree, units=placement.cache.queue_units, capacity=lambda: sim.capacity,
                                  history=placement.cache.history)
    assert QueueBook.ranks(coordinator, list(sim.records.values()), sim.now) == ranks  # gang-coordinator's wake
    recorded = placement.recorded("x", (), frozenset(), refusal="").order  # what the decision log says of the order
    again = queueorder.shares_and_ranks(QueueTree.of(recorded.specs), recorded.held, recorded.waiting,
                                        recorded.capacity, usage.recent_gpus(recorded.history, recorded.now))
    assert again[0] == recorded.shares == shares
    placement.begin_cycle()
    assert sorted(_names(placement._owed)) == sorted(_names(sim.queues.owed_candidates(waiting)))
    for freed in (*((q,) for q in tree.specs), None):  # a release charged to each queue's line, or unknown
        kw = dict(now=1.5, freed=freed, chain=tree.chain, rank=lambda q: ranks.get(q, float("inf")))
        service = fairness.wake_order(sim.records.values(), below_quota=lambda q: queueorder.below_quota(
            tree, placement.cache.queue_units, q), **kw)
        simulated = fairness.wake_order(sim._failed.values(), below_quota=sim.queues.below_quota, **kw)
        assert [s.gang_id for s in service] == [s.gang_id for s in simulated]


    preemptor = next((s for s in waiting if s.priority == 2), None)
    if preemptor is not None:  # the planner on each one's running gangs: their start times, the minimum runtimes
        _plans_agree(sim, placement, preemptor)


def _plans_agree(sim: Simulation, placement: PlacementQueues, s) -> None:
    view = placement.cache
    ledgers = [view.ledger_of(k) for k in view._ledgers]
    records = {r.gang_id: r for r in sim.records.values()}
    running = preempting.candidates(ledgers, records.get, s.gang_id, sim.now)
    assert running == sim_preemption.running(sim, s.gang_id)
    who = sim.derived.preemptor(s)
    service = plan_preemption(sim.cluster, who, running, placement.tree(), held_by=view.queue_units, now=sim.now)
    simulated, _ = sim_preemption.answer(sim, s, sim.now)
    assert service == simulated


def _names(candidates) -> list[tuple[str, tuple[str, ...]]]:
    return [(q, tuple(m.pod.name for m in members)) for q, members in candidates]


def test_the_generated_runs_exercise_the_rules_they_compare():
    """What the property compares is not vacuous: a run stopped in the middle has a gang refused at
    its queue's limit, with the same words from both, and queues on both sides of their quota."""
    tree = QueueTree.of((QueueSpec(name="a", quota=4 * GPU_UNITS, limit=8 * GPU_UNITS),
                         QueueSpec(name="b", quota=8 * GPU_UNITS)))
    gangs = [_gang("run0", "a", 4, 2, at=0.0, runs=1000.0), _gang("wait0", "a", 4, 1, at=1.0, runs=1000.0),
             _gang("wait1", "b", 8, 2, at=1.0, runs=1000.0)]
    sim = Simulation([node("n0").gpus(8).view(), node("n1").gpus(8).view()], gangs, tree,
                     SimConfig(starve_after_s=0, horizon_s=1.5, preemption=False)).run()
    placement = PlacementQueues(PlacementView(sim), clock=lambda: 0.0)
    wait0 = sim.records["ns/wait0"]
    refused = "0/8 GPUs available to queue a: at its limit 8 (allocated 8, this gang needs 4)"
    assert placement.refusal("ns/wait0", wait0.members, frozenset()) == sim.queues.refusal(wait0.members) == refused
    assert sim.queues.below_quota("b") and not sim.queues.below_quota("a")


pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")


def test_the_new_rules_are_exercised_both_sides_alike():
    """Not vacuous: a run where team a held 8 GPUs from 0.25 s to 1.25 s and team b 4 from then on, with
    a half-life of 0.5 s, weighs the shares by that usage (they differ from the plain ones), the
    two adapters give the same shares and the decision log's order replays to them; and a
    priority-2 gang of b finds b's running gang too young (preemptMinRuntime 5 s) on both sides,
    with the same time."""
    tree = QueueTree.of((QueueSpec(name="a"), QueueSpec(name="b", preempt_min_runtime_s=5.0)))
    gangs = [_gang("done0", "a", 8, 1, at=0.25, runs=1.0), _gang("run0", "b", 4, 1, at=0.25, runs=1000.0),
             _gang("wait0", "a", 8, 1, at=1.3, runs=1000.0), _gang("wait1", "b", 8, 1, at=1.3, runs=1000.0),
             _gang("wait2", "b", 8, 1, at=1.3, runs=1000.0, priority=2)]
    sim = Simulation([node("n0").gpus(8).view()], gangs, tree,
                     SimConfig(starve_after_s=0, horizon_s=1.5, preemption=False, usage_half_life_s=0.5)).run()
    placement = PlacementQueues(PlacementView(sim), clock=lambda: 0.0)
    placement.ranks()
    shares, _ = sim.queues.shares_and_ranks(sim.now)
    plain, _ = queueorder.shares_and_ranks(tree, sim.held, sim.waiting_units, sim.capacity)
    assert placement.shares == shares != plain
    assert shares["b"] > shares["a"]  # a used the whole node for a second, b half of it lately
    s = sim.records["ns/wait2"]
    _plans_agree(sim, placement, s)
    got, _ = sim_preemption.answer(sim, s, sim.now)
    assert (got.code, got.retry_at) == ("min-runtime", 6.25)
