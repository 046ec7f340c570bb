"""Phalanx on pods the real controllers create: the seed's JobSet ``gang-nccl-test`` applied as
written (image aside) to the JobSet controller, whose Job the Job controller turns into 7 pods,
which the Phalanx services (own processes, ``--cluster kube``) place and bind; a JobSet with a
driver and a worker job, one with ``replicas: 2``, and a member deleted while its gang runs.
Every test deletes its workloads and waits for their pods to go (``delete_workloads``), so no
pod of one test is left for the next one's scheduler.

The cluster (``stack4``, shared with the queue and preemption modules: tests/e2e/sharedstack.py):
four kwok nodes of 4 GPUs (one RDMA NIC each), two per network-pod, every node on its own
HyperNode and leaf switch. A gang of 7 one-GPU pods needs two nodes, so it lands whole only if
placement keeps it inside one network-pod.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml
from kubecontrollers import delete_workloads, wait_for
from kubeharness import KubeApi
from test_seed_examples import EXAMPLES, condition

from phalanx_localstack.stack import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


def dump(stack: Stack) -> str:
    return "\n".join(stack.tail(n, 30) for n in ("gang-coordinator", "placement", "binder"))


def test_the_seed_jobset_from_the_controller_lands_whole_within_one_network_pod(stack4, kube_api, kube_ns):
    jobset = yaml.safe_load((EXAMPLES / "pods" / "gang-nccl-test.yaml").read_text())
    jobset["metadata"]["namespace"] = kube_ns
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = \
        "registry.example/nccl:latest"
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", jobset)
    selector = {"labelSelector": "jobset.sigs.k8s.io/jobset-name=gang-nccl-test"}

    def all_bound():
        pods = kube_api.get(f"/api/v1/namespaces/{kube_ns}/pods", query=selector)["items"]
        return len(pods) == 7 and all(p["spec"].get("nodeName") for p in pods) and pods

    try:
        pods = wait_for(all_bound, 120, "the JobSet's 7 pods to be bound")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack4)}") from None
    placed = [json.loads(p["metadata"]["annotations"]["phalanx.io/assignment"]) for p in pods]
    assert {a["pod"]["uid"] for a in placed} == {p["metadata"]["uid"] for p in pods}
    per_node = Counter(p["spec"]["nodeName"] for p in pods)
    assert sorted(per_node.values()) == [3, 4], per_node  # two nodes, filled tightest first
    assert len({stack4.network_pods[n] for n in per_node}) == 1, per_node
    used = [(a["node"], g) for a in placed for g in a["gpus"]]
    assert len(used) == len(set(used)) == 7
    assert all(a["nics"] == ["mlx5_0"] for a in placed)
    # kwok plays the kubelet for the controller's pods too.
    wait_for(lambda: {p["status"].get("phase") for p in kube_api.get(
        f"/api/v1/namespaces/{kube_ns}/pods", query=selector)["items"]} == {"Running"}, 30,
        "kwok to run the 7 pods")


JOBSET = "jobset.sigs.k8s.io/jobset-name"


def jobset(name: str, ns: str, jobs: list[tuple[str, int, int]], **spec) -> dict:
    """A JobSet of one-GPU pods: ``jobs`` lists (replicated job, replicas, parallelism); each
    template says its Job's size as ``aliyun.com/min-member`` (seed rule 4.2)."""
    def rj(name: str, replicas: int, parallelism: int) -> dict:
        return {"name": name, "replicas": replicas, "template": {"spec": {
            "parallelism": parallelism, "completions": parallelism, "backoffLimit": 6, "template": {
                "metadata": {"labels": {"aliyun.com/min-member": str(parallelism)}},
                "spec": {"schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "registry.example/app:1",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicatedJobs": [rj(*j) for j in jobs], **spec}}


def live(api: KubeApi, ns: str, selector: str) -> list[dict]:
    return [p for p in api.get(f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": selector})["items"]
            if not p["metadata"].get("deletionTimestamp")]


def bound(api: KubeApi, ns: str, selector: str, n: int, stack: Stack, timeout_s: float = 120) -> list[dict]:
    def all_bound():
        pods = live(api, ns, selector)
        return len(pods) == n and all(p["spec"].get("nodeName") for p in pods) and pods
    try:
        return wait_for(all_bound, timeout_s, f"{n} pods of {selector} to be bound")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack)}") from None


def gpus_used(pods: list[dict]) -> list[tuple[str, int]]:
    return [(a["node"], g) for a in (json.loads(p["metadata"]["annotations"]["phalanx.io/assignment"]) for p in pods)
            for g in a["gpus"]]


@pytest.mark.parametrize(("case", "jobs", "pods"), [
    ("a driver job and a worker job", [("driver", 1, 1), ("workers", 1, 4)], 5),
    ("a replicated job with replicas 2", [("workers", 2, 3)], 6),
])
def test_a_jobset_of_several_jobs_is_placed_whole_as_one_gang(stack4, kube_api, kube_ns, case, jobs, pods):
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", jobset("js", kube_ns, jobs))
    placed = bound(kube_api, kube_ns, f"{JOBSET}=js", pods, stack4)
    used = gpus_used(placed)
    assert len(used) == len(set(used)) == pods
    nodes = {p["spec"]["nodeName"] for p in placed}
    assert len({stack4.network_pods[n] for n in nodes}) == 1, nodes
    assert len({p["metadata"]["labels"]["batch.kubernetes.io/job-name"] for p in placed}) == sum(r for _, r, _ in jobs)


def test_a_member_deleted_while_its_gang_runs_is_recreated_and_joins_without_disturbing_the_others(
        stack4, kube_api, kube_ns):
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets",
                  jobset("js", kube_ns, [("driver", 1, 1), ("workers", 1, 3)]))
    first = bound(kube_api, kube_ns, f"{JOBSET}=js", 4, stack4)
    victim = next(p for p in first if p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "workers")
    kube_api.request("DELETE", f"/api/v1/namespaces/{kube_ns}/pods/{victim['metadata']['name']}",
                     {"gracePeriodSeconds": 0})
    # The Job controller recreates it after its failure backoff (~10 s); Phalanx places the
    # newcomer by an attempt of its own while the three others keep running where they are.
    now = bound(kube_api, kube_ns, f"{JOBSET}=js", 4, stack4, timeout_s=150)
    kept = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in first if p is not victim}
    assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in now if p["metadata"]["uid"] in kept} == kept
    (new,) = [p for p in now if p["metadata"]["uid"] not in kept]
    assert new["metadata"]["uid"] != victim["metadata"]["uid"]
    used = gpus_used(now)
    assert len(used) == len(set(used)) == 4


