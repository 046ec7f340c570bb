"""Preemption on the real API server: four kwok nodes of 4 GPUs (16 GPUs), the whole stack on
the real API with the real JobSet, Job and disruption controllers; PriorityClasses give the pods
their ``spec.priority`` (the API server's Priority admission), victims go through the Eviction
API (policy/v1, PodDisruptionBudgets respected).

Every cluster here is filled by four JobSets of 2 pods x 2 GPUs: ``lo`` (priority 1) and three of
priority 5. The stories: a priority-100 JobSet evicts ``lo`` whole, takes its GPUs, and ``lo``'s
Jobs recreate its pods, which are placed again once the preemptor goes; a PriorityClass with
``preemptionPolicy: Never`` waits and evicts nothing; a PodDisruptionBudget that protects ``lo``
makes the planner take a priority-5 JobSet instead; a queue below its quota takes back what
another queue borrowed, down to that queue's quota and no further.
"""

from __future__ import annotations

import time

import pytest
from kubecontrollers import delete_workloads, wait_for
from kubeharness import KubeApi, unique
from test_controllers_e2e import JOBSET, bound, live, stack4  # noqa: F401
from test_seed_examples import condition

from phalanx_proto.queues import QUEUE_LABEL

pytestmark = pytest.mark.e2e

QUEUES = "/apis/scheduling.phalanx.io/v1alpha1/queues"
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
FILL = {"lo": "low", "m1": "mid", "m2": "mid", "m3": "mid"}


@pytest.fixture(scope="module")
def classes(kube_api: KubeApi):
    """PriorityClass names: low 1, mid 5, high 100, calm 100 with preemptionPolicy Never."""
    names = {k: unique(f"e2e-{k}") for k in ("low", "mid", "high", "calm")}
    for k, value in (("low", 1), ("mid", 5), ("high", 100), ("calm", 100)):
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": names[k]},
                "value": value}
        if k == "calm":
            body["preemptionPolicy"] = "Never"
        kube_api.post(PRIORITY_CLASSES, body)
    yield names
    for n in names.values():
        kube_api.request("DELETE", f"{PRIORITY_CLASSES}/{n}", ok=(404,))


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


def jobset2(name: str, ns: str, priority_class: str = "", queue: str = "", pods: int = 2, gpus: int = 2) -> dict:
    """A JobSet of one Job of ``pods`` pods x ``gpus`` GPUs (one gang, ``aliyun.com/min-member``)."""
    labels = {"aliyun.com/min-member": str(pods), **({QUEUE_LABEL: queue} if queue else {})}
    spec = {"schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.example/app:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    job = {"parallelism": pods, "completions": pods, "backoffLimit": 6,
           "template": {"metadata": {"labels": labels}, "spec": spec}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job}}]}}


def submit(api: KubeApi, ns: str, js: dict) -> None:
    api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", js)


