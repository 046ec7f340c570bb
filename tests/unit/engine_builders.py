"""Fluent builders for engine tests: ``node("n1").gpus(8, model="V100").busy(0, 1).view()`` and
``pod("p").gpus(2).spec()``. Topologies come from the real ``nvidia-smi topo -m`` fixtures."""

from __future__ import annotations

from pathlib import Path

import msgspec

from phalanx_engine import podaffinity
from phalanx_engine.cluster import Cluster
from phalanx_engine.framework import Filter, Member
from phalanx_engine.nodestate import NodeState
from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_engine.status import Status
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.scheduling import (
    HostPort,
    LabelSelectorRequirement,
    NodeKubeState,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    RunningPod,
    SpreadConstraint,
    Taint,
    Toleration,
    WeightedNodeSelectorTerm,
    WeightedPodAffinityTerm,
)
from phalanx_proto.topology import NetworkTiers, NodeTopology
from phalanx_topology import load_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
TOPOLOGIES = {
    "V100": load_file(FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt", node="x"),
    "A100": load_file(FIXTURES / "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt", node="x"),
    "H100": load_file(FIXTURES / "aws-p5.48xlarge_8xH100_NV18.txt", node="x"),
}
MODELS = {"V100": ("Tesla V100-SXM2-16GB", 16384), "A100": ("NVIDIA A100-SXM4-40GB", 40960),
          "H100": ("NVIDIA H100 80GB HBM3", 81920)}


def _sub(topo: NodeTopology, count: int) -> NodeTopology:
    gpus = topo.gpus[:count]
    keep = {g.name for g in gpus} | {n.name for n in topo.nics}
    relations = {a: {b: r for b, r in row.items() if b in keep} for a, row in topo.relations.items() if a in keep}
    return msgspec.structs.replace(topo, gpus=gpus, relations=relations)


GIB = 1 << 30
ROOMY = {"cpu": 128_000, "memory": 512 * GIB, "ephemeral-storage": 1024 * GIB, "pods": 110}
"""What a node has allocatable unless a test says otherwise."""


class NodeBuilder:
    """A node for engine tests; every method returns the builder. By default the node's agent
    has reported its Kubernetes state: Ready, roomy allocatable, no taints, no labels."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._topo = _sub(TOPOLOGIES["V100"], 0)
        self._enabled, self._fresh = True, True
        self._unhealthy: tuple[int, ...] = ()
        self._tiers = NetworkTiers(hypernode=f"node:{name}", leaf=f"node:{name}", netpod=f"node:{name}")
        self._allocs: list[Assignment] = []
        self._kube: dict | None = {"allocatable": dict(ROOMY), "ready": "True"}

    def gpus(self, count: int = 8, *, model: str = "V100", memory_mib: int | None = None, mig: bool = False,
             vendor: str = "nvidia", nics: bool = True) -> NodeBuilder:
        """``count`` GPUs of ``model`` (V100, A100 or H100: the fixture's links) with their memory."""
        name, memory = MODELS[model]
        base = _sub(TOPOLOGIES[model], count)
        gpus = tuple(msgspec.structs.replace(g, model=name, vendor=vendor, mig_enabled=mig,
                                             memory_mib=memory if memory_mib is None else memory_mib)
                     for g in base.gpus)
        self._topo = msgspec.structs.replace(base, node=self.name, gpus=gpus, nics=base.nics if nics else ())
        return self

    def disabled(self) -> NodeBuilder:
        self._enabled = False
        return self

    def stale(self) -> NodeBuilder:
        self._fresh = False
        return self

    def unhealthy(self, *gpus: int) -> NodeBuilder:
        """The node's agent reports these GPUs unhealthy."""
        self._unhealthy = gpus
        return self

    def tiers(self, *, hypernode: str = "", leaf: str = "", netpod: str = "") -> NodeBuilder:
        own = f"node:{self.name}"
        hn = hypernode or own
        lf = leaf or hypernode or own
        self._tiers = NetworkTiers(hypernode=hn, leaf=lf, netpod=netpod or lf)
        return self

    def busy(self, *gpus: int) -> NodeBuilder:
        """Whole GPUs reserved by another pod."""
        self._allocs.append(Assignment(pod=PodRef(namespace="bg", name=f"busy-{self.name}-{len(self._allocs)}"),
                                       node=self.name, gpus=gpus))
        return self

    def share(self, gpu: int, *, core: int = 0, memory_mib: int = 0) -> NodeBuilder:
        """A TDM share another pod holds on ``gpu``."""
        self._allocs.append(Assignment(pod=PodRef(namespace="bg", name=f"share-{self.name}-{len(self._allocs)}"),
                                       node=self.name, gpus=(gpu,), core_pct=core, memory_mib=memory_mib))
        return self

    def mig_instance(self, gpu: int, profile: str, start: int) -> NodeBuilder:
        self._allocs.append(Assignment(pod=PodRef(namespace="bg", name=f"mig-{self.name}-{len(self._allocs)}"),
                                       node=self.name, gpus=(gpu,), mig_profile=profile, mig_start=start))
        return self

    def reserved(self, assignment: Assignment) -> NodeBuilder:
        """A reservation given whole (a running gang's member, with its own pod)."""
        self._allocs.append(assignment)
        return self

    def unreported(self) -> NodeBuilder:
        """The node agent has not reported the node's Kubernetes state."""
        self._kube = None
        return self

    def _k(self) -> dict:
        assert self._kube is not None, "unreported() node"
        return self._kube

    def allocatable(self, **amounts: int) -> NodeBuilder:
        """``cpu`` (millicores), ``memory`` (bytes), ``pods``, ``ephemeral_storage``, other names
        with ``__`` for ``/`` (``example_com__foo``). Only the ones given change."""
        self._k()["allocatable"].update({_resource(k): v for k, v in amounts.items()})
        return self

    def running(self, *, pods: int = 1, ports: tuple[HostPort, ...] = (), **requested: int) -> NodeBuilder:
        """Pods Phalanx did not place run here, requesting ``requested`` and binding ``ports``."""
        k = self._k()
        used = dict(k.get("requested", {}))
        for name, v in requested.items():
            used[_resource(name)] = used.get(_resource(name), 0) + v
        k.update(requested=used, pods=k.get("pods", 0) + pods, host_ports=(*k.get("host_ports", ()), *ports))
        return self

    def pod_here(self, namespace: str = "default", anti: tuple[PodAffinityTerm, ...] = (),
                 terminating: bool = False, **labels: str) -> NodeBuilder:
        """A pod Phalanx did not place runs here with ``labels`` (and its own required
        anti-affinity terms; ``terminating``: its deletion has begun); counted among the node's pods."""
        k = self._k()
        k.update(pods=k.get("pods", 0) + 1,
                 running=(*k.get("running", ()), RunningPod(namespace=namespace, labels=labels, anti_affinity=anti,
                                                            terminating=terminating)))
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> NodeBuilder:
        self._k()["taints"] = (*self._k().get("taints", ()), Taint(key=key, value=value, effect=effect))
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._k()["labels"] = {**self._k().get("labels", {}), key: value}
        return self

    def cordoned(self) -> NodeBuilder:
        self._k()["unschedulable"] = True
        return self

    def ready(self, status: str) -> NodeBuilder:
        self._k()["ready"] = status
        return self

    def view(self) -> NodeView:
        kube = None if self._kube is None else NodeKubeState(**self._kube)
        return NodeView(name=self.name, topology=self._topo, enabled=self._enabled, fresh=self._fresh,
                        tiers=self._tiers, unhealthy=self._unhealthy, allocations=tuple(self._allocs), kube=kube)

    def state(self) -> NodeState:
        return NodeState(self.view())


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def each_node(plugin: Filter, p: PodBuilder, builders) -> dict[str, Status | None]:
    """What ``plugin`` says of ``p`` on every node, inside a decision over those nodes (the
    pod-affinity and spread rules see every node's pods)."""
    cluster = Cluster.from_snapshot(snapshot(*builders))
    with podaffinity.trial(cluster.affinity_pods()):
        return {name: plugin.filter(p.member(), st) for name, st in sorted(cluster.nodes.items())}


def snapshot(*nodes: NodeBuilder) -> Snapshot:
    return Snapshot(nodes=tuple(n.view() for n in nodes))


class PodBuilder:
    """A gang member's request; ``spec()`` is the wire form, ``member()`` the engine's."""

    def __init__(self, name: str) -> None:
        self._fields: dict = {"pod": PodRef(namespace="default", name=name)}

    def gpus(self, count: int, *, resource: str = "nvidia.com/gpu") -> PodBuilder:
        self._fields.update(gpus=count, resource_name=resource)
        return self

    def share(self, *, core: int = 0, memory_mib: int = 0, gpus: int = 1) -> PodBuilder:
        self._fields.update(gpus=gpus, core_pct=core, memory_mib=memory_mib)
        return self

    def mig(self, slices: int, memory_mib: int = 0) -> PodBuilder:
        self._fields.update(gpus=1, mig_slices=slices, memory_mib=memory_mib)
        return self

    def rdma(self) -> PodBuilder:
        self._fields.update(rdma=True)
        return self

    def vendor(self, vendor: str) -> PodBuilder:
        self._fields.update(vendor=vendor)
        return self

    def requests(self, **amounts: int) -> PodBuilder:
        """As ``NodeBuilder.allocatable``: ``cpu`` millicores, ``memory`` bytes, ..."""
        self._fields["requests"] = {**self._fields.get("requests", {}), **{_resource(k): v for k, v in amounts.items()}}
        return self

    def tolerate(self, key: str = "", value: str = "", *, operator: str = "Equal", effect: str = "") -> PodBuilder:
        t = Toleration(key=key, operator=operator, value=value, effect=effect)
        self._fields["tolerations"] = (*self._fields.get("tolerations", ()), t)
        return self

    def selector(self, **labels: str) -> PodBuilder:
        self._fields["node_selector"] = {**self._fields.get("node_selector", {}), **labels}
        return self

    def affinity(self, *terms: list[tuple]) -> PodBuilder:
        """Required node affinity: each term a list of ``(key, operator, *values)``; a key
        ``metadata.name`` goes to ``match_fields``."""
        def term(reqs: list[tuple]) -> NodeSelectorTerm:
            exprs = tuple(NodeSelectorRequirement(key=k, operator=op, values=tuple(v)) for k, op, *v in reqs
                          if k != "metadata.name")
            fields = tuple(NodeSelectorRequirement(key=k, operator=op, values=tuple(v)) for k, op, *v in reqs
                           if k == "metadata.name")
            return NodeSelectorTerm(match_expressions=exprs, match_fields=fields)
        self._fields["node_affinity"] = tuple(term(t) for t in terms)
        return self

    def on(self, node_name: str) -> PodBuilder:
        self._fields["node_name"] = node_name
        return self

    def ports(self, *ports: HostPort, host_network: bool = False) -> PodBuilder:
        self._fields.update(host_ports=ports, host_network=host_network)
        return self

    def labels(self, **labels: str) -> PodBuilder:
        self._fields["labels"] = {**self._fields.get("labels", {}), **labels}
        return self

    def namespace(self, namespace: str) -> PodBuilder:
        self._fields["pod"] = PodRef(namespace=namespace, name=self._fields["pod"].name)
        return self

    def pod_affinity(self, *terms: PodAffinityTerm) -> PodBuilder:
        self._fields["pod_affinity"] = (*self._fields.get("pod_affinity", ()), *terms)
        return self

    def pod_anti_affinity(self, *terms: PodAffinityTerm) -> PodBuilder:
        self._fields["pod_anti_affinity"] = (*self._fields.get("pod_anti_affinity", ()), *terms)
        return self

    def pod_affinity_preferred(self, *terms: WeightedPodAffinityTerm) -> PodBuilder:
        self._fields["preferred_affinity"] = (*self._fields.get("preferred_affinity", ()), *terms)
        return self

    def pod_anti_affinity_preferred(self, *terms: WeightedPodAffinityTerm) -> PodBuilder:
        self._fields["preferred_anti_affinity"] = (*self._fields.get("preferred_anti_affinity", ()), *terms)
        return self

    def prefer_nodes(self, *terms: WeightedNodeSelectorTerm) -> PodBuilder:
        self._fields["preferred_node_affinity"] = (*self._fields.get("preferred_node_affinity", ()), *terms)
        return self

    def soft_spread(self, *constraints: SpreadConstraint) -> PodBuilder:
        self._fields["soft_spread"] = (*self._fields.get("soft_spread", ()), *constraints)
        return self

    def spread(self, *constraints: SpreadConstraint) -> PodBuilder:
        self._fields["spread"] = (*self._fields.get("spread", ()), *constraints)
        return self

    def unsupported(self, *terms: str) -> PodBuilder:
        self._fields["unsupported"] = terms
        return self

    def spec(self) -> MemberSpec:
        return MemberSpec(**self._fields)

    def member(self) -> Member:
        return Member.of(self.spec())


def pod(name: str) -> PodBuilder:
    return PodBuilder(name)


def term(topology_key: str, *reqs: tuple, namespaces: tuple[str, ...] = (), all_namespaces: bool = False,
         match_none: bool = False) -> PodAffinityTerm:
    """A pod (anti-)affinity term: each requirement ``(key, operator, *values)``."""
    return PodAffinityTerm(topology_key=topology_key, match_none=match_none, namespaces=namespaces,
                           all_namespaces=all_namespaces,
                           selector=tuple(LabelSelectorRequirement(key=k, operator=op, values=tuple(v))
                                          for k, op, *v in reqs))


def spread(topology_key: str, *reqs: tuple, max_skew: int = 1, match_none: bool = False, **kw) -> SpreadConstraint:
    """A DoNotSchedule topology spread constraint: each requirement ``(key, operator, *values)``."""
    return SpreadConstraint(topology_key=topology_key, max_skew=max_skew, match_none=match_none,
                            selector=tuple(LabelSelectorRequirement(key=k, operator=op, values=tuple(v))
                                           for k, op, *v in reqs), **kw)


def port(number: int, protocol: str = "TCP", host_ip: str = "") -> HostPort:
    return HostPort(port=number, protocol=protocol, host_ip=host_ip)


def _resource(name: str) -> str:
    return name.replace("__", "/").replace("_", "-").replace("-com/", ".com/").replace("-io/", ".io/")
