"""A pod's scheduling constraints besides GPUs, read as the API server defaults them and
kube-scheduler sums them; every invalid value a violation naming field, value and rule."""

from __future__ import annotations

import pytest

from phalanx_kubeobjects import names
from phalanx_kubeobjects.containers import RESOURCES
from phalanx_kubeobjects.podspec import PodConstraints, parse_constraints
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.scheduling import (
    HostPort,
    LabelSelectorRequirement,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    SpreadConstraint,
    Toleration,
    WeightedNodeSelectorTerm,
    WeightedPodAffinityTerm,
)

GIB = 1 << 30


def parse(spec: dict) -> tuple[PodConstraints, list[Violation]]:
    v: list[Violation] = []
    got = parse_constraints(spec, RESOURCES, v)
    return got, v


def c(name: str, requests=None, limits=None, ports=None, **extra) -> dict:
    out = {"name": name, "resources": {k: x for k, x in (("requests", requests), ("limits", limits)) if x}, **extra}
    if ports:
        out["ports"] = ports
    return out


@pytest.mark.parametrize(("spec", "expected"), [
    pytest.param({"containers": [c("a", {"cpu": "500m", "memory": "1Gi"}), c("b", {"cpu": "1.5", "memory": "512Mi"})]},
                 {"cpu": 2000, "memory": GIB + 512 * 2**20}, id="containers add up, cpu in millicores, memory in bytes"),
    pytest.param({"containers": [c("a", limits={"cpu": "2", "memory": "4Gi"})]}, {"cpu": 2000, "memory": 4 * GIB},
                 id="a container that gives only limits requests its limits"),
    pytest.param({"containers": [c("a", {"cpu": "1"}, {"cpu": "4"})]}, {"cpu": 1000}, id="requests win over limits"),
    pytest.param({"containers": [c("a", {"cpu": "1"})], "initContainers": [c("i", {"cpu": "3"})]}, {"cpu": 3000},
                 id="an init container's request counts when it is the largest"),
    pytest.param({"containers": [c("a", {"cpu": "1"})],
                  "initContainers": [c("s", {"cpu": "1"}, restartPolicy="Always"), c("i", {"cpu": "1500m"})]},
                 {"cpu": 2500}, id="a sidecar adds up, and counts with the init containers after it"),
    pytest.param({"containers": [c("a", {"cpu": "1"})], "overhead": {"cpu": "250m", "memory": "64Mi"}},
                 {"cpu": 1250, "memory": 64 * 2**20}, id="the runtime class overhead is added"),
    pytest.param({"containers": [c("a", {"cpu": "1", "memory": "1Gi"})], "resources": {"requests": {"cpu": "8"}}},
                 {"cpu": 8000, "memory": GIB}, id="pod-level requests replace the containers' sum"),
    pytest.param({"containers": [c("a", {"ephemeral-storage": "10Gi", "hugepages-2Mi": "4Mi", "example.com/foo": "2"},
                                   {"nvidia.com/gpu": "1", "aliyun.com/gpu-core": "30"})]},
                 {"ephemeral-storage": 10 * GIB, "example.com/foo": 2, "hugepages-2Mi": 4 * 2**20},
                 id="storage, hugepages and extended resources; GPU resources are the GPU request's"),
    pytest.param({"containers": [c("a", {"cpu": "0"})]}, {}, id="a zero request is no request"),
])
def test_requests(spec, expected):
    got, v = parse(spec)
    assert (got.requests, v) == (expected, [])


@pytest.mark.parametrize(("spec", "violation"), [
    pytest.param({"containers": [c("a", {"cpu": "two"})]},
                 Violation("spec.containers[a].resources.requests[cpu]", "two", ""), id="cpu that is no quantity"),
    pytest.param({"containers": [c("a", {"memory": "-1Gi"})]},
                 Violation("spec.containers[a].resources.requests[memory]", "-1Gi", ""), id="negative memory"),
    pytest.param({"containers": [c("a", {"example.com/foo": "0.5"})]},
                 Violation("spec.containers[a].resources.requests[example.com/foo]", "0.5",
                           "must be an integer (the API server's rule for extended resources)"),
                 id="a fractional extended resource"),
    pytest.param({"containers": [c("a", {"storage": "1Gi"})]},
                 Violation("spec.containers[a].resources.requests[storage]", "storage",
                           "not a resource the API server accepts: cpu, memory, ephemeral-storage, hugepages-<size>, "
                           "or an extended resource named <domain>/<name>"), id="a resource name Kubernetes lacks"),
])
def test_invalid_requests_name_field_value_and_rule(spec, violation):
    _, v = parse(spec)
    assert len(v) == 1 and (v[0].field, v[0].value) == (violation.field, violation.value)
    assert v[0].rule and (not violation.rule or v[0].rule == violation.rule)


