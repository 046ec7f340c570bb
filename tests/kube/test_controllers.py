"""The real workload controllers on the test control plane: what the e2e tests of Phalanx rely
on when pods are created by a Job, a JobSet or an MPIJob instead of by the test.

No scheduler runs here: a test binds a pod itself through ``pods/binding`` (as Phalanx's binder
does) and kwok, playing the kubelet, moves it to Running. Each test deletes its workloads and
waits for their pods to go, so none is left for a later tier's scheduler.
"""

from __future__ import annotations

import copy
from pathlib import Path

import kubecontrollers
import pytest
import yaml
from kubecontrollers import delete_workloads, wait_for
from kubeharness import KubeApi, fake_gpu_node, unique

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOB_NAME = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def pods(api: KubeApi, ns: str, selector: str) -> list[dict]:
    return api.get(f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": selector})["items"]


def live(items: list[dict]) -> list[dict]:
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def bind(api: KubeApi, pod: dict, node: str) -> None:
    """What Phalanx's binder does: a Binding on the pod's ``binding`` subresource."""
    meta = pod["metadata"]
    api.post(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
             {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "uid": meta["uid"]},
              "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


def phase(api: KubeApi, ns: str, name: str) -> str | None:
    pod = api.get_pod(ns, name)
    return pod and pod.get("status", {}).get("phase")


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    """What a test made goes with it: a JobSet pod left pending here would be placed by the
    next tier's Phalanx (it answers to ``lj-runtimekit-scheduler`` too)."""
    yield
    delete_workloads(kube_api, kube_ns)


@pytest.fixture(scope="module")
def gpu_node(kube_api: KubeApi) -> str:
    name = unique("ctl-node")
    kube_api.create_node(fake_gpu_node(name))
    wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                         kube_api.get(f"/api/v1/nodes/{name}")["status"].get("conditions") or []),
             30, "kwok to make the node Ready")
    return name


def job(name: str, ns: str, parallelism: int, **spec) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": parallelism, "completions": parallelism, **spec, "template": {"spec": {
                "schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "registry.example/app:1",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def test_missing_controller_binaries_fail_with_the_command_that_builds_them(monkeypatch, tmp_path):
    monkeypatch.setenv("PHALANX_CONTROLLERS_CACHE", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(kubecontrollers.HarnessError, match=r"bash tools/controllers/build.sh"):
        kubecontrollers.controllers_dir()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(kubecontrollers.HarnessError, match=r"CI job must run `make kube`"):
        kubecontrollers.controllers_dir()


def test_a_job_creates_its_pods_and_kwok_runs_the_one_bound_to_a_node(kube_controller_manager, kube_api,
                                                                       kube_ns, gpu_node):
    kube_api.post(f"/apis/batch/v1/namespaces/{kube_ns}/jobs", job("train", kube_ns, 3))
    created = wait_for(lambda: len(p := pods(kube_api, kube_ns, f"{JOB_NAME}=train")) == 3 and p, 60,
                       "the Job controller to create 3 pods")
    owners = {(o["kind"], o["name"], o.get("controller")) for p in created for o in p["metadata"]["ownerReferences"]}
    assert owners == {("Job", "train", True)}
    assert {p["spec"]["schedulerName"] for p in created} == {"phalanx"}
    assert not any(p["spec"].get("nodeName") for p in created)
    bind(kube_api, created[0], gpu_node)
    wait_for(lambda: phase(kube_api, kube_ns, created[0]["metadata"]["name"]) == "Running", 30,
             "kwok to run the bound Job pod")
    assert {phase(kube_api, kube_ns, p["metadata"]["name"]) for p in created[1:]} == {"Pending"}


def test_a_deleted_bound_job_pod_is_recreated_with_a_new_uid_and_counted_as_failed(
        kube_controller_manager, kube_api, kube_ns, gpu_node):
    kube_api.post(f"/apis/batch/v1/namespaces/{kube_ns}/jobs", job("rollback", kube_ns, 2, backoffLimit=6))
    first = wait_for(lambda: len(p := pods(kube_api, kube_ns, f"{JOB_NAME}=rollback")) == 2 and p, 60,
                     "the Job controller to create 2 pods")
    victim = first[0]["metadata"]
    bind(kube_api, first[0], gpu_node)
    wait_for(lambda: phase(kube_api, kube_ns, victim["name"]) == "Running", 30, "kwok to run the bound pod")
    # Phalanx's rollback: a zero-grace delete with the uid as precondition.
    kube_api.request("DELETE", f"/api/v1/namespaces/{kube_ns}/pods/{victim['name']}",
                     {"gracePeriodSeconds": 0, "preconditions": {"uid": victim["uid"]}})

    def replaced():
        now = pods(kube_api, kube_ns, f"{JOB_NAME}=rollback")
        return len(now) == 2 and victim["uid"] not in {p["metadata"]["uid"] for p in now} and now

    # The replacement comes after the Job's failure backoff (10 s for the first failure).
    now = wait_for(replaced, 60, "the deleted pod to be gone and a replacement created")
    new = [p for p in now if p["metadata"]["uid"] != first[1]["metadata"]["uid"]]
    assert len(new) == 1 and not new[0]["spec"].get("nodeName")
    assert new[0]["metadata"]["name"] != victim["name"]  # a NonIndexed Job names pods at random
    # The deleted running pod counts against backoffLimit like a crash would. The controller
    # writes the failure and the replacement's activity in separate status updates: wait for both.
    status = wait_for(lambda: (s := kube_api.get(f"/apis/batch/v1/namespaces/{kube_ns}/jobs/rollback")["status"])
                      .get("failed") and s.get("active") == 2 and s, 30,
                      "the Job status to count the deleted pod and both active ones")
    assert (status["failed"], status.get("active")) == (1, 2)


def seed_jobset(ns: str) -> dict:
    """Seed 004's ``gang-nccl-test`` as written, but for the image (the seed leaves it to the user)."""
    js = yaml.safe_load((EXAMPLES / "pods" / "gang-nccl-test.yaml").read_text())
    js["metadata"]["namespace"] = ns
    pod_spec = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["containers"][0]["image"] = "registry.example/nccl:latest"
    return js


def runtime_class(api: KubeApi) -> None:
    api.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "lj-runtime"},
        "handler": "lj-runtime"}, ok=(409,))


