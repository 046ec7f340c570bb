"""The counterfactual probes' share of placement's CPU (``bench/whatif_cost.py --cycles``).

Runs scheduling cycles as ``phalanx_placement.service`` does, on an engine ``Cluster``, with the
service's own ``phalanx_placement.whatif.Probes`` (budget and kept answers) reading a stand-in
for its ``ClusterCache``: the views, the ledgers, the gang records. Every clock is
``time.process_time``, so the budget is a share of CPU time here, as it is of wall time in a
busy placement (a cycle that decides back to back uses its CPU all along).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace
from types import SimpleNamespace

from phalanx_engine.decide import DEFAULT_PROFILE, Cluster, decide
from phalanx_engine.snapshot import Decision, Snapshot
from phalanx_engine.whatif import Running
from phalanx_placement.service import Config
from phalanx_placement.whatif import ProbeBudget, Probes
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.state import Allocation, NodeLedger, alloc_key
from phalanx_rules.queues import QueueTree

SHAPES = ((1, 8), (8, 8), (32, 8), (64, 4), (2, 4), (4, 8))
"""Pending gangs (members, GPUs each): they do not fit the filled cluster."""


class BenchCache:
    """What ``Probes`` reads of ``ClusterCache``, kept by hand as gangs come and go."""

    def __init__(self, cluster: Cluster, holders: dict[PodRef, Running]) -> None:
        self.cluster, self.holders = cluster, dict(holders)
        self.views = {name: st.view for name, st in cluster.nodes.items()}
        self.generation = 0
        self.queues = SimpleNamespace(revision=0)
        self.usage = SimpleNamespace(revision=0)
        self.ledgers: dict[str, NodeLedger] = {}
        for name in self.views:
            self._ledger(name)

    def _ledger(self, name: str) -> None:
        allocs = {alloc_key(a.pod): Allocation(gang_id=self.holders[a.pod].gang_id, attempt=1, assignment=a)
                  for a in self.views[name].allocations}
        self.ledgers[name] = NodeLedger(node=name, allocations=allocs)

    def ledger_of(self, key: str) -> NodeLedger | None:
        return self.ledgers.get(key)

    def gang(self, gang_id: str):
        return None  # the holders' queue and age are not what is measured

    def set_allocations(self, name: str, allocations: tuple) -> None:
        view = replace(self.views[name], allocations=allocations)
        self.views[name] = view
        self.cluster.upsert(view)
        self._ledger(name)
        self.generation += 1


class NoQueues:
    def tree(self) -> QueueTree:
        return QueueTree.of(())

    def chain(self, members) -> tuple[str, ...]:
        return ()

    def held(self, queue: str) -> int:
        return 0

    def limited_held(self, chain) -> dict[str, int]:
        return {}

    def _replaced(self, gang_id, keep) -> dict[str, int]:
        return {}


def gang(name: str, members: int, gpus: int) -> tuple[MemberSpec, ...]:
    return tuple(MemberSpec(pod=PodRef(namespace="bench", name=f"{name}-{i}"), gpus=gpus) for i in range(members))


def run(cluster: Cluster, holders: dict[PodRef, Running], *, cycles: int, pending: int, seed: int,
        budget: ProbeBudget) -> dict:
    """CPU seconds of decisions and probes over ``cycles`` cycles (the cluster is changed: a copy is not)."""
    cluster = Cluster.from_snapshot(Snapshot(nodes=tuple(st.view for st in cluster.nodes.values())))
    cache = BenchCache(cluster, holders)
    clock = time.process_time
    probes = Probes(cache, NoQueues(), budget, clock=clock, now=lambda: 1e6)  # type: ignore[arg-type]
    rng = random.Random(seed)
    waiting = [(f"bench/pending{i}", gang(f"pending{i}", *SHAPES[i % len(SHAPES)])) for i in range(pending)]
    decide_s = probe_s = 0.0
    refused = answered = 0
    per_run: list[float] = []
    skip_s = 0.0
    for c in range(cycles):
        # A few running gangs end, a few one-GPU pods arrive: the view changes every cycle.
        gangs = sorted({r.gang_id for r in cache.holders.values()})
        for gone in rng.sample(gangs, min(3, len(gangs))):
            for name, view in list(cache.views.items()):
                left = tuple(a for a in view.allocations if cache.holders[a.pod].gang_id != gone)
                if len(left) != len(view.allocations):
                    cache.set_allocations(name, left)
        arrivals = [(f"bench/new{c}-{k}", gang(f"new{c}-{k}", 1, 1)) for k in range(3)]
        for i, (gang_id, members) in [(-1, a) for a in arrivals] + list(enumerate(waiting)):
            started = clock()
            got = decide(cache.cluster, members, DEFAULT_PROFILE)
            if not isinstance(got, Decision):
                decide(cache.cluster, members, DEFAULT_PROFILE)  # placement's empty-cluster decision costs as much
            decide_s += clock() - started
            if isinstance(got, Decision):
                by_node: dict[str, list] = {}
                for a in got.assignments:
                    cache.holders[a.pod] = Running(gang_id=gang_id)
                    by_node.setdefault(a.node, []).append(a)
                for name, new in by_node.items():
                    cache.set_allocations(name, cache.views[name].allocations + tuple(new))
                if i >= 0:  # a pending gang started: another of its shape takes its place
                    waiting[i] = (f"{gang_id}.{c}", gang(f"{gang_id[6:]}.{c}", len(members), members[0].gpus))
                continue
            refused += 1
            summary = got.summary  # placement words its reply with it anyway
            runs_before, started = probes.runs, clock()
            answer = probes.answer(gang_id, members, cache.cluster, DEFAULT_PROFILE, refusal=summary)
            spent = clock() - started
            probe_s += spent
            if probes.runs > runs_before:
                per_run.append(spent)
            else:
                skip_s += spent
            answered += answer is not None and bool(answer.answers)
    return {"decide_s": decide_s, "probe_s": probe_s, "refused": refused, "answered": answered,
            "runs": probes.runs, "reused": probes.reused, "skipped": probes.skipped,
            "per_run_ms": statistics.median(per_run) * 1000 if per_run else 0.0,
            "run_s": sum(per_run), "skip_s": skip_s}


def share_report(cluster: Cluster, holders: dict[PodRef, Running], *, cycles: int, pending: int,
                 seed: int) -> list[str]:
    c = Config()
    budgets = {f"placement's default (share {c.whatif_share:g}, burst {c.whatif_burst_s * 1000:g} ms, "
               f"{c.whatif_gang_s * 1000:g} ms a gang)": ProbeBudget(share=c.whatif_share, burst_s=c.whatif_burst_s,
                                                                     gang_s=c.whatif_gang_s, clock=time.process_time),
               "no bound (share 1, 20 ms a gang)": ProbeBudget(share=1.0, burst_s=1e9, gang_s=c.whatif_gang_s,
                                                                clock=time.process_time)}
    lines = [f"placement cycles: {cycles} cycles, {pending} pending gangs decided again each, 3 running gangs end "
             f"and 3 one-GPU pods arrive per cycle (CPU seconds, time.process_time)",
             f"{'budget':<58} {'decisions':>9} {'probes':>8} {'share':>6} {'refusals':>8} {'answered':>8} "
             f"{'probe runs':>10} {'kept':>5} {'skipped':>7} {'ms/run':>7}  (share: of decisions + probes)"]
    for label, budget in budgets.items():
        r = run(cluster, holders, cycles=cycles, pending=pending, seed=seed, budget=budget)
        share = r["probe_s"] / max(1e-9, r["decide_s"] + r["probe_s"])
        lines.append(f"{label:<58} {r['decide_s']:8.2f}s {r['probe_s']:7.2f}s {share:6.1%} {r['refused']:8} "
                     f"{r['answered']:8} {r['runs']:10} {r['reused']:5} {r['skipped']:7} {r['per_run_ms']:7.2f}")
    return lines
