"""The Kubernetes filters: each plugin's rule cases, Kubernetes edge cases included, as whole
statuses with kube-scheduler v1.36's plugin names, texts and resolvability."""

from __future__ import annotations

import pytest
from engine_builders import GIB, node, pod, port

from phalanx_engine import kube_plugins as kp
from phalanx_engine.status import Code, Reason, Status
from phalanx_proto.events import Assignment, PodRef

GPU_NODE = node("n1").gpus(1)


def refused(plugin: str, code: Code, text: str, *, resolvable: bool, **extra) -> Status:
    return Status(plugin=plugin, reasons=(Reason(code=code, text=text, **extra),), resolvable=resolvable)


def check(plugin, p, n):
    return plugin.filter(p.member(), n.state())


TAINTED = refused("TaintToleration", Code.UNTOLERATED_TAINT, kp.R_TAINT, resolvable=False,
                  detail="{dedicated: infra}")


@pytest.mark.parametrize(("p", "n", "expected"), [
    pytest.param(pod("p"), node("a").taint("dedicated", "infra"), TAINTED,
                 id="a NoSchedule taint without a toleration keeps the pod out, unresolvably"),
    pytest.param(pod("p"), node("a").taint("dedicated", "infra", "NoExecute"), TAINTED, id="NoExecute too"),
    pytest.param(pod("p"), node("a").taint("dedicated", "infra", "PreferNoSchedule"), None,
                 id="PreferNoSchedule is a preference, not a filter"),
    pytest.param(pod("p").tolerate("dedicated", "infra"), node("a").taint("dedicated", "infra"), None,
                 id="Equal with the same key and value tolerates"),
    pytest.param(pod("p").tolerate("dedicated", "gpu"), node("a").taint("dedicated", "infra"), TAINTED,
                 id="Equal with another value does not"),
    pytest.param(pod("p").tolerate("dedicated", operator="Exists"), node("a").taint("dedicated", "infra"), None,
                 id="Exists ignores the value"),
    pytest.param(pod("p").tolerate(operator="Exists"), node("a").taint("dedicated", "infra", "NoExecute"), None,
                 id="an empty key with Exists tolerates every taint"),
    pytest.param(pod("p").tolerate("dedicated", "infra", effect="NoSchedule"),
                 node("a").taint("dedicated", "infra", "NoExecute"), TAINTED,
                 id="a toleration for NoSchedule does not cover NoExecute"),
    pytest.param(pod("p").tolerate("dedicated", "infra"), node("a").taint("dedicated", "infra", "NoExecute"), None,
                 id="a toleration without effect covers every effect"),
    pytest.param(pod("p"), node("a").ready("False"),
                 refused("TaintToleration", Code.UNTOLERATED_TAINT, kp.R_TAINT, resolvable=False,
                         detail="{node.kubernetes.io/not-ready: }"),
                 id="a node that is not Ready is tainted not-ready"),
    pytest.param(pod("p"), node("a").ready("Unknown"),
                 refused("TaintToleration", Code.UNTOLERATED_TAINT, kp.R_TAINT, resolvable=False,
                         detail="{node.kubernetes.io/unreachable: }"),
                 id="a node whose Ready condition is Unknown is tainted unreachable"),
    pytest.param(pod("p").tolerate("node.kubernetes.io/not-ready", operator="Exists"), node("a").ready("False"), None,
                 id="a pod may tolerate not-ready"),
])
def test_taint_toleration(p, n, expected):
    assert check(kp.TaintToleration(), p, n) == expected


UNSCHEDULABLE = refused("NodeUnschedulable", Code.NODE_UNSCHEDULABLE, kp.R_UNSCHEDULABLE, resolvable=False)


@pytest.mark.parametrize(("p", "n", "expected"), [
    pytest.param(pod("p"), node("a").cordoned(), UNSCHEDULABLE, id="a cordoned node"),
    pytest.param(pod("p").tolerate("node.kubernetes.io/unschedulable", operator="Exists", effect="NoSchedule"),
                 node("a").cordoned(), None, id="tolerating the unschedulable taint admits the pod"),
    pytest.param(pod("p").tolerate(operator="Exists"), node("a").cordoned(), None,
                 id="so does tolerating everything"),
    pytest.param(pod("p"), node("a"), None, id="an uncordoned node"),
])
def test_node_unschedulable(p, n, expected):
    assert check(kp.NodeUnschedulable(), p, n) == expected


