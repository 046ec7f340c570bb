"""The readers' error type and how they show a value and read a field: a ``Violation`` names the
field (a path in the object), the value as written and the rule it breaks, and is what every
reader of this package returns or raises for bad input; ``shown``/``shown_value`` write a value
the way a violation shows it; ``as_map``/``as_list``/``as_str``/``name_of`` read a field of a
Kubernetes object given as plain dicts (YAML or the API's JSON): a value of the wrong shape
reads as empty, never raises; where the field must be a list or a string, a violation says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

_SHOWN = 80


class Violation(msgspec.Struct, frozen=True):
    """One broken rule: the field (a path in the object), the value as written, the rule."""

    field: str
    value: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value!r}: {self.rule}"


def shown(raw: object) -> str:
    """``raw`` as a violation shows it: text as written, booleans and null in YAML spelling,
    long values cut to their first characters and their length, a list or map by its type."""
    if raw is None or isinstance(raw, bool):
        return str(raw).lower() if raw is not None else "null"
    if isinstance(raw, int) and abs(raw) >= 10**_SHOWN:
        return f"an integer of {raw.bit_length()} bits"
    if isinstance(raw, int | float | str):
        text = raw if isinstance(raw, str) else repr(raw)
    else:
        return f"a {type(raw).__name__}"
    if len(text) > _SHOWN:
        return f"{text[:_SHOWN - 20]}... ({len(text)} characters)"
    return text


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


def shown_value(raw: Any) -> str:
    """A value for a violation: scalars as ``shown`` shows them, a list by its first
    items (never recursing into nested values)."""
    if raw is None:
        return "None"
    if isinstance(raw, list):
        return "[" + ", ".join(shown(x) for x in raw[:8]) + (", ..." if len(raw) > 8 else "") + "]"
    return shown(raw)
