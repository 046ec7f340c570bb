"""Which nodes a pod may go to, read from its spec the way kube-scheduler reads it: tolerations,
``nodeSelector``, required node affinity, ``nodeName``, and the terms Phalanx refuses (required
pod affinity and anti-affinity, hard topology spread: ``unsupported``) or ignores with a warning
(their preferred forms, preferred node affinity). Part of ``podspec.parse_constraints``; every
invalid value is a ``Violation`` naming field, value and rule, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phalanx_kubeobjects import names
from phalanx_kubeobjects.violations import Violation, as_list, as_map, as_str, shown
from phalanx_proto import scheduling as K
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm, Toleration

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_AFFINITY = "spec.affinity"
_TERMS = f"{_AFFINITY}.nodeAffinity.{REQUIRED}.nodeSelectorTerms"
WHY_POD_AFFINITY = ("it needs the labels of the pods on every node, which Phalanx's cluster state does not carry; "
                    "the pod would wait with that reason")


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


def node_affinity(spec: Mapping[str, Any], v: list[Violation], warnings: list[str]
                   ) -> tuple[NodeSelectorTerm, ...] | None:
    na = as_map(as_map(spec.get("affinity")).get("nodeAffinity"))
    if na.get(PREFERRED):
        warnings.append(f"{_AFFINITY}.nodeAffinity.{PREFERRED} is ignored: Phalanx ranks nodes by GPU topology and "
                        "packing, not by preferred node affinity")
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


def unsupported(spec: Mapping[str, Any], warnings: list[str]) -> tuple[str, ...]:
    refused = []
    affinity = as_map(spec.get("affinity"))
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = as_map(affinity.get(kind))
        if terms.get(REQUIRED):
            refused.append(kind)
            warnings.append(f"{_AFFINITY}.{kind}.{REQUIRED}: Phalanx refuses required pod "
                            f"{'anti-' if kind == 'podAntiAffinity' else ''}affinity ({WHY_POD_AFFINITY})")
        if terms.get(PREFERRED):
            warnings.append(f"{_AFFINITY}.{kind}.{PREFERRED} is ignored: Phalanx does not evaluate pod "
                            "(anti-)affinity")
    spread = [as_map(c) for c in as_list(spec.get("topologySpreadConstraints"))]
    if any(c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule" for c in spread):
        refused.append("topologySpreadConstraints")
        warnings.append("spec.topologySpreadConstraints with whenUnsatisfiable DoNotSchedule: Phalanx refuses hard "
                        f"topology spread ({WHY_POD_AFFINITY})")
    elif spread:
        warnings.append("spec.topologySpreadConstraints with whenUnsatisfiable ScheduleAnyway is ignored: Phalanx "
                        "does not evaluate topology spread")
    return tuple(refused)
