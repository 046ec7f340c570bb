"""A node's Kubernetes state as its agent reports it (``phalanx_kubeobjects.nodekube``): from the Node
and the pods bound to it, read as kube-scheduler reads them."""

from __future__ import annotations

import pytest

from phalanx_kubeobjects import names
from phalanx_kubeobjects.nodekube import node_kube_state
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.scheduling import (
    HostPort,
    LabelSelectorRequirement,
    NodeKubeState,
    PodAffinityTerm,
    RunningPod,
    Taint,
)

ANON = RunningPod(namespace="default")
"""A pod without metadata: in the default namespace, no labels."""


def node(**status_spec) -> dict:
    return {"metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": status_spec.pop("spec", {}),
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
                       "capacity": {"cpu": "9", "example.com/only-capacity": "3"},
                       "conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True"}], **status_spec}}


def pod(cpu: str = "", memory: str = "", *, phase: str = "Running", host_port: int = 0, host_network=False) -> dict:
    req = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    ports = [{"containerPort": host_port or 80, **({"hostPort": host_port} if host_port else {})}]
    return {"spec": {"hostNetwork": host_network, "containers": [{"name": "c", "resources": {"requests": req},
                                                                  "ports": ports}]},
            "status": {"phase": phase}}


CASES = [
    ("an idle ready node reports its allocatable (not its capacity), labels and readiness",
     node(), [],
     NodeKubeState(allocatable={"cpu": 8000, "memory": 32 << 30, "nvidia.com/gpu": 8, "pods": 110},
                   labels={"zone": "a"}, ready="True")),
    ("running and pending pods add up; terminal pods hold nothing",
     node(), [pod("500m", "1Gi"), pod("1", phase="Pending"), pod("4", "8Gi", phase="Succeeded"),
              pod("2", phase="Failed")],
     NodeKubeState(allocatable={"cpu": 8000, "memory": 32 << 30, "nvidia.com/gpu": 8, "pods": 110},
                   labels={"zone": "a"}, ready="True", requested={"cpu": 1500, "memory": 1 << 30}, pods=2,
                   running=(ANON, ANON))),
    ("host ports come from hostPort, and from every container port with hostNetwork",
     node(), [pod(host_port=8080), pod(host_network=True)],
     NodeKubeState(allocatable={"cpu": 8000, "memory": 32 << 30, "nvidia.com/gpu": 8, "pods": 110},
                   labels={"zone": "a"}, ready="True", pods=2,
                   host_ports=(HostPort(port=80), HostPort(port=8080)), running=(ANON, ANON))),
    ("a cordoned, tainted node without a Ready condition is Unknown; a taint with a made-up effect is left out",
     node(spec={"unschedulable": True, "taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
                                                   {"key": "x", "effect": "Sometimes"}]}, conditions=[]), [],
     NodeKubeState(allocatable={"cpu": 8000, "memory": 32 << 30, "nvidia.com/gpu": 8, "pods": 110},
                   labels={"zone": "a"}, unschedulable=True,
                   taints=(Taint(key="dedicated", value="infra", effect="NoSchedule"),), ready="Unknown")),
]


@pytest.mark.parametrize(("name", "node_obj", "pods", "expected"), CASES, ids=[c[0] for c in CASES])
def test_node_state(name, node_obj, pods, expected):
    assert node_kube_state(node_obj, pods) == expected


def test_an_unreadable_allocatable_quantity_is_a_violation_naming_the_field():
    got = node_kube_state({"status": {"allocatable": {"cpu": "lots"}}}, [])
    assert isinstance(got, Violation) and (got.field, got.value) == ("status.allocatable[cpu]", "lots")


def test_more_labels_than_the_wire_carries_is_a_violation_naming_the_bound():
    got = node_kube_state({"metadata": {"labels": {f"k{i}": "v" for i in range(1025)}}}, [])
    assert got == Violation("metadata.labels", "1025 entries", "Phalanx reports at most 1024 per node")