MISMATCH = refused("NodeAffinity", Code.NODE_AFFINITY, kp.R_AFFINITY, resolvable=False)
A100_NODE = node("gpu-1").label("gpu", "a100").label("cores", "64").label("zone", "z1")


@pytest.mark.parametrize(("p", "expected"), [
    pytest.param(pod("p").selector(gpu="a100"), None, id="nodeSelector matches"),
    pytest.param(pod("p").selector(gpu="a100", zone="z2"), MISMATCH, id="every nodeSelector label must match"),
    pytest.param(pod("p").affinity([("gpu", "In", "v100", "a100")]), None, id="In"),
    pytest.param(pod("p").affinity([("gpu", "NotIn", "v100")]), None, id="NotIn"),
    pytest.param(pod("p").affinity([("rack", "NotIn", "r1")]), None, id="NotIn matches a node without the label"),
    pytest.param(pod("p").affinity([("gpu", "Exists")]), None, id="Exists"),
    pytest.param(pod("p").affinity([("gpu", "DoesNotExist")]), MISMATCH, id="DoesNotExist"),
    pytest.param(pod("p").affinity([("cores", "Gt", "32")]), None, id="Gt on integers"),
    pytest.param(pod("p").affinity([("cores", "Lt", "32")]), MISMATCH, id="Lt on integers"),
    pytest.param(pod("p").affinity([("zone", "Gt", "0")]), MISMATCH, id="Gt on a label value that is no integer"),
    pytest.param(pod("p").affinity([("cores", "Gt", "1.5")]), MISMATCH, id="Gt with a value that is no integer"),
    pytest.param(pod("p").affinity([("cores", "Gt", "1", "2")]), MISMATCH, id="Gt needs exactly one value"),
    pytest.param(pod("p").affinity([("rack", "Lt", "9")]), MISMATCH, id="Lt on a missing label"),
    pytest.param(pod("p").affinity([("metadata.name", "In", "gpu-1")]), None, id="matchFields on the node name"),
    pytest.param(pod("p").affinity([("metadata.name", "NotIn", "gpu-1")]), MISMATCH, id="matchFields NotIn"),
    pytest.param(pod("p").affinity([("gpu", "In", "v100")], [("zone", "In", "z1")]), None,
                 id="terms are ORed"),
    pytest.param(pod("p").affinity([("gpu", "In", "a100"), ("zone", "In", "z2")]), MISMATCH,
                 id="expressions of one term are ANDed"),
    pytest.param(pod("p").affinity([]), MISMATCH, id="an empty term matches no node"),
    pytest.param(pod("p").selector(gpu="a100").affinity([("zone", "In", "z2")]), MISMATCH,
                 id="nodeSelector and affinity must both match"),
])
def test_node_affinity(p, expected):
    assert check(kp.NodeAffinity(), p, A100_NODE) == expected


def test_node_name():
    assert check(kp.NodeName(), pod("p").on("gpu-2"), node("gpu-1")) == refused(
        "NodeName", Code.NODE_NAME, kp.R_NODE_NAME, resolvable=False, detail="gpu-2")
    assert check(kp.NodeName(), pod("p").on("gpu-1"), node("gpu-1")) is None


def ports_refused(detail: str) -> Status:
    return refused("NodePorts", Code.NODE_PORTS, kp.R_PORTS, resolvable=True, detail=detail)


@pytest.mark.parametrize(("want", "used", "expected"), [
    pytest.param(port(8080), port(8080), ports_refused("TCP/8080 on 0.0.0.0"), id="the same port on every IP"),
    pytest.param(port(8080), port(8080, host_ip="10.0.0.1"), ports_refused("TCP/8080 on 0.0.0.0"),
                 id="0.0.0.0 conflicts with the port on any one IP"),
    pytest.param(port(8080, host_ip="10.0.0.1"), port(8080), ports_refused("TCP/8080 on 10.0.0.1"),
                 id="one IP conflicts with the port bound on 0.0.0.0"),
    pytest.param(port(8080, host_ip="10.0.0.1"), port(8080, host_ip="10.0.0.2"), None, id="two different IPs"),
    pytest.param(port(8080, "UDP"), port(8080), None, id="another protocol"),
    pytest.param(port(9090), port(8080), None, id="another port"),
])
def test_node_ports(want, used, expected):
    assert check(kp.NodePorts(), pod("p").ports(want), node("a").running(ports=(used,))) == expected


