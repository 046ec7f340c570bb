"""Link classes: the ordered view of nvidia-smi relation strings that placement compares.

Order, best first: NVLink (more bonded links is better; an NVSwitch fabric counts as the
best NVLink there is) > PIX > PXB > PHB > NODE > SYS. See docs/topology.md for the
bandwidth figures behind the order.
"""

from __future__ import annotations

import enum
import re

_NV = re.compile(r"^NV([0-9]{1,3})$")


class LinkClass(enum.IntEnum):
    """Higher is better."""

    SYS = 0
    NODE = 1
    PHB = 2
    PXB = 3
    PIX = 4
    NVLINK = 5


_PCIE = {"SYS": LinkClass.SYS, "NODE": LinkClass.NODE, "PHB": LinkClass.PHB,
         "PXB": LinkClass.PXB, "PIX": LinkClass.PIX}


def classify(relation: str) -> LinkClass:
    """The link class of a relation string; raises ValueError for an unknown string."""
    if _NV.match(relation):
        return LinkClass.NVLINK
    try:
        return _PCIE[relation]
    except KeyError:
        raise ValueError(f"unknown link relation {relation!r} (expected NV#, PIX, PXB, PHB, NODE or SYS)") from None


def nvlink_count(relation: str) -> int:
    """Number of bonded NVLinks in ``NV#``; 0 for a PCIe-only relation."""
    m = _NV.match(relation)
    return int(m.group(1)) if m else 0


FABRIC_LINKS = 1_000
"""The NVLink count used for a pair joined through an NVSwitch fabric: all-to-all at full
bandwidth, better than any direct bundle."""


def link_rank(relation: str, *, nvswitch: bool = False) -> tuple[int, int]:
    """A comparable rank for a relation: ``(class, nvlinks)``, larger is better."""
    cls = classify(relation)
    if cls is LinkClass.NVLINK:
        return (int(cls), FABRIC_LINKS if nvswitch else nvlink_count(relation))
    return (int(cls), 0)
