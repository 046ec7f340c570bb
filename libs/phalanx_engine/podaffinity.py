"""Required inter-pod affinity and anti-affinity, as kube-scheduler v1.36's InterPodAffinity
filter evaluates them (``pkg/scheduler/framework/plugins/interpodaffinity``), over every pod the
cluster state knows: the pods Phalanx did not place (``NodeKubeState.running``), Phalanx's own
reservations (``Assignment.labels``/``anti_affinity``), and the members of the decision under
way placed before this one (a gang's members see each other as if already placed).

Per incoming member, as kube-scheduler's PreFilter does (``Counts``), topology pair
(label key, value) → how many pods:

* ``affinity``: pods that match **every** required affinity term of the member, counted once per
  term at their node's value of the term's ``topologyKey``;
* ``anti``: pods a required anti-affinity term of the member selects, at that term's key;
* ``existing``: pods whose own required anti-affinity term selects the member, at that term's key.

Then, per node (``verdict``): every affinity term's key must be on the node with a count there
(or no pod matches anywhere and the member matches its own terms: the first pod of a group);
no anti-affinity term may count at the node's value; no pair of the node's labels may count
in ``existing``. A node without the topology label belongs to no domain.

Pure: the decision's pods come in through ``Pods`` (``decide`` sets one per decision,
``trial``); nothing here reads the clock or the bus. ``Pods`` also carries what topology
spread (``spread``) counts over: the same pods, and the nodes that may be its domains.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from phalanx_proto.events import Assignment, MemberSpec
from phalanx_proto.scheduling import NodeKubeState, PodAffinityTerm, selector_matches

T = TypeVar("T")

R_AFFINITY = "node(s) didn't match pod affinity rules"
R_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
R_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"

AFFINITY, ANTI, EXISTING = "affinity", "anti-affinity", "existing anti-affinity"


def term_matches(term: PodAffinityTerm, owner_namespace: str, namespace: str, labels: Mapping[str, str]) -> bool:
    """Does ``term`` (carried by a pod in ``owner_namespace``) select a pod in ``namespace``
    with ``labels``? (``AffinityTerm.Matches``.)"""
    if term.match_none or term.namespace_selector:  # a namespaceSelector not resolved: Phalanx cannot tell
        return False
    if not term.all_namespaces:
        if term.namespaces:
            if namespace not in term.namespaces:
                return False
        elif namespace != owner_namespace:
            return False
    return selector_matches(term.selector, labels)


@dataclass(frozen=True, slots=True)
class Placed:
    """One pod where it runs (or is reserved, or was placed in this decision)."""

    node_labels: Mapping[str, str]
    namespace: str
    labels: Mapping[str, str]
    anti: tuple[PodAffinityTerm, ...] = ()
    unread: bool = False
    """Its labels and terms are not known (``RunningPod.unread``): it matches every
    anti-affinity term of an incoming pod and no affinity term, the side that keeps pods apart."""
    node: str = ""
    """The node it is on (topology spread counts only pods on the nodes that are its domains)."""
    terminating: bool = False


Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Counts:
    """kube-scheduler's preFilterState for one member: topology pair → matching pods."""

    affinity: dict[Pair, int] = field(default_factory=dict)
    anti: dict[Pair, int] = field(default_factory=dict)
    existing: dict[Pair, int] = field(default_factory=dict)


def _bump(m: dict[Pair, int], node_labels: Mapping[str, str], key: str) -> None:
    value = node_labels.get(key)
    if value is not None:
        m[(key, value)] = m.get((key, value), 0) + 1


def matches_all(terms: tuple[PodAffinityTerm, ...], owner_namespace: str, namespace: str,
                labels: Mapping[str, str]) -> bool:
    return all(term_matches(t, owner_namespace, namespace, labels) for t in terms)


