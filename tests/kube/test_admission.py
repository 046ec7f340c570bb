"""deploy/k8s/admission.yaml on the real apiserver: Phalanx's ServiceAccounts cannot delete or
patch a pod of another scheduler, nor bind in a system namespace, whatever their RBAC allows;
Phalanx's own pods are untouched by the policy. A Binding cannot be checked against its pod's
schedulerName by admission (the request carries the Binding only): that case is shown here and
refused by the adapter instead."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kubeharness import KubeApiError, gpu_pod

from phalanx_kube.kube import KubeCluster
from phalanx_kube.port import NotOurs
from phalanx_proto.events import PodRef

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
NAMESPACE = "phalanx-system"


@pytest.fixture(scope="module")
def guarded(kube, kube_api):
    """rbac.yaml and admission.yaml applied for real; returns once the API server enforces the
    policy (binder's patch of a probe pod of another scheduler is denied): a new policy takes a
    moment to reach the admission chain, and nothing destructive may run before (a patch that
    slips through is harmless)."""
    kube_api.create_namespace(NAMESPACE)
    for f in ("rbac.yaml", "admission.yaml"):
        for obj in yaml.safe_load_all((DEPLOY / f).read_text()):
            kube_api.apply(obj)
    kube_api.create_pod(gpu_pod("policy-probe", NAMESPACE, scheduler="default-scheduler"))
    probe = f"/api/v1/namespaces/{NAMESPACE}/pods/policy-probe"
    binder = as_sa(kube, "binder")
    deadline = time.monotonic() + 60
    while "ValidatingAdmissionPolicy" not in denied(
            lambda: binder.patch(probe, {"metadata": {"annotations": {"phalanx.io/probe": "1"}}})):
        assert time.monotonic() < deadline, "the admission policy was not enforced within 60 s"
        time.sleep(0.5)
    yield kube
    kube_api.delete(probe)


def as_sa(plane, service: str):
    return plane.api_as(plane.service_account_token(NAMESPACE, f"phalanx-{service}"))


def denied(call) -> str:
    """The API server's refusal message of ``call`` ('' when it was allowed)."""
    try:
        call()
    except KubeApiError as e:
        return f"{e.status} {e}"
    return ""


def binding(ns: str, name: str, uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "some-node"}}


def test_service_accounts_cannot_delete_or_patch_a_pod_of_another_scheduler(guarded, kube_api, kube_ns):
    kube_api.create_pod(gpu_pod("victim", kube_ns, scheduler="default-scheduler"))
    coord, binder = as_sa(guarded, "gang-coordinator"), as_sa(guarded, "binder")
    path = f"/api/v1/namespaces/{kube_ns}/pods/victim"
    outcomes = {
        "gang-coordinator deletes": denied(lambda: coord.delete(path)),
        "binder annotates": denied(lambda: binder.patch(path, {"metadata": {"annotations": {"x": "y"}}})),
        "gang-coordinator sets a condition": denied(lambda: coord.patch(
            f"{path}/status", {"status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}},
            merge=False)),
    }
    assert {k: ("ValidatingAdmissionPolicy" in v and "schedulerName default-scheduler" in v)
            for k, v in outcomes.items()} == dict.fromkeys(outcomes, True), outcomes
    assert kube_api.get_pod(kube_ns, "victim")["metadata"].get("annotations", {}).get("x") is None


def test_service_accounts_still_delete_and_patch_phalanx_pods(guarded, kube_api, kube_ns):
    kube_api.create_pod(gpu_pod("ours", kube_ns))
    coord, binder = as_sa(guarded, "gang-coordinator"), as_sa(guarded, "binder")
    path = f"/api/v1/namespaces/{kube_ns}/pods/ours"
    assert denied(lambda: binder.patch(path, {"metadata": {"annotations": {"x": "y"}}})) == ""
    assert denied(lambda: coord.delete(path)) == ""


def test_binder_cannot_bind_in_a_system_namespace(guarded, kube_api):
    kube_api.create_pod(gpu_pod("sys-victim", "kube-system"))
    uid = kube_api.get_pod("kube-system", "sys-victim")["metadata"]["uid"]
    binder = as_sa(guarded, "binder")
    try:
        why = denied(lambda: binder.post(
            "/api/v1/namespaces/kube-system/pods/sys-victim/binding", binding("kube-system", "sys-victim", uid)))
        assert "ValidatingAdmissionPolicy" in why and "never binds pods in kube-system" in why
        assert not kube_api.get_pod("kube-system", "sys-victim")["spec"].get("nodeName")
    finally:
        kube_api.delete("/api/v1/namespaces/kube-system/pods/sys-victim")


@pytest.mark.anyio
async def test_a_binding_of_another_schedulers_pod_is_not_visible_to_admission_so_the_adapter_refuses_it(
        guarded, kube_api, kube_ns):
    uid = kube_api.create_pod(gpu_pod("default-one", kube_ns, scheduler="default-scheduler"))["metadata"]["uid"]
    token = guarded.service_account_token(NAMESPACE, "phalanx-binder")
    cluster = await KubeCluster.open(str(guarded.kubeconfig_for("sa-binder-adm", token)))
    try:
        with pytest.raises(NotOurs, match="schedulerName 'default-scheduler'"):
            await cluster.bind(PodRef(namespace=kube_ns, name="default-one", uid=uid), "some-node")
    finally:
        await cluster.close()
    assert not kube_api.get_pod(kube_ns, "default-one")["spec"].get("nodeName")
    # The API server itself would accept that Binding from binder's account (the gap the adapter closes):
    assert denied(lambda: as_sa(guarded, "binder").post(
        f"/api/v1/namespaces/{kube_ns}/pods/default-one/binding", binding(kube_ns, "default-one", uid))) == ""
