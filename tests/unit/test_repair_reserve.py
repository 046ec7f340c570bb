"""Spare capacity per domain for repairs (libs/phalanx_rules/reserve.py, docs/queues.md
"Spare capacity for repairs"): a queue's ``spec.repairReserve`` ({tier, gpus}) keeps that many
free GPUs, in each domain of the tier where the queue runs gangs, from other queues' new work —
never from its own gangs nor from repairs — and the reserve comes out of the queue's unused
quota. Table-driven, whole values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from engine_builders import node, pod, snapshot

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import Decision
from phalanx_kubeobjects.queuespec import queue_from_object
from phalanx_placement.spare import kept_detail, kept_from
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.queues import GPU_UNITS, QueueSpec, RepairReserve
from phalanx_proto.queuespec import RESERVE_TIERS
from phalanx_proto.state import Allocation, NodeLedger, alloc_key
from phalanx_rules.queues import QueueTree
from phalanx_rules.reserve import Reserve, held_back, reserves

G = GPU_UNITS

# Two leaves of two 8-GPU nodes each: a1, a2 on leaf-a, b1, b2 on leaf-b.
LEAF = {"a1": "leaf-a", "a2": "leaf-a", "b1": "leaf-b", "b2": "leaf-b"}


def domain(name: str, tier: str) -> str:
    return LEAF[name] if tier == "leaf" else name


def ref(name: str) -> PodRef:
    return PodRef(namespace="ns", name=name, uid=f"uid-{name}")


def q(name: str, quota: float, reserve: int | None = None, tier: str = "leaf", problem: str = "") -> QueueSpec:
    return QueueSpec(name=name, quota=round(quota * G), problem=problem,
                     repair_reserve=None if reserve is None else RepairReserve(tier=tier, gpus=reserve))


@pytest.mark.parametrize(("specs", "held", "expected"), [
    pytest.param([q("a", 16, 4), q("b", 8)], {"a": 8 * G}, [Reserve("a", "leaf", 4)], id="a reserve within the unused quota"),
    pytest.param([q("a", 16, 4)], {"a": 14 * G}, [Reserve("a", "leaf", 2)], id="cut to what is left of the quota"),
    pytest.param([q("a", 16, 4)], {"a": 16 * G}, [], id="a queue at its quota keeps nothing back"),
    pytest.param([q("a", 16, 4)], {"a": 20 * G}, [], id="nor one beyond it"),
    pytest.param([q("a", 16, 4, problem="queue x does not exist")], {}, [], id="a broken queue keeps nothing back"),
    pytest.param([q("b", 8, 2, tier="node"), q("a", 8, 4)], {}, [Reserve("a", "leaf", 4), Reserve("b", "node", 2)],
                 id="several, by queue name"),
])
def test_reserves_are_cut_to_the_queues_unused_quota(specs, held, expected):
    assert reserves(QueueTree.of(specs), held) == expected


@pytest.mark.parametrize(("rs", "queue", "running", "free", "expected"), [
    pytest.param([Reserve("a", "leaf", 4)], "b", {"a": {"a1"}}, {"a1": 2, "a2": 6, "b1": 8, "b2": 8},
                 {"a2": "a"}, id="the node with the most free GPUs in the queue's leaf covers the reserve"),
    pytest.param([Reserve("a", "leaf", 8)], "b", {"a": {"a1"}}, {"a1": 4, "a2": 6, "b1": 8, "b2": 8},
                 {"a1": "a", "a2": "a"}, id="nodes are added until the reserve is covered"),
    pytest.param([Reserve("a", "leaf", 4)], "b", {"a": {"a1", "b1"}}, {"a1": 0, "a2": 8, "b1": 0, "b2": 8},
                 {"a2": "a", "b2": "a"}, id="in every leaf where the queue runs gangs"),
    pytest.param([Reserve("a", "leaf", 4)], "a", {"a": {"a1"}}, {"a1": 2, "a2": 6, "b1": 8, "b2": 8},
                 {}, id="never from the queue's own gangs"),
    pytest.param([Reserve("a", "leaf", 4)], "b", {}, {"a1": 2, "a2": 6, "b1": 8, "b2": 8},
                 {}, id="nothing where the queue runs no gang"),
    pytest.param([Reserve("a", "leaf", 4)], "b", {"a": {"a1"}}, {"a1": 0, "a2": 0, "b1": 8, "b2": 8},
                 {}, id="a full leaf has nothing to keep"),
    pytest.param([Reserve("a", "leaf", 4), Reserve("c", "leaf", 4)], "b", {"a": {"a1"}, "c": {"a1"}},
                 {"a1": 0, "a2": 6, "b1": 8, "b2": 8}, {"a2": "a"},
                 id="two reserves in one leaf share its free GPUs: the second finds them taken"),
    pytest.param([Reserve("a", "leaf", 4), Reserve("c", "leaf", 4)], "b", {"a": {"a1"}, "c": {"a1"}},
                 {"a1": 4, "a2": 6, "b1": 8, "b2": 8}, {"a1": "c", "a2": "a"},
                 id="two reserves in one leaf each get their own node"),
    pytest.param([Reserve("a", "node", 2)], "b", {"a": {"a1"}}, {"a1": 2, "a2": 8, "b1": 8, "b2": 8},
                 {"a1": "a"}, id="tier node: the queue's own nodes"),
])
def test_the_nodes_held_back_from_a_queues_new_work(rs, queue, running, free, expected):
    assert held_back(rs, queue, running, free, domain) == expected


ROOT = Path(__file__).resolve().parents[2]
CRDS = [ROOT / "deploy/k8s/crds/queues.scheduling.phalanx.io.yaml",
        ROOT / "deploy/helm/phalanx/crds/queues.scheduling.phalanx.io.yaml"]


def read(reserve, quota: float = 16):
    return queue_from_object({"metadata": {"name": "team-a"}, "spec": {
        "resources": {"nvidia.com/gpu": {"quota": quota}}, "repairReserve": reserve}})


@pytest.mark.parametrize(("reserve", "quota", "got", "problem"), [
    ({"tier": "leaf", "gpus": 8}, 16, RepairReserve(tier="leaf", gpus=8), ""),
    ({"tier": "node", "gpus": 16}, 16, RepairReserve(tier="node", gpus=16), ""),
    ({"tier": "leaf", "gpus": 17}, 16, None, "spec.repairReserve.gpus: at most the queue's quota (16 GPUs): the "
                                              "reserve is kept out of it"),
    ({"tier": "rack", "gpus": 4}, 16, None, "spec.repairReserve.tier: one of node, hypernode, leaf, netpod"),
    ({"tier": "leaf", "gpus": 0}, 16, None, "spec.repairReserve.gpus: a whole number of GPUs from 1 to 1000000"),
    ({"tier": "leaf", "gpus": 2.5}, 16, None, "spec.repairReserve.gpus: a whole number of GPUs from 1 to 1000000"),
    ({"tier": "leaf", "gpus": True}, 16, None, "spec.repairReserve.gpus: a whole number of GPUs from 1 to 1000000"),
    ({"tier": "leaf"}, 16, None, "spec.repairReserve.gpus: a whole number of GPUs from 1 to 1000000"),
    ({"tier": "leaf", "gpus": 4, "nodes": 1}, 16, None, "spec.repairReserve.nodes: unknown field (tier, gpus)"),
    ("leaf", 16, None, "spec.repairReserve: must be an object with tier and gpus"),
])
def test_the_queue_object_reads_repair_reserve(reserve, quota, got, problem):
    spec = read(reserve, quota)
    assert (spec.repair_reserve, spec.problem) == (got, problem)


@pytest.mark.parametrize("crd", CRDS, ids=["deploy", "helm"])
def test_the_crd_declares_repair_reserve_as_the_reader_reads_it(crd):
    doc = yaml.safe_load(crd.read_text())
    props = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    field = props["repairReserve"]
    assert (field["type"], sorted(field["required"]), sorted(field["properties"])) == (
        "object", ["gpus", "tier"], ["gpus", "tier"])
    assert field["properties"]["tier"]["enum"] == list(RESERVE_TIERS)
    assert {k: field["properties"]["gpus"][k] for k in ("type", "minimum", "maximum")} == {
        "type": "integer", "minimum": 1, "maximum": 1000000}


def test_placement_keeps_a_reserving_queues_leaf_node_from_another_queues_gang_and_not_from_its_own():
    """placement's wiring (services/phalanx_placement/spare.py) on a real cluster view: team-a
    (quota 16, reserve 4 GPUs per leaf) runs on a1; leaf-a's free node a2 is kept from team-b's
    gang, which the engine then places in leaf-b; team-a's own gang may take a2."""
    nodes = {n: node(n).gpus(8).tiers(leaf=leaf, netpod="np") for n, leaf in LEAF.items()}
    held = Assignment(pod=ref("a-0"), node="a1", gpus=tuple(range(8)))
    nodes["a1"].reserved(held)
    cluster = Cluster.from_snapshot(snapshot(*nodes.values()))
    ledgers = [NodeLedger(node="a1", allocations={alloc_key(held.pod): Allocation(
        gang_id="ns/a", attempt=1, assignment=held, queues=("team-a",))})]
    tree = QueueTree.of([q("team-a", 16, 4), q("team-b", 8)])
    kept = kept_from("team-b", cluster, ledgers, tree, {"team-a": 8 * G})
    assert kept == {"a2": "team-a"}
    assert kept_from("team-a", cluster, ledgers, tree, {"team-a": 8 * G}) == {}
    places = [decide(cluster, (pod("b").gpus(8).spec(),), avoid=avoid) for avoid in (frozenset(), kept.keys())]
    assert [[a.node for a in got.assignments] if isinstance(got, Decision) else got for got in places] == [
        ["a2"], ["b1"]]  # without the reserve, a2
    assert kept_detail(kept, tree) == ("1 node(s) held back as spare capacity for queue team-a's repairs "
                                       "(4 GPUs per leaf switch): a2")
