"""Where a repair attempt, or a gang restarted whole, may be placed (docs/repair.md).

Called by ``service.Placement._decide`` for every decision; pure over the decision's cluster.
A repair attempt (the record has a ``Repair`` and members kept by earlier attempts) is
**confined** to the domain its repair names now (``Repair.domain()``): every other node is
left out of the decision, as ``avoid`` leaves nodes out. A gang placed whole again after it
ran (``GangState.home``: a repair's restart, a JobSet restarted by its failure policy)
**prefers** the tightest domain holding the nodes it ran on: that domain is tried first and,
only if the gang does not fit there, the whole cluster.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from phalanx_engine.cluster import Cluster
from phalanx_engine.topology import TIER_NAMES, TIERS, domain_of
from phalanx_proto.state import GangState


@dataclass(frozen=True, slots=True)
class Scope:
    """The nodes a decision may use (``inside``), and whether that is required (a repair) or
    only preferred (a restarted gang's old domain)."""

    tier: str
    domain: str
    inside: frozenset[str]
    required: bool

    @property
    def where(self) -> str:
        return f"{self.tier} {self.domain}"

    def no_room(self, detail: str, members: int) -> str:
        what = f"repair: no room for {members} replacement(s) inside the gang's {TIER_NAMES[self.tier]} {self.domain}"
        return f"{what}; {detail}" if detail else what


def confinement(record: GangState, cluster: Cluster) -> Scope | None:
    """The scope of ``record``'s current attempt on ``cluster`` (None: the whole cluster)."""
    r = record.repair
    if r is not None and record.running and not r.restart:
        d = r.domain()
        if d is None:
            return None
        return _scope(cluster, d.tier, d.domain, required=True)
    if record.home and not record.running:
        return home_scope(record.home, cluster)
    return None


def home_scope(home: Collection[str], cluster: Cluster) -> Scope | None:
    """The tightest domain holding every node of ``home`` still in the cluster, preferred."""
    known = [cluster.nodes[n] for n in sorted(set(home)) if n in cluster.nodes]
    if not known:
        return None
    for tier in TIERS:
        found = {domain_of(s, tier) for s in known}
        if len(found) == 1:
            return _scope(cluster, tier, found.pop(), required=False)
    return None


def _scope(cluster: Cluster, tier: str, domain: str, *, required: bool) -> Scope:
    if tier == "node":
        inside = frozenset({domain} & cluster.nodes.keys())
    else:
        inside = frozenset(cluster.topology.domains(tier).get(domain, ()))
    return Scope(tier=tier, domain=domain, inside=inside, required=required)
