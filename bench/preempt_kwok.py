"""The ``preempt`` workload of ``bench/scale.py``: a full cluster of low-priority mixed gangs,
then a stream of high-priority gangs that can only start by preemption, on the same kwok
cluster for Phalanx and for kube-scheduler (which preempts pod by pod and has no gangs).

PriorityClasses on the API server (``bench-low-1`` .. ``-3``, values 1-3, ``preemptionPolicy:
Never``, so the fill never preempts itself; ``bench-high``, 100); the pods name them and the API
server's Priority admission sets ``spec.priority`` and ``spec.preemptionPolicy``.

Fill: every GPU taken by jobs drawn with a seed (``fill_jobs``): gangs of 8 x 1, 4 x 2, 2 x 4 and
1 x 8 GPUs (JobSet labels and ``aliyun.com/min-member``) and single pods of 1, 2, 4 and 8 GPUs,
each job at a random priority 1-3 (all 1 with ``--preempt-low 1``). They are created in waves by GPUs per pod, 8 first, the
gangs of a size before its single pods, each wave bound before the next: with sizes that are
powers of two, every node's free GPUs stay a multiple of the next size, so any scheduler that
puts a pod on any node where it fits fills every GPU, and neither scheduler's result depends
on how the two order their queues.

Then ``--preemptors`` gangs of 8 pods x 8 GPUs at priority 100, one every ``--preempt-every-s``.
Per scheduler: time from a preemptor's first create to its whole gang bound (p50/p99; a gang
counts as started when all its pods are bound), and from the last victim on its nodes seen
deleted to that (p50, "gone->bound"); GPUs evicted (fill pods deleted) per GPU the preemptors
got (1.0 is the least possible on a full cluster); the share of preemptors placed within one
HyperNode (their tightest possible tier); the fill jobs that lost a pod, and the gangs among
them left partly evicted (some pods gone, some running: work broken for nothing; Phalanx must
have none). Beside it, the planner alone on small clusters against the
exhaustive optimum (``bench/preemption.py``'s ``run_small``).
"""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from kubeharness import ControlPlane, gpu_pod

from kube_baseline import BindWatch
from preemption import small_line
from procstat import pct

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
LOW = {p: f"bench-low-{p}" for p in (1, 2, 3)}
HIGH = "bench-high"
GANGS = ((8, 1), (4, 2), (2, 4), (1, 8))
SINGLES = (1, 2, 4, 8)
"""Fill jobs: gangs (pods, GPUs per pod) and single pods (GPUs)."""
WAVE_S = 0.2


def priority_classes(api) -> None:
    for p, name in LOW.items():
        api.request("POST", PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                               "metadata": {"name": name}, "value": p,
                                               "preemptionPolicy": "Never"}, ok=(409,))
    api.request("POST", PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                           "metadata": {"name": HIGH}, "value": 100}, ok=(409,))


def fill_jobs(gpus: int, seed: int, lows: int = 3) -> list[tuple[str, int, int, int]]:
    """(job name, pods, GPUs per pod, priority) adding up to exactly ``gpus`` (priorities drawn
    from 1-3, capped at ``lows``: the same jobs whatever ``lows``); a job of one pod
    named ``s…`` is a single pod, any other a gang. In creation order: by GPUs per pod, largest
    first, gangs before single pods, else in the order drawn."""
    rng = random.Random(seed)
    jobs: list[tuple[str, int, int, int]] = []
    left = gpus
    while left > 0:
        if rng.random() < 0.7:
            pods, each = rng.choice(GANGS)
            kind = "g"
        else:
            pods, each = 1, rng.choice(SINGLES)
            kind = "s"
        if pods * each > left:
            pods, each, kind = 1, max(s for s in SINGLES if s <= left), "s"
        jobs.append((f"{kind}{len(jobs):05d}", pods, each, min(rng.randint(1, 3), lows)))
        left -= pods * each
    return sorted(jobs, key=lambda j: (-j[2], j[0][0] == "s"))


def pod(name: str, gang: str, size: int, gpus: int, namespace: str, scheduler: str, priority_class: str) -> dict:
    labels = {"jobset.sigs.k8s.io/jobset-name": gang, "aliyun.com/min-member": str(size)} if gang else {}
    obj = gpu_pod(name, namespace, gpus, scheduler=scheduler, labels=labels)
    obj["spec"]["priorityClassName"] = priority_class
    return obj


def fill(api, watch: BindWatch, namespace: str, scheduler: str, jobs, cap_s: float, say) -> dict[str, list[str]]:
    """Creates the fill wave by wave; returns job → its pods."""
    members = {job: [f"{job}-{m}" for m in range(pods)] for job, pods, _, _ in jobs}
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        for each, kind in sorted({(j[2], j[0][0]) for j in jobs}, key=lambda w: (-w[0], w[1])):
            wave = [(f"{job}-{m}", job if kind == "g" else "", pods, each, LOW[prio])
                    for job, pods, e, prio in jobs if (e, job[0]) == (each, kind) for m in range(pods)]
            for _ in pool.map(lambda w: api.create_pod(pod(*w[:4], namespace, scheduler, w[4])), wave):
                pass
            while (not all(w[0] in watch.bound for w in wave)) and time.perf_counter() - started < cap_s:
                time.sleep(WAVE_S)
            say(f"  [{scheduler} preempt] fill: {each}-GPU {'gang' if kind == 'g' else 'single'} pods bound, "
                f"{sum(1 for w in wave if w[0] in watch.bound)}/{len(wave)}, {len(watch.bound)} in all, "
                f"{time.perf_counter() - started:.1f} s")
    return members


