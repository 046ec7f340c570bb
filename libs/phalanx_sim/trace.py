"""The Alibaba GPU-sharing trace (``../shared/fixtures/traces/alibaba-gpu-v2023``, openb) as
the engine sees it: the nodes as ``NodeView``s, the pods as ``MemberSpec``s, and two workloads.

* **packing** — the FGD paper's replay (docs/packing.md, ``REPLAY.md``): per seed a node order
  (the tie-break) and a pod sequence (every pod once, then draws until 130 % of the GPUs);
  pods arrive one a second and never leave. ``bench/packing.py`` replays the same sequence
  through the research model and the engine; ``phalanx sim --trace-mode packing`` through the
  whole scheduler, and ``packing_figures`` reads the bench's figure from the run.
* **timed** — pods drawn from the list (seeded) with their own lifetimes (deletion − creation),
  arriving as a Poisson process whose rate makes the offered GPU load a given fraction of the
  cluster's GPUs; each pod is a gang of one.

Each trace node becomes a view with its GPUs (of its model, on one PCIe host bridge), its CPU
and memory as allocatable Kubernetes state; its name starts with its rank in the seed's node
order, so the engine's last tie-break (the node name) is that order. A share of ``gpu_milli``
is a TDM share of ``gpu_milli / 10`` core percent (every share in the trace is a multiple of 10).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

import msgspec

from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import Gpu, NodeTopology
from phalanx_sim.model import SimGang

MILLI = 1000
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_default.csv"
TUNE_RATIO = 1.3
_POD_LIMIT = 1 << 30

TraceNode = tuple[str, int, int, int, "str | None"]
"""(name, cpu milli, memory MiB, GPUs, model)."""


@dataclass(frozen=True)
class TracePod:
    cpu_milli: int
    memory_mib: int
    gpu_milli: int
    gpu_count: int
    models: frozenset[str] | None = None
    created: int | None = None
    deleted: int | None = None

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    @property
    def lifetime_s(self) -> float | None:
        if self.created is None or self.deleted is None:
            return None
        return float(max(1, self.deleted - self.created))


class PodShape(Protocol):
    cpu_milli: int
    memory_mib: int
    gpu_milli: int
    gpu_count: int


def read_trace(trace_dir: Path, pod_file: str = POD_FILE) -> tuple[tuple[TraceNode, ...], tuple[TracePod, ...]]:
    """The GPU nodes and the pods of one pod list (``OSError`` when a file cannot be read)."""
    nodes = []
    with open(trace_dir / NODE_FILE, newline="") as f:
        for row in csv.DictReader(f):
            nodes.append((row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]), int(row["gpu"]),
                          row["model"] or None))
    pods = []
    with open(trace_dir / pod_file, newline="") as f:
        for row in csv.DictReader(f):
            count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            spec = (row.get("gpu_spec") or "").strip()
            created, deleted = row.get("creation_time"), row.get("deletion_time")
            pods.append(TracePod(int(row["cpu_milli"]), int(row["memory_mib"]), 0 if count == 0 else milli, count,
                                 frozenset(spec.split("|")) if spec else None,
                                 int(created) if created else None, int(deleted) if deleted else None))
    return tuple(nodes), tuple(pods)


def packing_sequence(nodes: Sequence[TraceNode], pods: Sequence[PodShape], seed: int) -> tuple[list[int], list[int]]:
    """(node order, pod sequence as indices into ``pods``) for one seed: ``order[k]`` is the
    tie-break rank of node k (lower wins); the sequence is the whole list shuffled, then uniform
    draws appended until the next draw would take the GPU request past ``TUNE_RATIO`` x capacity."""
    rng = random.Random(seed)
    order = list(range(len(nodes)))
    rng.shuffle(order)
    seq = list(range(len(pods)))
    rng.shuffle(seq)
    target = TUNE_RATIO * sum(node[3] for node in nodes) * MILLI
    demand = sum(pods[i].gpu_milli * pods[i].gpu_count for i in seq)
    while True:
        i = rng.randrange(len(pods))
        if demand + pods[i].gpu_milli * pods[i].gpu_count > target:
            break
        demand += pods[i].gpu_milli * pods[i].gpu_count
        seq.append(i)
    return order, seq


@cache
def _topology(gpus: int, model: str) -> NodeTopology:
    devs = tuple(Gpu(index=i, name=f"GPU{i}", model=model) for i in range(gpus))
    relations = {a.name: {b.name: "PHB" for b in devs if b is not a} for a in devs}
    return NodeTopology(node="", gpus=devs, relations=relations)


def snapshot(nodes: Sequence[TraceNode], ranked: Sequence[int]) -> Snapshot:
    """Trace nodes as views, in ``ranked`` order (their names start with the rank)."""
    views = []
    for rank, k in enumerate(ranked):
        sn, cpu, mem, gpus, model = nodes[k]
        kube = NodeKubeState(allocatable={"cpu": cpu, "memory": mem << 20, "pods": _POD_LIMIT}, ready="True")
        views.append(NodeView(name=f"{rank:04d}-{sn}", topology=_topology(gpus, model or ""), kube=kube))
    return Snapshot(nodes=tuple(views))


def member(pod: PodShape, k: int, queue: str = "") -> MemberSpec:
    """One trace pod as the wire request (``trace/p<k>``)."""
    requests = {n: v for n, v in (("cpu", pod.cpu_milli), ("memory", pod.memory_mib << 20)) if v}
    ref = PodRef(namespace="trace", name=f"p{k}")
    if pod.gpu_count == 0:
        spec = MemberSpec(pod=ref, requests=requests)
    elif pod.gpu_milli < MILLI:
        spec = MemberSpec(pod=ref, gpus=1, core_pct=pod.gpu_milli // 10, requests=requests)
    else:
        spec = MemberSpec(pod=ref, gpus=pod.gpu_count, requests=requests)
    return msgspec.structs.replace(spec, queue=queue) if queue else spec


def packing_gangs(pods: Sequence[PodShape], seq: Sequence[int]) -> list[SimGang]:
    """The packing sequence as gangs of one, arriving a second apart, never leaving."""
    return [SimGang(gang_id=f"trace/p{k}", members=(member(pods[i], k),), arrival_s=float(k))
            for k, i in enumerate(seq)]


def timed_gangs(pods: Sequence[TracePod], *, seed: int, load: float, horizon_s: float, capacity_gpus: int,
                queues: Sequence[str | tuple[str, float]] = ()) -> list[SimGang]:
    """Pods drawn uniformly (seeded) with their lifetimes, arriving as a Poisson process at the
    rate that offers ``load`` x ``capacity_gpus`` GPUs on average (each lifetime counted up to
    ``horizon_s``); each in one of ``queues`` drawn uniformly among those submitting at its
    arrival (a queue, or (queue, from when); none: ``default``)."""
    windows = [(q, 0.0) if isinstance(q, str) else q for q in queues]
    timed = [p for p in pods if p.lifetime_s is not None]
    if not timed:
        raise ValueError("the pod list has no creation and deletion times; use --trace-mode packing")
    mean = sum(p.total_gpu_milli / MILLI * min(p.lifetime_s, horizon_s) for p in timed) / len(timed)
    rate = load * capacity_gpus / mean
    rng = random.Random(seed)
    out: list[SimGang] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= horizon_s:
            return out
        pod = timed[rng.randrange(len(timed))]
        active = [q for q, start in windows if start <= t]
        queue = active[rng.randrange(len(active))] if active else ""
        k = len(out)
        out.append(SimGang(gang_id=f"trace/p{k}", members=(member(pod, k, queue),), arrival_s=round(t, 3),
                           duration_s=pod.lifetime_s))


def allocation_at(sums: Mapping[int, Sequence[float]], p: int) -> float | None:
    """The bench's figure: mean allocation (%) over the arrivals whose arrived demand rounds to
    ``p`` % (or the neighbouring percents when none does)."""
    if p in sums:
        return 100 * sums[p][0] / sums[p][1]
    near = [sums[q] for q in (p - 1, p, p + 1) if q in sums]
    return 100 * sum(s for s, _ in near) / sum(c for _, c in near) if near else None


def packing_figures(gangs: Iterable[SimGang], started: Mapping[str, float], capacity_gpus: int) -> dict[str, float | None]:
    """Allocation at 100 % and 130 % arrived, from a packing run: after each arrival, the GPU
    milli of the gangs started by then over the capacity (as ``bench/packing.py`` measures)."""
    cap = capacity_gpus * MILLI
    ordered = sorted(gangs, key=lambda g: g.arrival_s)
    starts = sorted((started[g.gang_id], _milli(g)) for g in ordered if g.gang_id in started)
    sums: dict[int, list[float]] = {}
    arrived = allocated = 0
    j = 0
    for g in ordered:
        arrived += _milli(g)
        while j < len(starts) and starts[j][0] <= g.arrival_s:
            allocated += starts[j][1]
            j += 1
        acc = sums.setdefault(round(arrived * 100 / cap), [0.0, 0.0])
        acc[0] += allocated / cap
        acc[1] += 1
    return {"alloc_100": allocation_at(sums, 100), "alloc_130": allocation_at(sums, 130)}


def _milli(g: SimGang) -> int:
    m = g.members[0]
    return m.core_pct * 10 if m.core_pct else m.gpus * MILLI
