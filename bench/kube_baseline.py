"""Binding throughput and latency on a real kube-apiserver: Phalanx vs kube-scheduler.

One control plane (etcd, kube-apiserver v1.36.3, kwok; tests/kube/kubeharness.py) with
``--nodes`` kwok nodes of 8 GPUs each. Two phases on the same API server:

1. **Phalanx**: a nats-server and every service as its own process (``phalanx run … --cluster
   kube``; one topology-discovery and one mig-manager per node, as the DaemonSets would run);
   N pods with ``schedulerName: phalanx`` and ``nvidia.com/gpu: 1``.
2. **kube-scheduler**: the Phalanx processes are stopped and their pods deleted, kube-scheduler
   is started, and N pods with ``schedulerName: default-scheduler`` and the same limits are created.

Each phase creates its N pods back to back over one keep-alive connection. A pod's
pending→bound latency runs from just before its create request to the moment a pod watch
(opened before the first create) shows ``spec.nodeName``; pods/s is N over the time from the first
create to the last binding. Everything shares this machine's CPUs (on a real cluster the node
agents run on their own nodes).

    .venv/bin/python bench/kube_baseline.py                # 100 pods
    .venv/bin/python bench/kube_baseline.py --pods 300 --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kube"))

import kubeharness  # noqa: E402
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, gpu_pod  # noqa: E402

from phalanx_localstack.stack import ClusterFile, Stack  # noqa: E402

TOPOLOGY = REPO / "examples" / "clusters" / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
SERVICES = ("topology-discovery", "gang-coordinator", "placement", "mig-manager", "binder")
LABELS = {"lj_runtimekit_enable": "true", "phalanx.io/hypernode": "hn-1", "phalanx.io/leaf-switch": "leaf-1",
          "phalanx.io/network-pod": "pod-1"}


class BindWatch:
    """A pod watch on one namespace (its own thread) that records when each pod is first bound."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace
        self.bound: dict[str, tuple[float, str]] = {}
        self.gone: dict[str, float] = {}
        """When each pod was first seen deleted or being deleted."""
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.rv = plane.api.get(f"/api/v1/namespaces/{namespace}/pods")["metadata"]["resourceVersion"]
        self.resumed = 0
        """How often the server ended the watch and it was resumed from the last resourceVersion."""
        self._open()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self) -> None:
        api = self.plane.api
        self.conn = http.client.HTTPSConnection(api.host, api.port, context=api.ctx, timeout=600)
        self.conn.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?watch=1&resourceVersion={self.rv}"
                                 "&allowWatchBookmarks=true&timeoutSeconds=900",
                          headers={"Authorization": f"Bearer {api.token}"})
        self.resp = self.conn.getresponse()
        if self.resp.status != 200:
            raise RuntimeError(f"watch failed: HTTP {self.resp.status} {self.resp.read()[:200]!r}")

    def _run(self) -> None:
        try:
            while not self.done.is_set():
                line = self.resp.readline()
                if not line:
                    if self.done.is_set():
                        return
                    # The API server ends a watch that falls behind (or at its timeout); going on
                    # from the last resourceVersion seen misses nothing.
                    self.conn.close()
                    self.resumed += 1
                    self._open()
                    continue
                ev = json.loads(line)
                pod = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {pod.get('message') or pod}")
                self.rv = (pod.get("metadata") or {}).get("resourceVersion") or self.rv
                node = (pod.get("spec") or {}).get("nodeName")
                name = (pod.get("metadata") or {}).get("name")
                if ev.get("type") in ("ADDED", "MODIFIED") and node and name not in self.bound:
                    self.bound[name] = (time.perf_counter(), node)
                if (ev.get("type") == "DELETED" or (pod.get("metadata") or {}).get("deletionTimestamp")) and (
                        name not in self.gone):
                    self.gone[name] = time.perf_counter()
        except (OSError, ValueError, AttributeError, RuntimeError, http.client.HTTPException) as e:  # closed under us
            if not self.done.is_set():
                self.error = e

    def close(self) -> None:
        self.done.set()
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
        except (OSError, AttributeError):
            pass
        self.thread.join(5)
        self.conn.close()


def run_phase(plane: ControlPlane, namespace: str, pods: int, scheduler: str, timeout_s: float) -> dict:
    api: KubeApi = plane.api
    api.create_namespace(namespace)
    watch = BindWatch(plane, namespace)
    created: dict[str, float] = {}
    try:
        for i in range(pods):
            name = f"p{i:04d}"
            created[name] = time.perf_counter()
            api.create_pod(gpu_pod(name, namespace, 1, scheduler=scheduler))
        deadline = time.monotonic() + timeout_s
        while len(watch.bound) < pods and time.monotonic() < deadline and watch.error is None:
            time.sleep(0.05)
    finally:
        watch.close()
    if watch.error is not None:
        raise RuntimeError(f"{scheduler}: the pod watch broke: {watch.error!r}")
    if len(watch.bound) < pods:
        raise RuntimeError(f"{scheduler}: only {len(watch.bound)}/{pods} pods bound after {timeout_s}s")
    lat = sorted(watch.bound[n][0] - created[n] for n in created)
    span = max(t for t, _ in watch.bound.values()) - min(created.values())
    return {"scheduler": scheduler, "pods": pods, "seconds": span, "pods_per_s": pods / span,
            "p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)],
            "max_ms": 1000 * lat[-1], "nodes_used": len({node for _, node in watch.bound.values()})}


