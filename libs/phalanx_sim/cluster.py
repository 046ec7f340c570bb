"""The simulated cluster as the engine sees it: one ``NodeView`` per node of a cluster file or a
``--synthetic`` spec, built as the node agents would report it — the topology file with its
model and memory filled in (``phalanx_topology.files.topology_from_file``), network tiers and
enablement from the Node's labels (``phalanx_topology.tiers``), and the Node's Kubernetes state
(``phalanx_kubeobjects.nodekube``) with the simulated allocatable every simulated node has. Every
node is fresh (its heartbeat never goes stale) and starts empty.
"""

from __future__ import annotations

import msgspec

from phalanx_engine.snapshot import NodeView
from phalanx_kubeobjects.nodekube import node_kube_state
from phalanx_kubeobjects.violations import Violation
from phalanx_localstack.inputs import ClusterFile
from phalanx_proto.topology import NodeTopology
from phalanx_topology.files import topology_from_file
from phalanx_topology.tiers import enabled_by_labels, tiers_from_labels


def views(cluster: ClusterFile) -> tuple[NodeView, ...]:
    """Every node of ``cluster`` as an empty, fresh view (``OSError``/``ValueError`` for a
    topology file that cannot be read or parsed, as the node agent would fail on it)."""
    out = []
    shared: dict[bytes, NodeTopology] = {}
    for node, obj in zip(cluster.nodes, cluster.node_objects(), strict=True):
        topo = topology_from_file(node.topology_file, node.name, gpu_model=node.gpu_model,
                                  gpu_memory_mib=node.gpu_memory_mib, mig_enabled=node.mig_enabled)
        # Nodes of one shape report equal GPUs and links: they share those objects, so the
        # engine's GPU-set search (gpuset, cached per topology by identity) knows them once,
        # not once per node (a 1,000-node cluster overflowed its cache on every decision).
        key = msgspec.json.encode((topo.gpus, topo.relations, topo.nvswitch))
        first = shared.setdefault(key, topo)
        if first is not topo:
            topo = msgspec.structs.replace(topo, gpus=first.gpus, relations=first.relations)
        labels = obj["metadata"]["labels"]
        kube = node_kube_state(obj, ())
        if isinstance(kube, Violation):
            raise ValueError(f"node {node.name}: {kube}")
        out.append(NodeView(name=node.name, topology=topo, enabled=enabled_by_labels(labels),
                            tiers=tiers_from_labels(node.name, labels), kube=kube))
    return tuple(out)


def gpus(nodes: tuple[NodeView, ...]) -> int:
    """The GPUs of the enabled nodes (what the queues' fair shares divide)."""
    return sum(len(v.topology.gpus) for v in nodes if v.enabled)
