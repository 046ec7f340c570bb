"""The shortcuts that make ``phalanx sim`` fast (issue #23) change nothing it finds: the engine's
single-member searches with and without passing over nodes without room and remembering each
node's answer per request shape, the cluster's indexes against a cluster built afresh, the
agenda against one heap of every event."""

from __future__ import annotations

import heapq
import random

import pytest

from phalanx_engine import decide as engine
from phalanx_engine.decide import Cluster
from phalanx_engine.kube_plugins import NodeResourcesFit, resources_fit
from phalanx_engine.snapshot import Snapshot
from phalanx_localstack.synthetic import synthetic_cluster
from phalanx_rules.queues import QueueTree
from phalanx_sim import cluster, trace
from phalanx_sim.agenda import ARRIVE, END, RETRY, Agenda
from phalanx_sim.loop import Simulation
from phalanx_sim.model import SimConfig
from phalanx_sim.trace import TracePod

SHAPES = [TracePod(cpu, mem, milli, count, created=0, deleted=life)
          for cpu, mem, milli, count, life in [
              (4000, 16000, 1000, 1, 900), (12000, 60000, 1000, 2, 3000), (32000, 120000, 1000, 8, 5000),
              (8000, 30000, 500, 1, 1200), (2000, 8000, 250, 1, 600), (16000, 64000, 0, 0, 2000),
              (6000, 24000, 1000, 4, 4000), (24000, 90000, 300, 1, 1500), (40000, 20000, 0, 0, 800)]]


def _run(horizon: float = 3 * 3600.0) -> Simulation:
    views = cluster.views(synthetic_cluster("24x8v100"))
    gangs = trace.timed_gangs(SHAPES, seed=7, load=1.2, horizon_s=horizon, capacity_gpus=cluster.gpus(views))
    return Simulation(views, gangs, QueueTree.of(()), SimConfig(horizon_s=horizon, sample_s=60)).run()


def _result(sim: Simulation) -> tuple:
    return (sim.decisions, [(g, o.start, o.end, o.tier, o.nodes, o.attempts, o.reason) for g, o in sim.outcomes.items()],
            [(s.allocated, s.stranded, s.pending, s.running) for s in sim.samples])


def test_a_trace_run_finds_the_same_with_the_engine_shortcuts_off(monkeypatch):
    fast = _result(_run())
    original = engine.candidate

    def plain(profile, member, st, gate):  # nothing remembered, every node evaluated
        st.memo = {}
        return original(profile, member, st, False)

    monkeypatch.setattr(engine, "room_for", lambda profile, member: None)
    monkeypatch.setattr(engine, "candidate", plain)
    assert _result(_run()) == fast
    assert fast[0] > 100 and any(o[1] is not None and o[5] > 1 for o in fast[1])  # it decided, some waited


def test_the_clusters_state_and_indexes_after_a_run_are_those_built_afresh_from_its_views():
    sim = _run(2 * 3600.0)
    fresh = Cluster.from_snapshot(Snapshot(nodes=tuple(sim.views.values())))
    got = sim.cluster
    assert sorted(got.nodes) == sorted(fresh.nodes)
    for name, st in fresh.nodes.items():
        mine = got.nodes[name]
        assert mine.view == st.view
        assert (mine.whole, mine.core, mine.mem, mine.requested, mine.pods, mine.ports, mine.free_whole()) == (
            st.whole, st.core, st.mem, st.requested, st.pods, st.ports, st.free_whole())
    assert {k: v for k, v in got.by_free.items() if v} == {k: v for k, v in fresh.by_free.items() if v}
    assert {k: v for k, v in got.by_core.items() if v} == {k: v for k, v in fresh.by_core.items() if v}
    assert got._room == fresh._room
    for (shares, key), ordered in got._sorted.items():
        assert ordered == sorted((got.by_core if shares else got.by_free)[key])


def test_resources_fit_is_node_resources_fits_verdict():
    sim = _run(3600.0)
    rng = random.Random(3)
    members = [engine.Member.of(trace.member(p, k)) for k, p in enumerate(SHAPES)]
    members += [engine.Member.of(trace.member(TracePod(rng.randrange(0, 60000), rng.randrange(0, 200000), 1000, 1), 99))
                for _ in range(30)]
    nrf = NodeResourcesFit()
    for st in sim.cluster.nodes.values():
        for m in members:
            assert resources_fit(m, st) == (nrf.filter(m, st) is None)


@pytest.mark.parametrize("seed", range(5))
def test_the_agenda_gives_the_events_in_the_order_of_one_heap(seed):
    rng = random.Random(seed)
    agenda, heap, seq = Agenda(), [], 0
    for t in sorted(rng.choice((0.0, 1.0, 2.5, 4.0, 7.0)) for _ in range(40)):
        agenda.arrive(t, f"a{seq}")
        seq += 1
        heapq.heappush(heap, (t, ARRIVE, seq, f"a{seq - 1}"))
    got, want = [], []
    while (t := agenda.first()) is not None:
        assert t == heap[0][0]
        while (event := agenda.take(t)) is not None:
            got.append(event)
            want.append(heapq.heappop(heap))
            if rng.random() < 0.5:  # ends and retries entered as the run goes, some at this instant
                kind, later = rng.choice((END, RETRY)), t + rng.choice((0.0, 1.0, 2.5, 3.0))
                seq += 1
                assert agenda.push(later, kind, f"g{seq}") == seq
                heapq.heappush(heap, (later, kind, seq, f"g{seq}"))
    assert got == want and not heap and agenda.changes == 0
