"""Reading the fields of a Kubernetes object given as plain dicts (YAML or the API's JSON),
shared by every reader of this package: a value of the wrong shape reads as empty, never
raises; where the field must be a list or a string, a ``Violation`` says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phalanx_kubeobjects.names import SUBDOMAIN_MAX
from phalanx_kubeobjects.quantity import Violation, shown


def as_map(x: Any) -> Mapping[str, Any]:
    """``x`` when it is a mapping, else empty."""
    return x if isinstance(x, Mapping) else {}


def as_list(x: Any, field: str = "", v: list[Violation] | None = None) -> list:
    """``x`` when it is a list; otherwise empty, and (with ``v``) a violation unless absent."""
    if isinstance(x, list):
        return x
    if v is not None and x is not None:
        v.append(Violation(field, shown(x), "must be a list"))
    return []


def as_str(m: Mapping[str, Any], key: str, field: str, v: list[Violation]) -> str | None:
    """``m[key]`` as text ('' when absent); None, with a violation, when it is not a string."""
    x = m.get(key)
    if x is None or isinstance(x, str):
        return x or ""
    v.append(Violation(f"{field}.{key}", shown(x), "must be a string"))
    return None


def name_of(item: Any, i: int) -> str:
    """How a violation names the ``i``-th container (or port, …): its name, else its index."""
    name = as_map(item).get("name")
    return shown(name) if isinstance(name, str) and name else str(i)


def name_text(raw: Any) -> str:
    """A name as written ('' when it is not a string, cut when it is too long to be a name; a
    violation says so)."""
    if not isinstance(raw, str):
        return ""
    return raw if len(raw) <= SUBDOMAIN_MAX else shown(raw)


def shown_value(raw: Any) -> str:
    """A value for a violation: scalars as ``quantity.shown`` shows them, a list by its first
    items (never recursing into nested values)."""
    if raw is None:
        return "None"
    if isinstance(raw, list):
        return "[" + ", ".join(shown(x) for x in raw[:8]) + (", ..." if len(raw) > 8 else "") + "]"
    return shown(raw)
