"""topology-discovery reports which GPUs are unhealthy (``NodeTopologyReported.unhealthy``,
docs/repair.md): from NVML on a GPU node (run here on the fake NVML, whose ``lost`` GPUs fail
every call as ``GPU_IS_LOST``), from the Node's ``sim.phalanx.io/unhealthy-gpus`` annotation on a
node whose topology is a file. A change of either is a new report, stored and published."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx_kube.port import Node
from phalanx_nvml import NvmlDiscovery
from phalanx_nvmlfake.nvml import FakeMachine, FakeNvml
from phalanx_proto import subjects as S
from phalanx_proto.events import NodeTopologyReported, topology_decoder
from phalanx_proto.kubeapi import SIM_UNHEALTHY_GPUS
from phalanx_topology import health as H
from phalanx_topology import load_file
from phalanx_topology_discovery.service import Config, Discovery, annotated_health, nvml_health

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
FILE_4GPU = ROOT / "examples" / "topology" / "pcie-4xL40S-handwritten.yaml"
LABELS = {"lj_runtimekit_enable": "true"}


class Entry:
    def __init__(self, value: bytes) -> None:
        self.value = value


class Kv:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def get(self, key: str) -> Entry | None:
        return Entry(self.data[key]) if key in self.data else None

    async def put(self, key: str, value: bytes) -> int:
        self.data[key] = value
        return len(self.data)


class Bus:
    """The two things a report touches: KV buckets and the topology subject."""

    def __init__(self) -> None:
        self.buckets: dict[str, Kv] = {}
        self.published: list[tuple[str, object]] = []

    async def kv(self, name: str) -> Kv:
        return self.buckets.setdefault(name, Kv())

    async def publish(self, subject: str, event, **kw) -> None:
        self.published.append((subject, event))


class Cluster:
    def __init__(self, node: Node) -> None:
        self.node = node

    async def get_node(self, name: str) -> Node:
        return self.node

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None:
        pass


def stored(bus: Bus, node: str) -> NodeTopologyReported:
    got = topology_decoder.decode(bus.buckets[S.KV_TOPOLOGY].data[S.token(node)])
    assert isinstance(got, NodeTopologyReported)
    return got


def test_the_annotation_names_gpus_of_the_node_only():
    topo = load_file(FILE_4GPU, node="n1")
    assert [H.by_annotation(topo, {SIM_UNHEALTHY_GPUS: text}) for text in (
        "2", " 3, 0 ,3", "", "x,7,-1,1", "1.0")] == [(2,), (0, 3), (), (1,), ()]
    assert H.by_annotation(topo, {}) == ()
    assert H.by_uuid(topo, {"GPU-nope"}) == ()


async def test_a_gpu_nvml_loses_is_reported_unhealthy_by_its_index_at_the_next_health_check(tmp_path):
    machine = FakeMachine.from_topology(load_file(FILE_4GPU, node="n1"))
    machine.write_sysfs(tmp_path)
    nvml = FakeNvml(machine)
    read = lambda: NvmlDiscovery(nvml, sysfs_root=tmp_path).discover("n1")  # noqa: E731
    uuids = [g.uuid for g in read().gpus]
    assert len(set(uuids)) == 4 and all(uuids)
    bus = Bus()
    agent = Discovery(bus, Cluster(Node(name="n1", labels=LABELS)), Config(node="n1", advertise="none"), read,
                      health=nvml_health(nvml))
    await agent.report_once()
    assert stored(bus, "n1").unhealthy == () and len(bus.published) == 1
    assert await agent.health_check() is False  # nothing changed: no report
    nvml.lost.add(uuids[2])
    with pytest.raises(Exception, match="GPU is lost"):
        read()  # discovery fails as a whole while a GPU is lost: the last topology is reported
    assert await agent.health_check() is True
    first = stored(bus, "n1")
    assert (first.unhealthy, first.topology.generation, first.enabled) == ((2,), 0, True)
    assert [(s, e.unhealthy) for s, e in bus.published] == [(S.topology_subject("n1"), ()),
                                                             (S.topology_subject("n1"), (2,))]
    assert await agent.health_check() is False
    await agent.report_once()  # a beat with the GPU still lost: nothing new
    assert len(bus.published) == 2
    nvml.lost.clear()
    assert await agent.health_check() is True
    assert stored(bus, "n1").unhealthy == () and len(bus.published) == 3


async def test_when_nvml_cannot_start_every_gpu_is_unhealthy():
    topo = load_file(FILE_4GPU, node="n1")
    machine = FakeMachine.from_topology(topo)
    gpus = NvmlDiscovery(FakeNvml(machine)).discover("n1")
    assert nvml_health(FakeNvml(None))(gpus, None) == (0, 1, 2, 3)


async def test_on_a_file_node_the_annotation_read_each_beat_is_the_health():
    topo = load_file(FILE_4GPU, node="n1")
    cluster = Cluster(Node(name="n1", labels=LABELS))
    bus = Bus()
    agent = Discovery(bus, cluster, Config(node="n1", advertise="none"), lambda: topo, health=annotated_health)
    await agent.report_once()
    assert stored(bus, "n1").unhealthy == ()
    cluster.node = Node(name="n1", labels=LABELS, annotations={SIM_UNHEALTHY_GPUS: "3,1"})
    assert agent.reads(cluster.node) == (LABELS, (1, 3))  # what the node fleet compares
    await agent.report_once()
    assert stored(bus, "n1") == NodeTopologyReported(node="n1", topology=topo, tiers=stored(bus, "n1").tiers,
                                                     unhealthy=(1, 3))
    assert [e.unhealthy for _, e in bus.published] == [(), (1, 3)]
    cluster.node = Node(name="n1", labels=LABELS)
    await agent.report_once()
    assert [e.unhealthy for _, e in bus.published] == [(), (1, 3), ()]