def check_phalanx_bindings(api: KubeApi, namespace: str) -> None:
    """Every pod bound once, with an assignment annotation, and no GPU handed out twice."""
    seen: set[tuple[str, int]] = set()
    for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        a = json.loads(pod["metadata"]["annotations"]["phalanx.io/assignment"])
        assert a["node"] == pod["spec"]["nodeName"], a
        for g in a["gpus"]:
            key = (a["node"], g)
            assert key not in seen, f"GPU {key} assigned twice"
            seen.add(key)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=100, help="pods per phase (default %(default)s)")
    p.add_argument("--nodes", type=int, default=0, help="kwok nodes of 8 GPUs (default: ceil(pods/8)+1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each phase may take (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--logs", default=None, help="keep the Phalanx service logs in this directory")
    args = p.parse_args(argv)
    nodes = args.nodes or math.ceil(args.pods / 8) + 1
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print

    t0 = time.monotonic()
    plane = kubeharness.start_control_plane()
    work = tempfile.TemporaryDirectory(prefix="phalanx-bench-")
    try:
        api = plane.api
        names = [f"bench-gpu-{i:03d}" for i in range(nodes)]
        for n in names:
            api.create_node(fake_gpu_node(n, labels=LABELS))
        say(f"control plane up, {nodes} kwok nodes ({time.monotonic() - t0:.1f}s); starting Phalanx "
            f"({2 * nodes + 3} processes)")
        cluster_file = Path(work.name) / "cluster.yaml"
        cluster_file.write_text(yaml.safe_dump({"nodes": [
            {"name": n, "labels": LABELS, "topology": str(TOPOLOGY)} for n in names]}))
        kube_args = ["--cluster", "kube", "--kubeconfig", str(plane.kubeconfig)]
        stack = Stack(ClusterFile.load(cluster_file), workdir=args.logs or str(Path(work.name) / "stack"),
                      service_args={s: kube_args for s in SERVICES})
        stack.start_nats()
        try:
            stack.start_services(timeout_s=180)
            deadline = time.monotonic() + 60
            while not all(api.get(f"/api/v1/nodes/{n}")["status"]["capacity"].get("aliyun.com/gpu-core")
                          for n in names):
                if time.monotonic() > deadline:
                    raise RuntimeError("topology-discovery did not advertise every node within 60s")
                time.sleep(0.2)
            time.sleep(2)  # let start-up settle (first heartbeats, watches)
            say(f"Phalanx ready ({time.monotonic() - t0:.1f}s); binding {args.pods} pods")
            phalanx = run_phase(plane, "bench-phalanx", args.pods, "phalanx", args.timeout)
            check_phalanx_bindings(api, "bench-phalanx")
        finally:
            stack.stop()
        api.request("DELETE", "/api/v1/namespaces/bench-phalanx/pods", {"gracePeriodSeconds": 0})
        plane.start_scheduler()
        time.sleep(2)
        say(f"kube-scheduler ready ({time.monotonic() - t0:.1f}s); binding {args.pods} pods")
        kube = run_phase(plane, "bench-default", args.pods, "default-scheduler", args.timeout)
    finally:
        plane.stop()
        work.cleanup()

    result = {"pods": args.pods, "nodes": nodes, "gpus_per_node": 8, "cpus": os.cpu_count(),
              "kube_version": "v1.36.3", "phalanx": phalanx, "kube_scheduler": kube,
              "ratio": {"pods_per_s": phalanx["pods_per_s"] / kube["pods_per_s"],
                        "p50": phalanx["p50_ms"] / kube["p50_ms"], "p99": phalanx["p99_ms"] / kube["p99_ms"]}}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
    return 0


def table(r: dict) -> str:
    rows = [("Phalanx", r["phalanx"]), ("kube-scheduler", r["kube_scheduler"])]
    out = [f"{r['pods']} pods x 1 GPU onto {r['nodes']} kwok nodes x {r['gpus_per_node']} GPUs, kube-apiserver "
           f"{r['kube_version']}, {r['cpus']} CPUs", "",
           f"{'scheduler':<22}{'pods/s':>9}{'p50 pending→bound':>20}{'p99 pending→bound':>20}{'all bound in':>15}"
           f"{'nodes used':>12}"]
    for name, x in rows:
        out.append(f"{name:<22}{x['pods_per_s']:>9.1f}{x['p50_ms']:>17.0f} ms{x['p99_ms']:>17.0f} ms"
                   f"{x['seconds']:>13.2f} s{x['nodes_used']:>12}")
    q = r["ratio"]
    out.append(f"{'Phalanx / kube-sched.':<22}{q['pods_per_s']:>9.2f}{q['p50']:>20.2f}{q['p99']:>20.2f}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