def test_tolerations_selector_and_required_node_affinity_are_carried_whole():
    got, v = parse({"containers": [c("a")], "nodeName": "n7", "nodeSelector": {"gpu": "a100"},
                       "tolerations": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
                                       {"operator": "Exists"}],
                       "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                           "nodeSelectorTerms": [{"matchExpressions": [{"key": "cores", "operator": "Gt",
                                                                        "values": ["32"]}],
                                                  "matchFields": [{"key": "metadata.name", "operator": "In",
                                                                   "values": ["n7"]}]}]}}}})
    assert v == []
    assert got == PodConstraints(
        tolerations=(Toleration(key="dedicated", value="infra", effect="NoSchedule"), Toleration(operator="Exists")),
        node_selector={"gpu": "a100"}, node_name="n7",
        node_affinity=(NodeSelectorTerm(
            match_expressions=(NodeSelectorRequirement(key="cores", operator="Gt", values=("32",)),),
            match_fields=(NodeSelectorRequirement(key="metadata.name", operator="In", values=("n7",)),)),))


@pytest.mark.parametrize(("spec", "field", "value"), [
    pytest.param({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "spec.tolerations[0].value", "v",
                 id="Exists with a value"),
    pytest.param({"tolerations": [{"value": "v"}]}, "spec.tolerations[0].operator", "Equal",
                 id="an empty key needs Exists"),
    pytest.param({"tolerations": [{"key": "k", "operator": "Gt", "value": "1"}]}, "spec.tolerations[0].operator", "Gt",
                 id="comparison operators are refused"),
    pytest.param({"tolerations": [{"key": "k", "effect": "Sometimes"}]}, "spec.tolerations[0].effect", "Sometimes",
                 id="an unknown effect"),
    pytest.param({"nodeSelector": {"zone": 3}}, "spec.nodeSelector[zone]", "3", id="a label value that is no string"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Near", "values": ["x"]}]}]}}}},
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        ".matchExpressions[0].operator", "Near", id="an unknown operator"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Lt", "values": ["1", "2"]}]}]}}}},
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        ".matchExpressions[0].values", "1, 2", id="Lt with two values"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["x"]}]}]}}}},
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        ".matchFields[0]", "metadata.labels In x", id="matchFields on anything but metadata.name"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}}},
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "[]",
        id="required node affinity without terms"),
])
def test_invalid_constraints_name_field_and_value(spec, field, value):
    _, v = parse({"containers": [c("a")], **spec})
    assert [(x.field, x.value) for x in v] == [(field, value)] and v[0].rule


@pytest.mark.parametrize(("spec", "ports"), [
    pytest.param({"containers": [c("a", ports=[{"containerPort": 80, "hostPort": 8080},
                                               {"containerPort": 53, "hostPort": 53, "protocol": "UDP",
                                                "hostIP": "10.0.0.1"}, {"containerPort": 9090}])]},
                 (HostPort(port=8080), HostPort(port=53, protocol="UDP", host_ip="10.0.0.1")),
                 id="only ports with a hostPort bind the node"),
    pytest.param({"hostNetwork": True, "containers": [c("a", ports=[{"containerPort": 29500}])]},
                 (HostPort(port=29500),), id="with hostNetwork every container port is a host port"),
    pytest.param({"containers": [c("a")], "initContainers": [
        c("side", ports=[{"containerPort": 1, "hostPort": 7000}], restartPolicy="Always"),
        c("once", ports=[{"containerPort": 1, "hostPort": 7001}])]},
                 (HostPort(port=7000),), id="a sidecar's host ports count, a run-once init container's do not"),
])
def test_host_ports(spec, ports):
    got, v = parse(spec)
    assert (got.host_ports, v) == (ports, [])


