"""Which nodes a pod may go to, read from its spec the way kube-scheduler reads it: tolerations,
``nodeSelector``, required node affinity, ``nodeName``, required pod affinity and anti-affinity
(``pod_terms``), topology spread (``spread``), the terms placement may not evaluate until
gang-coordinator resolves their namespaces (``unsupported``, ``resolve_namespaces``); and what
ranks the nodes that fit: preferred node affinity, preferred pod (anti-)affinity
(``preferred_terms``) and ``ScheduleAnyway`` spread. Part of ``podspec.parse_constraints``; every
invalid value is a ``Violation`` naming field, value and rule, never an exception.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from phalanx_kubeobjects import names
from phalanx_kubeobjects.violations import Violation, as_list, as_map, as_str, shown
from phalanx_proto import scheduling as K
from phalanx_proto.events import MemberSpec
from phalanx_proto.scheduling import (
    LabelSelectorRequirement,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    SpreadConstraint,
    Toleration,
    WeightedNodeSelectorTerm,
    WeightedPodAffinityTerm,
    selector_matches,
)

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_AFFINITY = "spec.affinity"
_TERMS = f"{_AFFINITY}.nodeAffinity.{REQUIRED}.nodeSelectorTerms"
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_SPREAD = "spec.topologySpreadConstraints"
_POLICIES = ("Honor", "Ignore")
_INT32 = 2**31 - 1


def tolerations(raw: Any, v: list[Violation]) -> tuple[Toleration, ...]:
    items = as_list(raw, "spec.tolerations", v)
    if len(items) > K.MAX_TOLERATIONS:
        v.append(Violation("spec.tolerations", f"{len(items)} tolerations",
                           f"Phalanx reads at most {K.MAX_TOLERATIONS} tolerations per pod"))
        return ()
    out = []
    for i, t in enumerate(items):
        field = f"spec.tolerations[{i}]"
        t = as_map(t)
        key, op, value, effect = (as_str(t, "key", field, v), as_str(t, "operator", field, v),
                                  as_str(t, "value", field, v), as_str(t, "effect", field, v))
        if key is None or op is None or value is None or effect is None:
            continue
        op = op or "Equal"
        if op not in ("Equal", "Exists"):
            v.append(Violation(f"{field}.operator", shown(op), "a toleration's operator is Equal or Exists (Phalanx "
                                                               "does not take the Lt/Gt comparison operators)"))
        elif effect not in EFFECTS:
            v.append(Violation(f"{field}.effect", shown(effect), "the effect is NoSchedule, PreferNoSchedule, "
                                                                 "NoExecute or empty for all"))
        elif key and not names.qualified_name(key):
            v.append(Violation(f"{field}.key", shown(key), f"a taint key {names.QUALIFIED_RULE}"))
        elif not key and op != "Exists":
            v.append(Violation(f"{field}.operator", op, "a toleration without a key must use operator Exists "
                                                        "(it then tolerates every taint)"))
        elif op == "Exists" and value:
            v.append(Violation(f"{field}.value", shown(value), "a toleration with operator Exists takes no value"))
        elif not names.label_value(value):
            v.append(Violation(f"{field}.value", shown(value), f"a taint value: {names.VALUE_RULE}"))
        else:
            out.append(Toleration(key=key, operator=op, value=value, effect=effect))
    return tuple(out)


def node_selector(raw: Any, v: list[Violation]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        v.append(Violation("spec.nodeSelector", shown(raw), "nodeSelector maps label keys to string values"))
        return {}
    if len(raw) > K.MAX_SELECTOR_LABELS:
        v.append(Violation("spec.nodeSelector", f"{len(raw)} labels",
                           f"Phalanx reads at most {K.MAX_SELECTOR_LABELS} nodeSelector labels per pod"))
        return {}
    before = len(v)
    for k, x in raw.items():
        field = f"spec.nodeSelector[{shown(k)}]"
        if not names.qualified_name(k):
            v.append(Violation(field, shown(k), f"a label key {names.QUALIFIED_RULE}"))
        elif not isinstance(x, str):
            v.append(Violation(field, shown(x), "a label value is a string: write it in quotes"))
        elif not names.label_value(x):
            v.append(Violation(field, shown(x), names.VALUE_RULE))
    return {} if len(v) > before else dict(raw)


def _requirement(r: Any, field: str, fields: bool, v: list[Violation]) -> NodeSelectorRequirement | None:
    r = as_map(r)
    key, op = as_str(r, "key", field, v), as_str(r, "operator", field, v)
    values = r.get("values") or []
    if key is None or op is None:
        return None
    if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
        v.append(Violation(f"{field}.values", shown(values) if not isinstance(values, list) else "a list",
                           "values is a list of strings"))
        return None
    if len(values) > K.MAX_VALUES:
        v.append(Violation(f"{field}.values", f"{len(values)} values",
                           f"Phalanx reads at most {K.MAX_VALUES} values per requirement"))
        return None
    if fields and (key != "metadata.name" or op not in ("In", "NotIn") or len(values) != 1):
        v.append(Violation(field, shown(f"{key} {op} {', '.join(values[:4])}"),
                           "matchFields supports only metadata.name with In or NotIn and exactly one value"))
        return None
    rule = _requirement_rule(op, values)
    if rule:
        v.append(Violation(f"{field}.{'operator' if op not in OPERATORS else 'values'}",
                           shown(op if op not in OPERATORS else ", ".join(values[:8]) or "[]"), rule))
        return None
    if not fields and not names.qualified_name(key):
        v.append(Violation(f"{field}.key", shown(key), f"a label key {names.QUALIFIED_RULE}"))
        return None
    return NodeSelectorRequirement(key=key, operator=op, values=tuple(values))


def _requirement_rule(op: str, values: list[str]) -> str:
    """The API server's rule ``op`` and ``values`` break together, or ''."""
    if op not in OPERATORS:
        return f"the operator is one of {', '.join(OPERATORS)}"
    if op in ("In", "NotIn") and not values:
        return f"{op} needs at least one value"
    if op in ("Exists", "DoesNotExist") and values:
        return f"{op} takes no values"
    if op in ("Gt", "Lt") and len(values) != 1:
        return f"{op} takes exactly one value (an integer)"
    return ""


