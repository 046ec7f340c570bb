"""Placement decision time and memory on synthetic clusters, Phalanx's engine vs first fit.

Synthetic cluster: N nodes x 8 V100 (the DGX-1V hybrid cube-mesh fixture), three network
tiers (HyperNode = 8 nodes, leaf switch = 64 nodes, network-pod = 512 nodes), and 50 % of the
GPUs taken at random by whole-GPU reservations; every node reports its Kubernetes state
(Ready, 96 cores, 768 GiB), so the Kubernetes filters run too. Requests: a 1-GPU pod, an 8-GPU pod, and gangs
of 8, 64 and 512 one-GPU members. Decisions are not applied, so every decision sees the same
50 % occupancy. Each cluster size runs in its own process so peak RSS is per size.

    python bench/placement_speed.py                       # 1,000 / 5,000 / 10,000 nodes
    python bench/placement_speed.py --nodes 5000 --json
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from phalanx_bench.firstfit import free_gpus, place_first_fit
from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import NetworkTiers
from phalanx_topology import load_file

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
KUBE = NodeKubeState(allocatable={"cpu": 96_000, "memory": 768 << 30, "ephemeral-storage": 2 << 40, "pods": 110},
                     labels={"node.kubernetes.io/instance-type": "dgx1v"}, ready="True")
"""Every node's Kubernetes state: a DGX-1V-sized node, Ready, nothing else running."""
CASES = [("1-GPU pod", 1, 1, 400), ("8-GPU pod", 1, 8, 100), ("gang of 8", 8, 1, 30),
         ("gang of 64", 64, 1, 15), ("gang of 512", 512, 1, 6)]
"""(name, members, GPUs per member, decisions)."""


def synthetic(n: int, seed: int) -> Snapshot:
    rng = random.Random(seed)
    base = load_file(FIXTURE, node="x")
    nodes = []
    for i in range(n):
        name = f"n{i:05d}"
        taken = tuple(g for g in range(8) if rng.random() < 0.5)
        allocs = (Assignment(pod=PodRef(namespace="bg", name=f"bg-{i}"), node=name, gpus=taken),) if taken else ()
        nodes.append(NodeView(name=name, topology=msgspec.structs.replace(base, node=name), allocations=allocs,
                              tiers=NetworkTiers(hypernode=f"hn{i // 8}", leaf=f"leaf{i // 64}", netpod=f"pod{i // 512}"),
                              kube=KUBE))
    return Snapshot(nodes=tuple(nodes))


def gang(members: int, gpus: int, k: int) -> tuple[MemberSpec, ...]:
    return tuple(MemberSpec(pod=PodRef(namespace="bench", name=f"g{k}-m{j}"), gpus=gpus) for j in range(members))


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def run_size(n: int, seed: int, baseline: bool) -> dict:
    t0 = time.perf_counter()
    snap = synthetic(n, seed)
    cluster = Cluster.from_snapshot(snap)
    build_ms = (time.perf_counter() - t0) * 1000
    free = free_gpus(snap) if baseline else {}
    out = {"nodes": n, "build_ms": round(build_ms, 1), "cases": []}
    for name, members, gpus, decisions in CASES:
        row = {"case": name}
        for engine in ("phalanx", "first-fit") if baseline else ("phalanx",):
            times, placed = [], 0
            for k in range(decisions if engine == "phalanx" else max(3, decisions // 4)):
                g = gang(members, gpus, k)
                start = time.perf_counter()
                result = decide(cluster, g) if engine == "phalanx" else place_first_fit(snap, g, free)
                times.append((time.perf_counter() - start) * 1000)
                placed += hasattr(result, "assignments")
            row[engine] = {"p50_ms": round(statistics.median(times), 3), "p99_ms": round(pct(times, 0.99), 3),
                           "placed": placed, "decisions": len(times)}
        out["cases"].append(row)
        print(f"  {n:>6} nodes  {name:<12} phalanx p50 {row['phalanx']['p50_ms']:8.3f} ms  "
              f"p99 {row['phalanx']['p99_ms']:8.3f} ms", file=sys.stderr, flush=True)
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def table(results: list[dict]) -> str:
    lines = [f"{'nodes':>6}  {'request':<12} {'phalanx p50':>12} {'phalanx p99':>12} {'placed':>8} "
             f"{'first-fit p50':>14} {'first-fit p99':>14} {'placed':>7}",
             "-" * 94]
    for r in results:
        for c in r["cases"]:
            p, f = c["phalanx"], c.get("first-fit")
            ff = (f"{f['p50_ms']:>11.3f} ms {f['p99_ms']:>11.3f} ms {f['placed']:>3}/{f['decisions']:<3}" if f
                  else f"{'-':>14} {'-':>14} {'-':>7}")
            lines.append(f"{r['nodes']:>6}  {c['case']:<12} {p['p50_ms']:>9.3f} ms {p['p99_ms']:>9.3f} ms "
                         f"{p['placed']:>4}/{p['decisions']:<3} {ff}")
        lines.append(f"{'':>6}  snapshot build {r['build_ms']:.0f} ms, peak RSS {r['peak_rss_mib']:.0f} MiB")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, action="append", help="cluster size (repeatable; default 1000 5000 10000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-baseline", action="store_true", help="skip the first-fit baseline")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = args.nodes or [1000, 5000, 10000]
    if args.child:
        print(json.dumps(run_size(sizes[0], args.seed, not args.no_baseline)))
        return 0
    results = []
    for n in sizes:
        print(f"cluster of {n} nodes x 8 GPUs ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--child", "--nodes", str(n), "--seed", str(args.seed)]
        if args.no_baseline:
            cmd.append("--no-baseline")
        proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        results.append(json.loads(proc.stdout))
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