@pytest.mark.parametrize(("spec", "field"), [
    pytest.param({"hostNetwork": True, "containers": [c("a", ports=[{"containerPort": 80, "hostPort": 8080}])]},
                 "spec.containers[a].ports[0].hostPort", id="hostNetwork with a different host port"),
    pytest.param({"containers": [c("a", ports=[{"containerPort": 70000}])]}, "spec.containers[a].ports[0].containerPort",
                 id="a port out of range"),
    pytest.param({"containers": [c("a", ports=[{"containerPort": 80, "hostPort": 80, "protocol": "ICMP"}])]},
                 "spec.containers[a].ports[0].protocol", id="an unknown protocol"),
    pytest.param({"containers": [c("a", ports=[{"containerPort": 80, "hostPort": 80}]),
                                 c("b", ports=[{"containerPort": 81, "hostPort": 80}])]},
                 "spec.containers[b].ports[0].hostPort", id="the same host port twice"),
])
def test_invalid_ports(spec, field):
    _, v = parse(spec)
    assert [x.field for x in v] == [field]


READ = ("pod_affinity", "pod_anti_affinity", "preferred_affinity", "preferred_anti_affinity", "spread", "soft_spread",
        "preferred_node_affinity")


@pytest.mark.parametrize(("affinity", "spread", "fields", "unsupported"), [
    pytest.param({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}}, [],
                 {"pod_anti_affinity"}, (), id="required anti-affinity is evaluated"),
    pytest.param({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "labelSelector": {}, "namespaceSelector": {"matchLabels": {"team": "a"}}}]}}, [],
                 {"pod_anti_affinity"}, ("podAntiAffinity",), id="a term selecting namespaces by label waits to be resolved"),
    pytest.param({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "zone"}}]}}, [], {"preferred_affinity"}, (),
                 id="preferred pod affinity is evaluated"),
    pytest.param({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "zone", "namespaceSelector": {"matchLabels": {"t": "a"}}}}]}},
                 [], {"preferred_affinity"}, (), id="a preferred term selecting namespaces by label is kept to be resolved"),
    pytest.param({}, [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}], {"spread"}, (),
                 id="hard topology spread is a filter"),
    pytest.param({}, [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}], {"soft_spread"}, (),
                 id="soft topology spread is a score"),
    pytest.param({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]}},
                 [], {"preferred_node_affinity"}, (), id="preferred node affinity is a score"),
])
def test_each_term_is_read_into_its_field(affinity, spread, fields, unsupported):
    got, v = parse({"containers": [c("a")], "affinity": affinity, "topologySpreadConstraints": spread})
    assert ({f for f in READ if getattr(got, f)}, got.unsupported, v) == (fields, unsupported, [])


