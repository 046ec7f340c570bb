"""The packing trace replayed through the placement engine itself (``phalanx_engine.decide``
with a ``Profile``), so ``bench/packing.py`` measures what the placement service does beside
the research model's policies.

Each trace node becomes a ``NodeView``: its GPUs (of its model, on one PCIe host bridge), its
CPU and memory as allocatable Kubernetes state, Ready; its name starts with its rank in the
seed's random node order, so the engine's last tie-break (the node name) is that order, as in
the research replay. Each pod becomes a ``MemberSpec``: whole GPUs, a TDM share of one GPU
(``gpu_milli / 10`` core percent: every share in the trace is a multiple of 10 milli), or no
GPU; CPU and memory as requests. A decision is booked with ``Cluster.assume``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cache

from phalanx_bench.sharepack import MILLI, PodRequest
from phalanx_engine.decide import Cluster, decide
from phalanx_engine.framework import Profile
from phalanx_engine.packing import ShapeMix
from phalanx_engine.snapshot import Decision, NodeView, Snapshot
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import Gpu, NodeTopology

_POD_LIMIT = 1 << 30


@cache
def _topology(gpus: int, model: str) -> NodeTopology:
    devs = tuple(Gpu(index=i, name=f"GPU{i}", model=model) for i in range(gpus))
    relations = {a.name: {b.name: "PHB" for b in devs if b is not a} for a in devs}
    return NodeTopology(node="", gpus=devs, relations=relations)


def snapshot(nodes: Sequence[tuple[str, int, int, int, str | None]], ranked: Sequence[int]) -> Snapshot:
    """Trace nodes (name, cpu milli, memory MiB, GPUs, model) as views, in ``ranked`` order."""
    views = []
    for rank, k in enumerate(ranked):
        sn, cpu, mem, gpus, model = nodes[k]
        kube = NodeKubeState(allocatable={"cpu": cpu, "memory": mem << 20, "pods": _POD_LIMIT}, ready="True")
        views.append(NodeView(name=f"{rank:04d}-{sn}", topology=_topology(gpus, model or ""), kube=kube))
    return Snapshot(nodes=tuple(views))


def member(pod: PodRequest, k: int) -> MemberSpec:
    """One trace pod as the wire request."""
    requests = {n: v for n, v in (("cpu", pod.cpu_milli), ("memory", pod.memory_mib << 20)) if v}
    ref = PodRef(namespace="trace", name=f"p{k}")
    if pod.gpu_count == 0:
        return MemberSpec(pod=ref, requests=requests)
    if pod.gpu_milli < MILLI:
        return MemberSpec(pod=ref, gpus=1, core_pct=pod.gpu_milli // 10, requests=requests)
    return MemberSpec(pod=ref, gpus=pod.gpu_count, requests=requests)


def mix_of(pods: Sequence[PodRequest]) -> ShapeMix:
    """The engine's FGD mix built from the trace's pod list (as the research model's mix)."""
    return ShapeMix.from_specs(member(p, k) for k, p in enumerate(pods))


def replay(nodes: Sequence[tuple[str, int, int, int, str | None]], pods: Sequence[PodRequest],
           order: Sequence[int], seq: Sequence[int], profile: Profile, stop_at: float | None = None
           ) -> tuple[dict[int, list[float]], int, float]:
    """Place ``pods[i]`` for ``i`` in ``seq`` one at a time; returns the allocation sums per
    rounded arrived percent (as the research replay keeps them), the pods dropped and the
    seconds taken."""
    t0 = time.perf_counter()
    ranked = sorted(range(len(nodes)), key=order.__getitem__)
    cluster = Cluster.from_snapshot(snapshot(nodes, ranked))
    cap = sum(n[3] for n in nodes) * MILLI
    allocated = arrived = failed = 0
    sums: dict[int, list[float]] = {}
    for i in seq:
        pod = pods[i]
        arrived += pod.total_gpu_milli
        got = decide(cluster, (member(pod, i),), profile, explain=False)
        if isinstance(got, Decision):
            cluster.assume(got.assignments)
            allocated += pod.total_gpu_milli
        else:
            failed += 1
        acc = sums.setdefault(round(arrived * 100 / cap), [0.0, 0.0])
        acc[0] += allocated / cap
        acc[1] += 1
        if stop_at is not None and arrived * 100 / cap >= stop_at:
            break
    return sums, failed, time.perf_counter() - t0