def test_a_malformed_node_object_gives_an_empty_unknown_state_and_no_exception():
    assert node_kube_state({"metadata": [], "spec": "x", "status": {"conditions": "y"}}, [{"spec": 3}]) == \
        NodeKubeState(pods=1, running=(ANON,))


ANTI = {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": {"matchLabels": {
        "team": "a"}}}]}


def labelled(ns: str, name: str, labels: dict, anti: dict | None = None) -> dict:
    return {"metadata": {"namespace": ns, "name": name, "labels": labels},
            "spec": {"containers": [{"name": "c"}], **({"affinity": {"podAntiAffinity": anti}} if anti else {})},
            "status": {"phase": "Running"}}


def test_the_pods_namespaces_labels_and_anti_affinity_are_reported_sorted():
    got = node_kube_state(node(), [labelled("b", "x", {"app": "db"}), labelled("a", "y", {"app": "web"}, ANTI),
                                   labelled("a", "z", {"app": "x"}, {"preferredDuringSchedulingIgnoredDuringExecution": [
                                       {"weight": 1}]})])
    assert isinstance(got, NodeKubeState)
    assert got.running == (
        RunningPod(namespace="a", labels={"app": "web"}, anti_affinity=(PodAffinityTerm(
            topology_key="zone", selector=(LabelSelectorRequirement(key="app", operator="In", values=("web",)),),
            all_namespaces=True),)),  # a namespaceSelector by labels: every namespace, keeping more pods apart
        RunningPod(namespace="a", labels={"app": "x"}),
        RunningPod(namespace="b", labels={"app": "db"}))


def test_a_pod_whose_deletion_has_begun_is_reported_terminating():
    leaving = labelled("a", "x", {"app": "web"})
    leaving["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    got = node_kube_state(node(), [leaving, labelled("a", "y", {"app": "web"})])
    assert isinstance(got, NodeKubeState)
    assert got.running == (RunningPod(namespace="a", labels={"app": "web"}, terminating=True),
                           RunningPod(namespace="a", labels={"app": "web"}))  # the sort is stable: as listed


@pytest.mark.parametrize(("pods", "unread"), [
    pytest.param([labelled("a", "p", {"bad key!": "v"})],
                 [str(Violation("pod a/p: metadata.labels[bad key!]", "bad key!", "a label key " + names.QUALIFIED_RULE))],
                 id="a label key"),
    pytest.param([labelled("a", "p", {f"k{i}": "v" for i in range(257)})],
                 [str(Violation("pod a/p: metadata.labels", "257 labels",
                                "Phalanx reads at most 256 labels per pod (pod affinity matches pods by them)"))],
                 id="too many labels on one pod"),
    pytest.param([labelled("a", "p", {}, {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": 7}]})],
                 [str(Violation("pod a/p: spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
                                ".topologyKey", "7", "required: a node label key " + names.QUALIFIED_RULE))],
                 id="a term without a topology key"),
    pytest.param([labelled("a", f"p{j:03}", {f"k{i}": "v" for i in range(64)}) for j in range(257)],
                 [""] * 256 + ["the node's pods carry more than 16384 labels together: this pod's are not reported"],
                 id="too many labels on the node's pods together: the pods past the budget"),
])
def test_a_hostile_pod_is_reported_unread_naming_the_pod_and_the_field_and_the_node_is_kept(pods, unread):
    # One pod anyone may run on the node must not take the node's whole state from Phalanx:
    # it is listed unread (the engine counts it as matching every anti-affinity term), and its
    # requests still count.
    got = node_kube_state(node(), pods)
    assert isinstance(got, NodeKubeState) and got.pods == len(pods)
    assert sorted(r.unread for r in got.running) == sorted(unread)
    assert all(r.labels == {} and r.anti_affinity == () for r in got.running if r.unread)