@pytest.mark.parametrize(("spec", "field", "value"), [
    pytest.param({"tolerations": [{"key": ["dedicated"], "operator": "Exists"}]}, "spec.tolerations[0].key", "a list",
                 id="a toleration key that is no string"),
    pytest.param({"tolerations": {"key": "k"}}, "spec.tolerations", "a dict", id="tolerations that are no list"),
    pytest.param({"tolerations": [{"key": "bad key!", "operator": "Exists"}]}, "spec.tolerations[0].key", "bad key!",
                 id="a toleration key that is no qualified name"),
    pytest.param({"nodeSelector": {"-zone": "a"}}, "spec.nodeSelector[-zone]", "-zone",
                 id="a node selector key that is no label key"),
    pytest.param({"nodeSelector": {"zone": "a b"}}, "spec.nodeSelector[zone]", "a b",
                 id="a node selector value that is no label value"),
    pytest.param({"nodeName": "Node_1"}, "spec.nodeName", "Node_1", id="a node name that is no DNS subdomain"),
    pytest.param({"containers": [c("a", {"example.com/fo o": "1"})]},
                 "spec.containers[a].resources.requests[example.com/fo o]", "example.com/fo o",
                 id="an extended resource whose name is no qualified name"),
    pytest.param({"containers": [c("a", ports=[{"containerPort": 80, "hostPort": 80, "hostIP": 10}])]},
                 "spec.containers[a].ports[0].hostIP", "10", id="a host IP that is no string"),
    pytest.param({"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(65)]},
                 "spec.tolerations", "65 tolerations", id="more tolerations than Phalanx reads"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists"}]}] * 17}}}},
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "17 terms",
        id="more node selector terms than Phalanx reads"),
    pytest.param({"containers": [c("a", ports=[{"containerPort": p, "hostPort": p} for p in range(1, 66)])]},
                 "spec.containers[*].ports", "65 host ports", id="more host ports than Phalanx reads"),
])
def test_hostile_constraints_are_violations_never_errors(spec, field, value):
    _, v = parse({"containers": [c("a")], **spec})
    assert [(x.field, x.value) for x in v] == [(field, value)] and v[0].rule


JOB_KEY = "jobset.sigs.k8s.io/job-key"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def req(key: str, op: str, *values: str) -> LabelSelectorRequirement:
    return LabelSelectorRequirement(key=key, operator=op, values=values)


def test_jobset_exclusive_placement_terms_are_read_whole():
    """The terms JobSet's pod webhook injects (pkg/webhooks/pod_mutating_webhook.go)."""
    spec = {"containers": [c("a")], "affinity": {
        "podAffinity": {REQ: [{"labelSelector": {"matchExpressions": [
            {"key": JOB_KEY, "operator": "In", "values": ["j1"]}]}, "topologyKey": "leaf", "namespaceSelector": {}}]},
        "podAntiAffinity": {REQ: [{"labelSelector": {"matchExpressions": [
            {"key": JOB_KEY, "operator": "Exists"}, {"key": JOB_KEY, "operator": "NotIn", "values": ["j1"]}]},
            "topologyKey": "leaf", "namespaceSelector": {}}]}}}
    v: list[Violation] = []
    got = parse_constraints(spec, RESOURCES, v, {JOB_KEY: "j1"})
    assert (got.labels, got.pod_affinity, got.pod_anti_affinity, got.unsupported, v) == (
        {JOB_KEY: "j1"},
        (PodAffinityTerm(topology_key="leaf", selector=(req(JOB_KEY, "In", "j1"),), all_namespaces=True),),
        (PodAffinityTerm(topology_key="leaf", selector=(req(JOB_KEY, "Exists"), req(JOB_KEY, "NotIn", "j1")),
                         all_namespaces=True),), (), [])


@pytest.mark.parametrize(("term", "labels", "expected"), [
    pytest.param({"topologyKey": "zone"}, {}, PodAffinityTerm(topology_key="zone", match_none=True),
                 id="no labelSelector selects no pod"),
    pytest.param({"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}}, "namespaces": ["b", "a"]},
                 {}, PodAffinityTerm(topology_key="zone", selector=(req("app", "In", "db"),), namespaces=("a", "b")),
                 id="matchLabels as In; namespaces sorted"),
    pytest.param({"topologyKey": "zone", "labelSelector": {}, "matchLabelKeys": ["run", "absent"],
                  "mismatchLabelKeys": ["team"]}, {"run": "r1", "team": "t"},
                 PodAffinityTerm(topology_key="zone", selector=(req("run", "In", "r1"), req("team", "NotIn", "t"))),
                 id="matchLabelKeys/mismatchLabelKeys merged from the pod's labels; absent keys ignored"),
])
def test_pod_affinity_terms(term, labels, expected):
    v: list[Violation] = []
    got = parse_constraints({"containers": [c("a")], "affinity": {"podAffinity": {REQ: [term]}}}, RESOURCES, v,
                            labels)
    assert (got.pod_affinity, v) == ((expected,), [])


F = f"spec.affinity.podAffinity.{REQ}[0]"


@pytest.mark.parametrize(("term", "expected"), [
    pytest.param({"labelSelector": {}}, Violation(f"{F}.topologyKey", "null",
                                                  f"required: a node label key {names.QUALIFIED_RULE}"),
                 id="topologyKey is required"),
    pytest.param({"topologyKey": "z", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt",
                                                                             "values": ["1"]}]}},
                 Violation(f"{F}.labelSelector.matchExpressions[0].operator", "Gt",
                           "the operator is one of In, NotIn, Exists, DoesNotExist"), id="no Gt in a pod selector"),
    pytest.param({"topologyKey": "z", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
                 Violation(f"{F}.labelSelector.matchExpressions[0].values", "[]", "In needs at least one value"),
                 id="In needs values"),
    pytest.param({"topologyKey": "z", "labelSelector": "all"},
                 Violation(f"{F}.labelSelector", "all", "a label selector (a mapping)"), id="a selector is a mapping"),
    pytest.param({"topologyKey": "z", "namespaces": ["Bad_NS"]},
                 Violation(f"{F}.namespaces[0]", "Bad_NS", f"a namespace name {names.LABEL_RULE}"),
                 id="namespace names"),
])
def test_pod_affinity_term_violations_name_the_field(term, expected):
    v: list[Violation] = []
    got = parse_constraints({"containers": [c("a")], "affinity": {"podAffinity": {REQ: [term]}}}, RESOURCES, v)
    assert (got.pod_affinity, v) == ((), [expected])


