"""A node's topology as a person reads it, and as one JSON document (``phalanx topology show``
and ``discover``; the document is also what scripts consume, so its keys are stable)."""

from __future__ import annotations

from typing import Any

import msgspec

from phalanx_proto.topology import NodeTopology
from phalanx_topology.groups import closest_gpus, numa_layout, nvlink_cliques, nvlink_components


def _names(topo: NodeTopology) -> list[str]:
    return [g.name for g in topo.gpus] + [n.name for n in topo.nics]


def matrix(topo: NodeTopology) -> dict[str, dict[str, str]]:
    """Relation of every ordered pair of devices, in device order, no self entries."""
    names = _names(topo)
    return {a: {b: topo.relations[a][b] for b in names if b != a} for a in names}


def document(topo: NodeTopology) -> dict[str, Any]:
    """The JSON document: every model field (defaults included, so ``numa: -1`` shows), the
    matrix, NVLink groups and cliques, each NIC's closest GPUs, and the NUMA layout."""
    nics = []
    for n in topo.nics:
        relation, gpus = closest_gpus(topo, n.name)
        nics.append({**msgspec.structs.asdict(n), "closest_gpus": list(gpus), "closest_relation": relation})
    return {
        "node": topo.node,
        "generation": topo.generation,
        "source": topo.source,
        "nvswitch": topo.nvswitch,
        "gpus": [msgspec.structs.asdict(g) for g in topo.gpus],
        "nics": nics,
        "matrix": matrix(topo),
        "nvlink_groups": [list(g) for g in nvlink_components(topo) if len(g) > 1],
        "nvlink_cliques": [list(c) for c in nvlink_cliques(topo)],
        "numa": [{"id": d.id, "gpus": list(d.gpus), "nics": list(d.nics)} for d in numa_layout(topo)],
    }


def _numa(i: int) -> str:
    return str(i) if i >= 0 else "?"


def _nvlink_lines(topo: NodeTopology) -> list[str]:
    groups = [g for g in nvlink_components(topo) if len(g) > 1]
    if not groups:
        return ["NVLink: none (GPUs talk over PCIe)"]
    if topo.nvswitch:
        rel = topo.relations[topo.gpus[0].name][topo.gpus[1].name]
        return [f"NVLink: NVSwitch fabric, all {len(topo.gpus)} GPUs all-to-all ({rel} each)"]
    lines = [f"NVLink: {len(groups)} group(s) of directly linked GPUs"]
    lines += [f"  group: {' '.join(g)}" for g in groups]
    lines += [f"  clique: {' '.join(c)}" for c in nvlink_cliques(topo)]
    return lines


def render_text(topo: NodeTopology) -> str:
    """The readable summary: GPUs, NVLink groups, NICs with their closest GPUs, NUMA layout."""
    lines = [f"Node {topo.node}" + (f" ({topo.source})" if topo.source else ""),
             f"GPUs: {len(topo.gpus)}"]
    for g in topo.gpus:
        detail = [f"NUMA {_numa(g.numa)}"]
        if g.model:
            detail.append(g.model)
        if g.memory_mib:
            detail.append(f"{g.memory_mib} MiB")
        if g.cpu_affinity:
            detail.append(f"CPUs {g.cpu_affinity}")
        if g.mig_capable:
            detail.append("MIG on" if g.mig_enabled else "MIG off")
        lines.append(f"  {g.name:<6} index {g.index:<3} " + ", ".join(detail))
    lines += _nvlink_lines(topo)
    lines.append(f"NICs: {len(topo.nics)}")
    for n in topo.nics:
        relation, gpus = closest_gpus(topo, n.name)
        device = f" ({n.device})" if n.device and n.device != n.name else ""
        near = f"closest GPUs {' '.join(gpus)} ({relation})" if gpus else "no GPUs"
        lines.append(f"  {n.name}{device}  NUMA {_numa(n.numa)}, {near}")
    lines.append("NUMA:")
    for d in numa_layout(topo):
        lines.append(f"  {_numa(d.id)}: " + " ".join((*d.gpus, *d.nics)))
    return "\n".join(lines) + "\n"
