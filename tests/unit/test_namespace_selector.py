"""A pod (anti-)affinity term's ``namespaceSelector`` by labels is read as a selector to resolve
(``nodeterms``), and gang-coordinator resolves it against the namespaces it follows
(``resolve_namespaces``) as kube-scheduler matches a term: the term's own namespaces, or any
namespace its selector selects."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_kubeobjects import nodeterms
from phalanx_kubeobjects.containers import RESOURCES
from phalanx_kubeobjects.podspec import parse_constraints
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.scheduling import LabelSelectorRequirement, PodAffinityTerm, WeightedPodAffinityTerm

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"
TEAM_A = {"matchLabels": {"team": "a"}}
NAMESPACES = {"a-1": {"team": "a"}, "a-2": {"team": "a", "tier": "gold"}, "b-1": {"team": "b"}, "plain": {}}


def In(key: str, *values: str) -> LabelSelectorRequirement:
    return LabelSelectorRequirement(key=key, operator="In", values=values)


def spec_of(affinity: dict) -> MemberSpec:
    v: list[Violation] = []
    got = parse_constraints({"containers": [{"name": "c"}], "affinity": affinity}, RESOURCES, v, {"app": "web"})
    assert v == []
    return MemberSpec(pod=PodRef(namespace="own", name="p"), **msgspec.structs.asdict(got))


def term(namespace_selector: dict, namespaces: list[str] | None = None) -> dict:
    return {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}},
            "namespaceSelector": namespace_selector, **({"namespaces": namespaces} if namespaces else {})}


def test_the_reader_keeps_the_selector_and_names_the_kind_to_resolve():
    spec = spec_of({"podAntiAffinity": {REQ: [term(TEAM_A)]}})
    assert spec.unsupported == ("podAntiAffinity",)
    assert spec.pod_anti_affinity == (PodAffinityTerm(topology_key="zone", selector=(In("app", "db"),),
                                                      namespace_selector=(In("team", "a"),)),)
    assert nodeterms.selects_namespaces(spec)


@pytest.mark.parametrize(("raw", "namespaces", "match_none"), [
    pytest.param(term(TEAM_A), ("a-1", "a-2"), False, id="the namespaces whose labels the selector selects"),
    pytest.param(term(TEAM_A, ["own"]), ("a-1", "a-2", "own"), False, id="with the term's own namespaces, a union"),
    pytest.param(term({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}),
                 ("b-1", "plain"), False, id="NotIn selects the namespaces without the label too"),
    pytest.param(term({"matchLabels": {"team": "z"}}), (), True,
                 id="a selector selecting no namespace (and no namespaces named): the term selects no pod"),
])
def test_resolution_as_kube_scheduler_matches_a_term(raw, namespaces, match_none):
    spec = spec_of({"podAffinity": {REQ: [raw]}})
    got = nodeterms.resolve_namespaces(spec, NAMESPACES)
    assert isinstance(got, MemberSpec)
    assert got.pod_affinity == (PodAffinityTerm(topology_key="zone", selector=(In("app", "db"),), namespaces=namespaces,
                                                match_none=match_none),)
    assert got.unsupported == () and not nodeterms.selects_namespaces(got)


def test_preferred_terms_are_resolved_with_their_weights():
    spec = spec_of({"podAffinity": {PREF: [{"weight": 7, "podAffinityTerm": term(TEAM_A)}]}})
    got = nodeterms.resolve_namespaces(spec, NAMESPACES)
    assert isinstance(got, MemberSpec)
    assert got.preferred_affinity == (WeightedPodAffinityTerm(weight=7, term=PodAffinityTerm(
        topology_key="zone", selector=(In("app", "db"),), namespaces=("a-1", "a-2"))),)


def test_more_namespaces_than_a_term_carries_is_a_violation_naming_the_term():
    spec = spec_of({"podAntiAffinity": {REQ: [term({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]})]}})
    many = {f"ns-{i}": {} for i in range(65)}
    got = nodeterms.resolve_namespaces(spec, many)
    assert got == Violation(f"spec.affinity.podAntiAffinity.{REQ}[0].namespaceSelector", "65 namespaces",
                            "Phalanx resolves a term to at most 64 namespaces")