def test_a_pod_with_more_labels_than_phalanx_reads_is_refused_naming_the_field():
    v: list[Violation] = []
    parse_constraints({"containers": [c("a")]}, RESOURCES, v, {f"k{i}": "v" for i in range(257)})
    assert v == [Violation("metadata.labels", "257 labels",
                           "Phalanx reads at most 256 labels per pod (pod affinity matches pods by them)")]


def In(key: str, *values: str) -> LabelSelectorRequirement:
    return LabelSelectorRequirement(key=key, operator="In", values=values)


HARD = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}


@pytest.mark.parametrize(("constraints", "want"), [
    pytest.param([HARD], (SpreadConstraint(topology_key="zone", max_skew=1, match_none=True),),
                 id="without a labelSelector it selects no pod"),
    pytest.param([{**HARD, "labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": ["rev", "absent"]}],
                 (SpreadConstraint(topology_key="zone", max_skew=1, selector=(In("app", "web"), In("rev", "7"))),),
                 id="matchLabelKeys the pod carries are merged in as In, the others dropped"),
    pytest.param([{**HARD, "maxSkew": 2, "labelSelector": {}, "minDomains": 3, "nodeAffinityPolicy": "Ignore",
                   "nodeTaintsPolicy": "Honor"}],
                 (SpreadConstraint(topology_key="zone", max_skew=2, min_domains=3, honor_node_affinity=False,
                                   honor_taints=True),),
                 id="minDomains and both node inclusion policies are read"),
    pytest.param([{**HARD, "whenUnsatisfiable": "ScheduleAnyway"}, {**HARD, "topologyKey": "rack"}],
                 (SpreadConstraint(topology_key="rack", max_skew=1, match_none=True),),
                 id="only the DoNotSchedule constraints are filters"),
])
def test_hard_topology_spread_is_read_as_kube_scheduler_reads_it(constraints, want):
    v: list[Violation] = []
    got = parse_constraints({"containers": [c("a")], "topologySpreadConstraints": constraints}, RESOURCES, v,
                            {"app": "web", "rev": "7"})
    assert (got.spread, v) == (want, [])


def test_schedule_anyway_constraints_are_read_apart_as_the_score():
    v: list[Violation] = []
    got = parse_constraints({"containers": [c("a")], "topologySpreadConstraints": [
        {**HARD, "whenUnsatisfiable": "ScheduleAnyway", "maxSkew": 3, "labelSelector": {}, "matchLabelKeys": ["app"]},
        HARD]}, RESOURCES, v, {"app": "web"})
    assert (got.soft_spread, got.spread, v) == (
        (SpreadConstraint(topology_key="zone", max_skew=3, selector=(In("app", "web"),)),),
        (SpreadConstraint(topology_key="zone", max_skew=1, match_none=True),), [])