def count(spec: MemberSpec, pods: Iterable[Placed]) -> Counts:
    """The three counts for ``spec`` over ``pods``."""
    c = Counts()
    ns, aff, anti = spec.pod.namespace, spec.pod_affinity, spec.pod_anti_affinity
    for p in pods:
        if aff and not p.unread and matches_all(aff, ns, p.namespace, p.labels):
            for t in aff:
                _bump(c.affinity, p.node_labels, t.topology_key)
        for t in anti:
            if p.unread or term_matches(t, ns, p.namespace, p.labels):
                _bump(c.anti, p.node_labels, t.topology_key)
        for t in p.anti:
            if term_matches(t, p.namespace, ns, spec.labels):
                _bump(c.existing, p.node_labels, t.topology_key)
    return c


def preference(spec: MemberSpec, pods: Iterable[Placed]) -> dict[Pair, int]:
    """kube-scheduler's InterPodAffinity topology score from the member's own preferred terms:
    per topology pair, the weight of each preferred affinity term for every pod it selects in
    that domain, less the weight of each preferred anti-affinity term for every pod it selects.
    A pod whose labels the agent could not read counts for neither."""
    score: dict[Pair, int] = {}
    ns = spec.pod.namespace
    weighted = [(w, 1) for w in spec.preferred_affinity] + [(w, -1) for w in spec.preferred_anti_affinity]
    for p in pods:
        if p.unread:
            continue
        for w, sign in weighted:
            t = w.term
            if term_matches(t, ns, p.namespace, p.labels):
                value = p.node_labels.get(t.topology_key)
                if value is not None:
                    score[(t.topology_key, value)] = score.get((t.topology_key, value), 0) + sign * w.weight
    return score


def preferred_score(score: Mapping[Pair, int], node_labels: Mapping[str, str]) -> int:
    """A node's score: the sum over the pairs its labels carry."""
    return sum(n for (k, v), n in score.items() if node_labels.get(k) == v)


def verdict(spec: MemberSpec, counts: Counts, node_labels: Mapping[str, str]) -> str:
    """"" when the node passes, else which rule it breaks (``AFFINITY``, ``ANTI``,
    ``EXISTING``), checked in kube-scheduler's order."""
    if spec.pod_affinity:
        exist = True
        for t in spec.pod_affinity:
            value = node_labels.get(t.topology_key)
            if value is None:
                return AFFINITY  # all topology labels must be on the node
            if counts.affinity.get((t.topology_key, value), 0) <= 0:
                exist = False
        if not exist and not (not counts.affinity and matches_all(spec.pod_affinity, spec.pod.namespace,
                                                                   spec.pod.namespace, spec.labels)):
            return AFFINITY
    if counts.anti:
        for t in spec.pod_anti_affinity:
            value = node_labels.get(t.topology_key)
            if value is not None and counts.anti.get((t.topology_key, value), 0) > 0:
                return ANTI
    if counts.existing and any(n > 0 and node_labels.get(k) == v for (k, v), n in counts.existing.items()):
        return EXISTING
    return ""


Node = tuple[str, NodeKubeState]
"""A node the decision may use, by name, with its Kubernetes state (topology spread's domains)."""


