"""Phalanx against kube-scheduler at cluster scale, on one real kube-apiserver, in one run.

For each node count N (default 100, 1,000, 5,000): one control plane (etcd, kube-apiserver
v1.36.3, kwok; ``tests/kube/kubeharness.py``) with N kwok nodes of 8 GPUs, labelled into
network tiers as ``phalanx_localstack.synthetic`` lays them out (HyperNodes of 8 nodes, leaf
switches of 64, network-pods of 512). Two workloads, each run by both schedulers on the same
API server, one scheduler at a time, the other stopped and every pod deleted in between:

* ``single``: ``--pods`` one-GPU pods (at most 90 % of the cluster's GPUs);
* ``gangs``: ``--gang-pods`` one-GPU pods in gangs, half of them in gangs of 64 and half in
  gangs of 8 (JobSet labels and ``aliyun.com/min-member``; kube-scheduler has no gangs and
  places the same pods one by one), gangs created in a seeded random order;
* ``queues``: the ``gangs`` pods, each gang in one of four queues (``bench/queue_share.py``; two
  with a limit, so their usage records ride in every commit): set beside ``gangs``, the cost of
  quota. kube-scheduler ignores the label and runs the same pods;
* ``share`` (Phalanx only): four queues submit jobs all along and finish them after a while;
  prints each queue's share of the GPUs against its fair share (``--share-plot``);
* ``dra`` (alone): pods whose GPUs are DRA ResourceClaims of 1, 2, 4 or 8 GPUs and gangs,
  on DRA-only nodes with NVIDIA-shaped ResourceSlices, DGX-1V and H100 in turn
  (``bench/dra_scale.py``): beside pods/s and latency, the share of multi-GPU claims given a
  fully NVLink-connected GPU set;
* ``preempt``: every GPU taken by low-priority mixed gangs, then a stream of high-priority
  8 x 8-GPU gangs that start only by preemption (``bench/preempt_kwok.py``): time to start
  them, GPUs evicted per GPU gained, how many landed in one HyperNode, victims left partial;
  beside it the planner alone on ``--preempt-small`` small clusters against the exact optimum.

Phalanx runs as the Deployments would (``phalanx run … --cluster kube``: a nats-server,
placement, gang-coordinator, binder) plus one ``node-fleet`` process that plays every node's
topology-discovery and mig-manager. Both schedulers' clients are raised to ``--qps`` (kube-
scheduler through its ``clientConnection``, as scheduler_perf does) so that no client rate
limiter is what is measured. Pods are created by 8 threads; a pod's pending→bound latency runs
from just before its create request to the moment a pod watch (opened before) shows
``spec.nodeName``; pods/s is the bound pods over the time from the first create to the last
binding. A phase stops after ``--cap-s``: pods not bound by then count as unbound (a
percentile that falls on them prints as ``>cap``). CPU seconds per bound pod sum every process
of the scheduler (Phalanx: placement, gang-coordinator, binder, nats-server; the node fleet is
shown apart, since real node agents run on their nodes) from ``/proc/<pid>/stat``; the API
server, etcd and kwok are shown per phase for context. kwok runs without its periodic node
heartbeat stage and with 10-minute leases (at thousands of nodes they would take the
control plane's CPU; nothing here needs them), and hands out pod IPs from a /16. The table and
the plot are ``bench/scale_report.py``'s; what this bench shares with ``bench/peers.py`` is in
``bench/kwokbench.py``.

    .venv/bin/python bench/scale.py                                   # 100, 1,000, 5,000 nodes
    .venv/bin/python bench/scale.py --nodes 1000 --pods 2000 --cap-s 600 --json
    .venv/bin/python bench/scale.py --nodes 100 --nodes 1000 --plot scale.png
    .venv/bin/python bench/scale.py --nodes 100 --workloads gangs,queues,share --share-plot share.png
    .venv/bin/python bench/scale.py --nodes 1000 --workloads dra --dra-pods 1000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kube"))
sys.path.insert(0, str(REPO / "bench"))

import kubeharness  # noqa: E402
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, gpu_pod  # noqa: E402

import dra_scale  # noqa: E402
import preempt_kwok  # noqa: E402
from kube_baseline import BindWatch  # noqa: E402
from kwokbench import api_counts, delete_pods, in_threads, kwok_stages, kwok_took_in, say  # noqa: E402
from phalanx_localstack.stack import Stack  # noqa: E402
from phalanx_localstack.synthetic import synthetic_cluster  # noqa: E402
from phalanx_proto.kubeapi import QUEUE_LABEL  # noqa: E402
from preemption import run_small  # noqa: E402
from procstat import Cpu, memory_mib, pct, start_profiles, stop_profiles  # noqa: E402
from queue_share import QUEUES_PATH, SHARE_QUEUES, ShareRun, queue_objects, share_plot  # noqa: E402
from scale_report import plot, table  # noqa: E402

SERVICES = ("placement", "gang-coordinator", "binder")
FLEET_HEARTBEAT_S = 10.0
STALE_S = 45.0
"""The fleet beats every 10 s and placement allows 45 s: the simulated agents share the CPUs."""
IDLE_S = 5.0
"""Seconds of CPU measured with no pods before each Phalanx phase (``idle_cpu``)."""


# -- workloads --------------------------------------------------------------------------------
def workload(kind: str, gpus: int, pods: int, gang_pods: int, seed: int) -> list[tuple[str, str, int]]:
    """(pod name, gang name or "", gang size) in creation order."""
    if kind == "single":
        return [(f"p{i:05d}", "", 1) for i in range(min(pods, int(0.9 * gpus)))]
    if kind in ("share", "preempt"):
        return []
    total = min(gang_pods, int(0.8 * gpus))
    gangs = [64] * (total // 2 // 64) + [8] * ((total - total // 2 // 64 * 64) // 8)
    random.Random(seed).shuffle(gangs)
    out = []
    for g, size in enumerate(gangs):
        out += [(f"g{g:03d}x{size}-m{m:02d}", f"g{g:03d}x{size}", size) for m in range(size)]
    return out


def pod_object(name: str, gang: str, size: int, namespace: str, scheduler: str, queued: bool = False) -> dict:
    labels = {"jobset.sigs.k8s.io/jobset-name": gang, "aliyun.com/min-member": str(size)} if gang else {}
    if queued and gang:  # gang gNNN goes to queue NNN mod 4
        labels[QUEUE_LABEL] = SHARE_QUEUES[int(gang[1:4]) % len(SHARE_QUEUES)][0]
    return gpu_pod(name, namespace, 1, scheduler=scheduler, labels=labels)


# -- one phase --------------------------------------------------------------------------------
def run_phase(plane: ControlPlane, label: str, namespace: str, pods: list[tuple[str, str, int]], scheduler: str,
              cap_s: float, groups: dict[str, list[int]], queued: bool = False,
              make: Callable[[tuple[str, str, int]], None] | None = None) -> dict:
    """One scheduler on ``pods``; ``make`` creates one (default: a one-GPU pod)."""
    api: KubeApi = plane.api
    api.create_namespace(namespace)
    watch = BindWatch(plane, namespace)
    created: dict[str, float] = {}
    served = api_counts(api)
    cpu = Cpu(groups)

    def create(item: tuple[str, str, int]) -> None:
        name, gang, size = item
        created[name] = time.perf_counter()
        if make is not None:
            make(item)
        else:
            api.create_pod(pod_object(name, gang, size, namespace, scheduler, queued))

    creator = threading.Thread(target=in_threads, args=(create, pods), daemon=True)
    started = time.perf_counter()
    creator.start()
    last_report = started
    try:
        while len(watch.bound) < len(pods) and time.perf_counter() - started < cap_s and watch.error is None:
            time.sleep(0.1)
            if time.perf_counter() - last_report >= 10:
                last_report = time.perf_counter()
                say(f"  [{label}] {len(created)} created, {len(watch.bound)}/{len(pods)} bound, "
                    f"{len(watch.bound) / (last_report - started):.1f} pods/s, {last_report - started:.0f} s")
        used = cpu.stop()
        served = api_counts(api) - served
        creator.join(120)
    finally:
        watch.close()
    if watch.error is not None:
        raise RuntimeError(f"{label}: the pod watch broke: {watch.error!r}")
    bound = dict(watch.bound)
    lat = [(bound[n][0] - created[n]) if n in bound else math.inf for n, _, _ in pods]
    span = (max(t for t, _ in bound.values()) - min(created.values())) if bound else cap_s
    gang_done: dict[int, list[float]] = {}
    for members in _gangs(pods).values():
        done = all(m in bound for m in members)
        gang_done.setdefault(len(members), []).append(
            max(bound[m][0] for m in members) - min(created[m] for m in members) if done else math.inf)
    result = {"scheduler": scheduler, "pods": len(pods), "bound": len(bound), "seconds": span,
              "pods_per_s": len(bound) / span if span > 0 else 0.0, "p50_s": pct(lat, 0.5), "p99_s": pct(lat, 0.99),
              "gang_p50_s": {size: pct(times, 0.5) for size, times in sorted(gang_done.items())},
              "cpu_s": used, "cap_s": cap_s,
              "api_per_pod": {k: round(v / max(1, len(bound)), 2) for k, v in sorted(served.items())
                              if v / max(1, len(bound)) >= 0.05}}
    result["bound_pods"] = sorted(bound)
    say(f"  [{label}] done: {len(bound)}/{len(pods)} bound in {span:.1f} s"
        + (f" (the API server ended the bench's pod watch {watch.resumed} time(s); resumed)" if watch.resumed else ""))
    return result


def _gangs(pods: list[tuple[str, str, int]]) -> dict[str, list[str]]:
    """Gang → its members (single pods are in none)."""
    out: dict[str, list[str]] = {}
    for name, gang, _ in pods:
        if gang:
            out.setdefault(gang, []).append(name)
    return out


def check_phalanx_bindings(api: KubeApi, namespace: str) -> None:
    """Every bound pod has its assignment annotation, on its node, and no GPU is handed out twice."""
    seen: set[tuple[str, int]] = set()
    for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        a = json.loads(pod["metadata"]["annotations"]["phalanx.io/assignment"])
        assert a["node"] == node, a
        for g in a["gpus"]:
            assert (node, g) not in seen, f"GPU {g} of {node} assigned twice"
            seen.add((node, g))


# -- one cluster size -------------------------------------------------------------------------
def run_size(n: int, args, work: Path) -> list[dict]:
    t0 = time.monotonic()
    dra = dra_scale.cluster(n, work, args.dra_shapes) if "dra" in args.workloads else None
    cluster = dra.files if dra is not None else synthetic_cluster(f"{n}x8v100")
    plane = kubeharness.start_control_plane(kwok_config=kwok_stages(work, "scale"), kwok_lease_s=600,
                                            kwok_cidr="10.0.0.0/16")
    rows = []
    try:
        api = plane.api
        if {"queues", "share"} & set(args.workloads):
            kubeharness.apply_crds(plane, [d for f in sorted(kubeharness.PHALANX_CRDS.glob("*.yaml"))
                                           for d in yaml.safe_load_all(f.read_text()) if d])
        before = api_counts(api)
        in_threads(lambda node: api.create_node(dra_scale.node_object(node.name, node.labels) if dra is not None
                                                else fake_gpu_node(node.name, labels=node.labels)), cluster.nodes)
        kwok_took_in(api, n, before)
        if dra is not None:
            dra_scale.publish(api, dra)
            say(f"{n} nodes: DeviceClasses and {n} ResourceSlices published ({time.monotonic() - t0:.0f} s)")
        say(f"{n} nodes: control plane up, nodes created and taken in by kwok ({time.monotonic() - t0:.0f} s)")
        context = {"control plane": [plane.procs[p].pid for p in ("kube-apiserver", "etcd", "kwok")]}
        kube_args = ["--cluster", "kube", "--kubeconfig", str(plane.kubeconfig),
                     "--kube-api-qps", str(args.qps), "--kube-api-burst", str(args.burst)]
        for kind in args.workloads:
            want: dict[str, int] = {}
            if kind == "dra":
                pods, want = dra_scale.workload(8 * n, args.dra_pods, args.seed)
            else:
                pods = workload(kind, 8 * n, args.pods, args.gang_pods, args.seed)
            if "phalanx" in args.schedulers:
                rows.append(phalanx_phase(plane, cluster, n, kind, pods, kube_args, args, work, context, dra, want))
            if "kube-scheduler" in args.schedulers and kind != "share":
                plane.start_scheduler(qps=args.qps, burst=args.qps)
                time.sleep(2)
                groups = {"scheduler": [plane.procs["kube-scheduler"].pid], **context}
                make = dra_scale.creator(api, f"k-{kind}", "default-scheduler", want) if kind == "dra" else None
                r = ({"scheduler": "default-scheduler",
                      "preempt": preempt_kwok.run(plane, cluster.nodes, "k-preempt", "default-scheduler", args, say)}
                     if kind == "preempt" else
                     run_phase(plane, f"kube-scheduler {n} nodes {kind}", f"k-{kind}", pods, "default-scheduler",
                               args.cap_s, groups, queued=kind == "queues", make=make))
                plane.stop_scheduler()
                if dra is not None and kind == "dra":
                    r["dra"] = {"connected": dra_scale.connectivity(api, f"k-{kind}", dra, r["bound_pods"]),
                                "gpus": sum(want.values()), "shapes": list(args.dra_shapes)}
                delete_pods(api, f"k-{kind}")
                if kind == "dra":
                    dra_scale.free_claims(api, f"k-{kind}")
                rows.append({"nodes": n, "workload": kind, **r})
    finally:
        plane.stop()
    return rows


def idle_cpu(groups: dict[str, list[int]], seconds: float = IDLE_S) -> dict[str, float]:
    """CPU seconds per second of each group while no pod is submitted: what a cluster of this
    size costs with nothing to place (heartbeats, watches, leases), to tell apart from the
    phase's cost per pod."""
    cpu = Cpu(groups)
    time.sleep(seconds)
    return {g: round(v / seconds, 3) for g, v in cpu.stop().items()}