@pytest.mark.parametrize(("constraint", "field", "value"), [
    pytest.param({"maxSkew": 1, "topologyKey": "zone"}, "whenUnsatisfiable", "null",
                 id="whenUnsatisfiable is required"),
    pytest.param({**HARD, "maxSkew": 0}, "maxSkew", "0", id="a maxSkew below 1"),
    pytest.param({**HARD, "maxSkew": "1"}, "maxSkew", "1", id="a maxSkew that is no integer"),
    pytest.param({**HARD, "topologyKey": "bad key"}, "topologyKey", "bad key", id="a topologyKey that is no label key"),
    pytest.param({**HARD, "minDomains": 0}, "minDomains", "0", id="a minDomains below 1"),
    pytest.param({**HARD, "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}, "minDomains", "2",
                 id="minDomains with ScheduleAnyway"),
    pytest.param({**HARD, "nodeTaintsPolicy": "Sometimes"}, "nodeTaintsPolicy", "Sometimes",
                 id="a node inclusion policy that is neither Honor nor Ignore"),
    pytest.param({**HARD, "labelSelector": {}, "matchLabelKeys": ["bad key"]}, "matchLabelKeys[0]", "bad key",
                 id="a matchLabelKeys entry that is no label key"),
])
def test_an_invalid_spread_constraint_names_its_field_and_adds_no_constraint(constraint, field, value):
    got, v = parse({"containers": [c("a")], "topologySpreadConstraints": [constraint]})
    assert got.spread == ()
    assert [(x.field, x.value) for x in v] == [(f"spec.topologySpreadConstraints[0].{field}", value)]


PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def test_preferred_terms_are_read_with_their_weights():
    affinity = {"podAffinity": {PREFERRED: [{"weight": 30, "podAffinityTerm": {
                    "topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}}}}]},
                "podAntiAffinity": {PREFERRED: [{"weight": 100, "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname", "labelSelector": {}, "matchLabelKeys": ["app"],
                    "namespaces": ["a"]}}]}}
    v: list[Violation] = []
    got = parse_constraints({"containers": [c("a")], "affinity": affinity}, RESOURCES, v, {"app": "web"})
    assert (got.preferred_affinity, got.preferred_anti_affinity, v) == (
        (WeightedPodAffinityTerm(weight=30, term=PodAffinityTerm(topology_key="zone", selector=(In("app", "db"),))),),
        (WeightedPodAffinityTerm(weight=100, term=PodAffinityTerm(topology_key="kubernetes.io/hostname",
                                                                  selector=(In("app", "web"),), namespaces=("a",))),),
        [])


@pytest.mark.parametrize(("entry", "field", "value"), [
    pytest.param({"weight": 0, "podAffinityTerm": {"topologyKey": "zone"}}, "[0].weight", "0", id="a weight below 1"),
    pytest.param({"weight": 101, "podAffinityTerm": {"topologyKey": "zone"}}, "[0].weight", "101",
                 id="a weight above 100"),
    pytest.param({"weight": 5}, "[0].podAffinityTerm.topologyKey", "null", id="a term without a topologyKey"),
])
def test_an_invalid_preferred_term_names_its_field(entry, field, value):
    got, v = parse({"containers": [c("a")], "affinity": {"podAntiAffinity": {PREFERRED: [entry]}}})
    assert got.preferred_anti_affinity == ()
    assert [(x.field, x.value) for x in v] == [(f"spec.affinity.podAntiAffinity.{PREFERRED}{field}", value)]


def test_preferred_node_affinity_is_read_with_weights_and_checked_as_a_required_term_is():
    na = {"nodeAffinity": {PREFERRED: [
        {"weight": 20, "preference": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}},
        {"weight": 0, "preference": {}},
        {"weight": 5, "preference": {"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["x", "y"]}]}}]}}
    got, v = parse({"containers": [c("a")], "affinity": na})
    assert got.preferred_node_affinity == (
        WeightedNodeSelectorTerm(weight=20, term=NodeSelectorTerm(match_expressions=(
            NodeSelectorRequirement(key="tier", operator="In", values=("gold",)),))),
        WeightedNodeSelectorTerm(weight=5, term=NodeSelectorTerm()))
    assert [(x.field, x.value) for x in v] == [
        (f"spec.affinity.nodeAffinity.{PREFERRED}[1].weight", "0"),
        (f"spec.affinity.nodeAffinity.{PREFERRED}[2].preference.matchExpressions[0].values", "x, y")]