def test_the_seed_jobset_makes_seven_indexed_pods_through_its_webhooks(jobset_controller, kube_api, kube_ns):
    runtime_class(kube_api)
    created = kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", seed_jobset(kube_ns))
    # The mutating webhook defaulted what the YAML leaves out.
    assert created["spec"]["successPolicy"]["operator"] == "All"
    assert created["spec"]["network"]["enableDNSHostnames"] is True
    seven = wait_for(lambda: len(p := pods(kube_api, kube_ns, f"{JOBSET_NAME}=gang-nccl-test")) == 7 and p, 90,
                     "the JobSet's Job to create 7 pods")
    assert sorted(int(p["metadata"]["labels"][COMPLETION_INDEX]) for p in seven) == list(range(7))
    assert {p["metadata"]["labels"]["aliyun.com/min-member"] for p in seven} == {"7"}
    assert {p["metadata"]["labels"][JOB_NAME] for p in seven} == {"gang-nccl-test-worker-0"}
    assert {p["spec"]["schedulerName"] for p in seven} == {"lj-runtimekit-scheduler"}
    assert {p["spec"].get("subdomain") for p in seven} == {"gang-nccl-test"}
    service = kube_api.get(f"/api/v1/namespaces/{kube_ns}/services/gang-nccl-test")
    assert service["spec"]["clusterIP"] == "None"


def bound_and_running(api: KubeApi, ns: str, selector: str, n: int, node: str) -> list[dict]:
    made = wait_for(lambda: len(p := pods(api, ns, selector)) == n and p, 90, f"{n} pods of {selector}")
    for p in made:
        bind(api, p, node)
    wait_for(lambda: {p["status"].get("phase") for p in pods(api, ns, selector)} == {"Running"}, 30,
             "kwok to run the bound pods")
    return made


def rollback(api: KubeApi, victims: list[dict]) -> None:
    """What Phalanx's rollback does to the bound members of a failed attempt."""
    for p in victims:
        meta = p["metadata"]
        api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})


def test_deleting_more_bound_pods_than_the_seed_backoff_limit_fails_the_jobset_for_good(
        jobset_controller, kube_api, kube_ns, gpu_node):
    runtime_class(kube_api)
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", seed_jobset(kube_ns))
    sel = f"{JOBSET_NAME}=gang-nccl-test"
    seven = bound_and_running(kube_api, kube_ns, sel, 7, gpu_node)
    rollback(kube_api, seven[:3])  # backoffLimit: 2, and a deleted running pod counts as failed

    def failed():
        js = kube_api.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets/gang-nccl-test")
        conditions = (js.get("status") or {}).get("conditions") or []
        return [(c["type"], c["reason"]) for c in conditions if c["status"] == "True"]

    assert wait_for(failed, 60, "the JobSet to fail") == [("Failed", "FailedJobs")]
    job = kube_api.get(f"/apis/batch/v1/namespaces/{kube_ns}/jobs/gang-nccl-test-worker-0")
    assert [c["reason"] for c in job["status"]["conditions"] if c["type"] == "Failed"] == ["BackoffLimitExceeded"]
    wait_for(lambda: not pods(kube_api, kube_ns, sel), 30, "the failed Job to delete its remaining pods")


