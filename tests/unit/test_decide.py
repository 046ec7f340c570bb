"""The placement engine's decisions on small clusters built from real topology fixtures:
whole Decisions and NoFits compared."""

from __future__ import annotations

import pytest
from engine_builders import GIB, node, pod, port, snapshot

from phalanx_engine import gpu_plugins as gpu
from phalanx_engine.decide import Cluster, decide, default_profile
from phalanx_engine.snapshot import Decision, NoFit
from phalanx_engine.status import Code, MemberFailure, Reason, Status
from phalanx_proto.events import Assignment

UNKNOWN = ("",) * 8


def placed(name: str, node_name: str, *gpus: int, **extra) -> Assignment:
    return Assignment(pod=pod(name).spec().pod, node=node_name, gpus=gpus, gpu_uuids=("",) * len(gpus), **extra)


def status(plugin: str, code: Code, text: str, *, resolvable: bool, **numbers) -> Status:
    return Status(plugin=plugin, reasons=(Reason(code=code, text=text, **numbers),), resolvable=resolvable)


def run(*nodes, members):
    return decide(Cluster.from_snapshot(snapshot(*nodes)), tuple(m.spec() for m in members))


@pytest.mark.parametrize(("nodes", "members", "expected"), [
    pytest.param([node("a").gpus(8)], [pod("p").gpus(4)], Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)),
                 id="a four-GPU pod gets an NVLink quad of the V100 cube mesh"),
    pytest.param([node("a").gpus(8), node("b").gpus(8).busy(0, 1, 2, 3)], [pod("p").gpus(2)],
                 Decision(assignments=(placed("p", "b", 4, 7),)),
                 id="a single pod goes to the tightest node that fits"),
    pytest.param([node("a").gpus(8).share(0, core=50, memory_mib=4096), node("b").gpus(8)],
                 [pod("t").share(core=50, memory_mib=4096)],
                 Decision(assignments=(placed("t", "a", 0, core_pct=50, memory_mib=4096),)),
                 id="a TDM share packs onto the partly used GPU"),
    pytest.param([node("a").gpus(8).share(0, core=50), node("b").gpus(8)], [pod("t").share(core=60)],
                 Decision(assignments=(placed("t", "a", 1, core_pct=60),)),
                 id="a share that does not fit the used GPU opens the next GPU of the same node"),
    pytest.param([node("a").gpus(8).busy(0, 1, 2, 3), node("b").gpus(8).share(5, core=70, memory_mib=8192)],
                 [pod("t").share(core=30, memory_mib=4096)],
                 Decision(assignments=(placed("t", "b", 5, core_pct=30, memory_mib=4096),)),
                 id="a TDM share goes to the tightest GPU in the cluster, not the first node"),
    pytest.param([node("a").gpus(8)], [pod("r").gpus(2).rdma()],
                 Decision(assignments=(placed("r", "a", 2, 3, nics=("mlx5_0",), rdma_level="pcie-switch"),)),
                 id="an RDMA pod gets GPUs and the NIC on their PCIe switch"),
    pytest.param([node("v").gpus(8), node("m").gpus(8, model="A100", mig=True)], [pod("g").mig(3, 20480)],
                 Decision(assignments=(placed("g", "m", 0, memory_mib=20480, mig_profile="3g.20gb", mig_start=4),)),
                 id="MIG goes to a MIG-enabled A100 with a legal slot"),
])
def test_decisions(nodes, members, expected):
    assert run(*nodes, members=members) == expected


def test_a_gang_lands_whole_on_one_hypernode_when_it_fits():
    nodes = [node("a1").gpus(8).tiers(hypernode="h1", netpod="np"), node("a2").gpus(8).tiers(hypernode="h1", netpod="np"),
             node("b1").gpus(8).tiers(hypernode="h2", netpod="np").busy(0),
             node("b2").gpus(8).tiers(hypernode="h2", netpod="np")]
    got = run(*nodes, members=[pod(f"w{i}").gpus(2) for i in range(7)])
    assert isinstance(got, Decision)
    hosts = {a.node for a in got.assignments}
    assert hosts <= {"b1", "b2"} or hosts <= {"a1", "a2"}
    assert len({(a.node, g) for a in got.assignments for g in a.gpus}) == 14


