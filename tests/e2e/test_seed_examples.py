"""The seed's YAML examples end to end: real kube-apiserver, kwok GPU nodes, real nats-server,
and every Phalanx service as its own process with ``--cluster kube --kubeconfig F``.

Covered here: seed 004 §3.1 ``whole-card-demo``, an
invalid request (seed FAQ Q1: ``gpu-core: 0``; and 0 whole GPUs), and a pod too big for any node
(seed FAQ Q2: pending with the reason in ``PodScheduled``). TDM, multi-GPU ``replica``, the
4-GPU topology pod, RDMA, MIG and the gang are in ``test_seed_requests.py``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, unique

from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TOPOLOGY = EXAMPLES / "clusters" / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
SERVICES = ("topology-discovery", "gang-coordinator", "placement", "mig-manager", "binder")
TIERS = {"phalanx.io/hypernode": "hn-1", "phalanx.io/leaf-switch": "leaf-1", "phalanx.io/network-pod": "pod-1"}


def wait_for(fn, timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll ``fn`` until it returns something truthy; fail after ``timeout_s`` saying ``what``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last value: {last!r}")


def seed_pod(name: str, namespace: str) -> dict:
    """One of the seed examples in examples/pods/, in ``namespace``."""
    obj = yaml.safe_load((EXAMPLES / "pods" / f"{name}.yaml").read_text())
    obj["metadata"]["namespace"] = namespace
    obj["spec"]["terminationGracePeriodSeconds"] = 0
    return obj


def with_limits(obj: dict, name: str, limits: dict[str, str]) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["name"] = name
    obj["spec"]["containers"][0]["resources"]["limits"] = limits
    return obj


def condition(pod: dict, kind: str = "PodScheduled") -> dict | None:
    return next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), None)


@pytest.fixture(scope="module")
def phalanx(kube: ControlPlane, kube_api: KubeApi, tmp_path_factory):
    """Two kwok 8-GPU nodes and the whole Phalanx stack pointed at the API server."""
    kube_api.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "lj-runtime"},
        "handler": "lj-runtime"}, ok=(409,))  # the LINGJUN runtime the seed pods name
    names = [unique("e2e-v100"), unique("e2e-v100")]
    for n in names:
        kube_api.create_node(fake_gpu_node(n, labels={"lj_runtimekit_enable": "true", **TIERS}))
    wait_for(lambda: all(condition(kube_api.get(f"/api/v1/nodes/{n}"), "Ready") is not None for n in names),
             30, "kwok to mark the nodes Ready")
    work = tmp_path_factory.mktemp("e2e")
    cluster_file = work / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({"nodes": [
        {"name": n, "labels": {"lj_runtimekit_enable": "true", **TIERS}, "topology": str(TOPOLOGY)} for n in names]}))
    kube_args = ["--cluster", "kube", "--kubeconfig", str(kube.kubeconfig)]
    stack = Stack(ClusterFile.load(cluster_file), workdir=str(work / "stack"),
                  service_args={s: kube_args for s in SERVICES})
    stack.start_nats()
    try:
        stack.start_services(timeout_s=90)
        # topology-discovery advertises the extended resources on the real Node status.
        wait_for(lambda: all(kube_api.get(f"/api/v1/nodes/{n}")["status"]["capacity"].get("aliyun.com/gpu-core") == "800"
                             for n in names), 30, "topology-discovery to patch node capacity")
        stack.node_names = names  # type: ignore[attr-defined]
        yield stack
    finally:
        stack.stop()


def dump(stack: Stack) -> str:
    return "\n".join(stack.tail(n, 30) for n in ("gang-coordinator", "placement", "binder"))


def test_whole_card_demo_is_bound_with_its_gpus_in_the_assignment_annotation(phalanx, kube_api, kube_ns):
    kube_api.create_pod(seed_pod("whole-card-demo", kube_ns))

    def bound():
        pod = kube_api.get_pod(kube_ns, "whole-card-demo")
        return pod if pod["spec"].get("nodeName") else None

    try:
        pod = wait_for(bound, 60, "whole-card-demo to be bound")
    except AssertionError:
        raise AssertionError(dump(phalanx)) from None
    node = pod["spec"]["nodeName"]
    assert node in phalanx.node_names
    assignment = json.loads(pod["metadata"]["annotations"]["phalanx.io/assignment"])
    assert assignment["node"] == node and len(assignment["gpus"]) == 1
    assert assignment["pod"]["name"] == "whole-card-demo" and assignment["pod"]["uid"] == pod["metadata"]["uid"]
    assert condition(pod)["status"] == "True"
    events = wait_for(lambda: [e for e in kube_api.events(kube_ns, "whole-card-demo") if e["reason"] == "Scheduled"],
                      10, "the Scheduled event")
    assert events[0]["type"] == "Normal" and f"to {node} (GPUs {assignment['gpus'][0]})" in events[0]["message"]
    assert events[0]["involvedObject"]["uid"] == pod["metadata"]["uid"]
    # kwok plays the kubelet: the bound pod starts on the fake node.
    wait_for(lambda: kube_api.get_pod(kube_ns, "whole-card-demo")["status"].get("phase") == "Running", 20,
             "kwok to run the pod")


@pytest.mark.parametrize(("name", "limits", "rule"), [
    pytest.param("zero-gpus", {"nvidia.com/gpu": "0"}, ("nvidia.com/gpu", "at least 1"), id="zero whole GPUs"),
    pytest.param("tdm-core-zero", {"aliyun.com/gpu-core": "0", "aliyun.com/gpu-memory": "4"}, ("gpu-core",),
                 id="gpu-core 0 (seed FAQ Q1)"),
])
def test_an_invalid_request_gets_a_warning_event_and_is_never_bound(phalanx, kube_api, kube_ns, name, limits, rule):
    kube_api.create_pod(with_limits(seed_pod("tdm-demo", kube_ns), name, limits))

    def warned():
        return [e for e in kube_api.events(kube_ns, name) if e["reason"] == "FailedScheduling"]

    events = wait_for(warned, 30, f"a FailedScheduling event on {name}")
    assert events[0]["type"] == "Warning"
    message = events[0]["message"]
    assert message.startswith("invalid request: ") and all(part in message for part in rule), message
    cond = wait_for(lambda: condition(kube_api.get_pod(kube_ns, name)), 10, "the PodScheduled condition")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable") and cond["message"] == message
    time.sleep(2.5)  # one gang-coordinator resync later it is still unbound
    assert not kube_api.get_pod(kube_ns, name)["spec"].get("nodeName")


def test_a_pod_too_big_for_any_node_stays_pending_with_the_kube_scheduler_style_reason_and_what_would_start_it(
        phalanx, kube, kube_api, kube_ns):
    kube_api.create_pod(with_limits(seed_pod("whole-card-demo", kube_ns), "too-big", {"nvidia.com/gpu": "9"}))

    def pending():
        cond = condition(kube_api.get_pod(kube_ns, "too-big"))
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for(pending, 30, "PodScheduled=False on too-big")
    assert cond["reason"] == "Unschedulable"
    told = "0/2 nodes are available: 2 insufficient free GPUs; would start with 8 GPUs per member instead of 9 GPUs"
    assert cond["message"].startswith(told), cond  # the counterfactual (docs/whatif.md) on the real API
    events = [e for e in kube_api.events(kube_ns, "too-big") if e["reason"] == "FailedScheduling"]
    assert events and events[0]["type"] == "Warning" and events[0]["message"].startswith(told)
    assert not kube_api.get_pod(kube_ns, "too-big")["spec"].get("nodeName")
    out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "explain", f"{kube_ns}/too-big", "--json",
                          "--nats", phalanx.url, "--cluster", "kube", "--kubeconfig", str(kube.kubeconfig)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **phalanx.identity_env(S.READER)})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert (r["status"], r["reason"].startswith(told)) == ("pending", True), r["reason"]
    assert [(a["probe"], a["change"]) for a in r["whatif"]["answers"]] == [("smaller", "gpus 9 -> 8")]


def test_every_service_process_is_still_running_after_the_scenarios(phalanx):
    """No service crashed on the real API (this test runs last in the module)."""
    dead = {n: sp.proc.returncode for n, sp in phalanx.procs.items() if sp.proc.poll() is not None}
    assert dead == {}, dump(phalanx)
    assert "KubeApiError" not in phalanx.procs["binder"].log_path.read_text(errors="replace")