def node_affinity(spec: Mapping[str, Any], v: list[Violation]) -> tuple[NodeSelectorTerm, ...] | None:
    na = as_map(as_map(spec.get("affinity")).get("nodeAffinity"))
    required = na.get(REQUIRED)
    if required is None:
        return None
    items = as_list(as_map(required).get("nodeSelectorTerms"), _TERMS, v)
    if not items:
        v.append(Violation(_TERMS, "[]", "required node affinity needs at least one node selector term"))
        return ()
    if len(items) > K.MAX_TERMS:
        v.append(Violation(_TERMS, f"{len(items)} terms", f"Phalanx reads at most {K.MAX_TERMS} node selector terms"))
        return ()
    return tuple(selector_term(t, f"{_TERMS}[{i}]", v) for i, t in enumerate(items))


def preferred_node_affinity(spec: Mapping[str, Any], v: list[Violation]) -> tuple[WeightedNodeSelectorTerm, ...]:
    """The preferred node affinity terms, each with its weight (1–100)."""
    field = f"{_AFFINITY}.nodeAffinity.{PREFERRED}"
    return tuple(WeightedNodeSelectorTerm(weight=weight, term=selector_term(raw.get("preference"), f"{where}.preference", v))
                 for weight, raw, where in _weighted(spec, "nodeAffinity", field, v))


def _weighted(spec: Mapping[str, Any], kind: str, field: str, v: list[Violation]
              ) -> Iterator[tuple[int, Mapping[str, Any], str]]:
    """The entries of ``spec.affinity.<kind>.preferred…`` (at most ``MAX_TERMS``), each as
    (weight 1–100, the entry, where it is); an entry without a valid weight is a violation."""
    items = as_list(as_map(as_map(spec.get("affinity")).get(kind)).get(PREFERRED), field, v)
    if len(items) > K.MAX_TERMS:
        v.append(Violation(field, f"{len(items)} terms", f"Phalanx reads at most {K.MAX_TERMS} terms"))
        return
    for i, raw in enumerate(items):
        entry = as_map(raw)
        weight = entry.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            v.append(Violation(f"{field}[{i}].weight", shown(weight), "required: an integer from 1 to 100"))
            continue
        yield weight, entry, f"{field}[{i}]"


