"""A claim's device constraints (``matchAttribute``, ``distinctAttribute``) while the allocator
tries devices: each constraint remembers the values of the devices added so far and refuses a
device that would break it. Called by ``phalanx_engine.dra.allocate``; the undo is exact, so the
search can back out of any choice.

Upstream's rules (incubating allocator, ``constraint.go``):

* a constraint covers the requests it names (``req`` or ``req/sub``; naming ``req`` covers every
  subrequest of it), or every request of the claim when it names none;
* a covered device must have the attribute. Its name is fully qualified: the device's attribute
  of exactly that name, or else, when the name's domain is the device's driver, its attribute of
  the bare id (``gpu.nvidia.com/productName`` finds a ``gpu.nvidia.com`` device's
  ``productName``, never another driver's);
* ``matchAttribute``: every covered device has the same value as the first, of the same type
  (versions compared as written); ``distinctAttribute``: every value differs from every other
  covered device's. Upstream remembers only the latest value per request, so three devices of one
  request may repeat a value there; Phalanx keeps them all distinct, which upstream accepts too.
"""

from __future__ import annotations

from phalanx_engine.dra.pools import Candidate
from phalanx_proto.dra import DeviceConstraint

Value = tuple[str, object]
"""(kind, value): kind is ``int``, ``bool``, ``string`` or ``version``."""


def lookup(device: Candidate, attribute: str) -> Value | None:
    """The device's value of a fully qualified attribute, or None."""
    attrs = device.device.attributes
    found = attrs.get(attribute)
    if found is None:
        domain, sep, ident = attribute.partition("/")
        if sep and domain == device.key[0]:
            found = attrs.get(ident)
    if found is None:
        return None
    for kind, v in (("int", found.int_), ("bool", found.bool_), ("string", found.string), ("version", found.version)):
        if v is not None:
            return (kind, v)
    return None


class Constraint:
    """One constraint of a claim and the values of the devices it has accepted (a stack)."""

    __slots__ = ("requests", "attribute", "distinct", "values")

    def __init__(self, spec: DeviceConstraint) -> None:
        self.requests = frozenset(spec.requests)
        self.distinct = not spec.match_attribute
        self.attribute = spec.match_attribute or spec.distinct_attribute
        self.values: list[Value] = []

    def covers(self, request: str, full_name: str) -> bool:
        return not self.requests or request in self.requests or full_name in self.requests

    def admits(self, value: Value | None) -> bool:
        if value is None:
            return False
        if not self.values:
            return True
        if self.distinct:
            return value not in self.values
        return value == self.values[0]


def add(constraints: list[Constraint], device: Candidate, request: str, full_name: str) -> list[Constraint] | None:
    """Add ``device`` (for ``request``, ``full_name`` being ``req`` or ``req/sub``) to every
    constraint covering it; the constraints it was added to (for ``remove``), or None when one
    refuses it (then none holds it)."""
    added: list[Constraint] = []
    for c in constraints:
        if not c.covers(request, full_name):
            continue
        value = lookup(device, c.attribute)
        if not c.admits(value):
            remove(added)
            return None
        c.values.append(value)  # type: ignore[arg-type]  # admits() refused None
        added.append(c)
    return added


def remove(added: list[Constraint]) -> None:
    for c in added:
        c.values.pop()