def test_a_jobset_with_max_restarts_recreates_every_pod_after_a_rollback(jobset_controller, kube_api, kube_ns,
                                                                         gpu_node):
    runtime_class(kube_api)
    js = seed_jobset(kube_ns)
    js["spec"]["failurePolicy"] = {"maxRestarts": 1}
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", js)
    sel = f"{JOBSET_NAME}=gang-nccl-test"
    seven = bound_and_running(kube_api, kube_ns, sel, 7, gpu_node)
    rollback(kube_api, seven[:3])
    old = {p["metadata"]["uid"] for p in seven}

    def recreated():
        now = live(pods(kube_api, kube_ns, sel))
        return len(now) == 7 and not old & {p["metadata"]["uid"] for p in now} and now

    now = wait_for(recreated, 90, "the JobSet to restart with 7 new pods")
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in now} == {"1"}
    assert not any(p["spec"].get("nodeName") for p in now)
    status = kube_api.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets/gang-nccl-test")["status"]
    assert status["restarts"] == 1


def test_deleting_a_jobset_garbage_collects_its_jobs_and_pods(jobset_controller, kube_api, kube_ns):
    name = "driver-workers"
    template = {"spec": {"parallelism": 1, "completions": 1, "template": {"spec": {
        "schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "registry.example/app:1"}]}}}}
    workers = copy.deepcopy(template)
    workers["spec"].update(parallelism=2, completions=2)
    kube_api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": kube_ns},
        "spec": {"replicatedJobs": [{"name": "driver", "replicas": 1, "template": template},
                                    {"name": "workers", "replicas": 2, "template": workers}]}})
    made = wait_for(lambda: len(p := pods(kube_api, kube_ns, f"{JOBSET_NAME}={name}")) == 5 and p, 90,
                    "the JobSet to create 1 driver + 2 x 2 worker pods")
    assert sorted({p["metadata"]["labels"][JOB_NAME] for p in made}) == [
        f"{name}-driver-0", f"{name}-workers-0", f"{name}-workers-1"]
    kube_api.request("DELETE", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets/{name}",
                     {"propagationPolicy": "Background"})
    wait_for(lambda: not pods(kube_api, kube_ns, f"{JOBSET_NAME}={name}"), 90,
             "the garbage collector to delete the JobSet's pods")
    jobs = kube_api.get(f"/apis/batch/v1/namespaces/{kube_ns}/jobs",
                        query={"labelSelector": f"{JOBSET_NAME}={name}"})["items"]
    assert jobs == []


def seed_mpijob(name: str, ns: str) -> dict:
    """Seed 000's ``arena submit mpi --gpus=1 --workers=4`` shape: 4 workers with one GPU each and a
    launcher without GPU (arena's gang annotations are added by the tests that need them)."""
    def replica(n: int, role: str, limits: dict[str, str]) -> dict:
        return {"replicas": n, "template": {"spec": {
            "schedulerName": "phalanx", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": f"mpi-{role}", "image": "registry.example/pytorch-benchmark:1",
                            "resources": {"limits": limits}}]}}}
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name, "namespace": ns},
            "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"},
                     "mpiReplicaSpecs": {"Launcher": replica(1, "launcher", {"cpu": "1"}),
                                         "Worker": replica(4, "worker", {"nvidia.com/gpu": "1"})}}}


def test_an_mpijob_makes_a_launcher_job_and_four_gpu_workers(mpi_operator, kube_api, kube_ns):
    name = "pytorch-topo-4-vgg16"
    kube_api.post(f"/apis/kubeflow.org/v2beta1/namespaces/{kube_ns}/mpijobs", seed_mpijob(name, kube_ns))
    sel = f"training.kubeflow.org/job-name={name}"
    made = wait_for(lambda: len(p := pods(kube_api, kube_ns, sel)) == 5 and p, 90,
                    "the MPI Operator to create 4 workers and the launcher Job its pod")
    roles = {p["metadata"]["name"]: p["metadata"]["labels"]["training.kubeflow.org/job-role"] for p in made}
    workers = sorted(n for n, r in roles.items() if r == "worker")
    assert workers == [f"{name}-worker-{i}" for i in range(4)]
    (launcher,) = [p for p in made if roles[p["metadata"]["name"]] == "launcher"]
    assert launcher["metadata"]["ownerReferences"][0]["kind"] == "Job"  # made by the Job controller
    limits = {p["metadata"]["name"]: p["spec"]["containers"][0]["resources"]["limits"] for p in made}
    assert {n: limits[n] for n in workers} == {n: {"nvidia.com/gpu": "1"} for n in workers}
    assert "nvidia.com/gpu" not in limits[launcher["metadata"]["name"]]
    # What the workers and the launcher mount and resolve.
    kube_api.get(f"/api/v1/namespaces/{kube_ns}/configmaps/{name}-config")
    kube_api.get(f"/api/v1/namespaces/{kube_ns}/secrets/{name}-ssh")
    assert kube_api.get(f"/api/v1/namespaces/{kube_ns}/services/{name}")["spec"]["clusterIP"] == "None"
