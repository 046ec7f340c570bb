"""The test control plane itself: what the e2e, contract and RBAC tests rely on."""

from __future__ import annotations

import time

import kubeharness
import pytest
from kubeharness import KubeApiError, fake_gpu_node, gpu_pod, unique

pytestmark = pytest.mark.e2e


def wait_for(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = fn()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_the_api_server_is_the_pinned_version_and_listens_on_loopback_only(kube, kube_api):
    assert kube_api.get("/version")["gitVersion"] == "v1.36.3"
    assert kube.server.startswith("https://127.0.0.1:")
    assert kube.kubeconfig.is_file() and kube.ca_file.is_file()


def test_missing_binaries_fail_with_the_command_that_builds_them(monkeypatch, tmp_path):
    monkeypatch.setenv("PHALANX_KUBE_CACHE", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(kubeharness.HarnessError, match=r"bash tools/kube/build.sh"):
        kubeharness.bin_dir()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(kubeharness.HarnessError, match=r"CI job must run `bash tools/kube/build.sh`"):
        kubeharness.bin_dir()


def test_kwok_makes_a_fake_gpu_node_ready_and_runs_the_pods_bound_to_it(kube_api, kube_ns):
    name = unique("gpu-node")
    kube_api.create_node(fake_gpu_node(name))
    node = wait_for(lambda: (n := kube_api.get(f"/api/v1/nodes/{name}")) and any(
        c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])) and n, 30,
        "the node to be Ready")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert not node["spec"].get("taints")
    pod = gpu_pod("on-fake-node", kube_ns)
    pod["spec"]["nodeName"] = name
    kube_api.create_pod(pod)
    wait_for(lambda: kube_api.get_pod(kube_ns, "on-fake-node")["status"].get("phase") == "Running", 20,
             "kwok to run the pod")


def test_a_limited_user_is_authenticated_but_allowed_nothing(kube, kube_ns):
    alice = kube.api_as(kube.users["alice"])
    review = alice.post("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review["status"]["userInfo"]["username"] == "alice"
    assert not alice.can_i("list", "pods", namespace=kube_ns)
    with pytest.raises(KubeApiError) as e:
        alice.get(f"/api/v1/namespaces/{kube_ns}/pods")
    assert e.value.status == 403
    assert kube.user_kubeconfig("alice").read_text().count(kube.users["alice"]) == 1


def test_kube_scheduler_binds_a_default_scheduler_gpu_pod_to_a_kwok_node(kube_scheduler, kube_api, kube_ns):
    name = unique("sched-node")
    kube_api.create_node(fake_gpu_node(name, labels={"phalanx-test": kube_ns}))
    pod = gpu_pod("for-kube-scheduler", kube_ns, 2, scheduler="default-scheduler")
    pod["spec"]["nodeSelector"] = {"phalanx-test": kube_ns}
    kube_api.create_pod(pod)
    bound = wait_for(lambda: kube_api.get_pod(kube_ns, "for-kube-scheduler")["spec"].get("nodeName"), 30,
                     "kube-scheduler to bind the pod")
    assert bound == name
