"""Topology spread (``topologySpreadConstraints``): the ``DoNotSchedule`` constraints as
kube-scheduler v1.36's PodTopologySpread filter evaluates them
(``pkg/scheduler/framework/plugins/podtopologyspread/filtering.go``), over the pods and nodes
the decision knows (``podaffinity.Pods``: the pods Phalanx did not place, its reservations, and
the members of the decision under way placed before this one).

Per incoming member, once (kube-scheduler's PreFilter), ``count``:

* a node is a **domain** of the member's constraints when it carries every constraint's
  ``topologyKey``; per constraint it counts only if it passes the constraint's node inclusion
  policies (``honor_node_affinity``: the pod's nodeSelector and required node affinity match it;
  ``honor_taints``: the pod tolerates its NoSchedule/NoExecute taints);
* each such (key, value) pair starts at 0 and counts the pods on those nodes that are in the
  member's namespace, not terminating, and matched by the constraint's selector (an empty
  selector counts none; a pod whose labels the node agent could not read counts nowhere);
* per key: how many domains, and the least count among them.

Then per node (``verdict``): a node without a constraint's key is refused, unresolvably; else
``count at the node's value + (1 if the member matches its own selector) - least`` may not
exceed ``max_skew``, where ``least`` is 0 while there are fewer domains than ``min_domains``.

The ``ScheduleAnyway`` constraints rank the nodes that fit (``soft_count``, ``soft_score``):
per constraint the pods counted in the node's domain, times log(domains + 2), plus maxSkew − 1,
summed; fewer ranks higher. kube-scheduler takes the domains from the nodes that passed every
filter for the pod; Phalanx ranks each node on its own, so from the nodes that carry every key.

Phalanx's domains are the nodes its decision may use (its node agents report them), not every
node of the cluster: a node Phalanx does not manage is no domain and its pods are not counted
(docs/placement.md, "Topology spread").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from phalanx_engine.matching import node_selector_matches, untolerated
from phalanx_engine.podaffinity import Node, Pair, Placed, Pods
from phalanx_proto.events import MemberSpec
from phalanx_proto.scheduling import NodeKubeState, SpreadConstraint, selector_matches

R_SPREAD = "node(s) didn't match pod topology spread constraints"
R_SPREAD_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"

SKEW, MISSING_LABEL = "skew", "missing label"
NO_DOMAIN = 2**31 - 1
"""The least count of a key without any domain (kube-scheduler's critical paths start at
MaxInt32): nothing to be skewed against."""


@dataclass(frozen=True, slots=True)
class Counts:
    """kube-scheduler's preFilterState for one member's constraints."""

    pairs: dict[Pair, int] = field(default_factory=dict)
    """(topology key, value) of every domain → matching pods there."""
    domains: dict[str, int] = field(default_factory=dict)
    """topology key → how many domains."""
    least: dict[str, int] = field(default_factory=dict)
    """topology key → the least count among its domains."""


def _counts_pod(c: SpreadConstraint, namespace: str, p: Placed) -> bool:
    if p.terminating or p.unread or p.namespace != namespace or c.match_none or not c.selector:
        return False
    return selector_matches(c.selector, p.labels)


def _domain_nodes(constraints: tuple[SpreadConstraint, ...], nodes: Iterable[Node], pods: Iterable[Placed]
                  ) -> Iterator[tuple[str, NodeKubeState, list[Placed]]]:
    """The nodes that carry every constraint's key (the others are in no domain), each with
    the pods on it."""
    on: dict[str, list[Placed]] = {}
    for p in pods:
        on.setdefault(p.node, []).append(p)
    for name, kube in nodes:
        if all(c.topology_key in kube.labels for c in constraints):
            yield name, kube, on.get(name, [])


def _matching(c: SpreadConstraint, spec: MemberSpec, pods: list[Placed]) -> int:
    """How many of ``pods`` the constraint counts for the member."""
    return sum(1 for p in pods if _counts_pod(c, spec.pod.namespace, p))


def _included(c: SpreadConstraint, spec: MemberSpec, name: str, kube: NodeKubeState) -> bool:
    """The constraint's node inclusion policies."""
    if c.honor_node_affinity and not node_selector_matches(spec.node_selector, spec.node_affinity, kube.labels, name):
        return False
    return not (c.honor_taints and untolerated(kube.taints, spec.tolerations) is not None)


