"""Kubernetes resource quantities, read exactly as the API server reads them, and the exact
integers Phalanx computes from them. The one quantity parser of the project: gang-coordinator,
placement and ``phalanx validate`` call it (through ``requests``) for GPU counts, GPU shares and
CPU/memory requests; every other integer a pod carries in a label goes through ``decimal``.

The grammar is apimachinery's ``resource.ParseQuantity``::

    quantity  ::= [sign] number suffix          sign   ::= "+" | "-"
    number    ::= digits | digits "." digits | digits "." | "." digits
    suffix    ::= "" | binary | decimal | exponent
    binary    ::= Ki | Mi | Gi | Ti | Pi | Ei   (powers of 1024)
    decimal   ::= n | u | m | k | M | G | T | P | E   (powers of 1000; k is lower case)
    exponent  ::= ("e" | "E") [sign] digits      ("1e3" is 1000; a lone "E" is exa)

Digits are ASCII ``0``-``9`` only: ``'٤'`` and ``'８'`` are not numbers to the API server, so
they are not numbers here. Leading and trailing white space is ignored (the API server trims it
when it decodes JSON); a YAML/JSON number is read as the number it writes; ``true``, ``null``,
lists and maps are not quantities. Like the API server, a value is kept to the nano and a finer
non-zero value rounds away from zero (``"0.1n"`` is 1n), and the three degenerate forms the
API server's scanner takes for zero (``"+"``, ``"-"``, ``"."``) are zero here too.

Where Phalanx is stricter than the API server, the rule says so: text longer than
``MAX_TEXT`` characters and magnitudes of ``10**MAX_DIGITS`` or more are refused before any
arithmetic (the API server accepts ``1e999999999``; computing it would exhaust memory).

Every function returns a value or a ``Violation`` (field, value as written, rule); none raises
on bad input. Resource values are never negative (the API server's rule for every container
resource). The integer forms:

- ``count``: a resource that must be a whole number (extended resources such as
  ``nvidia.com/gpu``): the API server's "must be an integer" rule, then ``least``..``most``;
- ``scaled``: a resource in a unit, rounded up as the API server's ``Value``/``MilliValue``
  round: ``cpu_millis`` (millicores) and ``memory_bytes`` (bytes) are the two users;
- ``decimal``: an integer written in a label value (``replica: "4"``): ASCII digits only, no
  sign, suffix or exponent;
- ``integer``: an integer field of a Kubernetes object (``parallelism: 4``): a JSON/YAML
  integer, never a string, a float or a boolean.

Each takes a ``Bound`` for its upper limit: the largest value and the reason none larger makes
sense ("no node has more than 64 GPUs"), which is what the violation says.
"""

from __future__ import annotations

import math
import re

import msgspec

from phalanx_kubeobjects.violations import Violation, shown

MAX_TEXT = 64
"""Longest quantity text Phalanx reads (the longest real quantity is far shorter)."""
MAX_DIGITS = 30
"""Quantities of 10**MAX_DIGITS or more are refused before they are computed."""
NANO = 10**9
"""Nanos per unit: ``Quantity.nanos`` counts units of 10**-9."""

_DIGITS = frozenset("0123456789")
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
_INT64 = 2**63 - 1
_BINARY_CAP_NANOS = _INT64 * NANO  # the API server caps a binary-suffixed quantity at 2**63-1

GRAMMAR = ("a Kubernetes quantity is ASCII digits with an optional sign and decimal point and an optional "
           "suffix (Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as e3); the API server rejects "
           "anything else")


class Bound(msgspec.Struct, frozen=True):
    """An upper limit and the reason for it, e.g. ``Bound(64, "no node has more than 64 GPUs")``."""

    most: int
    rule: str