def phalanx_phase(plane, cluster, n: int, kind: str, pods, kube_args, args, work: Path, context,
                  dra: dra_scale.DraCluster | None = None, want: dict[str, int] | None = None) -> dict:
    api = plane.api
    fleet_args = [*kube_args, "--heartbeat-s", str(FLEET_HEARTBEAT_S), "--label-refresh-s", "3600"]
    stack = Stack(cluster, workdir=str(work / f"stack-{n}-{kind}"), fleet=True,
                  service_args={"placement": [*kube_args, "--heartbeat-stale-s", str(STALE_S)],
                                "gang-coordinator": kube_args, "binder": kube_args, "node-fleet": fleet_args})
    stack.start_nats()
    try:
        started = time.monotonic()
        stack.start_services(timeout_s=180 + 0.2 * n)
        deadline = time.monotonic() + 120 + 0.05 * n
        while dra is None:  # DRA-only nodes advertise nothing: start_services waited for placement to hold them
            items = api.get("/api/v1/nodes")["items"]
            advertised = sum(1 for i in items if i["status"].get("capacity", {}).get("aliyun.com/gpu-core"))
            if advertised >= n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {advertised}/{n} nodes advertised by the fleet")
            time.sleep(2)
        say(f"{n} nodes: Phalanx ready ({time.monotonic() - started:.0f} s); {kind}: {len(pods)} pods")
        time.sleep(2)
        pid = {name: stack.procs[name].proc.pid for name in (*SERVICES, "node-fleet")}
        groups = {"scheduler": [pid[s] for s in SERVICES] + [stack.nats.proc.pid],
                  "node agents": [pid["node-fleet"]], **context,
                  **{f"  {s}": [pid[s]] for s in SERVICES}, "  nats-server": [stack.nats.proc.pid]}
        idle = idle_cpu(groups)
        say(f"{n} nodes: CPU s/s with no pods: " + ", ".join(f"{g.strip()} {v:.2f}" for g, v in idle.items()))
        if kind in ("queues", "share"):
            for q in queue_objects(8 * n, limits=kind == "queues"):
                api.post(QUEUES_PATH, q)
            time.sleep(5)  # gang-coordinator reads Queues every 2 s
        profilers = start_profiles(args.profile, {s: pid[s] for s in SERVICES}, f"{n}-{kind}")
        try:
            if kind == "share":
                r = share_phase(plane, n, args)
            elif kind == "preempt":
                r = {"scheduler": "phalanx", "preempt": preempt_kwok.run(plane, cluster.nodes, "p-preempt", "phalanx", args, say)}
            else:
                make = dra_scale.creator(api, f"p-{kind}", "phalanx", want or {}) if kind == "dra" else None
                r = run_phase(plane, f"Phalanx {n} nodes {kind}", f"p-{kind}", pods, "phalanx", args.cap_s, groups,
                              make=make)
        finally:
            stop_profiles(profilers)
        r["placement_rss_mib"] = memory_mib(pid["placement"])[1]
        r["idle_cpu_s_per_s"] = idle
        check_phalanx_bindings(api, f"p-{kind}")
        if dra is not None and kind == "dra":
            r["dra"] = {"connected": dra_scale.connectivity(api, f"p-{kind}", dra, r["bound_pods"]),
                        "gpus": sum((want or {}).values()), "shapes": list(args.dra_shapes)}
    finally:
        stack.stop()
    delete_pods(api, f"p-{kind}")
    if kind == "dra":
        dra_scale.free_claims(api, f"p-{kind}")
    if kind in ("queues", "share"):
        for q in queue_objects(8 * n):
            api.request("DELETE", f"{QUEUES_PATH}/{q['metadata']['name']}", ok=(404,))
    return {"nodes": n, "workload": kind, **r}