def test_a_gang_too_big_for_any_network_pod_is_refused_whole_with_the_reason():
    got = run(node("a1").gpus(8).tiers(netpod="np1"), node("a2").gpus(8).tiers(netpod="np2"),
              members=[pod(f"w{i}").gpus(4) for i in range(3)])
    assert isinstance(got, NoFit)
    assert got.summary == ("0/2 nodes are available: 2 cannot hold the gang's 3 members within one network-pod; "
                           "gang of 3 members needs 12 whole GPU(s) in one network-pod; "
                           "no network-pod has that many free.")


def test_a_single_pod_that_fits_nowhere_gets_every_nodes_status():
    got = run(node("a").gpus(8).disabled(), node("b").gpus(8).stale(), node("c").gpus(8).busy(*range(8)),
              members=[pod("p").gpus(1)])
    assert got == NoFit(total_nodes=3, failures=(MemberFailure(members=(pod("p").spec().pod,), statuses={
        "a": status("NodeUsable", Code.NOT_ENABLED, gpu.R_NOT_ENABLED, resolvable=False),
        "b": status("NodeUsable", Code.HEARTBEAT_STALE, gpu.R_STALE, resolvable=False),
        "c": status("WholeGpus", Code.INSUFFICIENT_GPUS, gpu.R_GPUS, resolvable=True, resource="nvidia.com/gpu",
                    requested=1, free=0, capacity=8),
    }),))
    assert got.summary == ("0/3 nodes are available: 1 insufficient free GPUs, 1 not enabled for Phalanx, "
                           "1 topology heartbeat stale.")


def test_tdm_memory_on_a_gpu_with_unknown_memory_is_refused_with_that_reason():
    got = run(node("a").gpus(8, memory_mib=0), members=[pod("t").share(core=10, memory_mib=1024)])
    assert isinstance(got, NoFit) and got.summary == "0/1 nodes are available: 1 GPU memory not reported."


def test_mig_on_a_model_without_mig_says_so():
    got = run(node("v").gpus(8), members=[pod("g").mig(1, 5120)])
    assert isinstance(got, NoFit) and got.summary == "0/1 nodes are available: 1 no MIG-capable GPU."


def test_the_decision_leaves_the_cluster_state_untouched():
    cluster = Cluster.from_snapshot(snapshot(node("a").gpus(8)))
    decide(cluster, (pod("p").gpus(8).spec(),))
    assert len(cluster.nodes["a"].free_whole()) == 8


def test_kubernetes_reasons_are_counted_in_kube_schedulers_words():
    got = run(node("a").gpus(8).label("gpu", "v100").allocatable(cpu=2000),
              node("b").gpus(8).label("gpu", "v100").taint("dedicated", "infra"),
              node("c").gpus(8).label("gpu", "v100").cordoned(), node("d").gpus(8).label("gpu", "a100"),
              node("e").gpus(8).unreported(),
              members=[pod("p").gpus(1).requests(cpu=4000).selector(gpu="v100")])
    assert isinstance(got, NoFit)
    assert got.summary == ("0/5 nodes are available: 1 Insufficient cpu, 1 node state not reported, "
                           "1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint(s), "
                           "1 node(s) were unschedulable.")


def test_a_profile_that_does_not_require_node_state_names_the_nodes_it_could_not_check():
    cluster = Cluster.from_snapshot(snapshot(node("a").gpus(8).unreported()))
    got = decide(cluster, (pod("p").gpus(1).requests(cpu=1000).spec(),), default_profile(require_node_state=False))
    assert got == Decision(assignments=(placed("p", "a", 0, requests={"cpu": 1000}),), unchecked=("a",))


def test_the_assignment_carries_the_members_requests_and_ports_for_the_ledger():
    got = run(node("a").gpus(8), members=[pod("p").gpus(1).requests(cpu=500, memory=GIB).ports(port(9000))])
    assert got == Decision(assignments=(placed("p", "a", 0, requests={"cpu": 500, "memory": GIB},
                                               host_ports=(port(9000),)),))
