"""Why a pod's claims found no allocation on a node, once the search has failed: which claim and
request, and why, in a sentence for people (``Refusal.detail``), under kube-scheduler's own
status text. Called by ``phalanx_engine.dra.allocate`` only.

The first request (in search order) that could not be satisfied even alone, against the devices
in use before this pod, is named, with the first of these that holds for its first alternative:

* ``no device of class C matches`` (the class's selectors pick nothing on the node);
* ``no device of class C matches the request's selectors``; ``k devices asked, n match``;
* ``k of n matching devices have a taint the request does not tolerate`` /
  ``... cannot give the capacity asked`` (too few usable);
* ``k of n matching devices are free`` (the rest are taken: waiting can help).

When every request could be satisfied alone, the requests (or the claims) do not fit together:
devices taken by one request are missing for another, or a constraint rules out every
combination. A node with an invalid pool answers upstream's ``invalid resource pools were
encountered`` instead, naming the pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx_engine.dra import refusal as why
from phalanx_engine.dra.capacity import fit
from phalanx_engine.dra.refusal import Fatal, Refusal

if TYPE_CHECKING:
    from phalanx_engine.dra.allocate import Alt, ClaimState, _Search


def explain(search: _Search) -> Refusal:
    """The refusal for a search that found nothing."""
    invalid = [p for p in search.devices.pools if p.invalid]
    if invalid:
        return why.unschedulable(why.RefusalCode.INVALID_POOLS, why.INVALID_POOLS,
                                 detail="; ".join(f"pool {p.name}: {p.invalid}" for p in invalid))
    taken = False
    for c in search.claims:
        for alts in c.alts:
            reasons: list[tuple[Alt, tuple[str, bool]]] = []
            for alt in alts:
                try:
                    reason = _alone(search, c, alt)
                except Fatal:
                    reason = None  # a subrequest the search never reached: its selector errors
                if reason is None or reason[0] == "":
                    reasons = []
                    taken = taken or bool(reason)
                    break
                reasons.append((alt, reason))
            if reasons:
                alt, (text, resolvable) = reasons[0]
                return why.unschedulable(why.RefusalCode.CANNOT_ALLOCATE, why.CANNOT_ALLOCATE,
                                         detail=f"claim {c.ref}, request {alt.full_name}: {text}", claim=c.ref,
                                         request=alt.full_name, resolvable=resolvable)
    if len(search.claims) == 1:
        c = search.claims[0]
        under = " under its constraints" if c.constraints else ""
        detail = f"claim {c.ref}: its requests do not fit on the node's free devices together{under}"
        return why.unschedulable(why.RefusalCode.CANNOT_ALLOCATE, why.CANNOT_ALLOCATE, detail=detail, claim=c.ref,
                                 resolvable=taken or _any_taken(search))
    names = ", ".join(c.ref for c in search.claims)
    return why.unschedulable(why.RefusalCode.CANNOT_ALLOCATE, why.CANNOT_ALLOCATE,
                             detail=f"claims {names} do not fit on the node's free devices together",
                             resolvable=taken or _any_taken(search))


def _alone(search: _Search, c: ClaimState, alt: Alt) -> tuple[str, bool] | None:
    """Why ``alt`` cannot be met even alone: (text, resolvable); ("", True) when it can but some
    device it selects is taken; None when it can and none is."""
    cls = alt.spec.device_class.name
    if not search.selected(c, alt, class_only=True):
        return f"no device of class {cls} matches", False
    selected = search.selected(c, alt)
    if not selected:
        return f"no device of class {cls} matches the request's selectors", False
    if alt.all:
        devices = alt.devices if alt.devices is not None else selected
        blocked = sum(1 for d in devices if not d.tolerated_by(alt.spec.tolerations))
        if blocked:
            return f"{blocked} of {len(devices)} matching devices have a taint the request does not tolerate", False
        free = [d for d in devices if search.could(c, alt, d)]
        if len(free) < len(devices):
            return f"{len(free)} of {len(devices)} matching devices are free", True
        return None
    if len(selected) < alt.need:
        return f"{alt.need} devices asked, {len(selected)} match", False
    usable = search.candidates(c, alt)
    if len(usable) < alt.need:
        tainted = sum(1 for d in selected if not d.tolerated_by(alt.spec.tolerations))
        if len(selected) - tainted < alt.need:
            return f"{tainted} of {len(selected)} matching devices have a taint the request does not tolerate", False
        lacking = sum(1 for d in selected if fit(d, alt.asked, None, None) is None)
        return f"{lacking} of {len(selected)} matching devices cannot give the capacity asked", False
    free = [d for d in usable if search.could(c, alt, d)]
    if len(free) < alt.need:
        return f"{len(free)} of {len(usable)} matching devices are free", True
    return ("", True) if len(free) < len(usable) else None


def _any_taken(search: _Search) -> bool:
    usage = search.usage
    return any(usage.allocated(d.key) for d in search.devices.candidates)
