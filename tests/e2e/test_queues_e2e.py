"""Queues on the real API server: Queue objects from deploy/k8s/crds/ (the harness installs the
CRD), single pods and JobSets of two teams on four kwok nodes of 4 GPUs (16 GPUs), the whole
stack on the real API with the real JobSet and Job controllers.

team-a: quota 8, limit 8 (its JobSets); team-b: quota 8, no limit (its single pods). The
story of one test, in order: team-b borrows the idle half of the cluster; a team-a JobSet
arrives after another team-b pod, and when one of team-b's pods goes, team-a (below its
quota) gets the GPUs first; then a team-a pod past its limit waits with the queue named in
its events and PodScheduled condition; the API server refuses a Queue whose quota exceeds its
limit, and the Queues' status shows the allocation.
"""

from __future__ import annotations

import pytest
from kubecontrollers import delete_workloads, wait_for
from kubeharness import KubeApi, gpu_pod, unique
from test_controllers_e2e import JOBSET, bound, dump, jobset, live
from test_seed_examples import condition

from phalanx_proto.kubeapi import QUEUE_LABEL

pytestmark = pytest.mark.e2e

QUEUES = "/apis/scheduling.phalanx.io/v1alpha1/queues"


def queue(name: str, quota: float, limit: float | None = None, **spec) -> dict:
    gpu = {"quota": quota, **({"limit": limit} if limit is not None else {})}
    return {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"resources": {"nvidia.com/gpu": gpu}, **spec}}


@pytest.fixture
def teams(kube_api: KubeApi, kube_ns: str):
    """Two Queues; afterwards the test's workloads in ``kube_ns`` and the Queues are deleted (the
    stack is shared: tests/e2e/sharedstack.py)."""
    names = {"a": unique("team-a"), "b": unique("team-b")}
    # team-a never reclaims: this test is about borrowing, order and limits; taking borrowed GPUs
    # back from running gangs is preemption's (docs/preemption.md, its own tests).
    kube_api.post(QUEUES, queue(names["a"], 8, 8, preemption={"reclaim": "Never"}))
    kube_api.post(QUEUES, queue(names["b"], 8))
    yield names
    delete_workloads(kube_api, kube_ns)
    for n in names.values():
        kube_api.request("DELETE", f"{QUEUES}/{n}", ok=(404,))


def team_pod(name: str, ns: str, gpus: int, team: str) -> dict:
    return gpu_pod(name, ns, gpus, labels={QUEUE_LABEL: team})


def pod_of(api: KubeApi, ns: str, name: str) -> dict:
    return api.get(f"/api/v1/namespaces/{ns}/pods/{name}")


def labelled_namespace(api: KubeApi, labels: dict[str, str]) -> str:
    name = unique("ns-race")
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": name, "labels": labels}})
    return name