def share_phase(plane: ControlPlane, n: int, args) -> dict:
    plane.api.create_namespace("p-share")
    watch = BindWatch(plane, "p-share")
    try:
        say(f"  [share] {n} nodes: four queues for {args.share_s:.0f} s, q-d from {args.share_late_s:.0f} s")
        result = ShareRun(plane.api, watch, "p-share", 8 * n, args.share_s, args.share_late_s, args.share_run_s,
                          args.seed, say).run()
    finally:
        watch.close()
    return {"scheduler": "phalanx", "share": result}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, action="append", help="kwok nodes of 8 GPUs (repeatable; default 100 1000 5000)")
    p.add_argument("--pods", type=int, default=2000, help="one-GPU pods of the single workload (default %(default)s)")
    p.add_argument("--gang-pods", type=int, default=1024, help="pods of the gang workload (default %(default)s)")
    p.add_argument("--workloads", default="single,gangs",
                   help="comma list of single, gangs, queues, share, preempt; or dra alone (default %(default)s)")
    p.add_argument("--dra-pods", type=int, default=1000,
                   help="dra: pods with a ResourceClaim each, at most 60%% of the GPUs (default %(default)s)")
    p.add_argument("--dra-shapes", default=",".join(dra_scale.NODE_SHAPES),
                   help="dra: the nodes' shapes, in turn (synthetic shape names; default %(default)s)")
    p.add_argument("--schedulers", default="phalanx,kube-scheduler", help="comma list (default %(default)s)")
    p.add_argument("--cap-s", type=float, default=300.0, help="seconds one phase may run (default %(default)s)")
    p.add_argument("--qps", type=int, default=5000, help="client QPS of both schedulers (default %(default)s)")
    p.add_argument("--burst", type=int, default=1000, help="Phalanx's client burst (default %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (the services' logs) instead of a temporary one")
    p.add_argument("--profile", metavar="DIR", help="py-spy each Phalanx service during its phases into DIR")
    p.add_argument("--share-s", type=float, default=240.0, help="length of the share run (default %(default)s)")
    p.add_argument("--share-late-s", type=float, default=90.0, help="when q-d starts submitting (default %(default)s)")
    p.add_argument("--share-run-s", type=float, default=30.0, help="how long a job runs, ±50%% (default %(default)s)")
    p.add_argument("--share-plot", metavar="PNG", help="draw each queue's share and fair share over time")
    p.add_argument("--preemptors", type=int, default=8, help="preempt: high-priority gangs (default %(default)s)")
    p.add_argument("--preempt-every-s", type=float, default=3.0,
                   help="preempt: seconds between two of them (default %(default)s)")
    p.add_argument("--preempt-low", type=int, default=3, choices=(1, 2, 3),
                   help="preempt: the fill's priorities are 1 to this (default %(default)s)")
    p.add_argument("--preempt-small", type=int, default=300,
                   help="preempt: small clusters for the planner against the exact optimum (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--plot", metavar="PNG", help="also draw pending→bound latency against nodes")
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.schedulers = [s for s in args.schedulers.split(",") if s]
    args.dra_shapes = tuple(s for s in args.dra_shapes.split(",") if s)
    if "dra" in args.workloads and len(args.workloads) > 1:
        p.error("--workloads dra runs alone (its nodes are DRA-only: no nvidia.com/gpu for the others)")
    rows: list[dict] = []
    began = time.monotonic()
    with (nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="phalanx-scale-")) as tmp:
        for n in args.nodes or [100, 1000, 5000]:
            try:
                rows += run_size(n, args, Path(tmp))
            except Exception as e:  # noqa: BLE001 - report what happened at this size and go on
                say(f"{n} nodes: FAILED: {e!r}")
                rows.append({"nodes": n, "error": repr(e)})
    for r in rows:
        r.pop("bound_pods", None)
    good = [r for r in rows if "error" not in r]
    small = run_small(args.preempt_small, args.seed) if "preempt" in args.workloads and args.preempt_small else None
    meta = {"planner_small": small, "cpus": os.cpu_count(), "kube_version": "v1.36.3", "minutes": round((time.monotonic() - began) / 60, 1),
            "load_average": os.getloadavg()}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    else:
        print(table(good, small))
        if any(r.get("workload") == "dra" for r in good):
            print("\n" + dra_scale.table(good))
        for r in rows:
            if "error" in r:
                print(f"{r['nodes']} nodes: {r['error']}")
        print(f"\n{meta['cpus']} CPUs, kube-apiserver {meta['kube_version']}, {meta['minutes']} min, "
              f"load average at the end {statistics.fmean(meta['load_average']):.1f}")
    if args.plot:
        plot(good, args.plot)
    if args.share_plot:
        for r in good:
            if "share" in r:
                share_plot(r["share"], r["nodes"], args.share_plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