class Pods:
    """Every pod one decision must respect: ``base`` (the cluster's pods, read at most once,
    only for a member with terms or spread constraints of its own), ``with_anti`` (the pods
    with required anti-affinity terms: every member is checked against them) and ``decided``
    (this decision's members placed so far, in order); and ``nodes`` (the nodes the decision
    may use, read at most once, for topology spread's domains)."""

    __slots__ = ("_base", "_all", "with_anti", "decided", "_kept", "_changes", "_nodes", "_node_list")

    def __init__(self, base: Iterable[Placed] | None, with_anti: tuple[Placed, ...],
                 nodes: Iterable[Node] | None = None) -> None:
        self._base = base
        self._all: tuple[Placed, ...] | None = None
        self.with_anti = with_anti
        self.decided: list[Placed] = []
        self._nodes = nodes
        self._node_list: tuple[Node, ...] | None = None
        self._changes = 0
        """Bumped whenever ``decided`` changes (booked or forgotten): what counts were kept for."""
        self._kept: dict[tuple[str, int], tuple[MemberSpec, int, object]] = {}

    def everyone(self) -> tuple[Placed, ...]:
        if self._all is None:
            self._all = tuple(self._base or ())
        return self._all

    def nodes(self) -> tuple[Node, ...]:
        if self._node_list is None:
            self._node_list = tuple(self._nodes or ())
        return self._node_list

    def kept(self, what: str, spec: MemberSpec, compute: Callable[[], T]) -> T:
        """``compute()``'s answer for ``spec``, kept per member and rule until the decision's
        pods change (a rule's pre-filter state, computed once per member, as kube-scheduler's
        PreFilter)."""
        key = (what, id(spec))
        got = self._kept.get(key)
        if got is not None and got[0] is spec and got[1] == self._changes:
            return got[2]  # type: ignore[return-value]
        value = compute()
        if len(self._kept) > 4096:
            self._kept.clear()
        self._kept[key] = (spec, self._changes, value)
        return value

    def counts(self, spec: MemberSpec) -> Counts:
        """The member's counts over the cluster's pods and the decision's so far."""
        def compute() -> Counts:
            if spec.pod_affinity or spec.pod_anti_affinity:
                return count(spec, (*self.everyone(), *self.decided))
            # only the existing pods' own anti-affinity can refuse it
            return count(spec, (*self.with_anti, *(p for p in self.decided if p.anti)))
        return self.kept(AFFINITY, spec, compute)

    def preference(self, spec: MemberSpec) -> dict[Pair, int]:
        """The member's preferred-terms score per topology pair (``preference``)."""
        return self.kept("preferred", spec, lambda: preference(spec, (*self.everyone(), *self.decided)))

    def relevant(self, spec: MemberSpec) -> bool:
        """Can the rules over other pods (pod (anti-)affinity, topology spread, preferred terms)
        refuse or rank any node differently for ``spec``? (False: they pass every node alike, so
        what a node said for the member's shape may be remembered.)"""
        if own_terms(spec):
            return True
        return bool(self.counts(spec).existing)

    def book(self, a: Assignment, node_labels: Mapping[str, str]) -> None:
        """The decision keeps ``a``: later members see its pod on its node."""
        self.decided.append(Placed(node_labels, a.pod.namespace, a.labels, a.anti_affinity, node=a.node))
        self._changes += 1

    def forget(self, since: int) -> None:
        """Drop the pods booked after the first ``since``."""
        if len(self.decided) > since:
            del self.decided[since:]
            self._changes += 1


_PODS: contextvars.ContextVar[Pods | None] = contextvars.ContextVar("pod_affinity", default=None)


@contextlib.contextmanager
def trial(pods: Pods) -> Iterator[Pods]:
    """Run the code inside with ``pods`` as the decision's pods."""
    token = _PODS.set(pods)
    try:
        yield pods
    finally:
        _PODS.reset(token)


def current() -> Pods | None:
    return _PODS.get()


def book(a: Assignment, node_labels: Mapping[str, str]) -> None:
    """Book a kept assignment into the decision's pods (nothing outside a decision)."""
    p = _PODS.get()
    if p is not None:
        p.book(a, node_labels)


def mark() -> int:
    """Where the decision's booked pods stand now (for ``forget``)."""
    p = _PODS.get()
    return len(p.decided) if p is not None else 0


def forget(since: int) -> None:
    """Forget the pods booked since ``mark`` said ``since`` (a trial packing that failed)."""
    p = _PODS.get()
    if p is not None:
        p.forget(since)


def own_terms(spec: MemberSpec) -> bool:
    """Does the member carry terms or constraints over other pods of its own?"""
    return bool(spec.pod_affinity or spec.pod_anti_affinity or spec.spread or ranks_by_pods(spec))


def ranks_by_pods(spec: MemberSpec) -> bool:
    """Does the member carry preferences over other pods (preferred pod (anti-)affinity,
    ``ScheduleAnyway`` spread), which rank the nodes that fit?"""
    return bool(spec.preferred_affinity or spec.preferred_anti_affinity or spec.soft_spread)


def relevant(spec: MemberSpec) -> bool:
    """Whether the decision's pods can make the rules over other pods refuse or rank nodes
    for ``spec`` (no decision under way: only its own terms and constraints can)."""
    p = _PODS.get()
    if p is None:
        return own_terms(spec)
    return p.relevant(spec)