def test_pods_created_with_their_namespace_are_in_the_queue_its_labels_name(stack4, kube_api):
    """A pipeline creates a namespace and its pods in the same second: each pod is in the queue
    its namespace's labels say, never in the one an unread (empty) label set would give — for a
    limit, a ``NotIn`` selector and an ``In`` selector."""
    lim, notin, inq = unique("q-lim"), unique("q-notin"), unique("q-in")
    kube_api.post(QUEUES, queue(lim, 2, 2))
    kube_api.post(QUEUES, queue(notin, 4, namespaceSelector={
        "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}))
    kube_api.post(QUEUES, queue(inq, 4, namespaceSelector={
        "matchExpressions": [{"key": "team", "operator": "In", "values": ["b"]}]}))
    # gang-coordinator has read the Queues once it writes their status
    wait_for(lambda: all((kube_api.get(f"{QUEUES}/{q}").get("status") or {}).get("conditions")
                         for q in (lim, notin, inq)), 30, "the Queues' status")
    ns_lim = labelled_namespace(kube_api, {QUEUE_LABEL: lim})
    for i in range(4):
        kube_api.create_pod(gpu_pod(f"lim-{i}", ns_lim, 1))
    ns_a = labelled_namespace(kube_api, {"team": "a"})
    kube_api.create_pod(team_pod("notin-0", ns_a, 1, notin))
    ns_b = labelled_namespace(kube_api, {"team": "b"})
    kube_api.create_pod(team_pod("in-0", ns_b, 1, inq))
    try:
        bound(kube_api, ns_b, f"{QUEUE_LABEL}={inq}", 1, stack4, timeout_s=60)
        waiting = "at its limit 2 (allocated 2, this gang needs 1)"
        wait_for(lambda: sum(bool(p["spec"].get("nodeName")) for p in live(kube_api, ns_lim, "")) == 2 and all(
            waiting in ((condition(p) or {}).get("message") or "") for p in live(kube_api, ns_lim, "")
            if not p["spec"].get("nodeName")), 60, "two pods bound and two waiting at the queue's limit")
        refused = f"queue {notin} does not admit pods of namespace {ns_a}"
        wait_for(lambda: refused in ((condition(pod_of(kube_api, ns_a, "notin-0")) or {}).get("message") or ""),
                 30, "the NotIn queue to refuse the team-a pod")
        wait_for(lambda: (kube_api.get(f"{QUEUES}/{lim}").get("status") or {}).get("allocated") == 2 and
                 (kube_api.get(f"{QUEUES}/{inq}").get("status") or {}).get("allocated") == 1, 30,
                 "the Queues' status to count the pods")
        assert not pod_of(kube_api, ns_a, "notin-0")["spec"].get("nodeName")
        assert sum(bool(p["spec"].get("nodeName")) for p in live(kube_api, ns_lim, "")) == 2
    finally:
        for ns in (ns_lim, ns_a, ns_b):
            for p in live(kube_api, ns, ""):
                kube_api.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
        for q in (lim, notin, inq):
            kube_api.request("DELETE", f"{QUEUES}/{q}", ok=(404,))


def test_two_teams_borrow_reclaim_first_and_wait_at_their_limit(stack4, kube_api, kube_ns, teams):
    # gang-coordinator has read the Queues once it writes their status (it reads them every 2 s)
    wait_for(lambda: all((kube_api.get(f"{QUEUES}/{q}").get("status") or {}).get("conditions")
                         for q in teams.values()), 30, "the Queues' status")
    # team-b borrows the idle cluster: four pods of 4 GPUs, its quota is 8.
    for i in range(4):
        kube_api.create_pod(team_pod(f"b-{i}", kube_ns, 4, teams["b"]))
    bound(kube_api, kube_ns, f"{QUEUE_LABEL}={teams['b']}", 4, stack4)
    # Another team-b pod (it would borrow more), then a team-a JobSet (team-a is below its quota).
    kube_api.create_pod(team_pod("b-late", kube_ns, 4, teams["b"]))
    wait_for(lambda: (c := condition(pod_of(kube_api, kube_ns, "b-late"))) and c["status"] == "False", 60,
             "b-late to wait")
    js = jobset("team-a-js", kube_ns, [("workers", 1, 4)])
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"][QUEUE_LABEL] = teams["a"]
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", js)
    wait_for(lambda: len(live(kube_api, kube_ns, f"{JOBSET}=team-a-js")) == 4 and all(
        (c := condition(p)) and c["status"] == "False" for p in live(kube_api, kube_ns, f"{JOBSET}=team-a-js")), 90,
        "the JobSet's 4 pods to wait")
    kube_api.request("DELETE", f"/api/v1/namespaces/{kube_ns}/pods/b-0", {"gracePeriodSeconds": 0})
    placed = bound(kube_api, kube_ns, f"{JOBSET}=team-a-js", 4, stack4)
    assert len({p["spec"]["nodeName"] for p in placed}) == 1  # the freed node
    assert not pod_of(kube_api, kube_ns, "b-late")["spec"].get("nodeName"), "team-b took GPUs team-a was owed"
    # team-a holds 4; 8 more would pass its limit of 8: it waits with the queue named.
    kube_api.create_pod(team_pod("a-big", kube_ns, 8, teams["a"]))
    expected = f"4/8 GPUs available to queue {teams['a']}: at its limit 8 (allocated 4, this gang needs 8)"
    try:
        wait_for(lambda: (c := condition(pod_of(kube_api, kube_ns, "a-big"))) and expected in c.get("message", ""),
                 60, "a-big to say its queue is at its limit")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack4)}") from None
    events = kube_api.get(f"/api/v1/namespaces/{kube_ns}/events",
                          query={"fieldSelector": "involvedObject.name=a-big"})["items"]
    assert any(expected in e["message"] for e in events)
    # The Queues' status (written by the reconciler's lease holder every pass).
    wait_for(lambda: (kube_api.get(f"{QUEUES}/{teams['a']}").get("status") or {}).get("allocated") == 4, 30,
             "team-a's status")
    status = kube_api.get(f"{QUEUES}/{teams['b']}")["status"]
    assert (status["allocated"], status["borrowed"], status["pendingGangs"]) == (12, 4, 1), status
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Valid": "True"}


@pytest.mark.parametrize(("case", "gpu", "message"), [
    ("quota above limit", {"quota": 9, "limit": 4}, "quota must not exceed limit"),
    ("a negative quota", {"quota": -1}, "should be greater than or equal to 0"),
])
def test_the_api_server_refuses_a_queue_that_breaks_the_crds_rules(kube_api, case, gpu, message):
    with pytest.raises(Exception) as e:  # noqa: B017 - the harness raises KubeApiError with the body
        kube_api.post(QUEUES, {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": unique("bad")}, "spec": {"resources": {"nvidia.com/gpu": gpu}}})
    assert "422" in str(e.value) and message in str(e.value), str(e.value)
