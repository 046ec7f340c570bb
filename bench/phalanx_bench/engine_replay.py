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

from phalanx_bench.sharepack import MILLI, PodRequest
from phalanx_engine.decide import Cluster, decide
from phalanx_engine.framework import Profile
from phalanx_engine.packing import ShapeMix
from phalanx_engine.snapshot import Decision
from phalanx_sim import trace

# The trace as the engine sees it (views, requests) lives in phalanx_sim.trace, which
# ``phalanx sim`` reads too; re-exported here for the bench.
snapshot, member = trace.snapshot, trace.member


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