def test_host_ports_of_phalanx_reservations_count_too():
    n = node("a").unreported()
    n._allocs.append(Assignment(pod=PodRef(namespace="bg", name="x"), node="a", host_ports=(port(6000),)))
    assert check(kp.NodePorts(), pod("p").ports(port(6000)), n) == ports_refused("TCP/6000 on 0.0.0.0")


def fit(*reasons: Reason, resolvable: bool = True) -> Status:
    return Status(plugin="NodeResourcesFit", reasons=reasons, resolvable=resolvable)


@pytest.mark.parametrize(("p", "n", "expected"), [
    pytest.param(pod("p").requests(cpu=4000), node("a").allocatable(cpu=8000).running(cpu=6000),
                 fit(Reason(Code.INSUFFICIENT_RESOURCE, "Insufficient cpu", "cpu", 4000, 2000, 8000)),
                 id="cpu taken by pods Phalanx did not place"),
    pytest.param(pod("p").requests(cpu=4000, memory=8 * GIB), node("a").allocatable(cpu=2000, memory=4 * GIB),
                 fit(Reason(Code.INSUFFICIENT_RESOURCE, "Insufficient cpu", "cpu", 4000, 2000, 2000),
                     Reason(Code.INSUFFICIENT_RESOURCE, "Insufficient memory", "memory", 8 * GIB, 4 * GIB, 4 * GIB),
                     resolvable=False),
                 id="every shortfall is a reason; more than allocatable is unresolvable"),
    pytest.param(pod("p"), node("a").allocatable(pods=3).running(pods=3),
                 fit(Reason(Code.TOO_MANY_PODS, "Too many pods", "pods", 1, 0, 3)), id="the node's pod limit"),
    pytest.param(pod("p").requests(example_com__foo=1), node("a"),
                 fit(Reason(Code.INSUFFICIENT_RESOURCE, "Insufficient example.com/foo", "example.com/foo", 1, 0, 0),
                     resolvable=False),
                 id="an extended resource the node does not have"),
    pytest.param(pod("p").requests(ephemeral_storage=10 * GIB, hugepages_2Mi=2 << 20),
                 node("a").allocatable(hugepages_2Mi=4 << 20), None, id="enough storage and hugepages"),
    pytest.param(pod("p").requests(cpu=0), node("a").allocatable(cpu=0), None, id="a zero request is not checked"),
])
def test_node_resources_fit(p, n, expected):
    assert check(kp.NodeResourcesFit(), p, n) == expected


def test_phalanx_reservations_count_against_allocatable():
    n = node("a").allocatable(cpu=8000)
    n._allocs.append(Assignment(pod=PodRef(namespace="bg", name="x"), node="a", requests={"cpu": 7000}))
    assert check(kp.NodeResourcesFit(), pod("p").requests(cpu=2000), n) == fit(
        Reason(Code.INSUFFICIENT_RESOURCE, "Insufficient cpu", "cpu", 2000, 1000, 8000))


def test_node_state_not_reported_is_refused_only_when_required():
    missing = refused("NodeStateReported", Code.NODE_STATE_NOT_REPORTED, kp.R_NOT_REPORTED, resolvable=True)
    assert check(kp.NodeStateReported(required=True), pod("p"), node("a").unreported()) == missing
    assert check(kp.NodeStateReported(required=False), pod("p"), node("a").unreported()) is None
    assert check(kp.NodeStateReported(required=True), pod("p"), node("a")) is None


@pytest.mark.parametrize("terms", [("podAntiAffinity",), ("podAffinity", "podAntiAffinity")])
def test_pod_affinity_selecting_namespaces_by_label_is_refused_not_ignored(terms):
    got = check(kp.PodAffinityRefused(), pod("p").unsupported(*terms), node("a"))
    assert got == refused("InterPodAffinity", Code.POD_AFFINITY_REFUSED, f"Phalanx does not evaluate {', '.join(terms)}",
                          resolvable=False)


@pytest.mark.parametrize("plugin", [kp.NodeUnschedulable(), kp.TaintToleration(), kp.NodeAffinity(),
                                    kp.NodeResourcesFit()], ids=lambda p: p.name)
def test_without_reported_state_the_kubernetes_filters_pass_and_leave_it_to_node_state_reported(plugin):
    p = pod("p").requests(cpu=1).selector(a="b").affinity([("x", "Exists")])
    assert check(plugin, p, node("a").unreported()) is None
