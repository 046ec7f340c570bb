"""Queues at scale: each queue's share of the GPUs over time against its fair share.

Used by ``bench/scale.py --workloads share`` (Phalanx only: kube-scheduler has no queues). Four
queues share the cluster; each keeps jobs waiting all along, so every queue always wants more
than it gets. A job is a gang of 8 one-GPU pods or a single one-GPU pod (half each, seeded); it
runs ``--share-run-s`` (±50 %) from its last member's binding, then the bench deletes its pods,
as a finished job's would be, and the freed GPUs go to whoever the scheduler picks. Queue
``q-d`` submits nothing before ``--share-late-s``: until then the others borrow its quota, and
afterwards — without preemption — it gets back to its share only as the others' jobs finish.

Every second the bench samples what each queue holds (its bound pods' GPUs, from a pod watch of
its own) and what it waits for, and computes the fair share from those numbers with
``phalanx_rules.queues.fair_shares``: the same function the scheduler uses, fed by what the
API server shows rather than by the scheduler's state.
"""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kwokbench import pyplot_or_exit
from phalanx_proto.kubeapi import QUEUE_LABEL
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_rules.queues import QueueTree, fair_shares

QUEUES_PATH = "/apis/scheduling.phalanx.io/v1alpha1/queues"
SHARE_QUEUES = (  # name, quota (fraction of the cluster), overQuotaWeight, starts at (fraction of the run)
    ("q-a", 0.30, 1.0, 0.0),
    ("q-b", 0.20, 1.0, 0.0),
    ("q-c", 0.10, 3.0, 0.0),
    ("q-d", 0.20, 1.0, None),
)
"""Quotas cover 80 % of the cluster; the other 20 % is shared by weight (q-c weighs 3)."""


def queue_objects(gpus: int, limits: bool = False) -> list[dict]:
    """The four Queue objects for a cluster of ``gpus`` GPUs (``limits``: q-a and q-b also get a
    limit, never reached, so that their usage records ride in every commit)."""
    out = []
    for name, quota, weight, _ in SHARE_QUEUES:
        gpu = {"quota": int(quota * gpus), "overQuotaWeight": weight}
        if limits and name in ("q-a", "q-b"):
            gpu["limit"] = gpus
        out.append({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
                    "spec": {"resources": {"nvidia.com/gpu": gpu}}})
    return out


def tree_of(gpus: int) -> QueueTree:
    return QueueTree.of([QueueSpec(name=n, quota=int(q * gpus) * GPU_UNITS, over_quota_weight=w)
                         for n, q, w, _ in SHARE_QUEUES])


@dataclass
class Job:
    name: str
    queue: str
    pods: list[str]
    created: float
    bound_at: float = math.inf
    ends_at: float = math.inf
    finished: bool = False


@dataclass
class ShareRun:
    """Drives one share run against a running Phalanx: creates, watches, finishes jobs."""

    api: object
    watch: object
    namespace: str
    gpus: int
    seconds: float
    late_s: float
    run_s: float
    seed: int
    say: object
    jobs: list[Job] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.pool = ThreadPoolExecutor(8)
        self.tree = tree_of(self.gpus)
        self.lock = threading.Lock()

    # -- jobs ---------------------------------------------------------------------------------
    def submit(self, queue: str, now: float) -> None:
        n = len(self.jobs)
        size = 8 if self.rng.random() < 0.5 else 1
        name = f"{queue}-j{n:05d}"
        pods = [f"{name}-m{m}" for m in range(size)]
        job = Job(name, queue, pods, now)
        self.jobs.append(job)
        labels = {QUEUE_LABEL: queue}
        if size > 1:
            labels |= {"jobset.sigs.k8s.io/jobset-name": name, "aliyun.com/min-member": str(size)}
        from kubeharness import gpu_pod

        for p in pods:
            self.pool.submit(self.api.create_pod, gpu_pod(p, self.namespace, 1, scheduler="phalanx", labels=labels))

    def finish(self, job: Job) -> None:
        job.finished = True
        for p in job.pods:
            self.pool.submit(self.api.request, "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{p}",
                             {"gracePeriodSeconds": 0}, ok=(404,))

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        started = time.perf_counter()
        next_sample = started
        while (now := time.perf_counter()) - started < self.seconds:
            if self.watch.error is not None:
                raise RuntimeError(f"the pod watch broke: {self.watch.error!r}")
            t = now - started
            bound = self.watch.bound
            held: dict[str, int] = {q: 0 for q, *_ in SHARE_QUEUES}
            waiting: dict[str, int] = dict(held)
            for job in self.jobs:
                if job.finished:
                    continue
                got = sum(1 for p in job.pods if p in bound)
                held[job.queue] += got
                waiting[job.queue] += len(job.pods) - got
                if got == len(job.pods) and math.isinf(job.bound_at):
                    job.bound_at = max(bound[p][0] for p in job.pods)
                    job.ends_at = job.bound_at + self.run_s * self.rng.uniform(0.5, 1.5)
                if now >= job.ends_at:
                    self.finish(job)
            for q, _, _, starts in SHARE_QUEUES:
                active = t >= (self.late_s if starts is None else 0.0)
                while active and waiting[q] < self.gpus // 8:
                    self.submit(q, now)
                    waiting[q] += len(self.jobs[-1].pods)
            if now >= next_sample:
                next_sample += 1.0
                demand = {q: (held[q] + waiting[q]) * GPU_UNITS for q in held}
                fair = fair_shares(self.tree, demand, self.gpus * GPU_UNITS)
                self.samples.append({"t": round(t, 1), "held": held, "waiting": waiting,
                                     "fair": {q: fair.get(q, 0) / GPU_UNITS for q in held}})
                if len(self.samples) % 20 == 0:
                    fair_now = {q: round(v) for q, v in self.samples[-1]["fair"].items()}
                    self.say(f"  [share] t={t:.0f} s held {held} fair {fair_now}")
            time.sleep(0.2)
        self.pool.shutdown(wait=True)
        return summary(self.samples, self.gpus, self.late_s, self.run_s)


