"""The field rules of the ``resource.k8s.io/v1`` objects, shared by the readers of
``phalanx_kubeobjects.dra``: each helper reads one field of an API object given as plain dicts
and returns the proto value, or raises ``Bad`` with the ``Violation`` (field path, value as
written, rule). ``Bad`` never leaves ``dra``: its readers catch it and return the violation.

Bounds are the API server's (``resource/v1`` validation, the proto's ``Meta`` bounds), so a value
the API server took always reads, and one it would refuse is named here with the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, NoReturn, TypeVar, cast

import msgspec

from phalanx_kubeobjects import names, nodeterms, quantity
from phalanx_kubeobjects.violations import Violation, shown, shown_value
from phalanx_proto import dra as D
from phalanx_proto.scheduling import NodeSelectorTerm

T = TypeVar("T")

C_IDENTIFIER_MAX = 32
DOMAIN_MAX = 63
DRIVER_MAX = 63
POOL_MAX = 252
ATTR_TEXT_MAX = 64
TOLERATIONS_MAX = 16
CAPACITY_POLICY_VALUES_MAX = 10

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEMVER = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?"
    r"(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?")

QUALIFIED_RULE = (f"an attribute or capacity name is a C identifier of at most {C_IDENTIFIER_MAX} characters, "
                  f"optionally after a DNS subdomain of at most {DOMAIN_MAX} characters and '/'")
FULLY_QUALIFIED_RULE = (f"a fully qualified attribute name: a DNS subdomain of at most {DOMAIN_MAX} characters, "
                        f"'/', and a C identifier of at most {C_IDENTIFIER_MAX} characters")
EFFECTS = ("NoSchedule", "NoExecute", "None")


class Bad(Exception):  # noqa: N818 - internal signal carrying a Violation, never raised out of dra
    def __init__(self, violation: Violation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def bad(field: str, raw: Any, rule: str) -> NoReturn:
    raise Bad(Violation(field, shown_value(raw) if isinstance(raw, list) else shown(raw), rule))


# --- shapes ----------------------------------------------------------------------------------------
def mapping(raw: Any, field: str, *, required: bool = False) -> Mapping[str, Any]:
    if raw is None and not required:
        return {}
    if not isinstance(raw, Mapping):
        bad(field, raw, "must be an object" if raw is not None else "required")
    return raw


def items(raw: Any, field: str, most: int, what: str, *, least: int = 0) -> list[Any]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        bad(field, raw, "must be a list")
    if len(raw) > most:
        bad(field, f"{len(raw)} {what}", f"at most {most} {what}")
    if len(raw) < least:
        bad(field, raw, f"at least {least} {what}")
    return raw


def text(m: Mapping[str, Any], key: str, field: str, *, required: bool = False, most: int = 253) -> str:
    raw = m.get(key)
    if raw is None or raw == "":
        if required:
            bad(f"{field}.{key}", raw, "required")
        return ""
    if not isinstance(raw, str):
        bad(f"{field}.{key}", raw, "must be a string")
    if len(raw) > most:
        bad(f"{field}.{key}", raw, f"at most {most} characters")
    return raw


def flag(m: Mapping[str, Any], key: str, field: str) -> bool:
    raw = m.get(key)
    if raw is None:
        return False
    if not isinstance(raw, bool):
        bad(f"{field}.{key}", raw, "must be true or false")
    return raw


def integer(m: Mapping[str, Any], key: str, field: str, *, least: int, most: int, default: int) -> int:
    raw = m.get(key)
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int):
        bad(f"{field}.{key}", raw, "must be an integer")
    if not least <= raw <= most:
        bad(f"{field}.{key}", raw, f"must be from {least} to {most}")
    return raw


def listed(raw: Any, field: str, most: int, what: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
    return tuple(read(x, f"{field}[{i}]") for i, x in enumerate(items(raw, field, most, what)))


# --- names -----------------------------------------------------------------------------------------
def subdomain(m: Mapping[str, Any], key: str, field: str, *, most: int = 253, required: bool = True) -> str:
    name = text(m, key, field, required=required, most=most)
    if name and not names.dns_subdomain(name):
        bad(f"{field}.{key}", name, names.SUBDOMAIN_RULE)
    return name


def label(m: Mapping[str, Any], key: str, field: str, *, required: bool = True) -> str:
    name = text(m, key, field, required=required, most=names.LABEL_MAX)
    if name and not names.dns_label(name):
        bad(f"{field}.{key}", name, names.LABEL_RULE)
    return name


def driver(m: Mapping[str, Any], key: str, field: str) -> str:
    return subdomain(m, key, field, most=DRIVER_MAX)


def pool_name(m: Mapping[str, Any], key: str, field: str) -> str:
    name = text(m, key, field, required=True, most=POOL_MAX)
    if not all(names.dns_subdomain(part) for part in name.split("/")):
        bad(f"{field}.{key}", name, "a pool name is one or more DNS subdomains separated by '/'")
    return name


def qualified(raw: Any, field: str) -> str:
    """An attribute or capacity name: ``<domain>/<id>`` or a bare ``<id>`` (the driver's domain)."""
    if not isinstance(raw, str) or len(raw) > DOMAIN_MAX + 1 + C_IDENTIFIER_MAX:
        bad(field, raw, QUALIFIED_RULE)
    domain, sep, ident = raw.rpartition("/")
    if (sep and not (len(domain) <= DOMAIN_MAX and names.dns_subdomain(domain))) or not (
            len(ident) <= C_IDENTIFIER_MAX and _C_IDENTIFIER.fullmatch(ident)):
        bad(field, raw, QUALIFIED_RULE)
    return raw


def fully_qualified(m: Mapping[str, Any], key: str, field: str) -> str:
    name = text(m, key, field, most=DOMAIN_MAX + 1 + C_IDENTIFIER_MAX)
    if name and "/" not in name:
        bad(f"{field}.{key}", name, FULLY_QUALIFIED_RULE)
    return qualified(name, f"{field}.{key}") if name else ""


def condition_types(m: Mapping[str, Any], key: str, field: str) -> tuple[str, ...]:
    got = items(m.get(key), f"{field}.{key}", 4, "conditions")
    for i, x in enumerate(got):
        if not names.qualified_name(x):
            bad(f"{field}.{key}[{i}]", x, f"a condition type {names.QUALIFIED_RULE}")
    return tuple(got)


# --- values ----------------------------------------------------------------------------------------
def quantity_text(raw: Any, field: str) -> str:
    q = quantity.parse(raw, field)
    if isinstance(q, Violation):
        raise Bad(q)
    if q.nanos < 0:
        bad(field, raw, "must not be negative")
    return q.text


def quantities(raw: Any, field: str, most: int) -> dict[str, str]:
    m = mapping(raw, field)
    if len(m) > most:
        bad(field, f"{len(m)} entries", f"at most {most} entries")
    return {qualified(k, f"{field}[{shown(k)}]"): quantity_text(v, f"{field}[{shown(k)}]") for k, v in m.items()}


def counter_values(raw: Any, field: str) -> dict[str, str]:
    """``counters``: ``{<name>: {value: <quantity>}}``."""
    m = mapping(raw, field)
    if len(m) > D.MAX_COUNTERS:
        bad(field, f"{len(m)} counters", f"at most {D.MAX_COUNTERS} counters")
    out = {}
    for k, v in m.items():
        where = f"{field}[{shown(k)}]"
        if not names.dns_label(k):
            bad(where, k, f"a counter name {names.LABEL_RULE}")
        out[k] = quantity_text(mapping(v, where, required=True).get("value"), f"{where}.value")
    return out


def attribute(raw: Any, field: str) -> D.AttrValue:
    m = mapping(raw, field, required=True)
    kinds = [k for k in ("int", "bool", "string", "version") if m.get(k) is not None]
    if len(kinds) != 1:
        bad(field, ", ".join(kinds) or "none", "exactly one of int, bool, string, version")
    kind, value = kinds[0], m[kinds[0]]
    where = f"{field}.{kind}"
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
            bad(where, value, "a 64-bit integer")
        return D.AttrValue(int_=value)
    if kind == "bool":
        if not isinstance(value, bool):
            bad(where, value, "true or false")
        return D.AttrValue(bool_=value)
    if not isinstance(value, str) or len(value) > ATTR_TEXT_MAX:
        bad(where, value, f"a string of at most {ATTR_TEXT_MAX} characters")
    if kind == "version":
        if not _SEMVER.fullmatch(value):
            bad(where, value, "a semantic version (semver 2.0: MAJOR.MINOR.PATCH[-pre][+build], no leading 'v')")
        return D.AttrValue(version=value)
    return D.AttrValue(string=value)


def capacity(raw: Any, field: str) -> D.Capacity:
    m = mapping(raw, field, required=True)
    value = quantity_text(m.get("value"), f"{field}.value")
    policy = mapping(m.get("requestPolicy"), f"{field}.requestPolicy")
    if not policy:
        return D.Capacity(value=value)
    where = f"{field}.requestPolicy"
    default = quantity_text(policy["default"], f"{where}.default") if policy.get("default") is not None else ""
    valid = tuple(quantity_text(x, f"{where}.validValues[{i}]") for i, x in enumerate(
        items(policy.get("validValues"), f"{where}.validValues", CAPACITY_POLICY_VALUES_MAX, "values")))
    vrange = mapping(policy.get("validRange"), f"{where}.validRange")
    if valid and vrange:
        bad(where, "validValues and validRange", "at most one of validValues and validRange")
    rng = None
    if vrange:
        r = f"{where}.validRange"
        rng = D.CapacityRange(min=quantity_text(vrange.get("min"), f"{r}.min"),
                              max=quantity_text(vrange["max"], f"{r}.max") if vrange.get("max") is not None else "",
                              step=quantity_text(vrange["step"], f"{r}.step") if vrange.get("step") is not None else "")
    return D.Capacity(value=value, request_policy=D.CapacityPolicy(default=default, valid_values=valid, valid_range=rng))


def cel_selectors(raw: Any, field: str) -> tuple[str, ...]:
    def one(x: Any, where: str) -> str:
        cel = mapping(mapping(x, where, required=True).get("cel"), f"{where}.cel", required=True)
        return text(cel, "expression", f"{where}.cel", required=True, most=D.MAX_CEL_TEXT)
    return listed(raw, field, D.MAX_SELECTORS, "selectors", one)


def opaque(raw: Any, field: str) -> D.OpaqueConfig:
    m = mapping(raw, field, required=True)
    params = m.get("parameters")
    if not isinstance(params, Mapping):
        bad(f"{field}.parameters", params, "a JSON object (the driver's parameters)" if params is not None else "required")
    if len(msgspec.json.encode(params)) > D.MAX_OPAQUE_BYTES:
        bad(f"{field}.parameters", "a large object", f"at most {D.MAX_OPAQUE_BYTES} bytes of JSON")
    return D.OpaqueConfig(driver=driver(m, "driver", field), parameters=params)


def request_names(raw: Any, field: str) -> tuple[str, ...]:
    got = items(raw, field, D.MAX_REQUESTS, "request names")
    for i, x in enumerate(got):
        if not isinstance(x, str) or not all(names.dns_label(p) for p in x.split("/", 1)):
            bad(f"{field}[{i}]", x, "a request name, or <request>/<subrequest> (DNS labels)")
    return tuple(got)


def toleration(raw: Any, field: str) -> D.DeviceToleration:
    m = mapping(raw, field, required=True)
    key = text(m, "key", field, most=317)
    op = text(m, "operator", field, most=16) or "Equal"
    value = text(m, "value", field, most=names.LABEL_MAX)
    effect = text(m, "effect", field, most=16)
    seconds = m.get("tolerationSeconds")
    if key and not names.qualified_name(key):
        bad(f"{field}.key", key, f"a taint key {names.QUALIFIED_RULE}")
    if op not in ("Equal", "Exists"):
        bad(f"{field}.operator", op, "Equal or Exists")
    if not key and op != "Exists":
        bad(f"{field}.operator", op, "a toleration without a key must use operator Exists")
    if op == "Exists" and value:
        bad(f"{field}.value", value, "a toleration with operator Exists takes no value")
    if not names.label_value(value):
        bad(f"{field}.value", value, names.VALUE_RULE)
    if effect not in ("", *EFFECTS):
        bad(f"{field}.effect", effect, "NoSchedule, NoExecute, None or empty for all")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int) or abs(seconds) >= 2**63):
        bad(f"{field}.tolerationSeconds", seconds, "an integer number of seconds")
    return D.DeviceToleration(key=key, operator=cast(Literal["Equal", "Exists"], op), value=value,
                              effect=cast(Literal["", "NoSchedule", "NoExecute", "None"], effect),
                              toleration_seconds=seconds)


