"""Preemption planner time on full synthetic clusters, and its greedy search against the exact one
on small clusters.

Large clusters: N nodes x 8 V100 (the DGX-1V hybrid cube-mesh fixture), HyperNode = 8 nodes,
leaf switch = 64, network-pod = 512, every node reporting its Kubernetes state; every GPU held
by a running gang. Per HyperNode the gangs are drawn at random: with probability 0.15 one gang
of 8 x 8 GPUs over its 8 nodes, 0.15 a gang of 4 x 8 on four of them, and otherwise pods and
gangs of 1, 2 and 4 GPUs (a gang of 2 x 4 across two nodes among them) on random GPUs of each
node; priorities 0-2, queues team-a (quota 30 % of the GPUs), team-b (quota 30 %) and
default (quota 0), 25 % of the gangs each in team-a, 60 % in team-b, 15 % in default; start
times random. Preemptors: a 1-, 4- and 8-GPU pod, gangs of 4 x 8 and 16 x 8 (priority 10,
team-b: within the queue), an 8-GPU pod of team-a (priority 0: reclaim from team-b and
default, which hold more than their quotas), and a gang of 64 x 8 that cannot be helped.
Each plan runs ``--repeat`` times on the same cluster (plans do not change it).

Small clusters (``--small K``): K seeded random clusters of 3 nodes (one HyperNode) filled the
same way, with 0-2 gangs taken out again, and a random preemptor. The default bounds search
them exhaustively (``SearchStats.exact``; tests/unit/test_preempt_brute_force.py proves such a
choice equals the brute-force optimum); against that optimum, the greedy search alone
(``exact_victims=0``): how often it finds a plan, how often the same one, and its GPUs
evicted per GPU the preemptor gets.

    python bench/preemption.py                        # 100 / 1,000 / 5,000 nodes and --small 200
    python bench/preemption.py --nodes 1000 --repeat 3 --small 0
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import msgspec

from phalanx_engine.decide import Cluster
from phalanx_engine.preempt import Plan, Preemptor, RunningGang, SearchBounds, plan_preemption
from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import NetworkTiers
from phalanx_rules.queues import QueueTree
from phalanx_topology import load_file

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
KUBE = NodeKubeState(allocatable={"cpu": 96_000, "memory": 768 << 30, "ephemeral-storage": 2 << 40, "pods": 110},
                     ready="True")
CASES = [("1-GPU pod", "team-b", 10, [1]), ("4-GPU pod", "team-b", 10, [4]), ("8-GPU pod", "team-b", 10, [8]),
         ("gang 4 x 8", "team-b", 10, [8] * 4), ("gang 16 x 8", "team-b", 10, [8] * 16),
         ("reclaim 8-GPU", "team-a", 0, [8]), ("gang 64 x 8", "team-b", 10, [8] * 64)]
"""(name, queue, priority, GPUs per member)."""


class Filler:
    """Running gangs put on exact GPUs of a synthetic cluster."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.allocs: dict[str, list[Assignment]] = {}
        self.gangs: list[RunningGang] = []

    def gang(self, members: list[tuple[str, tuple[int, ...]]], queue: str | None = None) -> None:
        k = len(self.gangs)
        queue = queue or self.rng.choices(["team-a", "team-b", "default"], [25, 60, 15])[0]
        out = tuple(Assignment(pod=PodRef(namespace="bench", name=f"g{k}-{i}", uid=f"u{k}-{i}"), node=n, gpus=gpus)
                    for i, (n, gpus) in enumerate(members))
        for a in out:
            self.allocs.setdefault(a.node, []).append(a)
        self.gangs.append(RunningGang(gang_id=f"bench/g{k}", assignments=out, priority=self.rng.randint(0, 2),
                                      queues=(queue,), started_at=self.rng.uniform(0, 86_400)))


