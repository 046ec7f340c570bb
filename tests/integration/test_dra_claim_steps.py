"""The saga's claim step and its compensation on the simulated cluster (real nats-server, each
service's own credentials): binder reserves every claim of a gang before any Binding, or binds
none; gang-coordinator's ``claims`` compensation takes the pods back out and clears what Phalanx
allocated, however often it runs (docs/dra.md, "Gangs").
"""

from __future__ import annotations

import msgspec
import pytest

from phalanx_binder import claims as binder_claims
from phalanx_bus import Bus, BusAuth
from phalanx_gang_coordinator import effects
from phalanx_kube.kvcluster import KvCluster
from phalanx_kube.port import ClaimRef
from phalanx_proto import subjects as S
from phalanx_proto.dra import AllocatedDevice, ClaimAllocated, ClaimAllocation, ExtendedRequest
from phalanx_proto.events import Assignment, PodRef, UnreserveClaims
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm
from phalanx_proto.state import GangState

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
async def clusters(nats_server, bus_secrets):
    """(user, binder's view, gang-coordinator's view) of one simulated cluster."""
    admin = await Bus.connect(nats_server.url, service="steps-admin")
    await admin.declare()
    binder = await Bus.connect(nats_server.url, service="steps-binder", auth=BusAuth.from_env(bus_secrets.env(S.BINDER)))
    coordinator = await Bus.connect(nats_server.url, service="steps-coordinator",
                                    auth=BusAuth.from_env(bus_secrets.env(S.GANG_COORDINATOR)))
    try:
        user = await KvCluster.open(admin)
        for bucket in (S.KV_SIM_DEVICE_CLASSES, S.KV_SIM_RESOURCE_SLICES, S.KV_SIM_RESOURCE_CLAIMS):
            await user._dra_kv(bucket)
        claims = await admin.kv(S.KV_SIM_RESOURCE_CLAIMS)
        for entry in await claims.items():
            await claims.delete(entry.key)
        yield user, await KvCluster.open(binder), await KvCluster.open(coordinator)
    finally:
        for bus in (coordinator, binder, admin):
            await bus.close()


def claim(name: str, *, finalizers: tuple[str, ...] = ()) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team", "finalizers": list(finalizers)},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


def allocation(device: str) -> ClaimAllocation:
    return ClaimAllocation(
        devices=(AllocatedDevice(request="gpu", driver="gpu.nvidia.com", pool="n1", device=device),),
        node_selector=(NodeSelectorTerm(match_fields=(NodeSelectorRequirement(
            key="metadata.name", operator="In", values=("n1",)),)),))


def member(name: str, obj: dict, device: str) -> Assignment:
    key = f"team/{obj['metadata']['name']}/{obj['metadata']['uid']}"
    return Assignment(pod=PodRef(namespace="team", name=name, uid=f"uid-{name}"), node="n1", gpus=(0,),
                      claims=(ClaimAllocated(claim=key, pod_claim="gpus", allocation=allocation(device)),))


async def read(user: KvCluster, name: str) -> dict:
    got = await user.get_resource_claim(ClaimRef(namespace="team", name=name))
    assert got is not None
    return got


def compensation(held: tuple[Assignment, ...]) -> UnreserveClaims:
    """What gang-coordinator's ``claims`` compensation sends binder for an attempt holding ``held``."""
    (publish,) = effects.compensation(GangState(gang_id="team/g", attempt=1, phase="rolling_back"), "claims", held)
    return publish.event


async def unreserve(binder: KvCluster, held: tuple[Assignment, ...]) -> None:
    await binder_claims.unreserve(binder, compensation(held), binder.get_pod)


