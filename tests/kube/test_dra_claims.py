"""The resourceclaim controller of kube-controller-manager on the test control plane: a pod that
names a ResourceClaimTemplate gets its claim made and recorded in ``status.resourceClaimStatuses``
(what gang-coordinator waits for, ``phalanx_kubeobjects.dra.pod_claims``), and the claim goes with
the pod. No scheduler serves these pods: they are never bound."""

from __future__ import annotations

import pytest
from kubecontrollers import wait_for
from kubeharness import KubeApi

from phalanx_kubeobjects import dra
from phalanx_proto.dra import POD_CLAIM_NAME_ANNOTATION

pytestmark = pytest.mark.e2e
RESOURCE = "/apis/resource.k8s.io/v1"
UNSERVED_SCHEDULER = "phalanx-harness-probe"


def template(ns: str, name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"metadata": {"labels": {"team": "ml"}}, "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "count": 2}}]}}}}


def claims(api: KubeApi, ns: str) -> list[dict]:
    return api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]


def test_a_pods_template_claim_is_made_recorded_in_its_status_and_deleted_with_it(kube_controller_manager, kube_api,
                                                                                    kube_ns):
    api = kube_api
    api.post(f"{RESOURCE}/namespaces/{kube_ns}/resourceclaimtemplates", template(kube_ns, "two-gpus"))
    pod = api.create_pod({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": kube_ns},
        "spec": {"schedulerName": UNSERVED_SCHEDULER, "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
                 "containers": [{"name": "c", "image": "registry.example/app:1",
                                 "resources": {"claims": [{"name": "gpus"}]}}]}})

    pod = wait_for(lambda: (p := api.get_pod(kube_ns, "trainer")) and p.get("status", {}).get(
        "resourceClaimStatuses") and p, 60, "status.resourceClaimStatuses set by the resourceclaim controller")
    ((pod_claim, name),) = dra.pod_claims(pod)
    (made,) = claims(api, kube_ns)
    assert (pod_claim, name) == ("gpus", made["metadata"]["name"])
    assert name.startswith("trainer-gpus-")
    meta = made["metadata"]
    assert meta["annotations"][POD_CLAIM_NAME_ANNOTATION] == "gpus" and meta["labels"] == {"team": "ml"}
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in meta["ownerReferences"]] == [
        ("Pod", "trainer", pod["metadata"]["uid"], True)]
    assert dra.claim_for_pod(made, pod, "gpus") == ""
    spec = dra.claim_spec(made, {})
    assert [(r.name, r.exactly.count, r.exactly.device_class.missing) for r in spec.requests] == [("gpu", 2, True)]

    api.delete(f"/api/v1/namespaces/{kube_ns}/pods/trainer")
    wait_for(lambda: not claims(api, kube_ns), 60, "the generated claim to be deleted with its pod")
