"""Repairing a running gang that lost members, as pure rules (docs/repair.md).

Called by gang-coordinator (its repair watch and intake, inside ``store.GangStore``'s
compare-and-set loop, through ``phalanx_rules.saga``) and by placement (the domain a repair
attempt may use). No I/O, no clock: ``now`` and what the nodes say are passed in, so every rule is
table-tested (tests/unit/test_repair_rules.py).

    failure_of(...)            is a bound member on this node failed, and why (a ``FailureSignal``)
    gang_domains(nodes, tiers) the network domains that hold every node the gang runs on, tightest first
    member_failed(s, f, ...)   a scheduled gang records a failed member: the repair starts (or grows)
    ready(s)                   every failed member has its replacement: the repair attempt may start
    no_room(s, now)            the repair attempt found no room in its domain: the policy decides
    overdue(s, now)            the repair's deadline passed while the gang waited: the policy decides
    restart_pods(s)            the members a whole restart deletes
    repaired(s)                the repair attempt bound every replacement: the repair is over

A repair is not a phase of its own: the gang stays ``scheduled`` while it waits for its
replacements, and its repair attempt is an attempt for late members (``placing`` … ``scheduled``)
whose placement is confined to ``Repair.domain()``. Every reader of the phases (queues, the
checks, the reconciler) therefore treats a repairing gang as what it is at each moment.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import msgspec

from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import REPAIR_POLICY_KEY
from phalanx_proto.scheduling import NodeKubeState, Taint, Toleration
from phalanx_proto.state import (
    REPAIR_POLICIES,
    FailedMember,
    GangState,
    Repair,
    RepairDomain,
    RepairPolicy,
)
from phalanx_proto.topology import NetworkTiers

TIERS = ("node", "hypernode", "leaf", "netpod")
"""The network tiers, tightest first (the engine's ``phalanx_engine.topology.TIERS``)."""
DEFAULT_POLICY: RepairPolicy = "wait-then-restart"
NOT_READY_GRACE_S = 30.0
"""How long a node may be seen NotReady before its members count as failed (kube's node
lifecycle controller marks a node NotReady after its own 40–50 s monitor grace already)."""
MAX_FAILED = 1000

replace = msgspec.structs.replace


def domain_at(node: str, tiers: NetworkTiers, tier: str) -> str:
    """``node``'s domain at ``tier``: the engine's rule (``phalanx_engine.topology.domain_of``):
    its name at the node tier, ``node:<name>`` where it reports no domain at a network tier."""
    value = {"node": node, "hypernode": tiers.hypernode, "leaf": tiers.leaf, "netpod": tiers.netpod}[tier]
    return value or f"node:{node}"


def gang_domains(nodes: Iterable[str], tiers: Mapping[str, NetworkTiers]) -> tuple[RepairDomain, ...]:
    """Every domain that holds all of ``nodes`` (those whose tiers are known), tightest first:
    where a repair places replacements first, then each wider one if its policy widens. Empty
    when no node is known or the nodes share no network-pod (the gang already spans the cluster)."""
    known = sorted({n for n in nodes if n in tiers})
    out = []
    for tier in TIERS:
        found = {domain_at(n, tiers[n], tier) for n in known}
        if len(found) == 1:
            out.append(RepairDomain(tier=tier, domain=found.pop()))
    return tuple(out)


def policy_of(values: Iterable[str], queue_default: str = "") -> tuple[RepairPolicy, str]:
    """The gang's policy from its pods' ``REPAIR_POLICY_KEY`` values ("" for a pod without one), else
    its queue's default, else ``DEFAULT_POLICY``; and a problem to tell ("" when none): pods
    that disagree (the first in ``REPAIR_POLICIES`` order wins) or a value that is no policy."""
    said = {v for v in values if v}
    bad = sorted(said - set(REPAIR_POLICIES))
    good = [p for p in REPAIR_POLICIES if p in said]
    problem = ""
    if bad:
        problem = f"{REPAIR_POLICY_KEY}={bad[0]!r} is not one of {', '.join(REPAIR_POLICIES)}"
    elif len(good) > 1:
        problem = f"the gang's pods name different repair policies ({', '.join(good)}); using {good[0]}"
    if good:
        return good[0], problem  # type: ignore[return-value]  # checked against REPAIR_POLICIES
    if queue_default in REPAIR_POLICIES:
        return queue_default, problem  # type: ignore[return-value]
    return DEFAULT_POLICY, problem


def tolerated(taint: Taint, tolerations: Collection[Toleration]) -> bool:
    """kube's rule: a toleration matches the taint's key (empty key with ``Exists``: every key),
    value (``Exists``: any) and effect (empty: every effect). ``tolerationSeconds`` is not
    counted: a taint tolerated for a while is one kube evicts for, after that while."""
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if not t.key and t.operator == "Exists":
            return True
        if t.key != taint.key:
            continue
        if t.operator == "Exists" or t.value == taint.value:
            return True
    return False


def failure_of(state: NodeKubeState | None, *, deleted: bool, not_ready_for: float,
               tolerations: Collection[Toleration] = (), gpus: Collection[int] = (),
               unhealthy: Collection[int] = (), grace_s: float = NOT_READY_GRACE_S,
               no_schedule: bool = False) -> tuple[str, str] | None:
    """Why a member bound to a node with ``state`` (its Kubernetes state; ``deleted``: the Node is
    gone) on GPUs ``gpus`` has failed, as (signal, detail), or None. ``not_ready_for``: how long
    the node has been seen not Ready (0: it is Ready); ``unhealthy``: the node's GPUs reported
    unhealthy; ``no_schedule``: a ``NoSchedule`` taint or a cordon counts too (configurable)."""
    if deleted:
        return "node_deleted", "the node was deleted"
    bad = sorted(set(gpus) & set(unhealthy))
    if bad:
        return "gpu_unhealthy", f"GPU {', '.join(map(str, bad))} reported unhealthy"
    if state is None:
        return None
    if state.ready != "True" and not_ready_for >= grace_s:
        return "node_not_ready", f"the node has not been Ready for {not_ready_for:.0f}s (Ready={state.ready})"
    for taint in state.taints:
        if taint.effect == "NoExecute" and not tolerated(taint, tolerations):
            return "node_tainted", f"untolerated taint {taint.key}:{taint.effect}"
    if no_schedule:
        for taint in state.taints:
            if taint.effect == "NoSchedule" and not tolerated(taint, tolerations):
                return "node_tainted", f"untolerated taint {taint.key}:{taint.effect}"
        if state.unschedulable:
            return "node_cordoned", "the node was cordoned"
    return None


def held_members(s: GangState) -> set[PodRef]:
    """The members bound and kept: by earlier attempts (``running``), or by the current one."""
    return {r.pod for r in s.running} | set(s.bound)


def member_failed(s: GangState | None, failed: FailedMember, *, domains: tuple[RepairDomain, ...] = (),
                  policy: RepairPolicy = DEFAULT_POLICY, now: float, timeout_s: float) -> GangState | None:
    """A bound member of a gang that runs failed: the repair starts (the first failure: its
    domains, policy and deadline ``now + timeout_s``) or counts one more failed member (several
    nodes failing together are one repair). Only for a member bound and kept (``held_members``)
    of a gang that is ``scheduled``, or whose running attempt is a repair's (a member of its
    survivors failed meanwhile); a failure recorded already, or any other: no change. An
    elastic gang that keeps its min-member without the pod lost an extra, not a member it
    needs: no repair; the pod's replacement joins as the gang grows (docs/workloads.md)."""
    if s is None or failed.pod not in held_members(s):
        return None
    if s.repair is None and s.max_member and len(held_members(s) - {failed.pod}) >= s.min_member:
        return None
    if s.phase != "scheduled" and not (s.repair is not None and failed.pod in {r.pod for r in s.running}):
        return None
    r = s.repair
    if r is not None and any(f.pod == failed.pod for f in r.failed):
        return None
    if r is None:
        r = Repair(domains=domains, policy=policy, started_at=now, deadline_at=now + timeout_s)
    if len(r.failed) >= MAX_FAILED:
        return None
    return replace(s, repair=replace(r, failed=r.failed + (failed,)))


def replacements(s: GangState) -> int:
    """How many members wait to be placed (arrived after the gang was scheduled)."""
    held = held_members(s)
    return sum(1 for m in s.members if m.pod not in held)


def ready(s: GangState) -> bool:
    """The repair attempt may start: the gang is repairing, not being restarted, every failed
    member's pod is gone, and a replacement is present for every failed member (so members lost
    together are placed together), or the gang is complete again by its declared min-member."""
    r = s.repair
    if r is None or r.restart:
        return True
    waiting = replacements(s)
    if not waiting:
        return False
    failed = {f.pod for f in r.failed}
    if any(m.pod in failed for m in s.members):
        # A failed member's pod is not gone yet (its deletion not seen): placing a replacement
        # now would end the repair with the failed member still held on its bad node, and the
        # next scan would record it failed again, for a replacement already placed.
        return False
    present = len(s.members)
    return waiting >= len(r.failed) - r.replaced or (s.min_member_declared and present >= s.min_member)


def no_room(s: GangState, now: float) -> GangState:
    """The repair attempt found no room in its domain (its gang is back in ``backoff``): by
    policy, ``widen`` moves to the next wider domain (once) and retries at once, ``restart``
    gives the domain up now; the waiting policies wait (retried as soon as GPUs are released)."""
    r = s.repair
    if r is None or r.restart:
        return s
    if r.policy == "widen" and r.level == 0 and len(r.domains) > 1:
        return replace(s, repair=replace(r, level=1), backoff_until=now)
    if r.policy == "widen" and r.level == 0 and r.domains:
        return replace(s, repair=replace(r, level=len(r.domains)), backoff_until=now)  # anywhere
    if r.policy == "restart":
        return restart(s)
    return s


def overdue(s: GangState, now: float) -> GangState | None:
    """The repair's deadline passed while the gang waited for room (not while an attempt runs:
    that attempt's own deadline decides it): ``wait-then-restart`` and ``widen`` restart the
    gang whole; ``wait`` keeps waiting in its domain. None: no change."""
    r = s.repair
    if r is None or r.restart or now < r.deadline_at or s.phase not in ("scheduled", "backoff"):
        return None
    if r.policy == "wait":
        return None
    return restart(s)


def restart(s: GangState) -> GangState:
    """Give the domain up: every member is deleted (``restart_pods``) and placed again as one
    gang, where the nodes it ran on (``home``) are tried first once their GPUs are released."""
    r = s.repair or Repair()
    return replace(s, repair=replace(r, restart=True))


def restart_pods(s: GangState) -> tuple[PodRef, ...]:
    """The pods a whole restart deletes: every member (survivors and replacements alike)."""
    if s.repair is None or not s.repair.restart:
        return ()
    return tuple(m.pod for m in s.members)


def repaired(s: GangState) -> GangState:
    """The repair attempt bound every replacement: the gang runs whole again in its domain."""
    return replace(s, repair=None, home=())


def attempt_bound(s: GangState) -> GangState:
    """The repair attempt bound its members (``s.bound``: the replacements it placed). The
    repair is over (``repaired``) when every failed member is replaced and a gang that declares
    min-member is complete again; otherwise a member failed after the attempt had started (its
    failure joined the repair, its replacement comes later): the repair goes on, in the same
    domain, with the ones placed so far counted (``Repair.replaced``)."""
    r = s.repair
    if r is None or r.restart:
        return s
    replaced = r.replaced + len(s.bound)
    if replaced >= len(r.failed) and not (s.min_member_declared and len(s.members) < s.min_member):
        return repaired(s)
    return replace(s, repair=replace(r, replaced=min(replaced, len(r.failed))))


def outcome(s: GangState) -> str:
    """The metric label of how a repair ended: ``in_domain`` (its tightest domain), ``widened``,
    ``anywhere`` (no domain known) or ``restarted``."""
    r = s.repair
    if r is None:
        return ""
    if r.restart:
        return "restarted"
    if not r.domains:
        return "anywhere"
    return "in_domain" if r.level == 0 else "widened"


def describe(r: Repair, now: float) -> str:
    """One line for ``phalanx explain`` and the pods' events."""
    failed = ", ".join(f"{f.pod.name} on {f.node} ({f.detail or f.signal})" for f in r.failed[:5])
    more = f" and {len(r.failed) - 5} more" if len(r.failed) > 5 else ""
    d = r.domain()
    where = f"{d.tier} {d.domain}" if d is not None else "any domain"
    if r.restart:
        return f"restarting whole after losing {failed}{more}"
    left = max(0.0, r.deadline_at - now)
    return (f"repairing {len(r.failed)} failed member(s) ({failed}{more}) inside {where}, "
            f"policy {r.policy}, {left:.0f}s left")
