"""deploy/k8s/rbac.yaml on the real apiserver: each service's ServiceAccount, with a token from
the TokenRequest API, can do its job through the real adapter, and is refused (403) outside it."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest
import yaml
from kubeharness import KubeApiError, fake_gpu_node, gpu_pod, unique
from rbactable import ACCESS, FENCE_ACCESS, GROUPS, scope

from phalanx_kube.kube import KubeApiError as AdapterApiError
from phalanx_kube.kube import KubeCluster
from phalanx_kube.port import ClaimRef, ClaimRefused
from phalanx_kubeobjects import dra
from phalanx_proto.dra import FINALIZER, AllocatedDevice, ClaimAllocation
from phalanx_proto.events import PodRef

pytestmark = pytest.mark.e2e

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "rbac.yaml"
NAMESPACE = "phalanx-system"



@pytest.fixture(scope="module")
def rbac(kube, kube_api):
    """rbac.yaml applied for real (server-side apply, idempotent)."""
    kube_api.create_namespace(NAMESPACE)
    for obj in yaml.safe_load_all(RBAC.read_text()):
        kube_api.apply(obj)
    return kube


def sa_api(plane, service: str):
    return plane.api_as(plane.service_account_token(NAMESPACE, f"phalanx-{service}"))


async def sa_cluster(plane, service: str) -> KubeCluster:
    token = plane.service_account_token(NAMESPACE, f"phalanx-{service}")
    return await KubeCluster.open(str(plane.kubeconfig_for(f"sa-{service}", token)))


@pytest.mark.parametrize("service", ACCESS)
def test_each_service_account_is_allowed_its_verbs_and_nothing_else_checked(rbac, kube_ns, service):
    api = sa_api(rbac, service)
    got = [(verb, res, sub, api.can_i(verb, res, subresource=sub, namespace=scope(res, sub, kube_ns),
                                          group=GROUPS.get(res, "")))
           for verb, res, sub, _ in ACCESS[service]]
    assert got == ACCESS[service]


@pytest.mark.parametrize("service", ["placement", "mig-manager"])
def test_services_without_a_role_are_refused_by_the_api(rbac, kube_ns, service):
    with pytest.raises(KubeApiError) as e:
        sa_api(rbac, service).get(f"/api/v1/namespaces/{kube_ns}/pods")
    assert e.value.status == 403


@pytest.mark.anyio
async def test_binder_binds_with_its_own_account_and_may_not_list_nodes(rbac, kube_api, kube_ns):
    uid = kube_api.create_pod(gpu_pod("to-bind", kube_ns))["metadata"]["uid"]
    ref = PodRef(namespace=kube_ns, name="to-bind", uid=uid)
    cluster = await sa_cluster(rbac, "binder")
    try:
        assert (await cluster.get_pod(ref)).uid == uid
        await cluster.annotate_pod(ref, {"phalanx.io/assignment": "{}"})
        await cluster.bind(ref, "some-node")
        await cluster.bind(ref, "some-node")  # the idempotent path reads the pod again
        await cluster.record_event(ref, reason="Scheduled", message="m")
        await cluster.record_event(ref, reason="Scheduled", message="m")  # get + patch of the event
        with pytest.raises(AdapterApiError) as e:
            await cluster.list_nodes()
        assert e.value.status == 403
        with anyio.fail_after(30):  # the pod watch that releases fence entries
            async with aclosing(cluster.watch_pods()) as events:
                async for ev in events:
                    if ev is None:
                        break
    finally:
        await cluster.close()
    assert [e["count"] for e in kube_api.events(kube_ns, "to-bind")] == [2]


@pytest.mark.anyio
async def test_gang_coordinator_watches_and_reports_with_its_own_account_and_may_not_bind(rbac, kube_api, kube_ns):
    uid = kube_api.create_pod(gpu_pod("watched", kube_ns))["metadata"]["uid"]
    ref = PodRef(namespace=kube_ns, name="watched", uid=uid)
    cluster = await sa_cluster(rbac, "gang-coordinator")
    try:
        assert ref in [p.ref for p in await cluster.list_pods()]
        watch = cluster.watch_pods()
        try:
            async for ev in watch:  # the initial list through the watch path
                if ev is None:
                    break
        finally:
            await watch.aclose()
        await cluster.set_scheduled_condition(ref, status=False, reason="Unschedulable", message="why")
        await cluster.record_event(ref, reason="FailedScheduling", message="why", type="Warning")
        with pytest.raises(AdapterApiError) as e:
            await cluster.bind(ref, "some-node")
        assert e.value.status == 403
        await cluster.delete_pod(ref)
    finally:
        await cluster.close()
    assert kube_api.get_pod(kube_ns, "watched") is None


@pytest.mark.anyio
async def test_gang_coordinator_reads_the_workload_apis_podgroups_and_writes_their_status_with_its_own_account(
        rbac, kube_api, kube_ns):
    groups = f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{kube_ns}/podgroups"

    def group(name: str) -> dict:
        return {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                "metadata": {"name": name, "namespace": kube_ns},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}

    kube_api.post(groups, group("first"))
    condition = {"type": "PodGroupScheduled", "status": "True", "reason": "Scheduled", "message": "2 pods placed",
                 "lastTransitionTime": "2026-12-07T00:00:00Z"}
    cluster = await sa_cluster(rbac, "gang-coordinator")
    try:
        got = await cluster.get_pod_group(kube_ns, "first")
        assert got is not None and got["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
        assert await cluster.get_pod_group(kube_ns, "missing") is None
        changes = cluster.watch_pod_groups()
        try:
            kind, items = await changes.__anext__()
            assert kind == "listed" and (kube_ns, "first") in {
                (o["metadata"]["namespace"], o["metadata"]["name"]) for o in items}
            kube_api.post(groups, group("second"))
            kind, obj = await changes.__anext__()
            assert (kind, obj["metadata"]["name"]) == ("put", "second")
        finally:
            await changes.aclose()
        await cluster.update_pod_group_status(kube_ns, "first", [condition])
    finally:
        await cluster.close()
    assert kube_api.get(f"{groups}/first")["status"]["conditions"] == [condition]


@pytest.mark.anyio
async def test_topology_discovery_advertises_resources_with_its_own_account_and_may_not_bind(rbac, kube_api, kube_ns):
    name = unique("rbac-node")
    kube_api.create_node(fake_gpu_node(name, kwok=False))
    uid = kube_api.create_pod(gpu_pod("unbound", kube_ns))["metadata"]["uid"]
    cluster = await sa_cluster(rbac, "topology-discovery")
    try:
        assert (await cluster.get_node(name)).name == name
        await cluster.patch_node_capacity(name, {"aliyun.com/gpu-core": "800"})
        # The agent may read pods (its device plugin identifies the pod being admitted), never bind one.
        with pytest.raises(AdapterApiError) as e:
            await cluster.bind(PodRef(namespace=kube_ns, name="unbound", uid=uid), name)
        assert e.value.status == 403
    finally:
        await cluster.close()
    assert kube_api.get(f"/api/v1/nodes/{name}")["status"]["capacity"]["aliyun.com/gpu-core"] == "800"
    assert not kube_api.get_pod(kube_ns, "unbound")["spec"].get("nodeName")




def test_only_binder_writes_the_fence_leases_and_the_node_agent_only_reads_them(rbac, kube_ns):
    got = [(svc, verb, sa_api(rbac, svc).can_i(verb, "leases", group="coordination.k8s.io", namespace=NAMESPACE),
            sa_api(rbac, svc).can_i(verb, "leases", group="coordination.k8s.io", namespace=kube_ns))
           for svc, verb, _, _ in FENCE_ACCESS]
    assert got == FENCE_ACCESS


# -- DRA (resource.k8s.io/v1) ----------------------------------------------------------------------
RESOURCE = "/apis/resource.k8s.io/v1"


def _claim(api, ns: str, name: str) -> ClaimRef:
    obj = api.post(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}})
    return ClaimRef(namespace=ns, name=name, uid=obj["metadata"]["uid"])


ALLOCATION = ClaimAllocation(devices=(AllocatedDevice(request="gpu", driver="gpu.example.com", pool="node-a",
                                                      device="gpu-0"),))


@pytest.mark.anyio
async def test_binder_writes_a_claims_allocation_and_reservation_and_the_extended_claim_with_its_own_account(
        rbac, kube_api, kube_ns):
    uid = kube_api.create_pod(gpu_pod("claimant", kube_ns))["metadata"]["uid"]
    pod = PodRef(namespace=kube_ns, name="claimant", uid=uid)
    ref = _claim(kube_api, kube_ns, "gpus")
    cluster = await sa_cluster(rbac, "binder")
    try:
        await cluster.reserve_claim(ref, pod, ALLOCATION)  # finalizer, then status.allocation + reservedFor
        requests = (dra.ExtendedRequest(request="container-0-request-0", container="c", index=0,
                                        resource="nvidia.com/gpu", device_class="gpu.example.com", count=1),)
        made = await cluster.create_resource_claim(dra.extended_claim(pod, requests))
        assert (await cluster.create_resource_claim(dra.extended_claim(pod, requests)))["metadata"]["uid"] == \
            made["metadata"]["uid"]  # found again by listing the namespace's claims
        await cluster.set_extended_claim_status(pod, dra.extended_claim_status(made["metadata"]["name"], requests))
        await cluster.unreserve_claim(ref, pod, ALLOCATION)
        await cluster.delete_resource_claim(ClaimRef(namespace=kube_ns, name=made["metadata"]["name"],
                                                     uid=made["metadata"]["uid"]))
        with pytest.raises(AdapterApiError) as e:
            await cluster.list_resource_slices()
        assert e.value.status == 403
    finally:
        await cluster.close()
    claim = kube_api.get(f"{RESOURCE}/namespaces/{kube_ns}/resourceclaims/gpus")
    assert (claim["status"], claim["metadata"].get("finalizers")) == ({}, None)  # written, then undone
    status = kube_api.get_pod(kube_ns, "claimant")["status"]
    assert status["extendedResourceClaimStatus"]["resourceClaimName"] == made["metadata"]["name"]


@pytest.mark.anyio
async def test_gang_coordinator_reads_the_dra_objects_with_its_own_account_and_may_not_reserve_a_claim(
        rbac, kube_api, kube_ns):
    ref = _claim(kube_api, kube_ns, "watched")
    cluster = await sa_cluster(rbac, "gang-coordinator")
    try:
        await cluster.list_device_classes()
        await cluster.list_resource_slices()
        assert ref.key in [dra.claim_key(o) for o in await cluster.list_resource_claims()]
        for watch in (cluster.watch_device_classes(), cluster.watch_resource_slices(), cluster.watch_resource_claims()):
            with anyio.fail_after(30):
                async with aclosing(watch) as events:
                    async for ev in events:
                        if ev is None:
                            break
        with pytest.raises(ClaimRefused) as e:
            await cluster.reserve_claim(ref, PodRef(namespace=kube_ns, name="p", uid="u"), ALLOCATION)
        assert "HTTP 403" in str(e.value) and 'cannot update resource "resourceclaims"' in str(e.value)
    finally:
        await cluster.close()


@pytest.mark.anyio
async def test_an_identity_without_resourceclaims_binding_may_not_write_an_allocation(kube, kube_api, kube_ns):
    """What binder's ``resourceclaims/binding`` rule is for: with update on claims and their status
    alone, the API server (granular status authorization, on in 1.36) refuses the allocation."""
    role = unique("claims-without-binding")
    kube_api.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaims/status"],
                   "verbs": ["get", "update", "patch"]}]})
    kube_api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}]})
    ref = _claim(kube_api, kube_ns, "guarded")
    cluster = await KubeCluster.open(str(kube.user_kubeconfig("carol")))
    try:
        with anyio.fail_after(30):
            while not kube.api_as(kube.users["carol"]).can_i("update", "resourceclaims", subresource="status",
                                                              namespace=kube_ns, group="resource.k8s.io"):
                await anyio.sleep(0.2)  # the RBAC cache has the new binding
        with pytest.raises(ClaimRefused) as e:
            await cluster.reserve_claim(ref, PodRef(namespace=kube_ns, name="p", uid="u"), ALLOCATION)
    finally:
        await cluster.close()
        kube_api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{role}")
        kube_api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")
    assert "HTTP 422" in str(e.value)
    assert ('changing status.allocation or status.reservedFor requires resource="resourceclaims/binding", '
            'verb="update" permission') in str(e.value)
    assert ('User "carol" cannot update resource "resourceclaims/binding" in API group "resource.k8s.io" '
            'at the cluster scope') in str(e.value)
    claim = kube_api.get(f"{RESOURCE}/namespaces/{kube_ns}/resourceclaims/guarded")
    assert claim["metadata"]["finalizers"] == [FINALIZER] and not claim["status"].get("allocation")
