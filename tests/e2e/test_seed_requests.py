"""The rest of the seed's request kinds end to end on the real API server: TDM, multi-GPU
``replica``, the 4-GPU topology pod, GPU + RDMA, MIG on a model without MIG, and the 7-worker
``gang-nccl-test`` JobSet (its pods created with the labels the JobSet controller sets)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, unique
from test_seed_examples import EXAMPLES, SERVICES, TIERS, TOPOLOGY, condition, seed_pod, wait_for

from phalanx_localstack.stack import ClusterFile, Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack3(kube: ControlPlane, kube_api: KubeApi, tmp_path_factory):
    """Three kwok 8 x V100 nodes on one HyperNode and the whole stack on the real API."""
    kube_api.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "lj-runtime"},
        "handler": "lj-runtime"}, ok=(409,))
    names = [unique("e2e-req") for _ in range(3)]
    for n in names:
        kube_api.create_node(fake_gpu_node(n, labels={"lj_runtimekit_enable": "true", **TIERS}))
    work = tmp_path_factory.mktemp("e2e-req")
    cluster_file = work / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({"nodes": [
        {"name": n, "labels": {"lj_runtimekit_enable": "true", **TIERS}, "topology": str(TOPOLOGY),
         "gpuModel": "Tesla V100-SXM2-16GB", "gpuMemoryMiB": 16384} for n in names]}))
    kube_args = ["--cluster", "kube", "--kubeconfig", str(kube.kubeconfig)]
    stack = Stack(ClusterFile.load(cluster_file), workdir=str(work / "stack"),
                  service_args={s: kube_args for s in SERVICES})
    stack.start_nats()
    try:
        stack.start_services(timeout_s=90)
        stack.node_names = names  # type: ignore[attr-defined]
        yield stack
    finally:
        stack.stop()


def bound(kube_api: KubeApi, ns: str, name: str, timeout_s: float = 60) -> tuple[dict, dict]:
    pod = wait_for(lambda: (p := kube_api.get_pod(ns, name))["spec"].get("nodeName") and p, timeout_s,
                   f"{name} to be bound")
    return pod, json.loads(pod["metadata"]["annotations"]["phalanx.io/assignment"])


def test_the_4_gpu_topology_pod_gets_an_nvlink_quad(stack3, kube_api, kube_ns):
    kube_api.create_pod(seed_pod("topology-4gpu", kube_ns))
    _, a = bound(kube_api, kube_ns, "topology-4gpu-demo")
    assert tuple(a["gpus"]) in ((0, 1, 2, 3), (4, 5, 6, 7))


def test_the_rdma_pod_gets_gpus_and_its_nic_with_the_fallback_level(stack3, kube_api, kube_ns):
    kube_api.create_pod(seed_pod("rdma-4gpu", kube_ns))
    pod, a = bound(kube_api, kube_ns, "rdma-4gpu-demo")
    assert (a["nics"], a["rdma_level"]) == (["mlx5_0"], "numa")
    assert sorted(a["gpus"]) == [0, 1, 2, 3]


def test_the_seed_jobset_gang_of_seven_lands_whole(stack3, kube_api, kube_ns):
    jobset = yaml.safe_load((EXAMPLES / "pods" / "gang-nccl-test.yaml").read_text())
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    for i in range(7):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": copy.deepcopy(template["metadata"]),
               "spec": copy.deepcopy(template["spec"])}
        pod["metadata"].update(name=f"gang-nccl-test-worker-0-{i}", namespace=kube_ns)
        pod["metadata"]["labels"].update({"jobset.sigs.k8s.io/jobset-name": "gang-nccl-test",
                                          "batch.kubernetes.io/job-completion-index": str(i)})
        pod["spec"]["containers"][0]["image"] = "registry.example/nccl:latest"
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        kube_api.create_pod(pod)
    placed = [bound(kube_api, kube_ns, f"gang-nccl-test-worker-0-{i}")[1] for i in range(7)]
    used = [(a["node"], g) for a in placed for g in a["gpus"]]
    assert len(used) == len(set(used)) == 7
    assert all(a["nics"] == ["mlx5_0"] for a in placed)


def test_tdm_and_multi_gpu_shares_are_bound_with_core_and_memory_in_the_annotation(stack3, kube_api, kube_ns):
    kube_api.create_pod(seed_pod("tdm-demo", kube_ns))
    kube_api.create_pod(seed_pod("multi-gpu-demo", kube_ns))
    _, tdm = bound(kube_api, kube_ns, "tdm-demo")
    _, multi = bound(kube_api, kube_ns, "multi-gpu-demo")
    assert (len(tdm["gpus"]), tdm["core_pct"], tdm["memory_mib"]) == (1, 50, 4096)
    assert (len(multi["gpus"]), multi["core_pct"], multi["memory_mib"]) == (2, 50, 4096)


def test_mig_on_v100_nodes_stays_pending_with_the_reason(stack3, kube_api, kube_ns):
    kube_api.create_pod(seed_pod("mig-demo", kube_ns))

    def pending():
        cond = condition(kube_api.get_pod(kube_ns, "mig-demo"))
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for(pending, 30, "PodScheduled=False on mig-demo")
    assert cond["message"].startswith("0/3 nodes are available: 3 no MIG-capable GPU."), cond


def test_a_gang_of_mig_pods_on_v100_nodes_is_told_no_mig_capable_gpu(stack3, kube_api, kube_ns):
    """Issue 14: a gang keeps the per-node reason a single pod gets, not a network-domain one."""
    names = [f"mig-gang-{i}" for i in range(2)]
    for name in names:
        pod = seed_pod("mig-demo", kube_ns)
        pod["metadata"].update(name=name, labels={"jobset.sigs.k8s.io/jobset-name": "mig-gang",
                                                  "aliyun.com/min-member": "2"})
        kube_api.create_pod(pod)

    def pending(name: str):
        cond = condition(kube_api.get_pod(kube_ns, name))
        return cond if cond and cond["status"] == "False" and "nodes are available" in cond["message"] else None

    messages = {name: wait_for(lambda n=name: pending(n), 30, f"PodScheduled=False on {name}")["message"]
                for name in names}
    assert all(m.startswith("0/3 nodes are available: 3 no MIG-capable GPU.") for m in messages.values()), messages
