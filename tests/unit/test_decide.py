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
    assert got == NoFit(total_nodes=3, resolvable=True, failures=(MemberFailure(members=(pod("p").spec().pod,),
                                                                                what="p (1 GPU)", statuses={
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


def test_a_gang_of_mig_pods_on_v100_nodes_is_told_no_mig_capable_gpu_and_that_waiting_cannot_help():
    got = run(node("v1").gpus(8), node("v2").gpus(8), members=[pod("m0").mig(3, 20480), pod("m1").mig(3, 20480)])
    no_mig = status("MigSlice", Code.NO_MIG_GPU, gpu.R_NO_MIG, resolvable=False)
    assert got == NoFit(total_nodes=2, resolvable=False, failures=(MemberFailure(
        members=(pod("m0").spec().pod, pod("m1").spec().pod), what="m0 and 1 more (a 3-slice MIG instance)",
        statuses={"v1": no_mig, "v2": no_mig}),))
    assert got.summary == "0/2 nodes are available: 2 no MIG-capable GPU."


def test_each_kind_of_member_says_what_kept_each_node_out():
    got = run(node("a").gpus(8).taint("dedicated", "infra"), node("b").gpus(8).busy(0, 1, 2, 3, 4, 5),
              node("c").gpus(8).label("role", "train"),
              members=[pod("launcher").gpus(1).selector(role="launch"), pod("w0").gpus(4), pod("w1").gpus(4)])
    assert isinstance(got, NoFit) and not got.resolvable
    assert got.summary == (
        "launcher (1 GPU): 0/3 nodes are available: 1 node(s) had untolerated taint(s), "
        "2 node(s) didn't match Pod's node affinity/selector; "
        "w0 and 1 more (4 GPUs): 0/3 nodes are available: 1 cannot hold the gang's 3 members within one network-pod, "
        "1 insufficient free GPUs, 1 node(s) had untolerated taint(s).")


@pytest.mark.parametrize(("nodes", "members", "resolvable"), [
    pytest.param([node("a").gpus(8).busy(*range(8)).tiers(netpod="np"), node("b").gpus(8).busy(0).tiers(netpod="np")],
                 [pod(f"w{i}").gpus(4) for i in range(3)], True,
                 id="a gang blocked by reservations may fit once they leave"),
    pytest.param([node("a").gpus(8).tiers(netpod="np1"), node("b").gpus(8).tiers(netpod="np2")],
                 [pod(f"w{i}").gpus(4) for i in range(3)], False,
                 id="a gang larger than every network-pod never fits"),
    pytest.param([node("a").gpus(8).taint("dedicated", "infra"), node("b").gpus(8).busy(*range(8))],
                 [pod("w0").gpus(8), pod("w1").gpus(8)], False,
                 id="only one node could ever take an 8-GPU member, the gang needs two"),
    pytest.param([node("a").gpus(8).allocatable(cpu=4000).running(cpu=3000)], [pod("p").gpus(1).requests(cpu=2000)],
                 True, id="CPU that other pods hold may come free"),
    pytest.param([node("a").gpus(8).allocatable(cpu=1000)], [pod("p").gpus(1).requests(cpu=2000)], False,
                 id="more CPU than the node has never comes free"),
])
def test_whether_waiting_can_help_comes_from_the_statuses(nodes, members, resolvable):
    got = run(*nodes, members=members)
    assert isinstance(got, NoFit) and got.resolvable is resolvable


def test_without_explaining_a_refusal_carries_no_statuses():
    cluster = Cluster.from_snapshot(snapshot(node("a").gpus(8).busy(*range(8))))
    assert decide(cluster, (pod("p").gpus(1).spec(),), explain=False) == NoFit(total_nodes=1)
    assert decide(cluster, (pod("p").gpus(1).spec(), pod("q").gpus(1).spec()), explain=False) == NoFit(total_nodes=1)


def test_nodes_kept_for_a_gang_ahead_are_left_alone_and_shown_as_kept():
    cluster = Cluster.from_snapshot(snapshot(node("a").gpus(8), node("b").gpus(8).busy(*range(6))))
    assert decide(cluster, (pod("p").gpus(2).spec(),), avoid={"b"}) == Decision(assignments=(placed("p", "a", 0, 3),))
    got = decide(cluster, (pod("p").gpus(4).spec(),), avoid={"a"})
    assert isinstance(got, NoFit) and got.resolvable
    assert got.summary == "0/2 nodes are available: 1 insufficient free GPUs, 1 kept for a gang ahead in the queue."


def test_a_gang_that_could_only_use_kept_nodes_still_counts_as_resolvable():
    cluster = Cluster.from_snapshot(snapshot(node("a").gpus(8).tiers(netpod="np"), node("b").gpus(8).tiers(netpod="np")))
    got = decide(cluster, tuple(pod(f"w{i}").gpus(4).spec() for i in range(4)), avoid={"a", "b"})
    assert isinstance(got, NoFit) and got.resolvable
    assert got.summary == "0/2 nodes are available: 2 kept for a gang ahead in the queue."
