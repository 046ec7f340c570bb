"""One team's unschedulable flood against another team's latency, on one real kube-apiserver.

A control plane (etcd, kube-apiserver v1.36.3, kwok; ``tests/kube/kubeharness.py``) with
``--nodes`` kwok nodes of 8 GPUs, two Queues (``team-a``, ``team-b``, quota half the GPUs each)
and Phalanx as the Deployments run it (``phalanx run … --cluster kube``: a nats-server with auth
and TLS, placement, gang-coordinator, binder, and one ``node-fleet`` process for the nodes'
agents). Two phases in the same run, on the same cluster:

* **quiet**: ``--rounds`` times, team-b creates ``--team-pods`` one-GPU pods at once; the time
  from just before a pod's create request to the moment a pod watch shows it bound is its
  latency; the pods are then deleted and their GPUs given back before the next round;
* **flood**: team-a first submits work that can never fit — ``--flood-pods`` single pods of 9
  GPUs (no node has 9) and ``--flood-gangs`` gangs of twice the cluster's GPUs, one GPU a pod —
  and the bench waits until every flood pod says why it waits (``PodScheduled=False``); then
  the same rounds of team-b as in the quiet phase, with the flood pending all along.

Printed side by side: team-b's latency (p50, max over every pod of every round) quiet and under
the flood, their ratio, and what the flood cost meanwhile — its placement attempts (the pods'
``FailedScheduling`` events) and the API requests of the whole phase per second.

    .venv/bin/python bench/flood.py                          # 2 nodes (16 GPUs), 840 flood pods
    .venv/bin/python bench/flood.py --nodes 4 --rounds 5 --json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kube"))
sys.path.insert(0, str(REPO / "bench"))

import kubeharness  # noqa: E402
import yaml  # noqa: E402
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, gpu_pod  # noqa: E402

from kube_baseline import BindWatch  # noqa: E402
from kwokbench import api_counts, delete_pods, in_threads, kwok_stages, kwok_took_in, say  # noqa: E402
from phalanx_localstack.stack import Stack  # noqa: E402
from phalanx_localstack.synthetic import synthetic_cluster  # noqa: E402
from phalanx_proto.kubeapi import QUEUE_LABEL  # noqa: E402

QUEUES_PATH = "/apis/scheduling.phalanx.io/v1alpha1/queues"
SERVICES = ("placement", "gang-coordinator", "binder")


def queue(name: str, quota: int) -> dict:
    return {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"resources": {"nvidia.com/gpu": {"quota": quota}}}}


def flood_pods(namespace: str, singles: int, gangs: int, gang_size: int) -> list[dict]:
    """Team-a's work that never fits: 9-GPU single pods and gangs bigger than the cluster."""
    out = [gpu_pod(f"big-{i:04d}", namespace, 9, labels={QUEUE_LABEL: "team-a"}) for i in range(singles)]
    for g in range(gangs):
        labels = {QUEUE_LABEL: "team-a", "jobset.sigs.k8s.io/jobset-name": f"wide-{g:03d}",
                  "aliyun.com/min-member": str(gang_size)}
        out += [gpu_pod(f"wide-{g:03d}-{m:03d}", namespace, 1, labels=labels) for m in range(gang_size)]
    return out


def told(api: KubeApi, namespace: str) -> int:
    """Pods of ``namespace`` whose ``PodScheduled`` condition says they wait."""
    return sum(1 for p in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
               if any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                      for c in (p.get("status") or {}).get("conditions") or []))


def failed_scheduling(api: KubeApi, namespace: str) -> int:
    """``FailedScheduling`` events of ``namespace`` counted with their repeats."""
    items = api.get(f"/api/v1/namespaces/{namespace}/events",
                    query={"fieldSelector": "reason=FailedScheduling"})["items"]
    return sum(int(e.get("count") or 1) for e in items)


