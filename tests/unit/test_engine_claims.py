"""The engine's claims step (``phalanx_engine.claims``) inside whole decisions: a member's
ResourceClaims are allocated on the node it goes to, a gang's members never share a device and
share a claim once, the device-plugin path and DRA never give one GPU twice, and a pod whose
claims fit nowhere says why in kube-scheduler's words.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from dra_builders import GPU_CLASS, claim, gpu_pool, pci, request

from phalanx_engine.cluster import Cluster
from phalanx_engine.decide import decide
from phalanx_engine.snapshot import Decision, NodeView, Snapshot
from phalanx_engine.status import NoFit
from phalanx_proto.dra import ClaimSpec, PodClaim
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import NodeTopology
from phalanx_topology import load_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


def v100(node: str) -> NodeTopology:
    """The DGX-1V cube mesh (NVLink quads 0-3 and 4-7) with the GPU ids the builders publish."""
    t = load_file(FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt", node=node)
    return msgspec.structs.replace(t, gpus=tuple(
        msgspec.structs.replace(g, uuid=f"GPU-{g.index:08d}", pci_bus_id=pci(g.index)) for g in t.gpus))


def view(node: str, *, in_use: tuple[str, ...] = (), allocations: tuple[Assignment, ...] = ()) -> NodeView:
    pool = gpu_pool(node, in_use=in_use)
    pool = msgspec.structs.replace(pool, in_use=tuple(msgspec.structs.replace(u, claim=f"x/held-{node}/u0")
                                                      for u in pool.in_use))
    return NodeView(name=node, topology=v100(node), dra=(pool,), allocations=allocations,
                    kube=NodeKubeState(allocatable={"cpu": 64000, "memory": 2**40, "pods": 110}, ready="True"))


def member(name: str, *claims: ClaimSpec, gpus: int = 0) -> MemberSpec:
    return MemberSpec(pod=PodRef(namespace="t", name=name, uid=f"uid-{name}"), gpus=gpus,
                      claims=tuple(PodClaim(name=f"c{i}", claim=c) for i, c in enumerate(claims)))


def gpu_claim(name: str, count: int) -> ClaimSpec:
    c = claim(name, request("gpu", GPU_CLASS, count))
    return msgspec.structs.replace(c, namespace="t", uid=f"uid-{name}")


def placed(result) -> Decision:
    assert isinstance(result, Decision), getattr(result, "summary", result)
    return result


def devices(a: Assignment) -> list[str]:
    return sorted(d.device for c in a.claims for d in c.allocation.devices)


def test_a_four_gpu_claim_gets_an_nvlink_quad_and_the_reservation_holds_those_gpus():
    # GPU 1 is held by another scheduler's claim: first-fit would take 0, 2, 3, 4
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1", in_use=("gpu-1",)),)))
    (a,) = placed(decide(cluster, (member("p", gpu_claim("quad", 4)),))).assignments
    assert (a.node, devices(a), a.gpus) == ("n1", ["gpu-4", "gpu-5", "gpu-6", "gpu-7"], (4, 5, 6, 7))
    (c,) = a.claims
    assert (c.claim, c.pod_claim, c.allocated, c.gpus) == ("t/quad/uid-quad", "c0", True, (4, 5, 6, 7))


def test_two_members_needing_halves_of_one_node_each_get_a_quad_and_never_one_device_twice():
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1"),)))
    got = placed(decide(cluster, (member("a", gpu_claim("ca", 4)), member("b", gpu_claim("cb", 4)))))
    quads = sorted(tuple(a.gpus) for a in got.assignments)
    assert quads == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert not set(devices(got.assignments[0])) & set(devices(got.assignments[1]))


def test_a_claim_shared_by_two_members_is_allocated_once_and_both_go_where_it_can_be_used():
    shared = gpu_claim("shared", 2)
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1"), view("n2"))))
    got = placed(decide(cluster, (member("a", shared), member("b", shared))))
    first, second = got.assignments
    assert first.node == second.node
    assert [c.allocated for c in first.claims + second.claims] == [True, False]
    assert first.claims[0].allocation == second.claims[0].allocation


def test_a_gpu_reserved_through_the_device_plugin_is_never_given_to_a_claim_and_back():
    plugin = Assignment(pod=PodRef(namespace="t", name="plugin", uid="u-plugin"), node="n1", gpus=(0, 1, 2, 3, 4, 5))
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1", allocations=(plugin,)),)))
    (a,) = placed(decide(cluster, (member("p", gpu_claim("two", 2)),))).assignments
    assert devices(a) == ["gpu-6", "gpu-7"]
    # and the other way: a device-plugin request sees the claim's GPUs taken
    cluster.assume((a,))
    refused = decide(cluster, (member("q", gpus=1),))
    assert isinstance(refused, NoFit)


def test_a_gpu_another_scheduler_allocated_through_dra_is_not_free_for_a_device_plugin_request():
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1", in_use=tuple(f"gpu-{i}" for i in range(7))),)))
    (a,) = placed(decide(cluster, (member("q", gpus=1),))).assignments
    assert a.gpus == (7,)
    assert isinstance(decide(cluster, (member("r", gpus=2),)), NoFit)


@pytest.mark.parametrize(("case", "claim_spec", "reason"), [
    ("more GPUs than any node has free", gpu_claim("nine", 9), "cannot allocate all claims"),
    ("a device class that does not exist", msgspec.structs.replace(
        gpu_claim("nocls", 1), requests=(request("gpu", msgspec.structs.replace(GPU_CLASS, name="gone", missing=True),
                                                 1),)), "device class gone does not exist"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_pod_whose_claims_fit_nowhere_says_why_in_kube_schedulers_words(case, claim_spec, reason):
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1"), view("n2"))))
    got = decide(cluster, (member("p", claim_spec),))
    assert isinstance(got, NoFit)
    assert "0/2 nodes are available" in got.summary and reason in got.summary, got.summary


def test_a_held_device_in_the_ledger_counts_even_before_the_api_shows_the_claim():
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1"),)))
    (a,) = placed(decide(cluster, (member("a", gpu_claim("ca", 8)),))).assignments
    cluster.assume((a,))  # committed: the ledger holds it, no pool's in_use shows it yet
    assert isinstance(decide(cluster, (member("b", gpu_claim("cb", 1)),)), NoFit)