def placed(api: KubeApi, ns: str, name: str) -> dict[str, tuple[str, str]]:
    """The JobSet's live pods: name → (uid, node)."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"].get("nodeName", ""))
            for p in live(api, ns, f"{JOBSET}={name}")}


def fill(api: KubeApi, ns: str, stack, classes: dict, gangs: dict[str, str] = FILL, queue: str = "") -> dict:
    """Every GPU taken by the gangs (name → PriorityClass key); their pods as ``placed`` says."""
    for name, cls in gangs.items():
        submit(api, ns, jobset2(name, ns, classes[cls] if cls else "", queue=queue))
    for name in gangs:
        bound(api, ns, f"{JOBSET}={name}", 2, stack)
    return {name: placed(api, ns, name) for name in gangs}


def preempted_events(api: KubeApi, ns: str, pods) -> list[dict]:
    return [e for p in pods for e in api.events(ns, p) if e["reason"] == "Preempted"]


def gone(api: KubeApi, ns: str, before: dict[str, tuple[str, str]]) -> bool:
    """None of those pods (by uid) is live any more."""
    uids = {uid for uid, _ in before.values()}
    return not any(p["metadata"]["uid"] in uids for p in live(api, ns, JOBSET))


def test_a_high_priority_jobset_evicts_the_lowest_whole_and_the_victims_jobs_recreate_it_placed_again_later(
        stack4, kube_api, kube_ns, classes):  # noqa: F811
    before = fill(kube_api, kube_ns, stack4, classes)
    submit(kube_api, kube_ns, jobset2("hi", kube_ns, classes["high"]))
    hi = bound(kube_api, kube_ns, f"{JOBSET}=hi", 2, stack4)
    # lo went, whole (both pods, by the Eviction API: each was told who preempted it); the others stay
    wait_for(lambda: gone(kube_api, kube_ns, before["lo"]), 30, "lo's pods to be gone")
    for name in ("m1", "m2", "m3"):
        assert placed(kube_api, kube_ns, name) == before[name], name
    events = preempted_events(kube_api, kube_ns, before["lo"])
    assert len(events) == 2 and all(f"{kube_ns}/JobSet:hi" in e["message"] and "rule priority" in e["message"]
                                    for e in events), events
    # hi took the GPUs lo held: the same nodes
    assert sorted(p["spec"]["nodeName"] for p in hi) == sorted(node for _, node in before["lo"].values())
    # the real Job controller recreates lo's pods; they wait until the preemptor goes, then run
    def recreated():
        now = placed(kube_api, kube_ns, "lo")
        return len(now) == 2 and not {u for u, _ in now.values()} & {u for u, _ in before["lo"].values()} and now
    again = wait_for(recreated, 60, "lo's Job to recreate its pods")
    assert not any(node for _, node in again.values()), f"lo placed again while hi holds its GPUs: {again}"
    kube_api.request("DELETE", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets/hi",
                     {"propagationPolicy": "Background"})
    bound(kube_api, kube_ns, f"{JOBSET}=lo", 2, stack4, timeout_s=120)


def test_a_jobset_whose_priority_class_never_preempts_waits_and_evicts_nothing(
        stack4, kube_api, kube_ns, classes):  # noqa: F811
    before = fill(kube_api, kube_ns, stack4, classes)
    submit(kube_api, kube_ns, jobset2("calm", kube_ns, classes["calm"]))

    def waiting():
        pods = live(kube_api, kube_ns, f"{JOBSET}=calm")
        return len(pods) == 2 and all((c := condition(p)) and c["status"] == "False" for p in pods) and pods

    pods = wait_for(waiting, 60, "calm's pods to be told why they wait")
    assert all(p["spec"].get("preemptionPolicy") == "Never" and p["spec"].get("priority") == 100 for p in pods)
    time.sleep(5)  # several of its attempts, backed off from 1 s, have been decided meanwhile
    assert {name: placed(kube_api, kube_ns, name) for name in FILL} == before
    assert not any(p["spec"].get("nodeName") for p in live(kube_api, kube_ns, f"{JOBSET}=calm"))
    assert preempted_events(kube_api, kube_ns, [n for b in before.values() for n in b]) == []


def test_a_disruption_budget_that_protects_the_cheapest_victim_makes_the_planner_take_another(
        stack4, kube_api, kube_ns, classes):  # noqa: F811
    before = fill(kube_api, kube_ns, stack4, classes)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "lo", "namespace": kube_ns},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": {JOBSET: "lo"}}}}
    kube_api.post(f"/apis/policy/v1/namespaces/{kube_ns}/poddisruptionbudgets", pdb)

    def computed():  # the real disruption controller counts lo's healthy pods
        status = kube_api.get(f"/apis/policy/v1/namespaces/{kube_ns}/poddisruptionbudgets/lo").get("status", {})
        return status.get("observedGeneration", 0) >= 1 and status.get("currentHealthy") == 2 and status

    status = wait_for(computed, 60, "the disruption controller to compute lo's budget")
    assert status["disruptionsAllowed"] == 0
    submit(kube_api, kube_ns, jobset2("hi", kube_ns, classes["high"]))
    hi = bound(kube_api, kube_ns, f"{JOBSET}=hi", 2, stack4)
    assert placed(kube_api, kube_ns, "lo") == before["lo"]  # protected: nothing of it evicted
    went = [name for name in ("m1", "m2", "m3") if gone(kube_api, kube_ns, before[name])]
    stayed = [name for name in ("m1", "m2", "m3") if placed(kube_api, kube_ns, name) == before[name]]
    assert len(went) == 1 and len(stayed) == 2, (went, stayed)
    assert sorted(p["spec"]["nodeName"] for p in hi) == sorted(node for _, node in before[went[0]].values())
    # the first plan took lo; the API server refused its eviction and hi's pods were told
    blocked = [e for p in hi for e in kube_api.events(kube_ns, p["metadata"]["name"])
               if e["reason"] == "PreemptionBlocked"]
    assert blocked and all("disruption budget" in e["message"] for e in blocked), blocked


def test_a_queue_below_its_quota_reclaims_borrowed_gpus_down_to_the_lenders_quota_and_no_further(
        stack4, kube_api, kube_ns, classes):  # noqa: F811
    a, b = unique("team-a"), unique("team-b")
    for name in (a, b):
        kube_api.post(QUEUES, {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": name}, "spec": {"resources": {"nvidia.com/gpu": {"quota": 8}}}})
    try:
        wait_for(lambda: {a, b} <= {q["metadata"]["name"] for q in kube_api.get(QUEUES)["items"]}, 10, "the Queues")
        time.sleep(3)  # gang-coordinator reads the Queues every 2 s
        # team-b borrows the idle half: four gangs of 4 GPUs, priority 5 (no priority matters for reclaim)
        before = fill(kube_api, kube_ns, stack4, classes, gangs={f"b{i}": "mid" for i in range(4)}, queue=b)
        # team-a (priority 0, below its quota of 8) asks for 8: two of team-b's gangs go, whole
        submit(kube_api, kube_ns, jobset2("a1", kube_ns, queue=a, pods=4))
        bound(kube_api, kube_ns, f"{JOBSET}=a1", 4, stack4)
        went = sorted(name for name in before if gone(kube_api, kube_ns, before[name]))
        assert len(went) == 2, went
        assert all(placed(kube_api, kube_ns, n) == before[n] for n in before if n not in went)
        events = preempted_events(kube_api, kube_ns, [p for n in went for p in before[n]])
        assert len(events) == 4 and all("rule reclaim" in e["message"] for e in events), events
        # team-a at its quota, team-b at its own: 4 more GPUs for team-a would take team-b below it
        submit(kube_api, kube_ns, jobset2("a2", kube_ns, queue=a))

        def waiting():
            pods = live(kube_api, kube_ns, f"{JOBSET}=a2")
            return len(pods) == 2 and all((c := condition(p)) and c["status"] == "False" for p in pods) and pods

        wait_for(waiting, 60, "a2 to be told why it waits")
        time.sleep(3)
        assert all(placed(kube_api, kube_ns, n) == before[n] for n in before if n not in went)
        assert not any(p["spec"].get("nodeName") for p in live(kube_api, kube_ns, f"{JOBSET}=a2"))
    finally:
        for name in (a, b):
            kube_api.request("DELETE", f"{QUEUES}/{name}", ok=(404,))
