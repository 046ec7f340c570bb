"""The upstream Workload API on the real API server (docs/workloads.md, "The upstream Workload
API"): ``scheduling.k8s.io`` PodGroups as Kubernetes 1.36 serves them (v1alpha2, gate
``GenericWorkload``, the shape 1.37 serves as v1beta1) and pods that name one in
``spec.schedulingGroup.podGroupName`` — bare pods, and a Job's pods made by the real Job
controller, which also carry the Job's labels: one gang, the PodGroup's, never a second one for
the Job. On the shared four-node stack (``stack4``: four kwok nodes of 4 GPUs); each pod takes a
whole node.

What is checked comes from the API server (bindings, the PodGroup's ``PodGroupScheduled``
condition, the pods' conditions) and from gang-coordinator's records.
"""

from __future__ import annotations

import anyio
import pytest
from kubecontrollers import delete_workloads, wait_for
from kubeharness import KubeApi
from test_controllers_e2e import bound, dump, live
from test_lws_e2e import gangs_of
from test_seed_examples import condition

from phalanx_localstack.stack import Stack

pytestmark = pytest.mark.e2e

GROUPS = "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups"


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


def pod_group(api: KubeApi, ns: str, name: str, min_count: int) -> None:
    api.post(GROUPS.format(ns=ns), {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                                    "metadata": {"name": name, "namespace": ns},
                                    "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}})


def spec(group: str) -> dict:
    """A pod spec of 4 GPUs (a whole node) in PodGroup ``group``."""
    return {"schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "schedulingGroup": {"podGroupName": group},
            "containers": [{"name": "c", "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}


def pods(api: KubeApi, ns: str, group: str, n: int, prefix: str) -> None:
    for i in range(n):
        api.post(f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{prefix}-{i}", "namespace": ns, "labels": {"group": group}}, "spec": spec(group)})


def scheduled(api: KubeApi, ns: str, name: str) -> dict | None:
    """The PodGroup's ``PodGroupScheduled`` condition."""
    obj = api.get(f"{GROUPS.format(ns=ns)}/{name}")
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "PodGroupScheduled"),
                None)


def test_pods_naming_a_podgroup_are_its_gang_of_min_count_and_the_podgroup_says_scheduled(stack4, kube_api, kube_ns):
    pod_group(kube_api, kube_ns, "train", 2)
    pods(kube_api, kube_ns, "train", 3, "train")
    placed = bound(kube_api, kube_ns, "group=train", 3, stack4)
    assert len({p["spec"]["nodeName"] for p in placed}) == 3
    record = anyio.run(gangs_of, stack4)[f"{kube_ns}/PodGroup:train"]
    assert (record.min_member, record.max_member, sorted(m.pod.name for m in record.members)) == (
        2, 10_000, ["train-0", "train-1", "train-2"])
    got = wait_for(lambda: scheduled(kube_api, kube_ns, "train"), 30, "the PodGroupScheduled condition")
    assert (got["status"], got["reason"]) == ("True", "Scheduled"), got


def test_a_jobs_pods_that_name_a_podgroup_are_one_gang_the_podgroups(stack4, kube_api, kube_ns):
    pod_group(kube_api, kube_ns, "both", 2)
    kube_api.post(f"/apis/batch/v1/namespaces/{kube_ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job", "namespace": kube_ns},
        "spec": {"parallelism": 2, "completions": 2, "template": {"metadata": {"labels": {"group": "both"}},
                                                                  "spec": spec("both")}}})
    placed = bound(kube_api, kube_ns, "group=both", 2, stack4)
    assert all(p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == "job" for p in placed)
    gangs = {g: sorted(m.pod.name for m in r.members) for g, r in anyio.run(gangs_of, stack4).items()
             if g.startswith(f"{kube_ns}/")}
    assert gangs == {f"{kube_ns}/PodGroup:both": sorted(p["metadata"]["name"] for p in placed)}


def test_a_podgroup_whose_gang_cannot_fit_says_unschedulable_and_places_nothing(stack4, kube_api, kube_ns):
    pod_group(kube_api, kube_ns, "big", 5)  # 5 pods of a whole node; the cluster has 4 nodes
    pods(kube_api, kube_ns, "big", 5, "big")
    got = wait_for(lambda: (c := scheduled(kube_api, kube_ns, "big")) and c["status"] == "False" and c, 60,
                   "the PodGroup to say it cannot be scheduled")
    assert got["reason"] == "Unschedulable" and got["message"].startswith("0/4 nodes are available: "), got
    assert "gang of 5 members needs 20 whole" in got["message"], got
    assert [p["spec"].get("nodeName") for p in live(kube_api, kube_ns, "group=big")] == [None] * 5


def test_a_pod_naming_a_podgroup_not_there_yet_waits_told_why_and_starts_once_it_is(stack4: Stack, kube_api, kube_ns):
    pods(kube_api, kube_ns, "late", 2, "late")

    def told():
        conds = [condition(p) for p in live(kube_api, kube_ns, "group=late")]
        return len(conds) == 2 and all(c and "does not exist (yet)" in c.get("message", "") for c in conds) and conds
    try:
        wait_for(told, 30, "the pods to say they wait for their PodGroup")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack4)}") from None
    pod_group(kube_api, kube_ns, "late", 2)
    bound(kube_api, kube_ns, "group=late", 2, stack4)
