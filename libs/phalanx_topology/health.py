"""Which of a node's GPUs are unhealthy, as topology-discovery reports them
(``NodeTopologyReported.unhealthy``: GPU indexes, docs/repair.md).

On a GPU node NVML says it (``phalanx_nvml.health.NvmlHealth``, by UUID: ``by_uuid`` turns its
answer into indexes); on a node whose topology comes from a file (the simulator, kwok) the Node's
``sim.phalanx.io/unhealthy-gpus`` annotation stands in for NVML (``by_annotation``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from phalanx_proto.kubeapi import SIM_UNHEALTHY_GPUS
from phalanx_proto.topology import NodeTopology


def by_uuid(topo: NodeTopology, bad: Collection[str]) -> tuple[int, ...]:
    """The indexes of ``topo``'s GPUs whose UUID is in ``bad``, ascending."""
    return tuple(sorted(g.index for g in topo.gpus if g.uuid and g.uuid in bad))


def by_annotation(topo: NodeTopology, annotations: Mapping[str, str]) -> tuple[int, ...]:
    """The indexes the ``sim.phalanx.io/unhealthy-gpus`` annotation lists that are GPUs of
    ``topo``, ascending and once each. An entry that is not an index of the node's GPUs (not a
    number, or no such GPU) is ignored: the annotation cannot make up a GPU."""
    have = {g.index for g in topo.gpus}
    out = set()
    for part in annotations.get(SIM_UNHEALTHY_GPUS, "").split(","):
        part = part.strip()
        if part.isdecimal() and int(part) in have:
            out.add(int(part))
    return tuple(sorted(out))
