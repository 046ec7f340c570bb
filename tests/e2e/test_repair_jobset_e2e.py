"""A JobSet restarted whole by its ``failurePolicy`` lands back where it ran (docs/repair.md,
"Whole restarts land back where they ran"), and a Job's failed pod does not cost its replacement
the GPUs the repair gave it; on the real API server with kwok nodes and the real JobSet and Job
controllers.

The cluster (``stack4``, shared with the controller, queue and preemption modules:
tests/e2e/sharedstack.py): four kwok nodes of 4 GPUs, two per network-pod (``np-a``, ``np-b``),
every node its own leaf switch. A pod fails as a kubelet reports an exit code 1: phase
``Failed``, its container terminated (kwok leaves a pod that ended alone).

The JobSet: 3 pods of 2 GPUs (6 GPUs, two nodes of one network-pod), ``failurePolicy.maxRestarts:
1`` and a Job ``podFailurePolicy`` that fails the Job on a failed pod, so one failed pod makes the
JobSet controller delete every pod and make them all again. The test is made so that landing
back is a choice, not the only room left: a 3-GPU pod held in ``np-a`` while the JobSet is first
placed puts the gang in ``np-b``; that pod is deleted before the failure, so when the gang is
placed again both network-pods are empty, and the engine's own order (the fullest fitting domain
first, then by name) would take ``np-a`` (it does with the home rule switched off). The gang's
``home`` (the nodes it ran on, kept through its tombstone) must bring it back to ``np-b``'s nodes.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from kubecontrollers import delete_workloads, wait_for
from kubeharness import KubeApi
from sharedstack import NETWORK_POD

from phalanx_localstack.stack import Stack
from phalanx_telemetry import exposition

pytestmark = pytest.mark.e2e

JOBSET = "jobset.sigs.k8s.io/jobset-name"
RESTART = "jobset.sigs.k8s.io/restart-attempt"
JOB = "batch.kubernetes.io/job-name"


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


def dump(stack: Stack, ns: str = "") -> str:
    """The services' last log lines, those naming ``ns`` where given (the shared stack logs the
    other modules' and the reconciler's lines too)."""
    if not ns:
        return "\n".join(stack.tail(n, 40) for n in ("gang-coordinator", "placement", "binder"))
    return "\n".join(line for n in ("gang-coordinator", "placement", "binder")
                     for line in stack.tail(n, 4000).splitlines() if ns in line)[-12000:]


def jobset(name: str, ns: str, pods: int, gpus: int) -> dict:
    template = {"spec": {
        "parallelism": pods, "completions": pods, "backoffLimit": 0,
        # A failed pod fails its Job at once: with backoffLimit alone the Job controller may make
        # the pod's replacement first, and the Job then lives on (a repair, not a restart).
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}}]},
        "template": {
            "metadata": {"labels": {"aliyun.com/min-member": str(pods)}},
            "spec": {"schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.example/train:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": ns},
            "spec": {"failurePolicy": {"maxRestarts": 1},
                     "replicatedJobs": [{"name": "w", "replicas": 1, "template": template}]}}


def blocker(name: str, ns: str, netpod: str, gpus: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": "phalanx", "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {NETWORK_POD: netpod},
                     "containers": [{"name": "c", "image": "registry.example/idle:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def live(api: KubeApi, ns: str, selector: str) -> list[dict]:
    return [p for p in api.get(f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": selector})["items"]
            if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") != "Failed"]


def gpus_used(pods: list[dict]) -> list[tuple[str, int]]:
    return [(a["node"], g) for a in (json.loads(p["metadata"]["annotations"]["phalanx.io/assignment"]) for p in pods)
            for g in a["gpus"]]


def by_name(pods: list[dict]) -> dict[str, str | None]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}


def placed(pods: list[dict]) -> dict[str, list[int]]:
    """Node -> the GPUs the pods hold there."""
    out: dict[str, list[int]] = {}
    for node, gpu in gpus_used(pods):
        out.setdefault(node, []).append(gpu)
    return {n: sorted(g) for n, g in sorted(out.items())}


def bound(api: KubeApi, ns: str, selector: str, n: int, stack: Stack, timeout_s: float = 90) -> list[dict]:
    def all_bound():
        pods = live(api, ns, selector)
        return len(pods) == n and all(p["spec"].get("nodeName") for p in pods) and pods
    try:
        return wait_for(all_bound, timeout_s, f"{n} pods of {selector} to be bound", interval_s=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack, ns)}") from None


def fail_pod(api: KubeApi, pod: dict) -> None:
    """What a kubelet writes when the pod's container exits 1 (kwok leaves a Failed pod be)."""
    meta, now = pod["metadata"], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", {"status": {
        "phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed"}],
        "containerStatuses": [{"name": "c", "image": "registry.example/train:1", "imageID": "", "ready": False,
                               "restartCount": 0, "started": False, "state": {"terminated": {
                                   "exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}}}]}})


def test_a_jobset_restarted_by_its_failure_policy_lands_back_on_the_nodes_it_ran_on(stack4, kube_api, kube_ns):
    api, sel, n = kube_api, f"{JOBSET}=train", 3

    api.post(f"/api/v1/namespaces/{kube_ns}/pods", blocker("hold-np-a", kube_ns, "np-a", 3))
    wait_for(lambda: (api.get_pod(kube_ns, "hold-np-a") or {}).get("spec", {}).get("nodeName"), 30,
             "the blocker in np-a to be bound")
    api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", jobset("train", kube_ns, n, 2))
    first = bound(api, kube_ns, sel, n, stack4)
    home = placed(first)
    assert {stack4.network_pods[node] for node in home} == {"np-b"}, home
    api.delete(f"/api/v1/namespaces/{kube_ns}/pods/hold-np-a")
    wait_for(lambda: api.get_pod(kube_ns, "hold-np-a") is None, 30, "the blocker to be gone")
    wait_for(lambda: {p["status"].get("phase") for p in live(api, kube_ns, sel)} == {"Running"}, 30,
             "kwok to run the JobSet's pods")

    # One pod fails: its Job fails (podFailurePolicy FailJob), and the JobSet controller
    # restarts the whole JobSet.
    failed_at = time.monotonic()
    fail_pod(api, first[0])

    old = {p["metadata"]["uid"] for p in first}
    seen_new, again = 0.0, []
    deadline = failed_at + 90
    while time.monotonic() < deadline:  # polled closely: the figure is the restart's, to ~20 ms
        pods = live(api, kube_ns, sel)
        fresh = [p for p in pods if p["metadata"]["uid"] not in old]
        if fresh and not seen_new:
            seen_new = time.monotonic()
        if len(fresh) == len(pods) == n and all(p["spec"].get("nodeName") for p in fresh):
            again = fresh
            break
        time.sleep(0.02)
    done = time.monotonic()
    assert again, f"the restarted JobSet's {n} new pods were not all bound in 90 s: {by_name(pods)}\n{dump(stack4)}"
    assert {p["metadata"]["labels"][RESTART] for p in again} == {"1"}
    status = api.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets/train")["status"]
    assert status.get("restarts") == 1, status
    assert placed(again).keys() == home.keys(), (home, placed(again))  # the same nodes, in np-b
    used = gpus_used(again)
    assert len(used) == len(set(used)) == 2 * n
    restart_s, failure_s = done - seen_new, done - failed_at
    assert restart_s < 30, restart_s
    print(f"JobSet restart: the new pods bound back on {sorted(home)} {restart_s:.2f}s after the first new pod "
          f"was seen, {failure_s:.2f}s after the pod failure")


def reconciler_passes(stack: Stack) -> float:
    """gang-coordinator's ``phalanx_reconciler_passes_total``."""
    port = int(stack.procs["gang-coordinator"].ready_file.read_text().split()[1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return exposition.samples(resp.read().decode()).get("phalanx_reconciler_passes_total", 0.0)


def test_a_failed_pod_the_job_keeps_does_not_cost_its_replacement_the_gpus_it_was_given(stack4, kube_api, kube_ns):
    """A Job keeps its failed pods (phase ``Failed``, still bound, still annotated with their
    GPUs) and makes a replacement, which the repair binds in the gang's domain — on the failed
    pod's very GPUs when the domain is full. A pod that ended holds no GPU: the reconciler must
    not roll the replacement back as "sharing a GPU" with it (it did, 5-10 s after the bind, and
    the deletion failed the Job again)."""
    api, n = kube_api, 4
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": kube_ns}, "spec": {
        "completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 3,
        "template": {"metadata": {"labels": {"aliyun.com/min-member": str(n)}}, "spec": {
            "schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}}
    sel = f"{JOB}=train"
    api.post(f"/apis/batch/v1/namespaces/{kube_ns}/jobs", job)
    first = bound(api, kube_ns, sel, n, stack4)
    assert len({stack4.network_pods[p["spec"]["nodeName"]] for p in first}) == 1, by_name(first)  # a full netpod
    wait_for(lambda: {p["status"].get("phase") for p in live(api, kube_ns, sel)} == {"Running"}, 30,
             "kwok to run the Job's pods")
    victim = first[0]
    failed_at = time.monotonic()
    fail_pod(api, victim)
    survivors = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in first[1:]}
    now = bound(api, kube_ns, sel, n, stack4)
    took = time.monotonic() - failed_at
    (new,) = [p for p in now if p["metadata"]["uid"] not in survivors]
    assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in now if p is not new} == survivors
    failed = api.get_pod(kube_ns, victim["metadata"]["name"])
    assert failed is not None and failed["status"]["phase"] == "Failed"  # kept by the Job, still annotated
    assert gpus_used([new]) == gpus_used([failed]), (gpus_used([new]), gpus_used([failed]))
    # The reconciler acts on a finding seen in two passes running: three passes after the bind.
    passes = reconciler_passes(stack4)
    wait_for(lambda: reconciler_passes(stack4) >= passes + 3, 30, "three reconciler passes", interval_s=0.5)
    kept = api.get_pod(kube_ns, new["metadata"]["name"])
    assert kept is not None and not kept["metadata"].get("deletionTimestamp"), (
        f"the replacement was rolled back\n{dump(stack4)}")
    assert not [line for line in stack4.tail("gang-coordinator", 400).splitlines()
                if "shares a GPU" in line and kube_ns in line]
    assert len(live(api, kube_ns, sel)) == n
    print(f"a failed Job pod: its replacement bound on the failed pod's GPUs {took:.1f}s after the failure, "
          "kept through three reconciler passes")