def rounds(plane: ControlPlane, label: str, namespace: str, n_pods: int, n_rounds: int, cap_s: float) -> list[float]:
    """Team-b's pods, ``n_rounds`` times: each pod's create→bound latency (inf when not bound
    within ``cap_s``)."""
    api = plane.api
    api.create_namespace(namespace)
    out: list[float] = []
    for r in range(n_rounds):
        watch = BindWatch(plane, namespace)
        created: dict[str, float] = {}
        names = [f"b-{r:02d}-{i:02d}" for i in range(n_pods)]

        def create(name: str, created: dict[str, float] = created) -> None:
            created[name] = time.perf_counter()
            api.create_pod(gpu_pod(name, namespace, 1, labels={QUEUE_LABEL: "team-b"}))

        try:
            in_threads(create, names)
            deadline = time.perf_counter() + cap_s
            while not all(n in watch.bound for n in names) and time.perf_counter() < deadline:
                time.sleep(0.02)
        finally:
            watch.close()
        lat = [watch.bound[n][0] - created[n] if n in watch.bound else math.inf for n in names]
        out += lat
        say(f"  [{label}] round {r + 1}/{n_rounds}: p50 {statistics.median(lat):.3f} s, max {max(lat):.3f} s")
        delete_pods(api, namespace)
        time.sleep(1.0)  # the agents report the pods gone and the GPUs are given back
    return out


