"""The claims step of a placement decision: a member's ResourceClaims allocated on the node the
member would go to (docs/dra.md), after its kind's allocator chose the rest.

``Claims.allocate(member, node, assignment)`` runs ``phalanx_engine.dra.allocate`` on the node's
DRA devices (``NodeState.dra``) and returns the assignment with the claims' allocations
(``Assignment.claims``) and the GPUs they are (added to ``Assignment.gpus``), or the node's
``Status`` in kube-scheduler's words.

What is in use comes from the decision's ``Trial`` (``trial``: a context the decision opens):
the devices every ResourceClaim holds (the pools' ``in_use``), the allocations in the ledger,
and those the decision itself made for earlier members — so two members never get one device,
and a claim several members share is allocated once: the later members see its allocation and
must go where it can be used. A call outside a decision (a planner trying one node) reads the
node's own pools and reservations. An extended claim (a pod's ``nvidia.com/gpu`` served by a
DeviceClass, KEP-5004) is used only on a node whose allocatable lacks the resource; there its
devices replace the GPUs the kind's allocator chose. A gang whose claims come from one
ComputeDomain's template is placed in one NVLink clique hosting no other ComputeDomain
(``ComputeDomainClique``, a domain filter; ``decide`` tries such a gang from the clique tier up). Devices that are, or sit on, a GPU the node's device-plugin
reservations hold are blocked: a GPU is never given twice across the two paths.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Sequence

import msgspec

from phalanx_engine.dra import Refusal, Usage, allocate
from phalanx_engine.dra.pools import DeviceKey
from phalanx_engine.framework import Member
from phalanx_engine.nodestate import NodeState
from phalanx_engine.status import Code, Status, refuse
from phalanx_proto.dra import ClaimAllocated, ClaimAllocation, DraPool, PodClaim
from phalanx_proto.events import Assignment, MemberSpec

PLUGIN = "DynamicResources"


class Trial:
    """The DRA state of one decision: the devices in use and the claims it allocated so far."""

    __slots__ = ("usage", "decided")

    def __init__(self, usage: Usage, decided: dict[str, ClaimAllocation] | None = None) -> None:
        self.usage = usage
        self.decided: dict[str, ClaimAllocation] = decided if decided is not None else {}
        """Claim key → the allocation this decision gave it."""

    def copy(self) -> Trial:
        return Trial(self.usage.copy(), dict(self.decided))

    def book(self, assignment: Assignment) -> None:
        """The decision keeps ``assignment``: its claims' devices are taken for what follows."""
        for c in assignment.claims:
            self.usage.add(c.claim, c.allocation)
            self.decided.setdefault(c.claim, c.allocation)


_TRIAL: contextvars.ContextVar[Trial | None] = contextvars.ContextVar("dra_trial", default=None)


@contextlib.contextmanager
def trial(t: Trial) -> Iterator[Trial]:
    """Run the code inside with ``t`` as the decision's DRA state."""
    token = _TRIAL.set(t)
    try:
        yield t
    finally:
        _TRIAL.reset(token)


def current() -> Trial | None:
    return _TRIAL.get()


def book(assignment: Assignment) -> None:
    """Book a kept assignment into the decision's trial (nothing outside a decision)."""
    t = _TRIAL.get()
    if t is not None and assignment.claims:
        t.book(assignment)


def usage_of(nodes: Iterable[NodeState]) -> Usage:
    """What is in use among ``nodes``: their pools (each once) and the claims their reservations hold."""
    pools: dict[tuple[str, str], DraPool] = {}
    held: list[ClaimAllocated] = []
    for st in nodes:
        for p in st.view.dra:
            pools.setdefault((p.driver, p.pool), p)
        held.extend(st.claims)
    return Usage(pools.values(), held)


