"""How close ``phalanx sim`` comes to the running scheduler on the same workload.

One workload (seeded): ``--gangs`` gangs arriving at random over ``--span-s`` seconds, each
running ``--min-s`` to ``--max-s`` seconds once all its pods are bound, in shapes users submit
(single pods of 1, 2, 4 and 8 GPUs; gangs of 2 x 4, 4 x 8 and 8 x 1 GPUs, JobSet-labelled), on
a synthetic cluster (``--cluster``, default 16 x 8 V100 in network tiers). It is run twice:

* **live**: the real services (a nats-server with auth and TLS, placement, gang-coordinator,
  binder, each node's agents; ``phalanx_localstack``) on the simulated Kubernetes cluster; a
  driver creates each gang's pods at its arrival time, notes when the whole gang is bound and
  where, and deletes its pods once it has run its duration;
* **sim**: ``phalanx sim``'s loop (``phalanx_sim.loop.Simulation``) on the same cluster and the
  same objects (written once as a YAML workload with ``sim.phalanx.io/arrival`` and
  ``duration`` annotations and read back by ``phalanx_sim.workload``), in virtual time.

Printed, gang by gang matched by id: how many started in each; start time (live minus sim)
p50 and p90 of the absolute difference; wait p50/p90 in each; the share of gangs placed at the
same network tier, and in the same domain of it (the same node for a gang on one node, the same
HyperNode, ...); each run's wall time.

    .venv/bin/python bench/sim_accuracy.py
    .venv/bin/python bench/sim_accuracy.py --gangs 120 --span-s 120 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import anyio
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from phalanx_engine.decide import Cluster  # noqa: E402
from phalanx_engine.snapshot import Snapshot  # noqa: E402
from phalanx_engine.whatif import tier_of  # noqa: E402
from phalanx_localstack.stack import Stack  # noqa: E402
from phalanx_localstack.synthetic import synthetic_cluster  # noqa: E402
from phalanx_proto.events import Assignment, PodRef  # noqa: E402
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION  # noqa: E402
from phalanx_rules.queues import QueueTree  # noqa: E402
from phalanx_sim import cluster as sim_cluster  # noqa: E402
from phalanx_sim import loop, workload  # noqa: E402
from stackutil import connect, seed_nodes  # noqa: E402

SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (4, 8), (8, 1))
"""(pods, GPUs per pod), drawn uniformly."""
POLL_S = 0.1


def build(args) -> list[dict]:
    """The workload's pods, in arrival order, each annotated with its gang's arrival and duration."""
    rng = random.Random(args.seed)
    arrivals = sorted(rng.uniform(0, args.span_s) for _ in range(args.gangs))
    pods = []
    for i, at in enumerate(arrivals):
        n, gpus = rng.choice(SHAPES)
        duration = round(rng.uniform(args.min_s, args.max_s), 1)
        name = f"g{i:03d}"
        for j in range(n):
            labels = {"jobset.sigs.k8s.io/jobset-name": name, "aliyun.com/min-member": str(n)} if n > 1 else {}
            pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"{name}-{j}" if n > 1 else name, "namespace": "default", "labels": labels,
                "annotations": {workload.ARRIVAL: f"{at:.3f}s", workload.DURATION: f"{duration}s"}},
                "spec": {"schedulerName": "phalanx", "containers": [{"name": "c", "image": "x", "resources": {
                    "limits": {"nvidia.com/gpu": str(gpus)}}}]}})
    return pods


def gang_of(pod: dict) -> str:
    js = pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name")
    return f"default/JobSet:{js}" if js else f"default/{pod['metadata']['name']}"


def seconds(text: str) -> float:
    return float(text.removesuffix("s"))


async def live_run(pods: list[dict], cluster_spec: str, work: Path, cap_s: float) -> dict[str, dict]:
    """gang → {start, nodes (assignments)}; started gangs only."""
    stack = Stack(synthetic_cluster(cluster_spec), workdir=str(work / "stack"))
    stack.start_nats()
    os.environ.update(stack.identity_env("admin"))  # this driver acts as the admin identity
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        gangs: dict[str, list[dict]] = {}
        for p in pods:
            gangs.setdefault(gang_of(p), []).append(p)
        arrival = {g: seconds(ps[0]["metadata"]["annotations"][workload.ARRIVAL]) for g, ps in gangs.items()}
        duration = {g: seconds(ps[0]["metadata"]["annotations"][workload.DURATION]) for g, ps in gangs.items()}
        started: dict[str, dict] = {}
        ended: set[str] = set()
        due = sorted(gangs, key=lambda g: arrival[g])
        t0 = time.monotonic()
        while len(ended) < len(gangs) and time.monotonic() - t0 < cap_s:
            now = time.monotonic() - t0
            while due and arrival[due[0]] <= now:
                for p in gangs[due.pop(0)]:
                    await sim.apply_pod(p)
            bound: dict[str, list[Assignment]] = {}
            for p in await sim.list_pods():
                if p.node_name:
                    a = json.loads(p.annotations.get(ASSIGNMENT_ANNOTATION, "{}"))
                    g = gang_of({"metadata": {"labels": p.labels, "name": p.name}})
                    bound.setdefault(g, []).append(Assignment(pod=PodRef(namespace=p.namespace, name=p.name),
                                                              node=p.node_name, gpus=tuple(a.get("gpus", ()))))
            for g, got in bound.items():
                if g not in started and len(got) == len(gangs[g]):
                    started[g] = {"start": now, "assignments": tuple(got)}
            for g, s in started.items():
                if g not in ended and now >= s["start"] + duration[g]:
                    for p in gangs[g]:
                        await sim.delete_pod(PodRef(namespace="default", name=p["metadata"]["name"]))
                    ended.add(g)
            await anyio.sleep(POLL_S)
        return started
    finally:
        await bus.close()
        stack.stop()


def sim_run(pods: list[dict], cluster_spec: str, work: Path) -> loop.Simulation:
    path = work / "workload.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    tree = QueueTree.of(())
    gangs = workload.read_workload([str(path)], tree, {}, None)
    return loop.Simulation(sim_cluster.views(synthetic_cluster(cluster_spec)), gangs, tree).run()


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def compare(pods: list[dict], live: dict[str, dict], sim: loop.Simulation, cluster_spec: str) -> dict:
    empty = Cluster.from_snapshot(Snapshot(nodes=sim_cluster.views(synthetic_cluster(cluster_spec))))
    arrival = {gang_of(p): seconds(p["metadata"]["annotations"][workload.ARRIVAL]) for p in pods}
    sim_started = {g: o for g, o in sim.outcomes.items() if o.start is not None}
    both = sorted(set(live) & set(sim_started))
    diffs = [abs(live[g]["start"] - sim_started[g].start) for g in both]
    where = {g: tier_of(empty, live[g]["assignments"]) for g in both}
    same_tier = sum(1 for g in both if where[g][0] == sim_started[g].tier)
    same_domain = sum(1 for g in both if where[g] == (sim_started[g].tier, sim_started[g].domain))
    return {
        "gangs": len(arrival), "started_live": len(live), "started_sim": len(sim_started), "started_both": len(both),
        "start_diff_p50_s": pct(diffs, 50), "start_diff_p90_s": pct(diffs, 90),
        "wait_live_p50_s": pct([live[g]["start"] - arrival[g] for g in live], 50),
        "wait_live_p90_s": pct([live[g]["start"] - arrival[g] for g in live], 90),
        "wait_sim_p50_s": pct([o.start - arrival[g] for g, o in sim_started.items()], 50),
        "wait_sim_p90_s": pct([o.start - arrival[g] for g, o in sim_started.items()], 90),
        "same_tier_pct": round(100 * same_tier / len(both), 1) if both else None,
        "same_domain_pct": round(100 * same_domain / len(both), 1) if both else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default="16x8v100", help="synthetic cluster spec (default %(default)s)")
    p.add_argument("--gangs", type=int, default=60, help="gangs in the workload (default %(default)s)")
    p.add_argument("--span-s", type=float, default=60.0, help="arrivals spread over this many seconds (default %(default)s)")
    p.add_argument("--min-s", type=float, default=10.0, help="shortest run (default %(default)s)")
    p.add_argument("--max-s", type=float, default=40.0, help="longest run (default %(default)s)")
    p.add_argument("--cap-s", type=float, default=300.0, help="stop the live run after this long (default %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    pods = build(args)
    with tempfile.TemporaryDirectory(prefix="phalanx-simacc-") as tmp:
        work = Path(tmp)
        t = time.monotonic()
        sim = sim_run(pods, args.cluster, work)
        sim_wall = time.monotonic() - t
        print(f"sim: {sim_wall:.2f} s; live run (up to {args.cap_s:.0f} s) ...", file=sys.stderr)
        t = time.monotonic()
        live = anyio.run(live_run, pods, args.cluster, work, args.cap_s)
        live_wall = time.monotonic() - t
    result = {**compare(pods, live, sim, args.cluster), "live_wall_s": round(live_wall, 1), "sim_wall_s": round(sim_wall, 2)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    def f(v):
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
    print(f"{args.gangs} gangs on {args.cluster}, arrivals over {args.span_s:.0f} s, runs {args.min_s:.0f}-{args.max_s:.0f} s")
    print(f"  started: live {result['started_live']}, sim {result['started_sim']}, both {result['started_both']}")
    print(f"  |start live - start sim|: p50 {f(result['start_diff_p50_s'])} s, p90 {f(result['start_diff_p90_s'])} s")
    print(f"  wait p50 / p90: live {f(result['wait_live_p50_s'])} / {f(result['wait_live_p90_s'])} s, "
          f"sim {f(result['wait_sim_p50_s'])} / {f(result['wait_sim_p90_s'])} s")
    print(f"  same network tier: {f(result['same_tier_pct'])} %, same tier and domain (the node, HyperNode, ... "
          f"it landed in): {f(result['same_domain_pct'])} %")
    print(f"  wall time: live {result['live_wall_s']} s, sim {result['sim_wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
