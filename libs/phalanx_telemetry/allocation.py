"""GPU allocation and fragmentation gauges, computed from the ledger (pure; no I/O).

placement calls ``record(nodes)`` after every ledger commit and release with, per node, its
topology, whether Phalanx schedules it, and every reservation on it. The result replaces
the series of ``phalanx_gpus_allocated``, ``phalanx_gpu_core_allocated_percent``,
``phalanx_gpu_memory_allocated_bytes``, ``phalanx_gpus_capacity`` and
``phalanx_cluster_fragmentation_ratio``, so a node that disappeared stops being reported.

Fragmentation, per GPU model: of the GPUs with no reservation at all (free), the share that
sits on nodes where some GPU is reserved. Such GPUs cannot serve a request for a whole node,
and multi-GPU requests on them compete with the neighbours' NVLink/PCIe paths. 0 when every
free GPU is on an empty node (or nothing is free), 1 when every free GPU is stranded.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from phalanx_proto.events import Assignment, RequestKind
from phalanx_proto.topology import NodeTopology
from phalanx_telemetry import metrics

MIB = 1024 * 1024
_MIG = re.compile(r"^(\d+)g\.(\d+)gb")


@dataclass(frozen=True, slots=True)
class NodeAllocation:
    node: str
    topology: NodeTopology
    enabled: bool
    assignments: tuple[Assignment, ...]


_MODE_LABEL = {RequestKind.MIG: "mig", RequestKind.TDM: "shared"}
"""The metrics' ``mode`` label per request kind (``shared`` is the label's name for TDM)."""


def mode_of(a: Assignment) -> str:
    """The ``mode`` label of a reservation: ``mig``, ``shared`` (TDM) or ``whole``."""
    return _MODE_LABEL.get(a.kind, "whole")


def _usage(a: Assignment, gpu_memory_mib: int) -> tuple[float, float]:
    """(core percent, memory MiB) that ``a`` takes on each of its GPUs."""
    mode = mode_of(a)
    if mode == "whole":
        return 100.0, float(gpu_memory_mib)
    if mode == "shared":
        return float(a.core_pct), float(a.memory_mib)
    m = _MIG.match(a.mig_profile)
    return (100.0 * int(m.group(1)) / 7, int(m.group(2)) * 1024.0) if m else (0.0, 0.0)


def compute(nodes: Iterable[NodeAllocation]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric name → its series ``(labels, value)``; only enabled nodes count."""
    gpus: dict[tuple, set[int]] = defaultdict(set)
    core: dict[tuple, float] = defaultdict(float)
    mem: dict[tuple, float] = defaultdict(float)
    capacity: list[tuple[dict[str, str], float]] = []
    free_total: dict[str, int] = defaultdict(int)
    free_stranded: dict[str, int] = defaultdict(int)
    for n in nodes:
        if not n.enabled:
            continue
        by_index = {g.index: g for g in n.topology.gpus}
        per_model: dict[str, int] = defaultdict(int)
        for g in n.topology.gpus:
            per_model[g.model or "unknown"] += 1
            free_total.setdefault(g.model or "unknown", 0)
        capacity.extend(({"node": n.node, "model": m}, float(c)) for m, c in sorted(per_model.items()))
        used: set[int] = set()
        for a in n.assignments:
            if a.node != n.node:
                continue
            mode = mode_of(a)
            for i in a.gpus:
                g = by_index.get(i)
                model = (g.model if g else "") or "unknown"
                c, m = _usage(a, g.memory_mib if g else 0)
                key = (n.node, model, mode)
                gpus[key].add(i)
                core[key] += c
                mem[key] += m * MIB
                used.add(i)
        for g in n.topology.gpus:
            if g.index in used:
                continue
            model = g.model or "unknown"
            free_total[model] += 1
            if used:
                free_stranded[model] += 1
    labels = lambda k: {"node": k[0], "model": k[1], "mode": k[2]}  # noqa: E731
    return {
        metrics.GPUS_ALLOCATED.name: [(labels(k), float(len(v))) for k, v in sorted(gpus.items())],
        metrics.GPU_CORE_ALLOCATED.name: [(labels(k), v) for k, v in sorted(core.items())],
        metrics.GPU_MEMORY_ALLOCATED.name: [(labels(k), v) for k, v in sorted(mem.items())],
        metrics.GPUS_CAPACITY.name: capacity,
        metrics.FRAGMENTATION.name: [
            ({"model": m}, free_stranded[m] / free_total[m] if free_total[m] else 0.0) for m in sorted(free_total)],
    }


def record(nodes: Iterable[NodeAllocation]) -> None:
    """Replace the allocation gauges with what ``nodes`` hold now."""
    for name, series in compute(nodes).items():
        metrics.REGISTRY.get(name).replace(series)  # type: ignore[attr-defined]