class Claims:
    """The claims step (module docstring)."""

    name = PLUGIN

    def allocate(self, member: Member, node: NodeState, assignment: Assignment) -> Assignment | Status:
        claims = tuple(pc for pc in member.spec.claims if not (pc.claim.extended and _plugin_serves(node, pc)))
        if not claims:
            return assignment  # its extended resources come from the node's device plugin
        extended = any(pc.claim.extended for pc in claims)
        t = _TRIAL.get()
        if t is None:
            t = Trial(usage_of((node,)))
        claims = tuple(_with_decided(pc, t.decided) for pc in claims)
        # A DRA-only node serves the member's GPUs through its extended claim, not the GPUs the
        # kind's allocator chose: those are free for the claim and replaced by its devices.
        blocked = _blocked(node, () if extended else assignment.gpus)
        got = allocate(claims, node.dra(), t.usage.blocking(blocked), node.ranking())
        if isinstance(got, Refusal):
            return got.status(PLUGIN)
        allocated = tuple(msgspec.structs.replace(c, extended_requests=pc.claim.extended_requests,
                                                  compute_domain=pc.claim.compute_domain)
                          if c.extended or pc.claim.compute_domain else c for c, pc in zip(got.claims, claims, strict=True))
        whole = node.whole_gpus_of(allocated)
        gpus = tuple(sorted(set(whole) if extended else set(assignment.gpus) | set(whole)))
        by_index = {g.index: g.uuid for g in node.gpus.values()}
        return msgspec.structs.replace(assignment, claims=allocated, gpus=gpus,
                                       gpu_uuids=tuple(by_index[g] for g in gpus) if any(by_index.values()) else ())


def _with_decided(pc: PodClaim, decided: dict[str, ClaimAllocation]) -> PodClaim:
    """The pod claim with the allocation this decision gave it for another member, if any."""
    got = decided.get(pc.claim.key)
    if got is None or pc.claim.allocation is not None:
        return pc
    return msgspec.structs.replace(pc, claim=msgspec.structs.replace(pc.claim, allocation=got))


def _plugin_serves(node: NodeState, pc: PodClaim) -> bool:
    """Does the node serve the extended claim's resources through a device plugin (its
    allocatable has them), so the pod takes the device-plugin path there, as upstream decides
    per node (KEP-5004)?"""
    kube = node.view.kube
    if kube is None:
        return True  # no Kubernetes state reported: the GPUs are the topology's, as before
    return all(kube.allocatable.get(r.resource, 0) > 0 for r in pc.claim.extended_requests)


def _blocked(node: NodeState, chosen: tuple[int, ...]) -> frozenset[DeviceKey]:
    """The node's DRA devices on GPUs held by its device-plugin reservations, or ``chosen`` for
    this member by its kind's allocator."""
    taken = node.plugin_gpus() | set(chosen)
    if not taken:
        return frozenset()
    return frozenset(key for key, gpu in node.dra_gpus().items() if gpu in taken)


def compute_domains(members: Iterable[Member]) -> frozenset[str]:
    """The ComputeDomains the members' claims ask channels of."""
    return frozenset(pc.claim.compute_domain for m in members for pc in m.spec.claims if pc.claim.compute_domain)


class ComputeDomainClique:
    """A gang whose claims come from a ComputeDomain is tried only in an NVLink clique (the
    hypernode tier: ``nvidia.com/gpu.clique``) hosting no other ComputeDomain: two domains'
    IMEX daemons in one clique corrupt each other's fabric memory (docs/dra.md)."""

    name = "ComputeDomainClique"

    def filter_domain(self, members: Sequence[Member], nodes: Sequence[NodeState]) -> Status | None:
        mine = compute_domains(members)
        if not mine:
            return None
        if len(mine) > 1:
            return refuse(self.name, Code.GANG_DOMAIN, "the gang's claims name more than one ComputeDomain",
                          resolvable=False, detail=", ".join(sorted(mine)))
        others = sorted({d for n in nodes for d in n.compute_domains()} - mine)
        if others:
            return refuse(self.name, Code.GANG_DOMAIN, "the NVLink clique hosts another ComputeDomain",
                          resolvable=True, detail=", ".join(others[:3]))
        return None


def alternatives(members: Iterable[Member]) -> int:
    """How many levels of ``firstAvailable`` alternatives the members' claims offer (1: none to
    fall back on)."""
    return max((len(r.first_available) for m in members for pc in m.spec.claims
                if pc.claim.allocation is None for r in pc.claim.requests), default=1) or 1


def from_alternative(spec: MemberSpec, level: int) -> MemberSpec:
    """``spec`` with each unallocated claim's ``firstAvailable`` requests starting at alternative
    ``level`` (their last one when they have fewer): a gang's second chance when every member's
    preferred alternatives do not fit together. The subrequests keep their names, so the
    allocation names the one used, as upstream's would."""
    def claim(pc: PodClaim) -> PodClaim:
        if pc.claim.allocation is not None:
            return pc
        requests = tuple(msgspec.structs.replace(r, first_available=r.first_available[min(level, len(
            r.first_available) - 1):]) if r.first_available else r for r in pc.claim.requests)
        return msgspec.structs.replace(pc, claim=msgspec.structs.replace(pc.claim, requests=requests))

    return msgspec.structs.replace(spec, claims=tuple(claim(pc) for pc in spec.claims))
