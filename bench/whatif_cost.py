"""What the counterfactual probes (``phalanx_engine.whatif``) cost per pending gang.

A synthetic cluster of N x 8 V100 nodes in network tiers (``phalanx sim --synthetic``'s), filled
to a target share of its GPUs by pods and gangs the engine placed (each gang's reservations
known by owner, as placement's ledger knows them); then, for gangs that do not fit, the engine's
refusal (what placement already pays: ``decide`` with the reasons) and the probes, with the
default time budget and without one. Prints p50/p99 in CPU milliseconds (``time.process_time``,
also the probes' clock here: the shared machine's load makes wall time jitter several times),
the engine decisions the probes made, which probes answered and which ran out of time.

Then placement's share (``--cycles``): scheduling cycles as placement runs them, on the same
cluster, with the service's own ``phalanx_placement.whatif.Probes`` (its budget, its kept
answers): each cycle a few one-GPU pods arrive and are placed, a few running gangs end (so the
cluster view changes every cycle and no answer can be kept: the worst case), and the pending
gangs are decided again, the probes run for each that does not fit. Prints the CPU seconds of
the decisions (the decision plus, on a refusal, the empty-cluster decision placement makes)
and of the probes, the probes' share, and how many refusals got answers, kept ones or none
(budget spent); once with placement's default budget and once with no bound.

Usage (from the repository root)::

    nice -n 10 .venv/bin/python bench/whatif_cost.py                 # 1,000 nodes
    .venv/bin/python bench/whatif_cost.py --nodes 200 --repeat 3     # quicker
    .venv/bin/python bench/whatif_cost.py --repeat 0 --cycles 50     # placement's share only
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import Decision, NoFit, Snapshot
from phalanx_engine.whatif import DEFAULT_BUDGET_S, ProbeContext, Running, what_if
from phalanx_localstack.synthetic import synthetic_cluster
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_sim.cluster import views

SHAPES = {"1 x 8 GPUs": (1, 8), "8 x 8 GPUs": (8, 8), "32 x 8 GPUs": (32, 8), "64 x 4 GPUs": (64, 4)}


def gang(name: str, members: int, gpus: int) -> tuple[MemberSpec, ...]:
    return tuple(MemberSpec(pod=PodRef(namespace="bench", name=f"{name}-{i}"), gpus=gpus) for i in range(members))


def filled(nodes: int, target: float, seed: int) -> tuple[Cluster, dict[PodRef, Running]]:
    """The cluster with random gangs placed until ``target`` of its GPUs are held."""
    base = {v.name: v for v in views(synthetic_cluster(f"{nodes}x8v100"))}
    cluster = Cluster.from_snapshot(Snapshot(nodes=tuple(base.values())))
    rng = random.Random(seed)
    holders: dict[PodRef, Running] = {}
    total, held, k, misses = nodes * 8, 0, 0, 0
    while held < target * total and misses < 200:
        members, gpus = rng.choice([(1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (4, 8), (1, 1), (1, 2)])
        g = gang(f"g{k}", members, gpus)
        got = decide(cluster, g, explain=False)
        if not isinstance(got, Decision):
            misses += 1
            continue
        for a in got.assignments:
            holders[a.pod] = Running(gang_id=f"bench/g{k}", queue=rng.choice(["team-a", "team-b"]),
                                     priority=rng.choice([0, 0, 10]), since=float(k))
            base[a.node] = replace(base[a.node], allocations=(*base[a.node].allocations, a))
            cluster.upsert(base[a.node])
        held += members * gpus
        k += 1
    for name in sorted(cluster.nodes):  # no node left wholly free: an 8-GPU member waits anywhere
        if len(cluster.nodes[name].free_whole()) == 8:
            pin = (MemberSpec(pod=PodRef(namespace="bench", name=f"g{k}-0"), gpus=1, node_name=name),)
            got = decide(cluster, pin, explain=False)
            assert isinstance(got, Decision), got
            holders[pin[0].pod] = Running(gang_id=f"bench/g{k}", queue="team-a", since=float(k))
            base[name] = replace(base[name], allocations=(*base[name].allocations, *got.assignments))
            cluster.upsert(base[name])
            k += 1
    return cluster, holders


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--fill", type=float, default=0.93, help="share of the GPUs held (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=10, help="gangs of each shape probed (default %(default)s)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cycles", type=int, default=20, help="placement cycles for the share (0: none; default %(default)s)")
    ap.add_argument("--pending", type=int, default=16, help="pending gangs decided every cycle (default %(default)s)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cluster, holders = filled(args.nodes, args.fill, args.seed)
    held = sum(len(st.gpus) - len(st.free_whole()) for st in cluster.nodes.values())
    print(f"{args.nodes} nodes x 8 V100 (HyperNode 8, leaf 64, network-pod 512), {held}/{args.nodes * 8} GPUs held by "
          f"{len({r.gang_id for r in holders.values()})} gangs; filled in {time.perf_counter() - t0:.1f} s")
    print(f"{'pending gang':<13} {'refusal p50':>11} {'probes p50':>10} {'p99':>8} {'decisions':>9} "
          f"{'unbounded p50':>13} {'p99':>8} {'decisions':>9}  answers with the {DEFAULT_BUDGET_S * 1000:g} ms "
          "budget; probes cut by it")
    ctx = ProbeContext(holders=holders, now=1e6)
    for label, (members, gpus) in SHAPES.items():
        refusal, bounded, unbounded, probes = [], [], [], []
        for r in range(args.repeat):
            g = gang(f"pending{r}", members, gpus)
            started = time.process_time()
            got = decide(cluster, g)
            refusal.append(time.process_time() - started)
            if not isinstance(got, NoFit):
                print(f"{label}: fits; raise --fill")
                break
            for budget, out in ((DEFAULT_BUDGET_S, bounded), (float("inf"), unbounded)):
                result = what_if(cluster, g, ctx=ctx, budget_s=budget, clock=time.process_time)
                out.append((result.spent_ms, result))
            probes.append(bounded[-1][1])
        if not bounded:
            continue
        ms = lambda xs: [x for x, _ in xs]  # noqa: E731
        dec = lambda xs: statistics.median(r.decisions for _, r in xs)  # noqa: E731
        answered = sorted({a.probe for r in probes for a in r.answers})
        cut = sorted({c for r in probes for c in r.cut})
        print(f"{label:<13} {statistics.median(refusal) * 1000:9.2f}ms {statistics.median(ms(bounded)):8.2f}ms "
              f"{pct(ms(bounded), 0.99):6.2f}ms {dec(bounded):9.0f} {statistics.median(ms(unbounded)):11.2f}ms "
              f"{pct(ms(unbounded), 0.99):6.2f}ms {dec(unbounded):9.0f}  {','.join(answered) or '-'}; "
              f"{','.join(cut) or '-'}")
    if args.cycles:
        from placement_share import share_report

        print()
        for line in share_report(cluster, holders, cycles=args.cycles, pending=args.pending, seed=args.seed):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