def selector_term(raw: Any, where: str, v: list[Violation]) -> NodeSelectorTerm:
    """One node selector term (``matchExpressions`` on labels, ``matchFields`` on
    ``metadata.name``) at ``where``; what breaks a rule is left out, with its violation."""
    t = as_map(raw)
    parts = []
    for section, fields in (("matchExpressions", False), ("matchFields", True)):
        got = as_list(t.get(section), f"{where}.{section}", v)
        if len(got) > K.MAX_REQUIREMENTS:
            v.append(Violation(f"{where}.{section}", f"{len(got)} requirements",
                               f"Phalanx reads at most {K.MAX_REQUIREMENTS} requirements per term"))
            got = []
        parts.append(tuple(x for j, r in enumerate(got)
                           if (x := _requirement(r, f"{where}.{section}[{j}]", fields, v)) is not None))
    return NodeSelectorTerm(match_expressions=parts[0], match_fields=parts[1])


def node_name(raw: Any, v: list[Violation]) -> str:
    if raw is None or raw == "":
        return ""
    if not names.dns_subdomain(raw):
        v.append(Violation("spec.nodeName", shown(raw), f"a node name {names.SUBDOMAIN_RULE}"))
        return ""
    return raw


def pod_labels(raw: Any, v: list[Violation], field: str = "metadata.labels", *, each: bool = True
               ) -> dict[str, str]:
    """A pod's labels for pod (anti-)affinity, at most ``MAX_POD_LABELS``; with ``each``, keys
    and values by the API server's rules (without: the caller checked them, ``names.check_metadata``,
    and labels that break them are left out here)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        v.append(Violation(field, shown(raw), "labels map keys to string values"))
        return {}
    if len(raw) > K.MAX_POD_LABELS:
        v.append(Violation(field, f"{len(raw)} labels", f"Phalanx reads at most {K.MAX_POD_LABELS} labels per pod "
                                                        "(pod affinity matches pods by them)"))
        return {}
    if not each:
        return dict(sorted((k, x) for k, x in raw.items() if names.qualified_name(k) and names.label_value(x)))
    before = len(v)
    for k, x in raw.items():
        if not names.qualified_name(k):
            v.append(Violation(f"{field}[{shown(k)}]", shown(k), f"a label key {names.QUALIFIED_RULE}"))
        elif not isinstance(x, str) or not names.label_value(x):
            v.append(Violation(f"{field}[{shown(k)}]", shown(x), names.VALUE_RULE))
    return {} if len(v) > before else dict(sorted(raw.items()))


def pod_terms(spec: Mapping[str, Any], labels: Mapping[str, str], kind: str, v: list[Violation], *,
              namespace_selectors: bool = False) -> tuple[tuple[PodAffinityTerm, ...], bool]:
    """The required terms of ``kind`` (``podAffinity`` or ``podAntiAffinity``) and whether one
    selects namespaces by their labels (not evaluated: the caller refuses the pod, or, with
    ``namespace_selectors`` (another pod's terms, read by a node agent), reads such a term as
    every namespace, which keeps more pods apart, never fewer)."""
    field = f"{_AFFINITY}.{kind}.{REQUIRED}"
    items = as_list(as_map(as_map(spec.get("affinity")).get(kind)).get(REQUIRED), field, v)
    if len(items) > K.MAX_TERMS:
        v.append(Violation(field, f"{len(items)} terms", f"Phalanx reads at most {K.MAX_TERMS} terms"))
        return (), False
    out, by_labels = [], False
    for i, raw in enumerate(items):
        got = _pod_term(as_map(raw), labels, f"{field}[{i}]", v, namespace_selectors)
        if got is None:
            continue
        term, selects = got
        by_labels = by_labels or selects
        out.append(term)
    return tuple(out), by_labels


def preferred_terms(spec: Mapping[str, Any], labels: Mapping[str, str], kind: str,
                    v: list[Violation]) -> tuple[WeightedPodAffinityTerm, ...]:
    """The preferred terms of ``kind`` (``podAffinity`` or ``podAntiAffinity``), each with its
    weight (1–100); a ``namespaceSelector`` by labels is kept to be resolved, as for the required
    terms (``resolve_namespaces``)."""
    out = []
    for weight, raw, where in _weighted(spec, kind, f"{_AFFINITY}.{kind}.{PREFERRED}", v):
        got = _pod_term(as_map(raw.get("podAffinityTerm")), labels, f"{where}.podAffinityTerm", v, False)
        if got is not None:
            out.append(WeightedPodAffinityTerm(weight=weight, term=got[0]))
    return tuple(out)


def _pod_term(t: Mapping[str, Any], labels: Mapping[str, str], where: str, v: list[Violation],
              namespace_selectors: bool) -> tuple[PodAffinityTerm, bool] | None:
    before = len(v)
    key = t.get("topologyKey")
    if not isinstance(key, str) or not names.qualified_name(key):
        v.append(Violation(f"{where}.topologyKey", shown(key), f"required: a node label key {names.QUALIFIED_RULE}"))
    reqs: list[LabelSelectorRequirement] = []
    raw_sel = t.get("labelSelector")
    if raw_sel is not None:
        reqs = _selector(raw_sel, f"{where}.labelSelector", v)
        for section, op in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn")):
            keys = as_list(t.get(section), f"{where}.{section}", v)
            if len(keys) > K.MAX_REQUIREMENTS or not all(isinstance(k, str) for k in keys):
                v.append(Violation(f"{where}.{section}", shown(keys) if len(keys) <= 8 else f"{len(keys)} keys",
                                   f"at most {K.MAX_REQUIREMENTS} label keys (strings)"))
                continue
            reqs.extend(LabelSelectorRequirement(key=k, operator=op, values=(labels[k],))  # type: ignore[arg-type]
                        for k in keys if k in labels)
        if len(reqs) > 2 * K.MAX_REQUIREMENTS:
            v.append(Violation(f"{where}.labelSelector", f"{len(reqs)} requirements",
                               f"Phalanx reads at most {2 * K.MAX_REQUIREMENTS} requirements per selector"))
    nss = as_list(t.get("namespaces"), f"{where}.namespaces", v)
    if len(nss) > K.MAX_TERM_NAMESPACES:
        v.append(Violation(f"{where}.namespaces", f"{len(nss)} namespaces",
                           f"Phalanx reads at most {K.MAX_TERM_NAMESPACES} namespaces per term"))
        nss = []
    for j, ns in enumerate(nss):
        if not names.dns_label(ns):
            v.append(Violation(f"{where}.namespaces[{j}]", shown(ns), f"a namespace name {names.LABEL_RULE}"))
    raw_ns_sel = t.get("namespaceSelector")
    if raw_ns_sel is not None and not isinstance(raw_ns_sel, Mapping):
        v.append(Violation(f"{where}.namespaceSelector", shown(raw_ns_sel), "a label selector (a mapping)"))
    ns_sel = as_map(raw_ns_sel)
    every = raw_ns_sel is not None and not ns_sel.get("matchLabels") and not ns_sel.get("matchExpressions")
    by_labels = raw_ns_sel is not None and not every
    to_resolve = by_labels and not namespace_selectors
    ns_reqs = _selector(ns_sel, f"{where}.namespaceSelector", v) if to_resolve else []
    if len(v) > before:
        return None
    term = PodAffinityTerm(topology_key=key, selector=tuple(reqs), match_none=raw_sel is None,  # type: ignore[arg-type]
                           namespaces=tuple(sorted(set(nss))), all_namespaces=every or (by_labels and namespace_selectors),
                           namespace_selector=tuple(ns_reqs))
    return term, to_resolve


def _selector(raw: Any, where: str, v: list[Violation]) -> list[LabelSelectorRequirement]:
    """``metav1.LabelSelector``: ``matchLabels`` as ``In`` requirements, then ``matchExpressions``."""
    if not isinstance(raw, Mapping):
        v.append(Violation(where, shown(raw), "a label selector (a mapping)"))
        return []
    out: list[LabelSelectorRequirement] = []
    ml = raw.get("matchLabels")
    if ml is not None and not isinstance(ml, Mapping):
        v.append(Violation(f"{where}.matchLabels", shown(ml), "matchLabels maps label keys to values"))
    ml = as_map(ml)
    if len(ml) > K.MAX_REQUIREMENTS:
        v.append(Violation(f"{where}.matchLabels", f"{len(ml)} labels",
                           f"Phalanx reads at most {K.MAX_REQUIREMENTS} labels per selector"))
        return []
    for k, x in ml.items():
        if not names.qualified_name(k):
            v.append(Violation(f"{where}.matchLabels[{shown(k)}]", shown(k), f"a label key {names.QUALIFIED_RULE}"))
        elif not isinstance(x, str) or not names.label_value(x):
            v.append(Violation(f"{where}.matchLabels[{shown(k)}]", shown(x), names.VALUE_RULE))
        else:
            out.append(LabelSelectorRequirement(key=k, operator="In", values=(x,)))
    exprs = as_list(raw.get("matchExpressions"), f"{where}.matchExpressions", v)
    if len(exprs) > K.MAX_REQUIREMENTS:
        v.append(Violation(f"{where}.matchExpressions", f"{len(exprs)} requirements",
                           f"Phalanx reads at most {K.MAX_REQUIREMENTS} requirements per selector"))
        return out
    for j, r in enumerate(exprs):
        field = f"{where}.matchExpressions[{j}]"
        r = as_map(r)
        key, op, values = r.get("key"), r.get("operator"), r.get("values") or []
        if not names.qualified_name(key):
            v.append(Violation(f"{field}.key", shown(key), f"a label key {names.QUALIFIED_RULE}"))
        elif op not in SELECTOR_OPERATORS:
            v.append(Violation(f"{field}.operator", shown(op), f"the operator is one of {', '.join(SELECTOR_OPERATORS)}"))
        elif not isinstance(values, list) or len(values) > K.MAX_VALUES \
                or not all(isinstance(x, str) and names.label_value(x) for x in values):
            v.append(Violation(f"{field}.values", shown(values) if not isinstance(values, list) else "a list",
                               f"values is a list of at most {K.MAX_VALUES} label values"))
        elif (rule := _requirement_rule(op, values)):
            v.append(Violation(f"{field}.values", shown(", ".join(values[:8]) or "[]"), rule))
        else:
            out.append(LabelSelectorRequirement(key=key, operator=op, values=tuple(values)))
    return out


def selects_namespaces(spec: MemberSpec) -> bool:
    """Has any pod (anti-)affinity term of ``spec`` a ``namespaceSelector`` still to resolve?"""
    terms = (*spec.pod_affinity, *spec.pod_anti_affinity,
             *(w.term for w in (*spec.preferred_affinity, *spec.preferred_anti_affinity)))
    return any(t.namespace_selector for t in terms)


def resolve_namespaces(spec: MemberSpec, namespaces: Mapping[str, Mapping[str, str]]) -> MemberSpec | Violation:
    """``spec`` with every pod (anti-)affinity term's ``namespaceSelector`` by labels replaced
    by the namespaces it selects among ``namespaces`` (name → labels: every namespace the
    caller knows), added to the term's own ``namespaces``, as kube-scheduler matches a term
    (its namespaces, or a namespace its selector selects). A term that then names no namespace
    selects no pod. ``unsupported`` is cleared. More namespaces than a term carries is a
    violation naming the term."""
    def one(t: PodAffinityTerm, where: str) -> PodAffinityTerm | Violation:
        if not t.namespace_selector:
            return t
        chosen = sorted({*t.namespaces, *(ns for ns, labels in namespaces.items()
                                          if selector_matches(t.namespace_selector, labels))})
        if len(chosen) > K.MAX_TERM_NAMESPACES:
            return Violation(f"{where}.namespaceSelector", f"{len(chosen)} namespaces",
                             f"Phalanx resolves a term to at most {K.MAX_TERM_NAMESPACES} namespaces")
        return msgspec.structs.replace(t, namespaces=tuple(chosen), namespace_selector=(), match_none=t.match_none or not chosen)

    out: dict[str, Any] = {}
    for attr, kind, section in (("pod_affinity", "podAffinity", REQUIRED), ("pod_anti_affinity", "podAntiAffinity", REQUIRED)):
        terms = []
        for i, t in enumerate(getattr(spec, attr)):
            got = one(t, f"{_AFFINITY}.{kind}.{section}[{i}]")
            if isinstance(got, Violation):
                return got
            terms.append(got)
        out[attr] = tuple(terms)
    for attr, kind in (("preferred_affinity", "podAffinity"), ("preferred_anti_affinity", "podAntiAffinity")):
        weighted = []
        for i, w in enumerate(getattr(spec, attr)):
            got = one(w.term, f"{_AFFINITY}.{kind}.{PREFERRED}[{i}].podAffinityTerm")
            if isinstance(got, Violation):
                return got
            weighted.append(msgspec.structs.replace(w, term=got))
        out[attr] = tuple(weighted)
    return msgspec.structs.replace(spec, unsupported=(), **out)


def unsupported(selects_namespaces: tuple[str, ...]) -> tuple[str, ...]:
    """The required term kinds placement may not evaluate until gang-coordinator resolves their
    ``namespaceSelector`` (``resolve_namespaces``): a pod decided without that (``phalanx
    place`` on a file) fits no node, with that reason."""
    return tuple(k for k in ("podAffinity", "podAntiAffinity") if k in selects_namespaces)


def spread(spec: Mapping[str, Any], labels: Mapping[str, str],
           v: list[Violation]) -> tuple[tuple[SpreadConstraint, ...], tuple[SpreadConstraint, ...]]:
    """The pod's ``topologySpreadConstraints`` as kube-scheduler's PodTopologySpread reads them
    (``matchLabelKeys`` whose key the pod carries merged into the selector as ``In``; defaults:
    minDomains 1, nodeAffinityPolicy Honor, nodeTaintsPolicy Ignore): (the ``DoNotSchedule``
    ones, its filter; the ``ScheduleAnyway`` ones, its score)."""
    items = as_list(spec.get("topologySpreadConstraints"), _SPREAD, v)
    if len(items) > K.MAX_TERMS:
        v.append(Violation(_SPREAD, f"{len(items)} constraints", f"Phalanx reads at most {K.MAX_TERMS}"))
        return (), ()
    hard: list[SpreadConstraint] = []
    soft: list[SpreadConstraint] = []
    for i, raw in enumerate(items):
        got = _spread_constraint(as_map(raw), labels, f"{_SPREAD}[{i}]", v)
        if got is not None:
            (hard if got[1] else soft).append(got[0])
    return tuple(hard), tuple(soft)


def _spread_constraint(c: Mapping[str, Any], labels: Mapping[str, str], where: str,
                       v: list[Violation]) -> tuple[SpreadConstraint, bool] | None:
    """One constraint and whether it is DoNotSchedule; None when it breaks a rule (appended to
    ``v``)."""
    before = len(v)
    when = c.get("whenUnsatisfiable")
    if when not in ("DoNotSchedule", "ScheduleAnyway"):
        v.append(Violation(f"{where}.whenUnsatisfiable", shown(when), "required: DoNotSchedule or ScheduleAnyway"))
    key = c.get("topologyKey")
    if not isinstance(key, str) or not names.qualified_name(key):
        v.append(Violation(f"{where}.topologyKey", shown(key), f"required: a node label key {names.QUALIFIED_RULE}"))
    skew = c.get("maxSkew")
    if isinstance(skew, bool) or not isinstance(skew, int) or not 1 <= skew <= _INT32:
        v.append(Violation(f"{where}.maxSkew", shown(skew), "required: an integer of at least 1"))
    least = c.get("minDomains")
    if least is not None:
        if isinstance(least, bool) or not isinstance(least, int) or not 1 <= least <= _INT32:
            v.append(Violation(f"{where}.minDomains", shown(least), "an integer of at least 1"))
        elif when == "ScheduleAnyway":
            v.append(Violation(f"{where}.minDomains", shown(least), "minDomains only with whenUnsatisfiable DoNotSchedule"))
    policies = {}
    for name in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
        got = c.get(name)
        if got is not None and got not in _POLICIES:
            v.append(Violation(f"{where}.{name}", shown(got), "Honor or Ignore"))
        policies[name] = got
    reqs: list[LabelSelectorRequirement] = []
    raw_sel = c.get("labelSelector")
    if raw_sel is not None:
        reqs = _selector(raw_sel, f"{where}.labelSelector", v)
        keys = as_list(c.get("matchLabelKeys"), f"{where}.matchLabelKeys", v)
        bad = next((j for j, k in enumerate(keys) if not (isinstance(k, str) and names.qualified_name(k))), None)
        if len(keys) > K.MAX_REQUIREMENTS:
            v.append(Violation(f"{where}.matchLabelKeys", f"{len(keys)} keys", f"at most {K.MAX_REQUIREMENTS} label keys"))
        elif bad is not None:
            v.append(Violation(f"{where}.matchLabelKeys[{bad}]", shown(keys[bad]), f"a label key {names.QUALIFIED_RULE}"))
        else:
            reqs.extend(LabelSelectorRequirement(key=k, operator="In", values=(labels[k],))  # type: ignore[arg-type]
                        for k in keys if k in labels)
    if len(v) > before:
        return None
    return SpreadConstraint(topology_key=key, max_skew=skew, selector=tuple(reqs), match_none=raw_sel is None,
                            min_domains=least or 1, honor_node_affinity=policies["nodeAffinityPolicy"] != "Ignore",
                            honor_taints=policies["nodeTaintsPolicy"] == "Honor"), when == "DoNotSchedule"
