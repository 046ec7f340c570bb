"""A running gang that loses a node is repaired inside its domain (docs/repair.md), on the real
API server with kwok nodes and the real Job controller: the one e2e case. Two nodes at once and
the policies with no room in the leaf run on the simulated stack
(tests/integration/test_repair_stack.py).

The cluster: six kwok nodes of 4 GPUs in one network-pod, each its own HyperNode: five on leaf
switch ``leaf-a``, one on ``leaf-b``. The gang: an indexed Job of 8 pods of 2 GPUs (16 GPUs, 4
nodes); only leaf-a holds it, so it runs there with one node to spare, and leaf-b has room for
the replacements too (the leaf is kept by choice, not for want of room). A node fails the way a
dead machine does: kwok stops managing it, its Ready condition turns False, it gains an
untolerated ``NoExecute`` taint, and then the Node is deleted.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml
from kubecontrollers import delete_workloads, wait_for
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, unique
from test_seed_examples import EXAMPLES, SERVICES, condition

from phalanx_localstack.stack import ClusterFile, Stack

pytestmark = pytest.mark.e2e

TOPOLOGY_4GPU = EXAMPLES / "topology" / "pcie-4xL40S-handwritten.yaml"
LEAF = "phalanx.io/leaf-switch"
JOB = "batch.kubernetes.io/job-name"


@pytest.fixture(scope="module")
def stack6(kube_controller_manager: ControlPlane, kube_api: KubeApi, tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e-repair")
    nodes = []
    for leaf, count in (("leaf-a", 5), ("leaf-b", 1)):
        for _ in range(count):
            name = unique(f"rp-{leaf[-1]}")
            labels = {"lj_runtimekit_enable": "true", "phalanx.io/hypernode": f"hn-{name}", LEAF: leaf,
                      "phalanx.io/network-pod": "np-1"}
            topo = yaml.safe_load(TOPOLOGY_4GPU.read_text())
            topo["node"] = name
            (work / f"{name}.yaml").write_text(yaml.safe_dump(topo))
            kube_api.create_node(fake_gpu_node(name, gpus=4, labels=labels))
            nodes.append({"name": name, "labels": labels, "topology": f"{name}.yaml"})
    names = [n["name"] for n in nodes]
    wait_for(lambda: all(condition(kube_api.get(f"/api/v1/nodes/{n}"), "Ready") for n in names), 30,
             "kwok to mark the nodes Ready")
    cluster_file = work / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({"nodes": nodes}))
    kube_args = ["--cluster", "kube", "--kubeconfig", str(kube_controller_manager.kubeconfig)]
    args = {s: list(kube_args) for s in SERVICES}
    args["gang-coordinator"] += ["--repair-scan-s", "0.5"]
    stack = Stack(ClusterFile.load(cluster_file), workdir=str(work / "stack"), service_args=args)
    stack.start_nats()
    try:
        stack.start_services(timeout_s=120)
        wait_for(lambda: all(kube_api.get(f"/api/v1/nodes/{n}")["status"]["capacity"].get("aliyun.com/gpu-core")
                             == "400" for n in names), 60, "topology-discovery to patch node capacity")
        stack.leaves = {n["name"]: n["labels"][LEAF] for n in nodes}  # type: ignore[attr-defined]
        stack.labels = {n["name"]: n["labels"] for n in nodes}  # type: ignore[attr-defined]
        yield stack
    finally:
        stack.stop()
        for name in names:  # other modules share the control plane
            kube_api.request("DELETE", f"/api/v1/nodes/{name}", ok=(404,))


def dump(stack: Stack) -> str:
    return "\n".join(stack.tail(n, 40) for n in ("gang-coordinator", "placement", "binder"))


def indexed_job(name: str, ns: str, pods: int = 8, gpus: int = 2, **labels: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns}, "spec": {
        "completionMode": "Indexed", "completions": pods, "parallelism": pods, "backoffLimit": 20,
        "template": {"metadata": {"labels": {"aliyun.com/min-member": str(pods), **labels}}, "spec": {
            "schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}


def live(api: KubeApi, ns: str, job: str) -> list[dict]:
    return [p for p in api.get(f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": f"{JOB}={job}"})["items"]
            if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") != "Failed"]


def bound(api: KubeApi, ns: str, job: str, stack: Stack, n: int = 8, timeout_s: float = 120,
          without: set[str] = frozenset()) -> list[dict]:
    def all_bound():
        pods = live(api, ns, job)
        ok = len(pods) == n and all(p["spec"].get("nodeName") for p in pods)
        return ok and not ({p["spec"]["nodeName"] for p in pods} & without) and pods
    try:
        return wait_for(all_bound, timeout_s, f"{n} pods of {job} bound")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack)}") from None


def fail_node(api: KubeApi, name: str) -> None:
    """What a dead machine looks like: nobody renews it, Ready=False, and a NoExecute taint."""
    api.patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}},
                                         "spec": {"taints": [{"key": "phalanx.test/failed", "effect": "NoExecute"}]}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "KubeletDown", "message": "test: the node died",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, merge=False)


def events(api: KubeApi, ns: str, reason: str) -> list[dict]:
    return [e for e in api.get(f"/api/v1/namespaces/{ns}/events")["items"] if e.get("reason") == reason]


def by_uid(pods: list[dict]) -> dict[str, str]:
    return {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods}


def gpus_used(pods: list[dict]) -> list[tuple[str, int]]:
    return [(a["node"], g) for a in (json.loads(p["metadata"]["annotations"]["phalanx.io/assignment"]) for p in pods)
            for g in a["gpus"]]


def test_a_gang_that_loses_a_node_has_its_replacements_bound_in_its_leaf_while_the_survivors_stay(
        stack6, kube_api, kube_ns):
    kube_api.post(f"/apis/batch/v1/namespaces/{kube_ns}/jobs", indexed_job("train", kube_ns))
    try:
        repaired_in_the_leaf(stack6, kube_api, kube_ns)
    finally:
        delete_workloads(kube_api, kube_ns)


def repaired_in_the_leaf(stack6: Stack, kube_api: KubeApi, kube_ns: str) -> None:
    first = bound(kube_api, kube_ns, "train", stack6)
    nodes = sorted({p["spec"]["nodeName"] for p in first})
    assert {stack6.leaves[n] for n in nodes} == {"leaf-a"} and len(nodes) == 4, nodes
    broken = nodes[0]
    started = time.monotonic()
    fail_node(kube_api, broken)
    kube_api.delete(f"/api/v1/nodes/{broken}")
    now = bound(kube_api, kube_ns, "train", stack6, timeout_s=90, without={broken})
    took = time.monotonic() - started
    survivors = {u: n for u, n in by_uid(first).items() if n != broken}
    assert len(survivors) == 6
    assert {u: n for u, n in by_uid(now).items() if u in survivors} == survivors  # kept where they were
    kept = {p["metadata"]["uid"]: gpus_used([p]) for p in first if p["metadata"]["uid"] in survivors}
    assert {p["metadata"]["uid"]: gpus_used([p]) for p in now if p["metadata"]["uid"] in survivors} == kept
    new = [p for p in now if p["metadata"]["uid"] not in survivors]
    assert len(new) == 2
    assert {stack6.leaves[p["spec"]["nodeName"]] for p in new} == {"leaf-a"}, by_uid(new)
    used = gpus_used(now)
    assert len(used) == len(set(used)) == 16
    repaired = wait_for(lambda: events(kube_api, kube_ns, "GangRepaired"), 20, "a GangRepaired event")
    assert "inside leaf leaf-a" in repaired[0]["message"], repaired[0]["message"]
    assert events(kube_api, kube_ns, "GangRepairing")
    assert not events(kube_api, kube_ns, "GangRestarted")
    print(f"repair of one node: every member bound again {took:.1f}s after the failure")
