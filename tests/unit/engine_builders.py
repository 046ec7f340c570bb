"""Fluent builders for engine tests: ``node("n1").gpus(8, model="V100").busy(0, 1).view()`` and
``pod("p").gpus(2).spec()``. Topologies come from the real ``nvidia-smi topo -m`` fixtures."""

from __future__ import annotations

from pathlib import Path

import msgspec

from phalanx_engine.framework import Member
from phalanx_engine.nodestate import NodeState
from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_proto.events import Assignment, MemberSpec, PodRef
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


class NodeBuilder:
    """A node for engine tests; every method returns the builder."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._topo = _sub(TOPOLOGIES["V100"], 0)
        self._enabled, self._fresh = True, True
        self._tiers = NetworkTiers(hypernode=f"node:{name}", leaf=f"node:{name}", netpod=f"node:{name}")
        self._allocs: list[Assignment] = []

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

    def view(self) -> NodeView:
        return NodeView(name=self.name, topology=self._topo, enabled=self._enabled, fresh=self._fresh,
                        tiers=self._tiers, allocations=tuple(self._allocs))

    def state(self) -> NodeState:
        return NodeState(self.view())


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


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

    def spec(self) -> MemberSpec:
        return MemberSpec(**self._fields)

    def member(self) -> Member:
        return Member.of(self.spec())


def pod(name: str) -> PodBuilder:
    return PodBuilder(name)