def full_cluster(n: int, seed: int, hypernode: int = 8, drop: int = 0) -> tuple[Snapshot, list[RunningGang], QueueTree]:
    """The cluster, its running gangs and queues; ``drop``: gangs taken out at random again
    (their GPUs left free)."""
    rng = random.Random(seed)
    base = load_file(FIXTURE, node="x")
    names = [f"n{i:05d}" for i in range(n)]
    fill = Filler(rng)
    for h in range(0, n, hypernode):
        group = names[h:h + hypernode]
        roll = rng.random()
        if roll < 0.15 and len(group) == 8:
            fill.gang([(m, tuple(range(8))) for m in group])
            continue
        if roll < 0.30 and len(group) >= 4:
            wide = rng.sample(group, 4)
            fill.gang([(m, tuple(range(8))) for m in sorted(wide)])
            group = [m for m in group if m not in wide]
        free = {m: rng.sample(range(8), 8) for m in group}
        for m in group:
            while free[m]:
                size = rng.choice([s for s in (1, 2, 4) if s <= len(free[m])])
                other = next((o for o in group if o != m and len(free[o]) >= 4), None)
                if size == 4 and other is not None and rng.random() < 0.3:
                    fill.gang([(m, tuple(sorted(free[m].pop() for _ in range(4)))),
                               (other, tuple(sorted(free[other].pop() for _ in range(4))))])
                else:
                    fill.gang([(m, tuple(sorted(free[m].pop() for _ in range(size))))])
    gone = set(rng.sample([g.gang_id for g in fill.gangs], min(drop, len(fill.gangs))))
    gangs = [g for g in fill.gangs if g.gang_id not in gone]
    held = {a.pod for g in gangs for a in g.assignments}
    nodes = tuple(NodeView(name=m, topology=msgspec.structs.replace(base, node=m),
                           allocations=tuple(a for a in fill.allocs.get(m, ()) if a.pod in held),
                           tiers=NetworkTiers(hypernode=f"hn{i // hypernode}", leaf=f"leaf{i // 64}", netpod=f"pod{i // 512}"),
                           kube=KUBE) for i, m in enumerate(names))
    capacity = 8 * n * GPU_UNITS
    tree = QueueTree.of([QueueSpec(name="team-a", quota=capacity * 3 // 10), QueueSpec(name="team-b", quota=capacity * 3 // 10)])
    return Snapshot(nodes=nodes), gangs, tree


def preemptor(queue: str, priority: int, sizes: list[int], k: int) -> Preemptor:
    members = tuple(MemberSpec(pod=PodRef(namespace="hi", name=f"p{k}-{i}"), gpus=s) for i, s in enumerate(sizes))
    return Preemptor(gang_id=f"hi/p{k}", members=members, priority=priority, queue=queue)


def run_large(n: int, seed: int, repeat: int) -> None:
    t0 = time.perf_counter()
    snap, gangs, tree = full_cluster(n, seed)
    cluster = Cluster.from_snapshot(snap)
    print(f"\n{n} nodes, {len(gangs)} running gangs, cluster built in {(time.perf_counter() - t0) * 1000:.0f} ms", flush=True)
    print(f"{'preemptor':<15} {'p50':>9} {'max':>9}  {'result':<34} {'cands':>5} {'doms':>4} {'sets':>5} {'trials':>6} exact")
    for k, (name, queue, prio, sizes) in enumerate(CASES):
        times, got = [], None
        for _ in range(repeat):
            start = time.perf_counter()
            got = plan_preemption(cluster, preemptor(queue, prio, sizes, k), gangs, tree, now=86_400.0)
            times.append((time.perf_counter() - start) * 1000)
        s = got.search
        if isinstance(got, Plan):
            rules = sorted({v.rule for v in got.victims})
            result = f"{len(got.victims)} gang(s), {got.gpus:g} GPUs, {'+'.join(rules)}"
        else:
            result = f"no plan: {got.code}"
        print(f"{name:<15} {statistics.median(times):>6.0f} ms {max(times):>6.0f} ms  {result:<34} {s.candidates:>5} "
              f"{s.domains:>4} {s.sets:>5} {s.trials:>6} {s.exact}", flush=True)


def run_small(cases: int, seed: int) -> dict:
    """The planner on ``cases`` seeded 3-node clusters: how many need victims, how many of those it
    searched exhaustively (where its choice is the brute-force optimum), and the greedy search
    alone against it; GPUs evicted per GPU gained averaged where both found a plan."""
    need = found = same = proven = 0
    evicted_exact, evicted_greedy = [], []
    for k in range(cases):
        rng = random.Random(seed * 100_000 + k)
        snap, gangs, tree = full_cluster(3, seed * 100_000 + k, hypernode=3, drop=rng.randint(0, 2))
        p = preemptor(rng.choice(["team-a", "team-b"]), rng.randint(1, 3), rng.choice([[1], [2], [4], [8], [4, 4]]), k)
        exact = plan_preemption(Cluster.from_snapshot(snap), p, gangs, tree, now=86_400.0)
        if not isinstance(exact, Plan) or not exact.victims:
            continue
        greedy = plan_preemption(Cluster.from_snapshot(snap), p, gangs, tree, now=86_400.0,
                                 bounds=SearchBounds(exact_victims=0))
        need += 1
        proven += exact.search.exact
        gained = sum(m.gpus for m in p.members)
        if isinstance(greedy, Plan):
            found += 1
            same += greedy.victims == exact.victims
            evicted_exact.append(exact.gpus / gained)
            evicted_greedy.append(greedy.gpus / gained)
    return {"cases": cases, "need": need, "exhaustive": proven, "greedy_found": found, "greedy_same": same,
            "optimum_evicted_per_gained": statistics.mean(evicted_exact) if evicted_exact else None,
            "greedy_evicted_per_gained": statistics.mean(evicted_greedy) if evicted_greedy else None}


def small_line(r: dict) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"
    return (f"small clusters (3 nodes): {r['need']} of {r['cases']} need preemption ({r['exhaustive']} searched "
            f"exhaustively); the greedy search alone finds a plan in {r['greedy_found']} of them, the optimal one in "
            f"{r['greedy_same']}; GPUs evicted per GPU gained where both found one: optimum "
            f"{f(r['optimum_evicted_per_gained'])}, greedy {f(r['greedy_evicted_per_gained'])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, action="append", help="cluster size (repeatable; default 100 1000 5000)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small", type=int, default=200, help="small random clusters for greedy vs exact (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    for n in args.nodes or [100, 1000, 5000]:
        run_large(n, args.seed, args.repeat)
    if args.small:
        print("\n" + small_line(run_small(args.small, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