def summary(samples: list[dict], gpus: int, late_s: float, run_s: float) -> dict:
    """Per queue: the mean share held and the mean fair share over the settled stretches (after
    the first ``run_s`` and, after q-d arrives, after another ``1.5 × run_s``: the time it takes
    jobs running at its arrival to finish), the mean gap, and how long q-d took to reach 90 % of
    its fair share."""
    settle = 1.5 * run_s

    def settled(s: dict) -> bool:
        return (run_s <= s["t"] < late_s) or s["t"] >= late_s + settle

    steady = [s for s in samples if settled(s)]
    per_queue = {}
    for q, quota, weight, _ in SHARE_QUEUES:
        held = [s["held"][q] for s in steady]
        fair = [s["fair"][q] for s in steady]
        gaps = [abs(h - f) for h, f in zip(held, fair, strict=True)]
        per_queue[q] = {"quota": int(quota * gpus), "weight": weight,
                        "held_mean": sum(held) / len(held) if held else 0.0,
                        "fair_mean": sum(fair) / len(fair) if fair else 0.0,
                        "gap_mean_pct": 100 * (sum(gaps) / len(gaps)) / gpus if gaps else 0.0}
    reach = next((s["t"] - late_s for s in samples
                  if s["t"] >= late_s and s["fair"]["q-d"] and s["held"]["q-d"] >= 0.9 * s["fair"]["q-d"]), None)
    return {"queues": per_queue, "q_d_reached_90pct_s": reach, "samples": samples, "late_s": late_s,
            "run_s": run_s, "gpus": gpus}


def share_table(result: dict, nodes: int) -> str:
    out = [f"Queue shares on {nodes} nodes ({result['gpus']} GPUs), settled stretches "
           f"(q-d arrives at {result['late_s']:.0f} s; jobs run ~{result['run_s']:.0f} s):",
           f"{'queue':<6} {'quota':>6} {'weight':>7} {'held (mean)':>12} {'fair share (mean)':>18} {'|gap| % of GPUs':>16}"]
    for q, r in result["queues"].items():
        out.append(f"{q:<6} {r['quota']:>6} {r['weight']:>7.0f} {r['held_mean']:>12.1f} {r['fair_mean']:>18.1f} "
                   f"{r['gap_mean_pct']:>16.1f}")
    reach = result["q_d_reached_90pct_s"]
    out.append("q-d reached 90 % of its fair share " + (f"{reach:.0f} s after it arrived" if reach is not None
                                                           else "never within the run"))
    return "\n".join(out)


def share_plot(result: dict, nodes: int, path: str) -> None:
    plt = pyplot_or_exit()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    t = [s["t"] for s in result["samples"]]
    for (q, *_), color in zip(SHARE_QUEUES, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True):
        ax.plot(t, [s["held"][q] for s in result["samples"]], "-", color=color, label=f"{q} holds")
        ax.plot(t, [s["fair"][q] for s in result["samples"]], "--", color=color, alpha=0.7, label=f"{q} fair share")
    ax.axvline(result["late_s"], color="grey", lw=0.8)
    ax.set(xlabel="seconds", ylabel="GPUs", title=f"Queue shares, {nodes} kwok nodes ({result['gpus']} GPUs), Phalanx")
    ax.grid(True, alpha=0.3)
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