def run(args, work: Path) -> dict:
    cluster = synthetic_cluster(f"{args.nodes}x8v100")
    plane = kubeharness.start_control_plane(kwok_config=kwok_stages(work, "flood"), kwok_lease_s=600)
    try:
        api = plane.api
        kubeharness.apply_crds(plane, [d for f in sorted(kubeharness.PHALANX_CRDS.glob("*.yaml"))
                                       for d in yaml.safe_load_all(f.read_text()) if d])
        gpus = 8 * args.nodes
        for name in ("team-a", "team-b"):
            api.post(QUEUES_PATH, queue(name, gpus // 2))
        before = api_counts(api)
        in_threads(lambda node: api.create_node(fake_gpu_node(node.name, labels=node.labels)), cluster.nodes)
        kwok_took_in(api, args.nodes, before)
        kube_args = ["--cluster", "kube", "--kubeconfig", str(plane.kubeconfig)]
        stack = Stack(cluster, workdir=str(work / "stack"), fleet=True,
                      service_args={"placement": kube_args, "gang-coordinator": kube_args, "binder": kube_args,
                                    "node-fleet": [*kube_args, "--label-refresh-s", "3600"]})
        stack.start_nats()
        try:
            stack.start_services(timeout_s=180)
            deadline = time.monotonic() + 120
            while sum(1 for i in api.get("/api/v1/nodes")["items"]
                      if i["status"].get("capacity", {}).get("aliyun.com/gpu-core")) < args.nodes:
                if time.monotonic() > deadline:
                    raise RuntimeError("the fleet did not advertise every node")
                time.sleep(1)
            time.sleep(3)  # gang-coordinator has read the Queues
            say(f"{args.nodes} nodes ({gpus} GPUs): Phalanx ready; quiet phase")
            served0, t0 = api_counts(api), time.perf_counter()
            quiet = rounds(plane, "quiet", "team-b-quiet", args.team_pods, args.rounds, args.cap_s)
            quiet_api = rates(api_counts(api) - served0, time.perf_counter() - t0)
            api.create_namespace("team-a")
            flood = flood_pods("team-a", args.flood_pods, args.flood_gangs, 2 * gpus)
            say(f"flood: {len(flood)} team-a pods that never fit")
            t0 = time.perf_counter()
            in_threads(api.create_pod, flood)
            deadline = time.monotonic() + args.cap_s * 10
            while (n := told(api, "team-a")) < len(flood):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {n}/{len(flood)} flood pods were told why they wait")
                time.sleep(1)
            say(f"flood: every pod told why it waits after {time.perf_counter() - t0:.1f} s; flood phase")
            events0, served0, t1 = failed_scheduling(api, "team-a"), api_counts(api), time.perf_counter()
            busy = rounds(plane, "flood", "team-b-flood", args.team_pods, args.rounds, args.cap_s)
            seconds = time.perf_counter() - t1
            attempts = failed_scheduling(api, "team-a") - events0
            flood_api = rates(api_counts(api) - served0, seconds)
            bound = sum(1 for p in api.get("/api/v1/namespaces/team-a/pods")["items"] if p["spec"].get("nodeName"))
        finally:
            stack.stop()
    finally:
        plane.stop()
    return {"nodes": args.nodes, "gpus": gpus, "team_pods": args.team_pods, "rounds": args.rounds,
            "flood_pods": len(flood), "quiet": summary(quiet), "flood": summary(busy),
            "ratio_p50": summary(busy)["p50_s"] / summary(quiet)["p50_s"],
            "ratio_max": summary(busy)["max_s"] / summary(quiet)["max_s"],
            "flood_attempts_per_s": attempts / seconds, "api_per_s": {"quiet": quiet_api, "flood": flood_api},
            "flood_pods_bound": bound}


def rates(served, seconds: float) -> dict[str, float]:
    """API requests per second by kind (the five most frequent) and in all."""
    top = {k: round(v / seconds, 1) for k, v in served.most_common(5) if not k.startswith("WATCH-EVENT")}
    return {"all": round(sum(v for k, v in served.items() if not k.startswith("WATCH-EVENT")) / seconds, 1), **top}


def summary(lat: list[float]) -> dict:
    return {"p50_s": statistics.median(lat), "max_s": max(lat), "unbound": sum(1 for x in lat if math.isinf(x))}


def table(r: dict) -> str:
    rows = [("team-b pods bound, p50", f"{r['quiet']['p50_s']:.3f} s", f"{r['flood']['p50_s']:.3f} s",
             f"{r['ratio_p50']:.2f}x"),
            ("team-b pods bound, max", f"{r['quiet']['max_s']:.3f} s", f"{r['flood']['max_s']:.3f} s",
             f"{r['ratio_max']:.2f}x"),
            ("team-b pods not bound", str(r["quiet"]["unbound"]), str(r["flood"]["unbound"]), "")]
    out = [f"{r['nodes']} nodes, {r['gpus']} GPUs; team-b: {r['rounds']} rounds of {r['team_pods']} one-GPU pods; "
           f"team-a flood: {r['flood_pods']} pods that never fit",
           f"{'':28} {'quiet':>10} {'flood':>10} {'flood/quiet':>12}"]
    out += [f"{a:28} {b:>10} {c:>10} {d:>12}" for a, b, c, d in rows]
    out.append(f"during the flood phase: {r['flood_attempts_per_s']:.2f} flood placement attempts/s "
               f"(FailedScheduling events); flood pods bound: {r['flood_pods_bound']}")
    for phase in ("quiet", "flood"):
        api = r["api_per_s"][phase]
        out.append(f"API requests/s, {phase}: {api['all']} (" + ", ".join(
            f"{k} {v}" for k, v in api.items() if k != "all") + ")")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--nodes", type=int, default=2, help="kwok nodes of 8 GPUs (default 2: 16 GPUs)")
    p.add_argument("--team-pods", type=int, default=8, help="team-b's one-GPU pods per round")
    p.add_argument("--rounds", type=int, default=5, help="team-b rounds per phase")
    p.add_argument("--flood-pods", type=int, default=200, help="team-a's 9-GPU single pods")
    p.add_argument("--flood-gangs", type=int, default=20, help="team-a's gangs of twice the cluster's GPUs")
    p.add_argument("--cap-s", type=float, default=60.0, help="give up on a round after this long")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="phalanx-flood-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
