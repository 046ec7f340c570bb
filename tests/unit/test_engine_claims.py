"""The engine's claims step (``phalanx_engine.claims``) inside whole decisions: a member's
ResourceClaims are allocated on the node it goes to, a gang's members never share a device and
share a claim once, the device-plugin path and DRA never give one GPU twice, and a pod whose
claims fit nowhere says why in kube-scheduler's words.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest
from dra_builders import GPU_CLASS, claim, exact, first_available, gpu_pool, pci, request

from phalanx_engine.cluster import Cluster
from phalanx_engine.decide import decide
from phalanx_engine.snapshot import Decision, NodeView, Snapshot
from phalanx_engine.status import NoFit
from phalanx_proto.dra import ClaimSpec, ExtendedRequest, PodClaim
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import NetworkTiers, NodeTopology
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


def extended_member(name: str, gpus: int) -> MemberSpec:
    """A pod asking ``nvidia.com/gpu: <gpus>`` in a cluster whose gpu.nvidia.com class serves that
    resource (KEP-5004): it carries the claim Phalanx would make for it."""
    req = ExtendedRequest(request="container-0-request-0", container="c", index=0, resource="nvidia.com/gpu",
                          device_class="gpu.nvidia.com", count=gpus)
    spec = ClaimSpec(namespace="t", name="", uid=f"extended:uid-{name}", extended=True, extended_requests=(req,),
                     requests=(request(req.request, GPU_CLASS, gpus),))
    return msgspec.structs.replace(member(name, gpus=gpus), claims=(PodClaim(name="", claim=spec),))


def with_allocatable(v: NodeView, gpus: int) -> NodeView:
    return dataclasses.replace(v, kube=msgspec.structs.replace(v.kube, allocatable={**v.kube.allocatable,
                                                                                   "nvidia.com/gpu": gpus}))


def test_an_extended_resource_request_takes_the_device_plugin_path_where_the_node_has_the_plugin():
    cluster = Cluster.from_snapshot(Snapshot(nodes=(with_allocatable(view("n1"), 8),)))
    (a,) = placed(decide(cluster, (extended_member("p", 4),))).assignments
    assert (len(a.gpus), a.claims) == (4, ())


def test_on_a_dra_only_node_an_extended_resource_request_is_served_by_its_claim_on_an_nvlink_quad():
    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1", in_use=("gpu-1",)),)))
    (a,) = placed(decide(cluster, (extended_member("p", 4),))).assignments
    (c,) = a.claims
    assert (c.extended, c.extended_requests[0].resource, devices(a), a.gpus) == (
        True, "nvidia.com/gpu", ["gpu-4", "gpu-5", "gpu-6", "gpu-7"], (4, 5, 6, 7))


def in_clique(v: NodeView, clique: str) -> NodeView:
    return dataclasses.replace(v, tiers=NetworkTiers(hypernode=clique, leaf="leaf-1", netpod="pod-1"))


def cd_member(name: str, domain: str) -> MemberSpec:
    c = msgspec.structs.replace(gpu_claim(f"{name}-gpus", 8), compute_domain=domain)
    return member(name, c)


def test_a_compute_domain_gang_lands_in_one_nvlink_clique_and_never_in_one_hosting_another_domain():
    nodes = (in_clique(view("n1"), "c1"), in_clique(view("n2"), "c1"), in_clique(view("n3"), "c2"),
             in_clique(view("n4"), "c2"))
    cluster = Cluster.from_snapshot(Snapshot(nodes=nodes))
    first = placed(decide(cluster, (cd_member("a0", "cd-a"), cd_member("a1", "cd-a"))))
    cliques = {"n1": "c1", "n2": "c1", "n3": "c2", "n4": "c2"}
    (taken,) = {cliques[a.node] for a in first.assignments}
    assert {c.compute_domain for a in first.assignments for c in a.claims} == {"cd-a"}
    cluster.assume(first.assignments)
    # the other clique is whole and free; the first hosts cd-a, so cd-b goes to the other one
    second = placed(decide(cluster, (cd_member("b0", "cd-b"),)))
    assert {cliques[a.node] for a in second.assignments} == {"c1", "c2"} - {taken}
    cluster.assume(second.assignments)
    refused = decide(cluster, (cd_member("c0", "cd-c"),))
    assert isinstance(refused, NoFit) and "hosting no other ComputeDomain" in refused.summary, refused


def test_a_gang_whose_members_each_prefer_a_whole_node_fits_as_two_halves_by_their_next_alternative():
    def prefers_whole(name: str) -> ClaimSpec:
        return msgspec.structs.replace(claim(name, first_available(
            "gpu", exact(GPU_CLASS, 8, name="whole"), exact(GPU_CLASS, 4, name="half"))), namespace="t")

    cluster = Cluster.from_snapshot(Snapshot(nodes=(view("n1"),)))
    got = placed(decide(cluster, (member("a", prefers_whole("ca")), member("b", prefers_whole("cb")))))
    assert sorted(a.gpus for a in got.assignments) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert {d.request for a in got.assignments for c in a.claims for d in c.allocation.devices} == {"gpu/half"}
    # alone, a member gets what it prefers
    (solo,) = placed(decide(cluster, (member("c", prefers_whole("cc")),))).assignments
    assert {d.request for c in solo.claims for d in c.allocation.devices} == {"gpu/whole"}
