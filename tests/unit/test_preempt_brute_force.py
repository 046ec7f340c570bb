"""The preemption planner against a brute force, on seeded random small clusters: 2-3 nodes of 8
V100s (the DGX-1V hybrid cube mesh fixture) in one network-pod, sometimes split into
HyperNodes; up to 10 running gangs of 1-2 members on random GPUs, in random queues of a flat or
nested tree with random quotas, limits and policy switches; a random preemptor.

The brute force shares nothing with the planner's search: it writes the contract's rules out
again, tries *every* subset of the running gangs on a cluster rebuilt from the snapshot without
their reservations (``decide`` on ``Cluster.from_snapshot``), and picks the best by the plan
order, written out again as staged comparisons. It uses the planner's ``placement_rank`` (the
definition of "best placement", tested by the table tests), nothing else of it.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import msgspec
from engine_builders import node, pod, snapshot

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.preempt import (
    NoPlan,
    Plan,
    Preemptor,
    RunningGang,
    SearchBounds,
    placement_rank,
    plan_preemption,
)
from phalanx_engine.snapshot import Decision
from phalanx_proto.events import Assignment, PodRef, pod_key
from phalanx_proto.queues import GPU_UNITS, QueueSpec, units_of_member
from phalanx_rules.queues import QueueTree

CASES = 1000
NOW = 10_000.0


@dataclasses.dataclass
class Case:
    seed: int
    snap: object
    gangs: list[RunningGang]
    tree: QueueTree
    preemptor: Preemptor


def random_case(seed: int) -> Case:
    rng = random.Random(seed)
    names = ["a", "b", "c"][:rng.choice([2, 3])]
    split = rng.random() < 0.4
    builders = {n: node(n).gpus(8).tiers(hypernode=("h1" if n != "c" else "h2") if split else "", netpod="np")
                for n in names}
    g = lambda x: round(x * GPU_UNITS)  # noqa: E731 - GPUs to units
    cap = 8 * len(names)
    if rng.random() < 0.5:
        roots = ["team-a", "team-b", "team-c"]
        specs = [QueueSpec(name=q, quota=g(rng.randint(0, cap // 2))) for q in roots]
        chains = {q: (q,) for q in roots}
    else:
        org = rng.randint(2, cap // 2)
        qa = rng.randint(0, org)
        specs = [QueueSpec(name="org", quota=g(org)), QueueSpec(name="team-a", parent="org", quota=g(qa)),
                 QueueSpec(name="team-b", parent="org", quota=g(rng.randint(0, org - qa))),
                 QueueSpec(name="team-c", quota=g(rng.randint(0, cap // 2)))]
        chains = {"org": ("org",), "team-a": ("team-a", "org"), "team-b": ("team-b", "org"), "team-c": ("team-c",)}
    specs = [msgspec.structs.replace(s, within_queue="Never" if rng.random() < 0.15 else "LowerPriority",
                                 reclaim="Never" if rng.random() < 0.15 else "Any",
                                 limit=g(s.quota // GPU_UNITS + rng.randint(0, 6)) if rng.random() < 0.2 else None)
             for s in specs]
    free = {n: rng.sample(range(8), 8) for n in names}
    gangs: list[RunningGang] = []
    fill = rng.uniform(0.9, 1.0)
    while len(gangs) < 10 and sum(8 - len(f) for f in free.values()) < fill * cap:
        members = []
        for n in rng.sample(names, rng.choice([1, 1, 2])):
            size = rng.choice([s for s in (1, 2, 4) if s <= len(free[n])] or [0])
            if size:
                members.append((n, tuple(sorted(free[n].pop() for _ in range(size)))))
        if not members:
            break
        queue = rng.choice(list(chains))
        gid = f"ns/g{len(gangs)}"
        assignments = tuple(Assignment(pod=PodRef(namespace="ns", name=f"g{len(gangs)}-{i}", uid=f"u{len(gangs)}-{i}"),
                                       node=n, gpus=gpus) for i, (n, gpus) in enumerate(members))
        for a in assignments:
            builders[a.node].reserved(a)
        gangs.append(RunningGang(gang_id=gid, assignments=assignments, priority=rng.randint(0, 2),
                                 queues=chains[queue], started_at=rng.uniform(0, 9000) if rng.random() < 0.3 else None))
    sizes = rng.choice([[1], [2], [4], [4], [8], [2, 2], [4, 4], [8, 8], [4, 2]])
    members = tuple(pod(f"p{i}").gpus(s).spec() for i, s in enumerate(sizes))
    preemptor = Preemptor(gang_id="default/p", members=members, priority=rng.randint(1, 3),
                          queue=rng.choice(list(chains)),
                          preemption_policy="Never" if rng.random() < 0.05 else "PreemptLowerPriority")
    return Case(seed, snapshot(*builders.values()), gangs, QueueTree.of(specs), preemptor)


# -- the brute force ------------------------------------------------------------------------------
def units(g: RunningGang) -> int:
    return sum(len(a.gpus) for a in g.assignments) * GPU_UNITS


def allowed(case: Case, held: dict[str, int], victims: tuple[RunningGang, ...]) -> bool:
    """The contract, written out again."""
    p, tree = case.preemptor, case.tree
    spec = tree.get(p.queue)
    chain = tree.chain(p.queue)
    need = sum(units_of_member(m) for m in p.members)
    for v in victims:
        if v.queue == p.queue and (spec.within_queue == "Never" or v.priority >= p.priority):
            return False
        if v.queue != p.queue and (spec.reclaim == "Never" or held.get(p.queue, 0) >= spec.quota):
            return False

    def after(q: str) -> int:
        return held.get(q, 0) - sum(units(v) for v in victims if q in v.queues) + (need if q in chain else 0)

    if any(tree.get(q).limit is not None and after(q) > tree.get(q).limit for q in chain):
        return False
    takers = [v for v in victims if v.queue != p.queue]
    if any(after(q) > tree.get(q).quota for q in chain if any(q not in v.queues for v in takers)):
        return False
    return all(after(q) >= tree.get(q).quota for v in victims for q in v.queues if q not in chain)


def without(case: Case, victims: tuple[RunningGang, ...]) -> Cluster:
    gone = {pod_key(a.pod) for v in victims for a in v.assignments}
    views = tuple(dataclasses.replace(v, allocations=tuple(a for a in v.allocations if pod_key(a.pod) not in gone))
                  for v in case.snap.nodes)
    return Cluster.from_snapshot(dataclasses.replace(case.snap, nodes=views))


def brute_force(case: Case) -> tuple[tuple[str, ...], Decision] | None:
    p = case.preemptor
    held: dict[str, int] = {}
    for g in case.gangs:
        for q in g.queues:
            held[q] = held.get(q, 0) + units(g)
    as_is = decide(without(case, ()), p.members)
    if isinstance(as_is, Decision) and allowed(case, held, ()):
        return (), as_is
    if p.preemption_policy == "Never" or case.tree.problem(p.queue):
        return None
    best = None
    for r in range(1, len(case.gangs) + 1):
        for victims in itertools.combinations(case.gangs, r):
            if not allowed(case, held, victims):
                continue
            cluster = without(case, victims)
            got = decide(cluster, p.members)
            if not isinstance(got, Decision):
                continue
            ids = tuple(sorted(v.gang_id for v in victims))
            lost = sum(units(v) / GPU_UNITS * max(0.0, NOW - v.started_at)
                       for v in sorted(victims, key=lambda v: v.gang_id) if v.started_at is not None)
            cand = ((max(v.priority for v in victims), sum(units(v) for v in victims), len(victims)),
                    placement_rank(cluster, got, p.members), lost, ids, got)
            if best is None or _better(cand, best):
                best = cand
    return None if best is None else (best[3], best[4])


def _better(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return a[0] < b[0]
    if a[1] != b[1]:
        return a[1] > b[1]
    if a[2] != b[2]:
        return a[2] < b[2]
    return a[3] < b[3]


def planned(case: Case, bounds: SearchBounds | None = None) -> Plan | NoPlan:
    return plan_preemption(Cluster.from_snapshot(case.snap), case.preemptor, case.gangs, case.tree, now=NOW,
                           bounds=bounds or SearchBounds())


def test_the_planner_chooses_the_brute_force_optimum_on_small_random_clusters():
    mismatches, kinds = [], {"no plan": 0, "fits as is": 0, "victims": 0}
    for seed in range(CASES):
        case = random_case(seed)
        want, got = brute_force(case), planned(case)
        kinds["no plan" if want is None else "fits as is" if not want[0] else "victims"] += 1
        if want is None:
            ok = isinstance(got, NoPlan)
        else:
            ok = (isinstance(got, Plan) and tuple(v.gang_id for v in got.victims) == want[0]
                  and got.placement == want[1] and got.search.exact)
        if not ok:
            mismatches.append((seed, want and want[0], got))
    assert mismatches == []
    assert kinds["victims"] >= CASES // 6, kinds  # enough cases need victims


def test_the_greedy_search_alone_only_offers_plans_that_keep_the_rules_and_fit():
    found = 0
    for seed in range(CASES // 2):
        case = random_case(seed)
        got = planned(case, SearchBounds(exact_victims=0))
        if not isinstance(got, Plan):
            continue
        victims = tuple(g for g in case.gangs if g.gang_id in {v.gang_id for v in got.victims})
        held: dict[str, int] = {}
        for g in case.gangs:
            for q in g.queues:
                held[q] = held.get(q, 0) + units(g)
        assert allowed(case, held, victims), seed
        assert decide(without(case, victims), case.preemptor.members) == got.placement, seed
        found += bool(victims)
    assert found > 0