def run(plane: ControlPlane, nodes: list, namespace: str, scheduler: str, args, say) -> dict:
    """One scheduler's phase; ``nodes``: the cluster's nodes (name, labels)."""
    api = plane.api
    priority_classes(api)
    api.create_namespace(namespace)
    hypernode = {n.name: n.labels.get("phalanx.io/hypernode", n.name) for n in nodes}
    watch = BindWatch(plane, namespace)
    try:
        jobs = fill_jobs(8 * len(nodes), args.seed, args.preempt_low)
        started = time.perf_counter()
        members = fill(api, watch, namespace, scheduler, jobs, args.cap_s, say)
        fill_pods = {m: e for job, _, e, _ in jobs for m in members[job]}
        filled = sum(1 for m in fill_pods if m in watch.bound)
        fill_s = time.perf_counter() - started
        created: dict[str, float] = {}
        preemptors = {f"hi{k:03d}": [f"hi{k:03d}-{m}" for m in range(8)] for k in range(args.preemptors)}

        def stream() -> None:
            for gang, ms in preemptors.items():
                for m in ms:
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
    bound, deleted = dict(watch.bound), dict(watch.gone)
    took = [max(bound[m][0] for m in ms) - min(created[m] for m in ms) if all(m in bound for m in ms) else math.inf
            for ms in preemptors.values()]
    after = []  # from the last victim on its nodes seen going to the whole gang bound
    for ms in preemptors.values():
        if all(m in bound for m in ms):
            nodes = {bound[m][1] for m in ms}
            last = max((deleted[v] for v in fill_pods if v in deleted and v in bound and bound[v][1] in nodes),
                       default=min(created[m] for m in ms))
            after.append(max(bound[m][0] for m in ms) - last)
    placed = [ms for ms in preemptors.values() if all(m in bound and m in live for m in ms)]
    one_hn = sum(1 for ms in placed if len({hypernode.get(live[m]["spec"]["nodeName"]) for m in ms}) == 1)
    gone = {m for m in fill_pods if m in bound and m not in live}
    evicted_gpus = sum(fill_pods[m] for m in gone)
    hit = [ms for ms in members.values() if any(m in gone for m in ms)]
    partial = sum(1 for ms in hit if not all(m in gone for m in ms))
    gained = 64 * len(placed)
    return {"scheduler": scheduler, "fill_priorities": f"1-{args.preempt_low}" if args.preempt_low > 1 else "1",
            "fill_pods": len(fill_pods), "fill_bound": filled, "fill_s": fill_s,
            "fill_gpus": sum(fill_pods.values()), "preemptors": len(preemptors), "placed": len(placed),
            "start_p50_s": pct(took, 0.5), "start_p99_s": pct(took, 0.99), "start_s": took,
            "after_victims_p50_s": pct(after, 0.5) if after else None,
            "evicted_gpus": evicted_gpus, "gained_gpus": gained,
            "evicted_per_gained": evicted_gpus / gained if gained else None,
            "one_hypernode_pct": 100 * one_hn / len(placed) if placed else None,
            "victim_pods": len(gone), "victim_jobs": len(hit), "victim_gangs_partial": partial}


def table(rows: list[dict], small: dict | None = None) -> str:
    def s(v, unit=""):
        return "-" if v is None else (">cap" if v == math.inf else f"{v:.2f}{unit}")
    lines = [f"{'nodes':>6} {'scheduler':<15} {'fill prio':>9} {'fill bound':>13} {'placed':>7} {'start p50':>10} {'start p99':>10} "
             f"{'gone->bound':>11} {'evicted/gained':>14} {'one HyperNode':>13} {'victim jobs':>11} {'partial':>7}"]
    for r in rows:
        name = "Phalanx" if r["scheduler"] == "phalanx" else "kube-scheduler"
        lines.append(f"{r['nodes']:>6} {name:<15} {r['fill_priorities']:>9} {r['fill_bound']:>6}/{r['fill_pods']:<6} "
                     f"{r['placed']:>3}/{r['preemptors']:<3} "
                     f"{s(r['start_p50_s'], ' s'):>10} {s(r['start_p99_s'], ' s'):>10} "
                     f"{s(r['after_victims_p50_s'], ' s'):>11} {s(r['evicted_per_gained']):>14} "
                     f"{s(r['one_hypernode_pct'], ' %'):>13} {r['victim_jobs']:>11} {r['victim_gangs_partial']:>7}")
    if small:
        lines.append("planner alone, " + small_line(small))
    return "\n".join(lines)
