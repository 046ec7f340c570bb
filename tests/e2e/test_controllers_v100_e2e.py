"""Phalanx on pods the real controllers create, on the seed benchmark's testbed: two kwok nodes of
8 × V100 (hybrid cube-mesh NVLink) enabled the ACK way (``ack.node.gpu.schedule=topology``, R10),
one network-pod. Seed 000's MPIJob (4 one-GPU workers, a launcher without GPU, arena's gang
annotation); two JobSets that each need more than half the cluster; and a rollback that the
JobSet controller repairs.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml
from kubecontrollers import delete_workloads, wait_for
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, unique
from test_controllers_e2e import JOBSET, bound, gpus_used, jobset, live
from test_seed_examples import SERVICES, TOPOLOGY, condition

from phalanx_localstack.stack import ClusterFile, Stack

pytestmark = pytest.mark.e2e

ACK = {"ack.node.gpu.schedule": "topology", "phalanx.io/hypernode": "hn-1", "phalanx.io/leaf-switch": "leaf-1",
       "phalanx.io/network-pod": "pod-1"}
QUADS = ({0, 1, 2, 3}, {4, 5, 6, 7})
"""The fully NVLink-connected GPU quads of the cube mesh (every pair NV1 or NV2)."""


@pytest.fixture(scope="module")
def v100(jobset_controller: ControlPlane, mpi_operator: ControlPlane, kube_api: KubeApi, tmp_path_factory):
    """Two 8 × V100 kwok nodes labelled the ACK way, and the whole stack on the real API."""
    names = [unique("e2e-v100") for _ in range(2)]
    for n in names:
        kube_api.create_node(fake_gpu_node(n, labels=ACK))
    wait_for(lambda: all(condition(kube_api.get(f"/api/v1/nodes/{n}"), "Ready") for n in names), 30,
             "kwok to mark the nodes Ready")
    work = tmp_path_factory.mktemp("e2e-v100")
    cluster_file = work / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({"nodes": [
        {"name": n, "labels": ACK, "topology": str(TOPOLOGY), "gpuModel": "Tesla V100-SXM2-16GB",
         "gpuMemoryMiB": 16384} for n in names]}))
    kube_args = ["--cluster", "kube", "--kubeconfig", str(jobset_controller.kubeconfig)]
    stack = Stack(ClusterFile.load(cluster_file), workdir=str(work / "stack"),
                  service_args={s: kube_args for s in SERVICES})
    stack.start_nats()
    try:
        stack.start_services(timeout_s=90)
        wait_for(lambda: all(kube_api.get(f"/api/v1/nodes/{n}")["status"]["capacity"].get("aliyun.com/gpu-core")
                             == "800" for n in names), 30, "topology-discovery to patch node capacity")
        stack.network_pods = {n: "pod-1" for n in names}  # type: ignore[attr-defined]
        yield stack
    finally:
        stack.stop()


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


def dump(stack: Stack) -> str:
    return "\n".join(stack.tail(n, 30) for n in ("gang-coordinator", "placement", "binder"))


def events(api: KubeApi, ns: str, reason: str) -> list[dict]:
    return [e for e in api.get(f"/api/v1/namespaces/{ns}/events")["items"] if e.get("reason") == reason]


def arena_mpijob(name: str, ns: str) -> dict:
    """Seed 000's ``arena submit mpi --gang --gputopology=true --gpus=1 --workers=4``: 4 workers of
    one GPU, a launcher without GPU, both with arena's pod-group annotation and Phalanx's name."""
    gang = {"scheduling.k8s.io/group-name": name}

    def replica(n: int, role: str, limits: dict[str, str]) -> dict:
        return {"replicas": n, "template": {"metadata": {"annotations": gang}, "spec": {
            "schedulerName": "phalanx", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": f"mpi-{role}", "image": "registry.example/pytorch-benchmark:1",
                            "resources": {"limits": limits}}]}}}
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name, "namespace": ns},
            "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"},
                     "mpiReplicaSpecs": {"Launcher": replica(1, "launcher", {"cpu": "1"}),
                                         "Worker": replica(4, "worker", {"nvidia.com/gpu": "1"})}}}


def test_seed_000_mpijob_workers_land_on_one_nvlink_quad_and_the_launcher_is_told_it_is_no_member(
        v100, kube_api, kube_ns):
    name = "pytorch-topo-4-vgg16"
    kube_api.post(f"/apis/kubeflow.org/v2beta1/namespaces/{kube_ns}/mpijobs", arena_mpijob(name, kube_ns))
    workers = bound(kube_api, kube_ns, f"training.kubeflow.org/job-role=worker,training.kubeflow.org/job-name={name}",
                    4, v100)
    placed = [json.loads(p["metadata"]["annotations"]["phalanx.io/assignment"]) for p in workers]
    assert len({a["node"] for a in placed}) == 1, placed
    assert {g for a in placed for g in a["gpus"]} in QUADS, placed
    (launcher,) = live(kube_api, kube_ns, f"training.kubeflow.org/job-role=launcher,training.kubeflow.org/job-name={name}")
    assert not launcher["spec"].get("nodeName")
    told = wait_for(lambda: [e["message"] for e in events(kube_api, kube_ns, "FailedScheduling")
                             if e["involvedObject"]["name"] == launcher["metadata"]["name"]], 30,
                    "the launcher to be told why it is not placed")
    assert "give a pod without GPUs (an MPIJob launcher) schedulerName default-scheduler" in told[0]


def test_of_two_jobsets_each_over_half_the_cluster_one_runs_the_other_waits_whole_then_runs(v100, kube_api, kube_ns):
    api = kube_api
    api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", jobset("first", kube_ns, [("w", 3, 3)]))
    bound(api, kube_ns, f"{JOBSET}=first", 9, v100)
    api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", jobset("second", kube_ns, [("w", 3, 3)]))
    wait_for(lambda: len(live(api, kube_ns, f"{JOBSET}=second")) == 9, 90, "the second JobSet's 9 pods")

    def told_why():
        pods = live(api, kube_ns, f"{JOBSET}=second")
        return all((condition(p) or {}).get("status") == "False" and (condition(p) or {}).get("message")
                   for p in pods) and pods
    waiting = wait_for(told_why, 60, "every pod of the second JobSet to say why it waits")
    reasons = {condition(p)["message"] for p in waiting}
    deadline = time.monotonic() + 10  # several attempts' worth: never a part of it bound
    while time.monotonic() < deadline:
        assert not [p for p in live(api, kube_ns, f"{JOBSET}=second") if p["spec"].get("nodeName")], reasons
        time.sleep(0.5)
    api.request("DELETE", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets/first",
                {"propagationPolicy": "Background"})
    second = bound(api, kube_ns, f"{JOBSET}=second", 9, v100, timeout_s=180)
    used = gpus_used(second)
    assert len(used) == len(set(used)) == 9
    assert any("insufficient" in r or "available" in r for r in reasons), reasons
    # ... and what would start it: the first JobSet's GPUs (docs/whatif.md), on the real API.
    assert any("would start if" in r and "first" in r for r in reasons), reasons


def deny_binds(api: KubeApi, ns: str, prefix: str) -> str:
    """An admission policy that refuses the ``pods/binding`` of pods named ``prefix…`` in ``ns``:
    a bind that fails after other members of its gang are bound."""
    name = unique("deny-bind")
    api.post("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
            "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/binding"]}]},
            "validations": [{"expression": f"!object.metadata.name.startsWith('{prefix}')",
                             "message": "the test refuses this bind"}]}})
    api.post("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}})
    # The API server compiles a new policy in the background: wait until it refuses a bind.
    probe = f"{prefix}probe"
    api.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": probe, "namespace": ns},
                    "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.example/x"}]}})

    def refused() -> bool:
        status, body = api.request("POST", f"/api/v1/namespaces/{ns}/pods/{probe}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": probe},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "nowhere"}}, query={"dryRun": "All"},
            ok=(400, 403, 422))
        return status != 201 and "the test refuses this bind" in json.dumps(body)
    wait_for(refused, 30, "the admission policy to refuse binds", interval_s=0.5)
    api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{probe}", {"gracePeriodSeconds": 0})
    return name


def allow_binds(api: KubeApi, name: str) -> None:
    api.delete(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}")
    api.delete(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}")


def test_a_rollback_after_some_members_were_bound_is_repaired_by_the_jobset_controller(v100, kube_api, kube_ns):
    api = kube_api
    js = jobset("rb", kube_ns, [("w", 1, 4)], failurePolicy={"maxRestarts": 3})
    pod_template = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod_template["backoffLimit"] = 0  # a pod Phalanx deletes fails the Job, the JobSet restarts it
    pod_template["template"]["metadata"]["annotations"] = {"phalanx.io/gang-timeout-seconds": "15"}
    policy = deny_binds(api, kube_ns, "rb-w-0-3-")
    try:
        api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", js)
        first = wait_for(lambda: len(p := live(api, kube_ns, f"{JOBSET}=rb")) == 4 and p, 90, "the JobSet's 4 pods")
        old = {p["metadata"]["uid"] for p in first}
        wait_for(lambda: [p for p in live(api, kube_ns, f"{JOBSET}=rb") if p["spec"].get("nodeName")], 60,
                 "some members bound while one bind is refused")
        started = time.monotonic()
        try:
            rolled = wait_for(lambda: events(api, kube_ns, "GangRollback"), 90, "Phalanx to roll the attempt back")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{dump(v100)}") from None
    finally:
        allow_binds(api, policy)
    assert all("deleting this bound pod so its controller recreates it" in e["message"] for e in rolled), rolled

    def recreated():
        now = live(api, kube_ns, f"{JOBSET}=rb")
        return len(now) == 4 and not old & {p["metadata"]["uid"] for p in now} and all(
            p["spec"].get("nodeName") for p in now) and now
    try:
        now = wait_for(recreated, 180, "the JobSet's recreated pods to be bound whole")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(v100)}") from None
    repaired_s = time.monotonic() - started
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in now} != {"0"}
    # Nothing stays reserved for the old pods: a JobSet of the 12 GPUs left fits at once.
    api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{kube_ns}/jobsets", jobset("rest", kube_ns, [("w", 1, 12)]))
    rest = bound(api, kube_ns, f"{JOBSET}=rest", 12, v100)
    used = gpus_used(now + rest)
    assert len(used) == len(set(used)) == 16
    print(f"rollback repaired: recreated pods bound {repaired_s:.1f} s after the rollback event")


def test_every_service_process_is_still_running(v100):
    dead = {n: sp.proc.returncode for n, sp in v100.procs.items() if sp.proc.poll() is not None}
    assert dead == {}, dump(v100)
