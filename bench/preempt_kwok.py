"""The ``preempt`` workload of ``bench/scale.py``: a full cluster of low-priority mixed gangs,
then a stream of high-priority gangs that can only start by preemption, on the same kwok
cluster for Phalanx and for kube-scheduler (which preempts pod by pod and has no gangs).

Fill: every GPU taken by priority-1 work (PriorityClasses created on the API server; the pods
name them, the API server's Priority admission gives ``spec.priority``): gangs of 2 x 4 GPUs
and 4 x 2 GPUs (JobSet labels and ``aliyun.com/min-member``) and single 8-GPU pods, seeded.
Then ``--preemptors`` gangs of 8 pods x 8 GPUs at priority 100, one every ``--preempt-every-s``.
Printed per scheduler: time from a preemptor's first create to its whole gang bound (p50/p99),
GPUs evicted per GPU the preemptors got (1.0 is the least possible on a full cluster), the
share of preemptors placed within one HyperNode (their tightest possible tier), and victim
gangs left partly evicted (some pods gone, some running: work broken for nothing).
"""

from __future__ import annotations

import math
import random
import threading
import time

from kubeharness import ControlPlane, gpu_pod

from kube_baseline import BindWatch
from procstat import pct

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
LOW, HIGH = "bench-low", "bench-high"
SHAPES = ((2, 4), (4, 2), (1, 8))
"""Fill gangs: (pods, GPUs per pod)."""


def priority_classes(api) -> None:
    for name, value in ((LOW, 1), (HIGH, 100)):
        api.request("POST", PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                               "metadata": {"name": name}, "value": value}, ok=(409,))


def fill_pods(gpus: int, seed: int) -> list[tuple[str, str, int, int]]:
    """(pod, gang or "", gang size, GPUs) adding up to exactly ``gpus``."""
    rng = random.Random(seed)
    out: list[tuple[str, str, int, int]] = []
    left, g = gpus, 0
    while left > 0:
        pods, each = rng.choice(SHAPES)
        if pods * each > left:
            pods, each = 1, left if left <= 8 else 8
        gang = f"f{g:05d}" if pods > 1 else ""
        out += [(f"f{g:05d}-{m}", gang, pods, each) for m in range(pods)]
        left -= pods * each
        g += 1
    return out


def pod(name: str, gang: str, size: int, gpus: int, namespace: str, scheduler: str, priority_class: str) -> dict:
    labels = {"jobset.sigs.k8s.io/jobset-name": gang, "aliyun.com/min-member": str(size)} if gang else {}
    obj = gpu_pod(name, namespace, gpus, scheduler=scheduler, labels=labels)
    obj["spec"]["priorityClassName"] = priority_class
    return obj


def run(plane: ControlPlane, nodes: list, namespace: str, scheduler: str, args, say) -> dict:
    """One scheduler's phase; ``nodes``: the cluster's nodes (name, labels)."""
    api = plane.api
    priority_classes(api)
    api.create_namespace(namespace)
    hypernode = {n.name: n.labels.get("phalanx.io/hypernode", n.name) for n in nodes}
    watch = BindWatch(plane, namespace)
    try:
        fill = fill_pods(8 * len(nodes), args.seed)
        started = time.perf_counter()
        for name, gang, size, gpus in fill:
            api.create_pod(pod(name, gang, size, gpus, namespace, scheduler, LOW))
        while len(watch.bound) < len(fill) and time.perf_counter() - started < args.cap_s:
            time.sleep(0.2)
        filled = len(watch.bound)
        say(f"  [{scheduler} preempt] fill: {filled}/{len(fill)} pods bound in {time.perf_counter() - started:.1f} s")
        created: dict[str, float] = {}
        preemptors = {f"hi{k:03d}": [f"hi{k:03d}-{m}" for m in range(8)] for k in range(args.preemptors)}

        def stream() -> None:
            for gang, members in preemptors.items():
                for m in members:
                    created[m] = time.perf_counter()
                    api.create_pod(pod(m, gang, 8, 8, namespace, scheduler, HIGH))
                time.sleep(args.preempt_every_s)

        creator = threading.Thread(target=stream, daemon=True)
        t0 = time.perf_counter()
        creator.start()
        wanted = {m for ms in preemptors.values() for m in ms}
        while not wanted <= set(watch.bound) and time.perf_counter() - t0 < args.cap_s:
            time.sleep(0.2)
        creator.join(60)
        time.sleep(2)  # evictions still under way are seen
        live = {p["metadata"]["name"]: p for p in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
                if not p["metadata"].get("deletionTimestamp")}
    finally:
        watch.close()
    bound = dict(watch.bound)
    took = [max(bound[m][0] for m in ms) - min(created[m] for m in ms) if all(m in bound for m in ms) else math.inf
            for ms in preemptors.values()]
    placed = [ms for ms in preemptors.values() if all(m in bound and m in live for m in ms)]
    one_hn = sum(1 for ms in placed if len({hypernode.get(live[m]["spec"]["nodeName"]) for m in ms}) == 1)
    gone = [(name, gang, gpus) for name, gang, _, gpus in fill if name in bound and name not in live]
    evicted_gpus = sum(g for _, _, g in gone)
    fill_gangs: dict[str, list[str]] = {}
    for name, gang, _, _ in fill:
        if gang:
            fill_gangs.setdefault(gang, []).append(name)
    partial = sum(1 for ms in fill_gangs.values() if 0 < sum(m not in live for m in ms) < len(ms))
    gained = 64 * len(placed)
    return {"scheduler": scheduler, "fill_pods": len(fill), "fill_bound": filled, "preemptors": len(preemptors),
            "placed": len(placed), "start_p50_s": pct(took, 0.5), "start_p99_s": pct(took, 0.99),
            "evicted_gpus": evicted_gpus, "evicted_per_gained": evicted_gpus / gained if gained else None,
            "one_hypernode_pct": 100 * one_hn / len(placed) if placed else None,
            "victim_gangs_partial": partial, "victim_pods": len(gone)}


def table(rows: list[dict]) -> str:
    def s(v, unit=""):
        return "-" if v is None else (">cap" if v == math.inf else f"{v:.2f}{unit}")
    lines = [f"{'nodes':>6} {'scheduler':<15} {'placed':>8} {'start p50':>10} {'start p99':>10} "
             f"{'evicted/gained':>14} {'one HyperNode':>13} {'partial victims':>15}"]
    for r in rows:
        name = "Phalanx" if r["scheduler"] == "phalanx" else "kube-scheduler"
        lines.append(f"{r['nodes']:>6} {name:<15} {r['placed']:>3}/{r['preemptors']:<4} "
                     f"{s(r['start_p50_s'], ' s'):>10} {s(r['start_p99_s'], ' s'):>10} {s(r['evicted_per_gained']):>14} "
                     f"{s(r['one_hypernode_pct'], ' %'):>13} {r['victim_gangs_partial']:>15}")
    return "\n".join(lines)