class Quantity(msgspec.Struct, frozen=True):
    """A parsed quantity: ``nanos`` is its exact value in units of 10**-9 (rounded away from zero
    below a nano, as the API server does); ``text`` is what was written."""

    nanos: int
    text: str

    def ceil(self, unit_nanos: int) -> int:
        """The value in units of ``unit_nanos`` nanos, rounded up (``NANO``: whole units)."""
        return -(-self.nanos // unit_nanos)


CPU_MOST = Bound(10**9, "no node has a million CPU cores (10^9 millicores)")
MEMORY_MOST = Bound(2**50, "no node has a PiB of memory (2^50 bytes)")





def parse(raw: object, field: str) -> Quantity | Violation:
    """``raw`` (a string, or a YAML/JSON number) as a quantity, or why it is not one."""
    text = _text(raw)
    if isinstance(text, Violation):
        return Violation(field, shown(raw), text.rule)
    if not text:
        return Violation(field, shown(raw), "a quantity cannot be empty")
    if len(text) > MAX_TEXT:
        return Violation(field, shown(raw), f"a quantity Phalanx reads has at most {MAX_TEXT} characters")
    scanned = _scan(text)
    if scanned is None:
        return Violation(field, shown(raw), GRAMMAR)
    positive, num, denom, suffix = scanned
    scale = _suffix(suffix)
    if scale is None:
        return Violation(field, shown(raw), f"{suffix!r} is not a quantity suffix: {GRAMMAR}")
    base, exponent = scale
    nanos = _nanos(int(num + denom), len(denom), base, exponent)
    if nanos is None:
        return Violation(field, shown(raw), f"quantities of 10^{MAX_DIGITS} or more are beyond any resource "
                                            "Phalanx schedules")
    return Quantity(nanos if positive else -nanos, text)


def count(raw: object, field: str, *, most: Bound, least: int = 0) -> int | Violation:
    """A whole-number resource (an extended resource such as ``nvidia.com/gpu``): a quantity
    that is a non-negative integer (the API server's rules), ``least``..``most``."""
    q = _non_negative(raw, field)
    if isinstance(q, Violation):
        return q
    if q.nanos % NANO:
        return Violation(field, shown(raw), "must be an integer (the API server's rule for extended resources)")
    return _bounded(q.nanos // NANO, raw, field, least, most)


def scaled(raw: object, field: str, *, unit_nanos: int, most: Bound) -> int | Violation:
    """A non-negative quantity in units of ``unit_nanos`` nanos, rounded up, at most ``most``."""
    q = _non_negative(raw, field)
    if isinstance(q, Violation):
        return q
    return _bounded(q.ceil(unit_nanos), raw, field, 0, most)


def cpu_millis(raw: object, field: str, *, most: Bound = CPU_MOST) -> int | Violation:
    """A CPU quantity (``"2"``, ``"500m"``, ``"0.5"``) in millicores, rounded up like ``MilliValue``."""
    return scaled(raw, field, unit_nanos=10**6, most=most)


def memory_bytes(raw: object, field: str, *, most: Bound = MEMORY_MOST) -> int | Violation:
    """A memory quantity (``"16Gi"``, ``"1G"``, ``"129e6"``) in bytes, rounded up like ``Value``."""
    return scaled(raw, field, unit_nanos=NANO, most=most)


def decimal(raw: object, field: str, *, most: Bound, least: int = 1) -> int | Violation:
    """An integer written in a label value: a string of ASCII digits (label values are strings
    to the API server; no sign, suffix, exponent or white space), ``least``..``most``."""
    if not isinstance(raw, str):
        return Violation(field, shown(raw), "label values are strings: write the number in quotes, e.g. \"4\"")
    if not raw or len(raw) > MAX_TEXT or not set(raw) <= _DIGITS:
        return Violation(field, shown(raw), "must be a whole number written with ASCII digits 0-9 only")
    return _bounded(int(raw), raw, field, least, most)


def integer(raw: object, field: str, *, most: Bound, least: int = 0) -> int | Violation:
    """An integer field of a Kubernetes object (``parallelism``): a JSON/YAML integer, not a
    string, float or boolean (the API server refuses those for an integer field)."""
    if isinstance(raw, bool) or not isinstance(raw, int):
        return Violation(field, shown(raw), "must be an integer (a number without quotes or decimal point)")
    return _bounded(raw, raw, field, least, most)


# --- internals ------------------------------------------------------------------------------


def _text(raw: object) -> str | Violation:
    if isinstance(raw, bool) or raw is None:
        return Violation("", "", f"a quantity is a string such as \"4\" or a number, not {shown(raw)}")
    if isinstance(raw, int):
        return str(raw) if abs(raw) < 10**MAX_TEXT else "9" * (MAX_TEXT + 1)
    if isinstance(raw, float):
        if not math.isfinite(raw):
            return Violation("", "", "a quantity is a finite number")
        return repr(raw)
    if isinstance(raw, str):
        return raw.strip()
    return Violation("", "", f"a quantity is a string such as \"4\" or a number, not a {type(raw).__name__}")


def _scan(s: str) -> tuple[bool, str, str, str] | None:
    """(positive, integer digits, fraction digits, suffix), or None when the text is not
    shaped like a quantity. Mirrors the API server's scanner, zero-forms included."""
    pos, end = 0, len(s)
    positive = True
    if pos < end and s[pos] in "+-":
        positive = s[pos] == "+"
        pos += 1
    while pos < end and s[pos] == "0":
        pos += 1
    start = pos
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    num = s[start:pos] or "0"
    denom = ""
    if pos < end and s[pos] == ".":
        pos += 1
        start = pos
        while pos < end and s[pos] in _DIGITS:
            pos += 1
        denom = s[start:pos]
    suffix_start = pos
    while pos < end and s[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and s[pos] in "+-":
        pos += 1
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    if pos < end:
        return None
    return positive, num, denom, s[suffix_start:]


def _suffix(suffix: str) -> tuple[int, int] | None:
    """(base, exponent) of a suffix: (10, 3) for ``k``, (2, 20) for ``Mi``, (10, 3) for ``e3``."""
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix]
    if suffix in _BINARY:
        return 2, _BINARY[suffix]
    m = _EXPONENT.fullmatch(suffix)
    if m is None or len(m.group(1)) > 20 or not -_INT64 - 1 <= int(m.group(1)) <= _INT64:
        return None  # the API server reads the exponent as a 64-bit integer
    return 10, int(m.group(1))


def _nanos(digits: int, decimals: int, base: int, exponent: int) -> int | None:
    """|value| in nanos, rounded up below a nano; None when it is 10**MAX_DIGITS units or more."""
    if digits == 0:
        return 0
    if base == 2:
        nanos = -(-(digits << exponent) * NANO // 10**decimals)
        return min(nanos, _BINARY_CAP_NANOS) if nanos < 10**(MAX_DIGITS + 9) else None
    scale = exponent - decimals + 9  # value = digits * 10**scale nanos
    width = len(str(digits))
    if width + scale - 9 > MAX_DIGITS:
        return None
    if scale >= 0:
        return digits * 10**scale
    if -scale > width:
        return 1  # below one nano: rounds up to 1n
    return -(-digits // 10**-scale)


def _non_negative(raw: object, field: str) -> Quantity | Violation:
    q = parse(raw, field)
    if isinstance(q, Quantity) and q.nanos < 0:
        return Violation(field, shown(raw), "must be greater than or equal to 0")
    return q


def _bounded(n: int, raw: object, field: str, least: int, most: Bound) -> int | Violation:
    if n < least:
        return Violation(field, shown(raw), f"must be at least {least}")
    if n > most.most:
        return Violation(field, shown(raw), f"must be at most {most.most}: {most.rule}")
    return n