def taint(raw: Any, field: str) -> D.DeviceTaint:
    m = mapping(raw, field, required=True)
    key = text(m, "key", field, required=True, most=317)
    value = text(m, "value", field, most=names.LABEL_MAX)
    effect = text(m, "effect", field, required=True, most=16)
    if not names.qualified_name(key):
        bad(f"{field}.key", key, f"a taint key {names.QUALIFIED_RULE}")
    if not names.label_value(value):
        bad(f"{field}.value", value, names.VALUE_RULE)
    if effect not in EFFECTS:
        bad(f"{field}.effect", effect, "NoSchedule, NoExecute or None")
    return D.DeviceTaint(key=key, value=value, effect=cast(D.Effect, effect))


def node_selector(raw: Any, field: str) -> tuple[NodeSelectorTerm, ...]:
    """A v1 NodeSelector of exactly one term (what slices and allocations carry)."""
    where = f"{field}.nodeSelectorTerms"
    terms = items(mapping(raw, field, required=True).get("nodeSelectorTerms"), where, 64, "terms")
    if len(terms) != 1:
        bad(where, f"{len(terms)} terms", "exactly one node selector term")
    v: list[Violation] = []
    term = nodeterms.selector_term(terms[0], f"{field}.nodeSelectorTerms[0]", v)
    if v:
        raise Bad(v[0])
    return (term,)


