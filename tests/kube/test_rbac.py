"""deploy/k8s/rbac.yaml on the real apiserver: each service's ServiceAccount, with a token from
the TokenRequest API, can do its job through the real adapter, and is refused (403) outside it."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest
import yaml
from kubeharness import KubeApiError, fake_gpu_node, gpu_pod, unique
from rbactable import ACCESS, CLUSTER_SCOPED, FENCE_ACCESS, GROUPS

from phalanx_kube.kube import KubeApiError as AdapterApiError
from phalanx_kube.kube import KubeCluster
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
    got = [(verb, res, sub, api.can_i(verb, res, subresource=sub, namespace="" if res in CLUSTER_SCOPED else kube_ns,
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