async def test_every_claim_of_a_gang_is_reserved_before_binding_and_the_compensation_takes_them_back(clusters):
    user, binder, _ = clusters
    gang = (member("a", await user.apply_resource_claim(claim("ca")), "gpu-0"),
            member("b", await user.apply_resource_claim(claim("cb")), "gpu-1"))
    assert await binder_claims.reserve(binder, gang) == {}
    for name, device, pod in (("ca", "gpu-0", "a"), ("cb", "gpu-1", "b")):
        obj = await read(user, name)
        assert [r["device"] for r in obj["status"]["allocation"]["devices"]["results"]] == [device]
        assert [r["name"] for r in obj["status"]["reservedFor"]] == [pod]
        assert "resource.kubernetes.io/delete-protection" in obj["metadata"]["finalizers"]
    for _ in range(2):  # a compensation may run again (a coordinator died after it, before recording it)
        await unreserve(binder, gang)
        for name in ("ca", "cb"):
            obj = await read(user, name)
            assert not (obj.get("status") or {}).get("allocation") and not (obj.get("status") or {}).get("reservedFor")
            assert "resource.kubernetes.io/delete-protection" not in (obj["metadata"].get("finalizers") or [])


async def test_a_claim_that_cannot_be_reserved_binds_no_member_and_each_is_told_why(clusters):
    user, binder, _ = clusters
    ok = await user.apply_resource_claim(claim("fine"))
    going = await user.apply_resource_claim(claim("going", finalizers=("example.com/keep",)))
    await user.delete_resource_claim(ClaimRef(namespace="team", name="going", uid=going["metadata"]["uid"]))
    gang = (member("a", ok, "gpu-0"), member("b", going, "gpu-1"))
    failed = await binder_claims.reserve(binder, gang)
    assert set(failed) == {gang[0].pod, gang[1].pod}
    assert failed[gang[1].pod].startswith("claim team/going: ") and "deleted" in failed[gang[1].pod]
    assert failed[gang[0].pod] == f"not bound: gang member {gang[1].pod}'s {failed[gang[1].pod]}"
    # what was written before the failure is taken back by the rollback's compensation
    await unreserve(binder, gang)
    assert not ((await read(user, "fine")).get("status") or {}).get("allocation")


async def test_an_unreserve_for_a_bound_pod_is_refused_and_its_claim_stays_reserved(clusters):
    user, binder, _ = clusters
    obj = await user.apply_resource_claim(claim("running"))
    pod = await user.apply_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "r", "namespace": "team"},
                                "spec": {"schedulerName": "phalanx", "containers": [{"name": "c", "image": "x"}]}})
    held = msgspec.structs.replace(member("r", obj, "gpu-0"), pod=pod.ref)
    assert await binder_claims.reserve(binder, (held,)) == {}
    await user.bind(pod.ref, "n1", {})
    await unreserve(binder, (held,))  # forged, or late: the pod runs
    assert [r["name"] for r in (await read(user, "running"))["status"]["reservedFor"]] == ["r"]


async def test_the_claim_for_a_pods_extended_resources_is_made_reserved_and_named_in_its_status_then_undone(clusters):
    user, binder, _ = clusters
    pod = await user.apply_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ext", "namespace": "team"},
                                "spec": {"schedulerName": "phalanx", "containers": [{"name": "c", "image": "x"}]}})
    req = ExtendedRequest(request="container-0-request-0", container="c", index=0, resource="nvidia.com/gpu",
                          device_class="gpu.nvidia.com", count=1)
    held = Assignment(pod=pod.ref, node="n1", gpus=(0,), claims=(ClaimAllocated(
        claim=f"team//extended:{pod.uid}", allocation=allocation("gpu-0"), extended=True, extended_requests=(req,)),))
    for _ in range(2):  # a redelivered command finds the claim it made, not a second one
        assert await binder_claims.reserve(binder, (held,)) == {}
    (made,) = [c for c in await user.list_resource_claims("team")
               if c["metadata"]["annotations"].get("resource.kubernetes.io/extended-resource-claim") == "true"]
    assert made["metadata"]["name"].startswith("ext-extended-resources-")
    assert [r["name"] for r in made["status"]["reservedFor"]] == ["ext"]
    status = (await user.get_pod(pod.ref)).raw["status"]["extendedResourceClaimStatus"]
    assert status == {"resourceClaimName": made["metadata"]["name"], "requestMappings": [
        {"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}
    await unreserve(binder, (held,))
    assert [c for c in await user.list_resource_claims("team") if c["metadata"]["name"] == made["metadata"]["name"]
            and not c["metadata"].get("deletionTimestamp")] == []
    assert "extendedResourceClaimStatus" not in ((await user.get_pod(pod.ref)).raw.get("status") or {})