def node_selection(m: Mapping[str, Any], field: str, *, per_device_allowed: bool) -> tuple[D.NodeSelection, bool]:
    """``nodeName`` | ``nodeSelector`` | ``allNodes`` | (a slice) ``perDeviceNodeSelection``: exactly
    one. The second value is ``perDeviceNodeSelection``."""
    keys = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
            if m.get(k) not in (None, "", False)]
    allowed = ("nodeName", "nodeSelector", "allNodes") + (("perDeviceNodeSelection",) if per_device_allowed else ())
    if len(keys) != 1 or keys[0] not in allowed:
        bad(field, ", ".join(keys) or "none", f"exactly one of {', '.join(allowed)}")
    if keys[0] == "perDeviceNodeSelection":
        return D.NodeSelection(), flag(m, "perDeviceNodeSelection", field)
    if keys[0] == "nodeName":
        return D.NodeSelection(node_name=subdomain(m, "nodeName", field)), False
    if keys[0] == "nodeSelector":
        return D.NodeSelection(node_selector=node_selector(m["nodeSelector"], f"{field}.nodeSelector")[0]), False
    return D.NodeSelection(all_nodes=flag(m, "allNodes", field)), False


def check(value: T, what: str) -> T:
    """``value`` as the wire decodes it: a bound the readers missed is a violation, never a value
    that does not decode."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value), type=type(value))
    except (msgspec.ValidationError, msgspec.EncodeError) as e:
        raise Bad(Violation(what, "the object", f"beyond Phalanx's bounds: {e}")) from None
