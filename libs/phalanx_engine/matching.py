"""Kubernetes matching rules the filters share, as kube-scheduler v1.36 applies them:
tolerations against taints (``core/v1`` ``Toleration.ToleratesTaint``), node selector
requirements (``labels.Requirement.Matches``, ``component-helpers`` node affinity) and the
host-port conflict check (``HostPortInfo.CheckConflict``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from phalanx_proto.kubeapi import NOT_READY_TAINT as NOT_READY
from phalanx_proto.kubeapi import UNREACHABLE_TAINT as UNREACHABLE
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration

ANY_IP = "0.0.0.0"

_INT64 = re.compile(r"[+-]?[0-9]+")


def parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: optional sign, ASCII digits, no spaces, in
    int64 range; ``None`` otherwise (so ``Gt``/``Lt`` on ``"1.5"`` or ``"ten"`` never match)."""
    if not _INT64.fullmatch(text):
        return None
    n = int(text)
    return n if -(1 << 63) <= n < (1 << 63) else None


def tolerates(t: Toleration, taint: Taint) -> bool:
    """Does ``t`` tolerate ``taint``? An empty effect matches every effect, an empty key every
    key; ``Exists`` ignores the value; ``Equal`` (or empty) compares it."""
    if t.effect and t.effect != taint.effect:
        return False
    if t.key and t.key != taint.key:
        return False
    if t.operator == "Exists":
        return True
    if t.operator in ("", "Equal"):
        return t.value == taint.value
    return False


def untolerated(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> Taint | None:
    """The first ``NoSchedule`` or ``NoExecute`` taint no toleration tolerates, else None."""
    tolerations = tuple(tolerations)
    for taint in taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def requirement_matches(r: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """One ``matchExpressions`` entry against the node's labels. An invalid requirement (an
    unknown operator, ``Gt``/``Lt`` without exactly one integer value, ``In``/``NotIn`` without
    values, ``Exists`` with values) matches nothing, as kube-scheduler's parse error does."""
    value = labels.get(r.key)
    match r.operator:
        case "In":
            return bool(r.values) and value is not None and value in r.values
        case "NotIn":
            return bool(r.values) and (value is None or value not in r.values)
        case "Exists":
            return not r.values and value is not None
        case "DoesNotExist":
            return not r.values and value is None
        case "Gt" | "Lt":
            if len(r.values) != 1:
                return False
            bound, have = parse_int64(r.values[0]), None if value is None else parse_int64(value)
            if bound is None or have is None:
                return False
            return have > bound if r.operator == "Gt" else have < bound
    return False


def field_matches(r: NodeSelectorRequirement, fields: Mapping[str, str]) -> bool:
    """One ``matchFields`` entry: ``In``/``NotIn`` with exactly one value, on the node's fields
    (``metadata.name``); anything else matches nothing."""
    if r.operator not in ("In", "NotIn") or len(r.values) != 1:
        return False
    equal = fields.get(r.key, "") == r.values[0]
    return equal if r.operator == "In" else not equal


def term_matches(term: NodeSelectorTerm, labels: Mapping[str, str], node_name: str) -> bool:
    """All expressions and all fields of one term match. A term with neither matches nothing
    (kube-scheduler drops empty terms)."""
    if not term.match_expressions and not term.match_fields:
        return False
    fields = {"metadata.name": node_name}
    return (all(requirement_matches(r, labels) for r in term.match_expressions)
            and all(field_matches(r, fields) for r in term.match_fields))


def preference_matches(term: NodeSelectorTerm, labels: Mapping[str, str], node_name: str) -> bool:
    """A preferred node affinity term: as a required one, except that an empty term matches
    every node (kube-scheduler drops empty terms only from the required ones)."""
    return (not term.match_expressions and not term.match_fields) or term_matches(term, labels, node_name)


def node_selector_matches(selector: Mapping[str, str], terms: tuple[NodeSelectorTerm, ...] | None,
                          labels: Mapping[str, str], node_name: str) -> bool:
    """``spec.nodeSelector`` (every label equal) and required node affinity (any term)."""
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    return terms is None or any(term_matches(t, labels, node_name) for t in terms)


def ports_conflict(want: tuple[str, str, int], used: set[tuple[str, str, int]]) -> bool:
    """kube-scheduler's host-port rule: a port on ``0.0.0.0`` conflicts with the same
    protocol/port on any IP; a port on one IP conflicts with that IP and with ``0.0.0.0``."""
    ip, protocol, port = want
    if ip == ANY_IP:
        return any(p == port and proto == protocol for _, proto, p in used)
    return (ip, protocol, port) in used or (ANY_IP, protocol, port) in used


def readiness_taints(ready: str, taints: tuple[Taint, ...]) -> tuple[Taint, ...]:
    """The node's taints plus the ``NoSchedule`` taint the node lifecycle controller puts on a
    node whose ``Ready`` condition is ``False`` (not-ready) or ``Unknown`` (unreachable), when
    the node does not carry it yet."""
    key = {"False": NOT_READY, "Unknown": UNREACHABLE}.get(ready)
    if key is None or any(t.key == key and t.effect == "NoSchedule" for t in taints):
        return taints
    return (*taints, Taint(key=key, effect="NoSchedule"))