def count(spec: MemberSpec, nodes: Iterable[Node], pods: Iterable[Placed]) -> Counts:
    """The member's spread counts over ``nodes`` and the ``pods`` on them."""
    constraints = spec.spread
    pairs: dict[Pair, int] = {}
    for name, kube, here_pods in _domain_nodes(constraints, nodes, pods):
        labels = kube.labels
        here: dict[Pair, int] = {}
        for c in constraints:
            if not _included(c, spec, name, kube):
                continue
            # a later constraint on the same key replaces the node's count, as kube-scheduler's map does
            here[(c.topology_key, labels[c.topology_key])] = _matching(c, spec, here_pods)
        for pair, n in here.items():
            pairs[pair] = pairs.get(pair, 0) + n
    domains: dict[str, int] = {}
    least: dict[str, int] = {}
    for (key, _), n in pairs.items():
        domains[key] = domains.get(key, 0) + 1
        least[key] = min(least.get(key, NO_DOMAIN), n)
    return Counts(pairs, domains, least)


def verdict(spec: MemberSpec, counts: Counts, node_labels: Mapping[str, str]) -> str:
    """"" when the node passes every constraint, else ``MISSING_LABEL`` or ``SKEW``."""
    for c in spec.spread:
        key = c.topology_key
        value = node_labels.get(key)
        if value is None:
            return MISSING_LABEL
        least = counts.least.get(key, NO_DOMAIN)
        if counts.domains.get(key, 0) < c.min_domains:
            least = 0
        own = 0 if c.match_none else int(selector_matches(c.selector, spec.labels))
        if counts.pairs.get((key, value), 0) + own - least > c.max_skew:
            return SKEW
    return ""


def counts_in(pods: Pods, spec: MemberSpec) -> Counts:
    """The member's counts over the decision's pods and nodes (``podaffinity.Pods``), kept until
    the decision's pods change."""
    return pods.kept("spread", spec, lambda: count(spec, pods.nodes(), (*pods.everyone(), *pods.decided)))


# -- ScheduleAnyway: the score -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SoftCounts:
    """kube-scheduler's preScoreState for one member's ``ScheduleAnyway`` constraints."""

    pairs: dict[Pair, int] = field(default_factory=dict)
    """(topology key, value) of every domain → matching pods there."""
    weights: tuple[float, ...] = ()
    """Per constraint, log(domains + 2): a key with more domains weighs more per pod."""


def soft_count(spec: MemberSpec, nodes: Iterable[Node], pods: Iterable[Placed]) -> SoftCounts:
    """The member's ``ScheduleAnyway`` counts: the domains of the nodes that carry every
    constraint's key, and per domain the pods the constraint counts there (as ``count``, each
    constraint with its node inclusion policies)."""
    constraints = spec.soft_spread
    pairs: dict[Pair, int] = {}
    domains: list[set[str]] = [set() for _ in constraints]
    for name, kube, here_pods in _domain_nodes(constraints, nodes, pods):
        labels = kube.labels
        for i, c in enumerate(constraints):
            pair = (c.topology_key, labels[c.topology_key])
            domains[i].add(pair[1])
            pairs.setdefault(pair, 0)
            if _included(c, spec, name, kube):
                pairs[pair] += _matching(c, spec, here_pods)
    return SoftCounts(pairs, tuple(math.log(len(d) + 2) for d in domains))


def soft_score(spec: MemberSpec, counts: SoftCounts, node_labels: Mapping[str, str]) -> float:
    """How crowded the node's domains are for the member (``count × weight + maxSkew − 1``
    summed over the constraints, kube-scheduler's ``scoreForCount``), negated so that larger is
    better; a node without every key ranks below all that have them."""
    if not all(c.topology_key in node_labels for c in spec.soft_spread):
        return -math.inf
    total = 0.0
    for c, weight in zip(spec.soft_spread, counts.weights, strict=True):
        total += counts.pairs.get((c.topology_key, node_labels[c.topology_key]), 0) * weight + c.max_skew - 1
    return -round(total)


def soft_counts_in(pods: Pods, spec: MemberSpec) -> SoftCounts:
    """The member's ``ScheduleAnyway`` counts over the decision's pods and nodes, kept until the
    decision's pods change."""
    return pods.kept("soft spread", spec, lambda: soft_count(spec, pods.nodes(), (*pods.everyone(), *pods.decided)))