def test_a_jobset_started_in_order_has_its_workers_join_the_running_driver_as_late_members(stack4, kube_api, kube_ns):
    """``startupPolicy: InOrder`` creates the workers' Job only once the driver runs: the
    workers arrive late. With ``phalanx.io/gang-min-member: 1`` the driver is placed alone, and
    the workers join the scheduled gang by an attempt of their own, without a failure."""
    js = jobset("ordered", kube_ns, [("driver", 1, 1), ("workers", 1, 3)],
                startupPolicy={"startupPolicyOrder": "InOrder"})
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"][
        "phalanx.io/gang-min-member"] = "1"
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", js)
    (driver,) = bound(kube_api, kube_ns, f"{JOBSET}=ordered,jobset.sigs.k8s.io/replicatedjob-name=driver", 1, stack4)
    everyone = bound(kube_api, kube_ns, f"{JOBSET}=ordered", 4, stack4)
    driver_bound = condition(driver)["lastTransitionTime"]  # RFC 3339 UTC: compares as text
    assert all(p["metadata"]["creationTimestamp"] >= driver_bound for p in everyone
               if p["metadata"]["uid"] != driver["metadata"]["uid"])
    assert driver["metadata"]["uid"] in {p["metadata"]["uid"] for p in everyone}
    assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in everyone}[driver["metadata"]["uid"]] == \
        driver["spec"]["nodeName"]
    used = gpus_used(everyone)
    assert len(used) == len(set(used)) == 4
    assert not [e for e in kube_api.get(f"/api/v1/namespaces/{kube_ns}/events")["items"]
                if e.get("reason") == "GangRollback"]


def test_an_exclusive_jobset_through_jobsets_webhook_gets_one_leaf_per_job_leaders_first(stack4, kube_api, kube_ns):
    """``alpha.jobset.sigs.k8s.io/exclusive-topology`` through JobSet's real pod webhook: each
    Job's leader (completion index 0) carries the injected pod affinity and anti-affinity, and
    the webhook refuses its followers until the leader is scheduled, then gives them a
    ``nodeSelector`` on the leader's leaf. Phalanx places the two leaders together, each on a
    leaf of its own; the followers join as late members on their leader's leaf."""
    leaf = "phalanx.io/leaf-switch"
    js = jobset("excl", kube_ns, [("w", 2, 3)])
    js["metadata"]["annotations"] = {"alpha.jobset.sigs.k8s.io/exclusive-topology": leaf}
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", js)
    placed = bound(kube_api, kube_ns, f"{JOBSET}=excl", 6, stack4, timeout_s=150)
    by_job: dict[str, set[str]] = {}
    for p in placed:
        by_job.setdefault(p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"], set()).add(p["spec"]["nodeName"])
    assert sorted(by_job) == ["0", "1"] and all(len(n) == 1 for n in by_job.values()), by_job
    assert by_job["0"] != by_job["1"], by_job  # each leaf is one node here: one Job per leaf
    leaders = [p for p in placed if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "0"]
    followers = [p for p in placed if p not in leaders]
    assert len(leaders) == 2 and all(p["spec"]["affinity"]["podAntiAffinity"] for p in leaders)
    assert all(leaf in (p["spec"].get("nodeSelector") or {}) for p in followers)
    used = gpus_used(placed)
    assert len(used) == len(set(used)) == 6


def test_every_service_process_is_still_running(stack4):
    dead = {n: sp.proc.returncode for n, sp in stack4.procs.items() if sp.proc.poll() is not None}
    assert dead == {}, dump(stack4)
