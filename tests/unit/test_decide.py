"""The placement engine's decisions on small clusters built from real topology fixtures."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import Decision, NodeView, NoFit, Snapshot
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.topology import NetworkTiers
from phalanx_topology import load_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
V100 = load_file(FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt", node="x")
A100 = load_file(FIXTURES / "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt", node="x")


def node(name: str, topo=V100, *, hypernode="", leaf="", netpod="", allocations=(), enabled=True, fresh=True,
         model="", memory_mib=0, mig=False) -> NodeView:
    gpus = tuple(msgspec.structs.replace(g, model=model or g.model, memory_mib=memory_mib or g.memory_mib,
                                         mig_enabled=mig or g.mig_enabled) for g in topo.gpus)
    t = msgspec.structs.replace(topo, node=name, gpus=gpus)
    return NodeView(name=name, topology=t, enabled=enabled, fresh=fresh, allocations=tuple(allocations),
                    tiers=NetworkTiers(hypernode=hypernode or f"node:{name}", leaf=leaf or hypernode or f"node:{name}",
                                       netpod=netpod or leaf or hypernode or f"node:{name}"))


def member(name: str, gpus: int = 1, **kw) -> MemberSpec:
    return MemberSpec(pod=PodRef(namespace="default", name=name), gpus=gpus, **kw)


def taken(node_name: str, *gpus: int) -> Assignment:
    return Assignment(pod=PodRef(namespace="default", name=f"busy-{node_name}-{gpus}"), node=node_name, gpus=gpus)


def placed(result) -> list[tuple[str, str, tuple[int, ...]]]:
    assert isinstance(result, Decision), result
    return [(a.pod.name, a.node, a.gpus) for a in result.assignments]


def test_a_four_gpu_pod_gets_an_nvlink_quad_of_the_v100_cube_mesh():
    got = decide(Cluster.from_snapshot(Snapshot(nodes=(node("a"),))), (member("p", 4),))
    assert placed(got) == [("p", "a", (0, 1, 2, 3))]


def test_a_single_pod_goes_to_the_tightest_node_that_fits():
    snap = Snapshot(nodes=(node("a"), node("b", allocations=[taken("b", 0, 1, 2, 3)])))
    got = decide(Cluster.from_snapshot(snap), (member("p", 2),))
    assert placed(got)[0][1] == "b"


def test_a_gang_lands_whole_on_one_hypernode_when_it_fits():
    snap = Snapshot(nodes=(
        node("a1", hypernode="h1", netpod="np"), node("a2", hypernode="h1", netpod="np"),
        node("b1", hypernode="h2", netpod="np", allocations=[taken("b1", 0)]), node("b2", hypernode="h2", netpod="np"),
    ))
    gang = tuple(member(f"w{i}", 2) for i in range(7))
    got = placed(decide(Cluster.from_snapshot(snap), gang))
    assert {n for _, n, _ in got} <= {"b1", "b2"} or {n for _, n, _ in got} <= {"a1", "a2"}
    assert len({(n, g) for _, n, gs in got for g in gs}) == 14


def test_a_gang_too_big_for_any_network_pod_is_refused_whole_with_the_reason():
    snap = Snapshot(nodes=(node("a1", netpod="np1"), node("a2", netpod="np2")))
    got = decide(Cluster.from_snapshot(snap), tuple(member(f"w{i}", 4) for i in range(3)))
    assert isinstance(got, NoFit)
    assert got.summary == ("0/2 nodes are available: 2 cannot hold the gang's 3 members within one network-pod; "
                           "gang of 3 members needs 12 whole GPU(s) in one network-pod; "
                           "no network-pod has that many free.")


def test_reasons_count_nodes_per_reason_like_kube_scheduler():
    snap = Snapshot(nodes=(node("a", enabled=False), node("b", fresh=False),
                           node("c", allocations=[taken("c", *range(8))])))
    got = decide(Cluster.from_snapshot(snap), (member("p", 1),))
    assert isinstance(got, NoFit)
    assert got.summary == ("0/3 nodes are available: 1 insufficient free GPUs, 1 not enabled for Phalanx, "
                           "1 topology heartbeat stale.")


@pytest.mark.parametrize(("ask", "expected"), [
    (dict(core_pct=50, memory_mib=4096), ("a", (0,))),
    (dict(core_pct=60), ("a", (1,))),
])
def test_tdm_shares_pack_onto_partly_used_gpus_and_nodes_first(ask, expected):
    share = Assignment(pod=PodRef(namespace="default", name="s"), node="a", gpus=(0,), core_pct=50, memory_mib=4096)
    snap = Snapshot(nodes=(node("a", allocations=[share], memory_mib=16384), node("b", memory_mib=16384)))
    got = placed(decide(Cluster.from_snapshot(snap), (member("t", 1, **ask),)))
    assert got[0][1:] == expected


def test_tdm_memory_on_a_gpu_with_unknown_memory_is_refused_with_that_reason():
    got = decide(Cluster.from_snapshot(Snapshot(nodes=(node("a"),))), (member("t", 1, core_pct=10, memory_mib=1024),))
    assert isinstance(got, NoFit) and "GPU memory not reported" in got.summary


def test_mig_goes_to_a_mig_enabled_a100_with_a_legal_slot():
    snap = Snapshot(nodes=(node("v", model="Tesla V100-SXM2-16GB"),
                           node("m", topo=A100, model="NVIDIA A100-SXM4-40GB", memory_mib=40960, mig=True)))
    got = decide(Cluster.from_snapshot(snap), (member("g", 1, mig_slices=3, memory_mib=20480),))
    assert isinstance(got, Decision)
    a = got.assignments[0]
    assert (a.node, a.mig_profile, a.mig_start in (0, 4)) == ("m", "3g.20gb", True)


def test_mig_on_a_model_without_mig_says_so():
    snap = Snapshot(nodes=(node("v", model="Tesla V100-SXM2-16GB"),))
    got = decide(Cluster.from_snapshot(snap), (member("g", 1, mig_slices=1, memory_mib=5120),))
    assert isinstance(got, NoFit) and got.summary == "0/1 nodes are available: 1 no MIG-capable GPU."


def test_rdma_pod_gets_gpus_and_the_nic_on_their_pcie_switch():
    got = decide(Cluster.from_snapshot(Snapshot(nodes=(node("a"),))), (member("r", 2, rdma=True),))
    assert isinstance(got, Decision)
    a = got.assignments[0]
    assert (a.gpus, a.nics, a.rdma_level) == ((2, 3), ("mlx5_0",), "pcie-switch")


def test_the_decision_leaves_the_cluster_state_untouched():
    cluster = Cluster.from_snapshot(Snapshot(nodes=(node("a"),)))
    decide(cluster, (member("p", 8),))
    assert len(cluster.nodes["a"].free_whole()) == 8


def test_a_tdm_share_goes_to_the_tightest_gpu_in_the_cluster_not_the_first_node():
    half = Assignment(pod=PodRef(namespace="default", name="s1"), node="b", gpus=(5,), core_pct=70, memory_mib=8192)
    snap = Snapshot(nodes=(node("a", allocations=[taken("a", 0, 1, 2, 3)], memory_mib=16384),
                           node("b", allocations=[half], memory_mib=16384)))
    got = placed(decide(Cluster.from_snapshot(snap), (member("t", 1, core_pct=30, memory_mib=4096),)))
    assert got == [("t", "b", (5,))]
